"""nvidia-smi output as GPU evidence (llmdiag.collect.telemetry.nvidia_smi), on real pastes (tests/fixtures/nvidia-smi,
provenance in its README): the table, -q and -q -x read into NVML's vocabulary, so the GPU rules judge them.

Every expected number below is read off the fixture text by eye (MiB x 2**20, W, %), never from the code.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmdiag.collect.files import collect_files
from llmdiag.collect.merge import merge_signal_sets
from llmdiag.collect.telemetry.nvidia_smi import catalogue_gpu, collect_nvidia_smi, looks_like_nvidia_smi
from llmdiag.engine.evaluate import build_verdict
from llmdiag.errors import InputFileError
from llmdiag.model import SignalSet
from llmdiag.schema.loader import load_signal_registry
from tests.conftest import FIXTURES

SMI = FIXTURES / "nvidia-smi"
MIB = 2**20
REGISTRY = load_signal_registry()


def read(name: str) -> str:
    return (SMI / name).read_text()


def collect(name: str) -> SignalSet:
    return collect_nvidia_smi(read(name), name)


def stat(signals: SignalSet, name: str, key: str) -> float | None:
    signal = signals.get(name)
    assert signal is not None, name
    return signal.stat(key)


# ---------------------------------------------------------------------------------------------
# recognising it


@pytest.mark.parametrize("name", sorted(p.name for p in SMI.iterdir() if p.name != "README.md"))
def test_every_format_is_recognised(name: str):
    assert looks_like_nvidia_smi(read(name))


@pytest.mark.parametrize(
    "path",
    [FIXTURES / "nccl" / "watchdog-timeout-allreduce.txt", FIXTURES / "logs" / "vllm-0.32-healthy.log"],
)
def test_other_texts_are_not_nvidia_smi(path: Path):
    assert not looks_like_nvidia_smi(path.read_text())


# ---------------------------------------------------------------------------------------------
# the default table


def test_table_gives_each_gpu_and_its_processes():
    signals = collect("rtx4090-x4-shared-gpu-table.txt")
    used = signals.get("gpu_memory_used_bytes")
    assert used is not None and used.by_series["gpu=2"] == 23703 * MIB and used.by_series["gpu=1"] == 3428 * MIB
    assert stat(signals, "gpu_memory_total_bytes", "max") == 24564 * MIB
    processes = signals.get("gpu_process_count")
    assert processes is not None
    assert processes.by_series == {"gpu=0": 3.0, "gpu=1": 2.0, "gpu=2": 1.0, "gpu=3": 1.0}
    memory = signals.get("gpu_process_memory_bytes")
    assert memory is not None
    assert memory.by_series["gpu=0,process=3332855"] == 3732 * MIB
    assert memory.stat("max") == 23694 * MIB
    power = signals.get("gpu_power_watts")
    assert power is not None and power.by_series == {"gpu=0": 13.0, "gpu=1": 10.0, "gpu=2": 24.0, "gpu=3": 19.0}
    assert stat(signals, "gpu_power_limit_watts", "max") == 450.0
    assert stat(signals, "gpu_utilization_ratio", "max") == 0.0  # '0%' printed: a real zero
    assert stat(signals, "gpu_count", "last") == 4.0
    assert signals.window.kind == "snapshot" and signals.window.scrapes == 1
    source = signals.sources[0]
    assert source.probe == "nvidia-smi" and source.config["gpus"] == "4 × NVIDIA GeForce RTX 4090"
    assert source.config["driver"] == "580.126.18" and source.config["cuda"] == "13.0"


def test_what_the_table_does_not_print_is_unavailable_with_the_command_that_shows_it():
    signals = collect("rtx4090-x4-shared-gpu-table.txt")
    for name in ("sm_clock_hertz", "pcie_link_generation", "clocks_throttled_ratio", "gpu_memory_free_bytes"):
        signal = signals.get(name)
        assert signal is not None and signal.stat("max") is None
        assert "nvidia-smi -q" in (signal.unavailable or "")
    nvlink = signals.get("nvlink_tx_bytes_per_second")
    assert nvlink is not None and "nvidia-smi nvlink" in (nvlink.unavailable or "")
    ecc = signals.get("ecc_uncorrected_errors_per_second")  # the column reads 'Off': ECC is off, not zero errors
    assert ecc is not None and ecc.stat("rate") is None and "'Off'" in (ecc.unavailable or "")


def test_a_table_pasted_in_a_fence_under_prose_without_its_header():
    signals = collect("h100-x8-busy-issue-paste.md")
    util = signals.get("gpu_utilization_ratio")
    assert util is not None
    assert util.by_series["gpu=0"] == 0.0 and util.by_series["gpu=7"] == 1.0
    power = signals.get("gpu_power_watts")
    assert power is not None and power.by_series["gpu=4"] == 697.0 and power.by_series["gpu=0"] == 71.0
    assert stat(signals, "gpu_memory_used_bytes", "max") == 58333 * MIB
    # no Processes section in the paste: unknown, never 'no process'
    for name in ("gpu_process_count", "gpu_process_memory_bytes"):
        signal = signals.get(name)
        assert signal is not None and signal.stat("max") is None and "no process list" in (signal.unavailable or "")


def test_a_quoted_table_reads_as_the_bare_one():
    bare = read("rtx4090-x4-shared-gpu-table.txt")
    quoted = "Here is my nvidia-smi:\n\n" + "\n".join("> " + line for line in ["```", *bare.splitlines(), "```"])
    want, got = collect_nvidia_smi(bare, "bare"), collect_nvidia_smi(quoted, "quoted")
    for name in ("gpu_memory_used_bytes", "gpu_process_count", "gpu_power_watts", "gpu_utilization_ratio"):
        assert got.signals[name].by_series == want.signals[name].by_series, name


def test_an_old_style_table_without_processes_section():
    signals = collect("h100-sxm-x8-idle-table.txt")
    power = signals.get("gpu_power_watts")
    assert power is not None and power.by_series["gpu=0"] == 100.0 and power.by_series["gpu=7"] == 75.0
    assert stat(signals, "gpu_process_count", "max") == 0.0  # 'No running processes found': a real zero
    assert signals.sources[0].config["gpu"] == "H100"


def test_the_old_two_row_table_of_driver_418():
    signals = collect("p40-x3-driver418-table.md")
    power = signals.get("gpu_power_watts")
    assert power is not None and power.by_series == {"gpu=0": 172.0, "gpu=1": 9.0, "gpu=2": 10.0}
    util = signals.get("gpu_utilization_ratio")
    assert util is not None and util.by_series == {"gpu=0": 1.0, "gpu=1": 0.0, "gpu=2": 0.0}
    assert stat(signals, "gpu_memory_used_bytes", "max") == 22747 * MIB
    assert stat(signals, "gpu_temperature_celsius", "max") == 82.0
    assert signals.sources[0].config["driver"] == "418.39" and signals.sources[0].config["cuda"] == "10.1"


# ---------------------------------------------------------------------------------------------
# nvidia-smi -q and -q -x


def test_query_text_gives_clocks_link_power_and_framebuffer():
    signals = collect("h200-idle-q.txt")
    assert stat(signals, "gpu_power_watts", "last") == pytest.approx(74.58)
    assert stat(signals, "gpu_power_limit_watts", "last") == 700.0
    assert stat(signals, "sm_clock_hertz", "last") == 345e6 and stat(signals, "sm_clock_max_hertz", "last") == 1980e6
    assert stat(signals, "memory_clock_hertz", "last") == 3199e6
    assert (
        stat(signals, "pcie_link_generation", "min") == 5.0 and stat(signals, "pcie_link_max_width_lanes", "min") == 16
    )
    assert stat(signals, "gpu_memory_total_bytes", "max") == 143771 * MIB
    assert stat(signals, "gpu_memory_free_bytes", "min") == 143072 * MIB
    assert stat(signals, "pcie_tx_bytes_per_second", "last") == 657 * 1024
    assert stat(signals, "gpu_temperature_celsius", "max") == 28.0
    assert stat(signals, "gpu_row_remap_pending", "max") == 0.0
    # 'Idle : Active' and nothing else: clocks are low because the GPU is idle, not held down
    assert stat(signals, "clocks_throttled_ratio", "max") == 0.0
    assert stat(signals, "gpu_process_count", "max") == 0.0  # 'Processes : None'
    assert signals.window.start_unix is not None  # 'Timestamp : Thu Nov 28 04:03:23 2024'
    assert signals.sources[0].config == {
        "format": "nvidia-smi -q",
        "gpus": "1 × NVIDIA H200",
        "driver": "550.90.12",
        "cuda": "12.4",
        "gpu": "H200",
    }


def test_query_text_of_eight_gpus_names_the_catalogue_part():
    signals = collect("h100-sxm-x8-idle-q.txt")
    assert stat(signals, "gpu_count", "last") == 8.0
    assert signals.sources[0].config["gpus"] == "8 × NVIDIA H100 80GB HBM3"
    assert signals.sources[0].config["gpu"] == "H100"
    power = signals.get("gpu_power_watts")
    assert power is not None and len(power.by_series) == 8


def test_a_counter_from_one_snapshot_has_no_rate():
    signals = collect("h200-idle-q.txt")  # 'Replays Since Reset : 0', 'DRAM Uncorrectable : 0'
    for name in ("pcie_replay_errors_per_second", "ecc_uncorrected_errors_per_second"):
        signal = signals.get(name)
        assert signal is not None and signal.stats == {} and "two readings" in (signal.unavailable or "")


def test_xml_gives_each_link_and_a_degraded_one_shows():
    signals = collect("rtx3090-x4-q-x.xml")
    width = signals.get("pcie_link_width_lanes")
    assert width is not None and width.by_series == {"gpu=0": 16.0, "gpu=1": 16.0, "gpu=2": 8.0, "gpu=3": 16.0}
    assert stat(signals, "pcie_link_max_width_lanes", "min") == 16.0
    power = signals.get("gpu_power_watts")
    assert power is not None and power.by_series["gpu=0"] == pytest.approx(13.78)
    # compute processes are listed with used_memory N/A (a WSL driver): counted, their memory unknown
    processes = signals.get("gpu_process_count")
    assert processes is not None and processes.by_series["gpu=0"] == 2.0
    memory = signals.get("gpu_process_memory_bytes")
    assert memory is not None and memory.stat("max") is None and "N/A" in (memory.unavailable or "")
    # the derived link speed: GPU 2 runs x8 of x16 at the generation it supports, half the bandwidth
    verdict = build_verdict(signals)
    assert verdict.signals["pcie_link_speed_ratio"].stat("value") == pytest.approx(0.5)


def test_xml_graphics_processes_are_not_compute_processes():
    signals = collect("rtx3080ti-q-x.xml")  # Xorg, gnome-shell and a browser, all type G
    assert stat(signals, "gpu_process_count", "max") == 0.0
    memory = signals.get("gpu_process_memory_bytes")
    assert memory is not None and "no compute process" in (memory.unavailable or "")
    assert stat(signals, "pcie_link_generation", "min") == 1.0  # an idle link trained down from Gen 4
    assert stat(signals, "gpu_memory_used_bytes", "max") == 352 * MIB


def test_query_text_in_a_fence_with_a_compute_process_and_a_narrowed_link():
    signals = collect("a10g-triton-q.md")  # a blank line inside the PCI block, a process with an empty Name
    memory = signals.get("gpu_process_memory_bytes")
    assert memory is not None and memory.by_series == {"gpu=0,process=3402470": 8716 * MIB}
    assert stat(signals, "gpu_process_count", "max") == 1.0
    assert (
        stat(signals, "pcie_link_width_lanes", "min") == 8.0 and stat(signals, "pcie_link_max_width_lanes", "min") == 16
    )
    assert stat(signals, "pcie_rx_bytes_per_second", "last") == 0.0  # the line after the blank one
    assert stat(signals, "gpu_memory_free_bytes", "min") == 14001 * MIB
    # nvidia-smi's "NVIDIA A10G" is the A10G entry of probes/tables/gpus.toml: the scan can price it
    assert signals.sources[0].config["gpu"] == "A10G" and "gpu_note" not in signals.sources[0].config
    verdict = build_verdict(signals)
    assert verdict.signals["pcie_link_speed_ratio"].stat("value") == pytest.approx(0.5)  # x8 of x16, Gen 4 of 4
    assert verdict.signals["gpu_memory_used_ratio"].stat("value") == pytest.approx(8722 / (8722 + 14001))


def test_an_empty_process_table_from_a_container_is_unknown_not_zero():
    signals = collect("a10g-triton-table-empty-processes.md")  # 8722 MiB in use, no process listed
    assert stat(signals, "gpu_memory_used_bytes", "max") == 8722 * MIB
    count = signals.get("gpu_process_count")
    assert count is not None and count.stat("max") is None and "PID namespace" in (count.unavailable or "")


# ---------------------------------------------------------------------------------------------
# the signals are the registry's, the rules judge them


@pytest.mark.parametrize("name", sorted(p.name for p in SMI.iterdir() if p.name != "README.md"))
def test_every_signal_is_declared(name: str):
    signals = collect(name)
    assert REGISTRY.produced_problems(signals.signals.values()) == []
    allowed = set(REGISTRY.produced_by("probe:nvml")) | set(REGISTRY.produced_by("nvidia-smi"))
    allowed |= set(REGISTRY.produced_by("collector"))
    assert set(signals.signals) <= allowed
    assert {"gpu_count", "gpu_memory_free_bytes"} <= set(signals.signals)


def test_shared_gpu_beside_a_busy_server_fires_the_framebuffer_rule():
    server = collect_files(sorted((FIXTURES / "vllm-0.32.0" / "memory").glob("*.prom")))
    signals = merge_signal_sets(server, collect("rtx4090-x4-shared-gpu-table.txt"))
    verdict = build_verdict(signals)
    finding = next(f for f in verdict.findings if f.code == "MEM004")
    values = {e.signal: e.value for e in finding.evidence}
    assert values["gpu_process_count"] == 3.0  # three VLLM::EngineCore processes on GPU 0
    assert values["gpu_memory_used_bytes"] == 23703 * MIB
    assert values["gpu_memory_used_ratio"] == pytest.approx(23703 / 24564)


def test_idle_snapshot_alone_judges_no_load_rule():
    verdict = build_verdict(collect("h100-sxm-x8-idle-q.txt"))
    assert verdict.findings == []
    outcomes = {o.code: o for o in verdict.coverage.rules}
    assert outcomes["NET012"].status == "passed" and "gpu_utilization_ratio" in outcomes["NET012"].reason


# ---------------------------------------------------------------------------------------------
# refusals and names


def test_output_without_a_gpu_row_is_refused_with_a_hint():
    header = "\n".join(read("h100-sxm-x8-idle-table.txt").splitlines()[:7])
    assert not looks_like_nvidia_smi(header)  # a header alone is not evidence
    with pytest.raises(InputFileError) as info:
        collect_nvidia_smi(header, "header.txt")
    assert "header.txt" in info.value.message and "GPU row" in info.value.message
    assert "nvidia-smi -q" in info.value.hint


def test_text_that_is_not_nvidia_smi_is_refused():
    with pytest.raises(InputFileError):
        collect_nvidia_smi((FIXTURES / "logs" / "vllm-0.32-healthy.log").read_text(), "vllm.log")


@pytest.mark.parametrize(
    ("printed", "entry"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),  # another part: its figures are not the SXM5's
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", None),  # not in the table
        ("NVIDIA A10", None),  # the A10 is not the A10G: its Tensor Core rate differs
    ],
)
def test_product_names_map_onto_the_gpu_table(printed: str, entry: str | None):
    assert catalogue_gpu(printed) == entry


# ---------------------------------------------------------------------------------------------
# pastes cut short: what is there is read, what is cut off is unavailable with that reason

FIELD = FIXTURES / "field"


def test_a_table_cut_after_the_first_gpus_bus_id_keeps_the_gpu_and_says_the_rest_is_cut():
    path = FIELD / "mixed-dcgm-gpu-util-above-100-samples" / "nvidia-smi.txt"
    signals = collect_nvidia_smi(path.read_text(), path.name)
    # '|   0  NVIDIA H100 80GB HBM3          On  |   00000000:1A:00.0 Off |' and nothing after it
    assert signals.sources[0].config["gpus"] == "1 × NVIDIA H100 80GB HBM3"
    assert signals.sources[0].config["gpu"] == "H100" and signals.sources[0].config["driver"] == "550.118"
    count = signals.get("gpu_count")
    assert count is not None and count.stat("last") == 1 and "at least" in count.source
    for name in ("gpu_utilization_ratio", "gpu_memory_used_bytes", "gpu_power_watts", "gpu_temperature_celsius"):
        signal = signals.get(name)
        assert signal is not None and signal.stat("max") is None and "cut off" in (signal.unavailable or ""), name


def test_a_table_pasted_from_its_middle_without_any_header():
    path = FIELD / "mixed-nccl-tests-p2p-level-loc-forces-shm" / "nvidia-smi.txt"
    assert looks_like_nvidia_smi(path.read_text())
    signals = collect_nvidia_smi(path.read_text(), path.name)
    # GPUs 1-3 are whole ('4MiB / 81920MiB', 59 W, 60 W, 59 W); GPU 0's name row and GPU 4's are cut
    assert signals.sources[0].config["gpus"] == "3 × NVIDIA A100-SXM4-80GB"
    power = signals.get("gpu_power_watts")
    assert power is not None and power.by_series == {"gpu=1": 59.0, "gpu=2": 60.0, "gpu=3": 59.0}
    assert stat(signals, "gpu_memory_total_bytes", "max") == 81920 * MIB
    count = signals.get("gpu_count")
    assert count is not None and "at least" not in count.source


def test_nvlink_status_gives_each_whole_gpus_links_and_leaves_a_cut_one_unavailable():
    path = FIELD / "mixed-nccl-tests-p2p-level-loc-forces-shm" / "nvidia-smi-nvlink.txt"
    assert looks_like_nvidia_smi(path.read_text())
    signals = collect_nvidia_smi(path.read_text(), path.name)
    # GPUs 0 and 1: 'Link 0: 25 GB/s' … 'Link 11: 25 GB/s'; GPU 2 shows Link 0, then the poster's '......'
    links = signals.get("nvlink_active_links")
    assert links is not None and links.by_series == {"gpu=0": 12.0, "gpu=1": 12.0}
    capacity = signals.get("nvlink_capacity_bytes_per_second")
    assert capacity is not None and capacity.stat("min") == 12 * 25e9
    count = signals.get("gpu_count")
    assert count is not None and count.stat("last") == 3 and "at least" in count.source
    assert signals.sources[0].config["gpu"] == "A100"
    util = signals.get("gpu_utilization_ratio")
    assert util is not None and util.stat("max") is None and "links only" in (util.unavailable or "")


def test_a_gpu_the_table_lacks_is_noted_not_priced():
    from llmdiag.collect.telemetry.nvidia_smi import gpus_config

    config = gpus_config(["NVIDIA RTX PRO 6000 Blackwell Server Edition"])
    assert "gpu" not in config and "not in probes/tables/gpus.toml" in config["gpu_note"]
