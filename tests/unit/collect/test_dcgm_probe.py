"""probes/dcgm.toml applied to dcgm-exporter pages (synthetic, recorded real ones, the simulator's): units scaled,
blank sentinels missing, several GPUs and MIG instances; and the derived GPU signals the rules read."""

from __future__ import annotations

import time

import pytest
import requests

from llmdiag.collect.exposition import parse_exposition
from llmdiag.collect.merge import merge_signal_sets
from llmdiag.collect.signals import build_signal_set, drop_blanks, is_blank
from llmdiag.config import Settings
from llmdiag.engine.derived import add_derived
from llmdiag.engine.evaluate import build_verdict, evaluate_rule
from llmdiag.model import Category, Signal, SignalSet, Window
from llmdiag.schema.loader import load_probe, load_rules
from tests.conftest import FIXTURES

RULES = {rule.code: rule for rule in load_rules()}

# 9223372036854775794 is DCGM_INT64_BLANK + 2 ("not supported"), as in dcgm-exporter's README sample;
# 140737488355328.0 is DCGM_FP64_BLANK. Older exporters label the host "Hostname", newer ones "hostname".
PAGE = """\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"}} {u0}
DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"}} {u1}
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"}} 1024
DCGM_FI_DEV_FB_USED{{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"}} 2048
# HELP DCGM_FI_DEV_MEMORY_TEMP Memory temperature (in C).
# TYPE DCGM_FI_DEV_MEMORY_TEMP gauge
DCGM_FI_DEV_MEMORY_TEMP{{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"}} \
9223372036854775794
# HELP DCGM_FI_PROF_SM_ACTIVE The ratio of cycles an SM has at least 1 warp assigned.
# TYPE DCGM_FI_PROF_SM_ACTIVE gauge
DCGM_FI_PROF_SM_ACTIVE{{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",hostname="n1"}} 0.2
DCGM_FI_PROF_SM_ACTIVE{{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",hostname="n1"}} \
140737488355328.0
# HELP DCGM_FI_PROF_DRAM_ACTIVE Ratio of cycles the device memory interface is active.
# TYPE DCGM_FI_PROF_DRAM_ACTIVE gauge
DCGM_FI_PROF_DRAM_ACTIVE{{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"}} \
9223372036854775792
DCGM_FI_PROF_DRAM_ACTIVE{{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"}} \
9223372036854775792
# HELP DCGM_FI_PROF_PCIE_TX_BYTES PCIe bytes sent per second.
# TYPE DCGM_FI_PROF_PCIE_TX_BYTES gauge
DCGM_FI_PROF_PCIE_TX_BYTES{{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"}} 1e9
DCGM_FI_PROF_PCIE_TX_BYTES{{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"}} 3e9
# HELP DCGM_FI_PROF_PCIE_RX_BYTES PCIe bytes received per second.
# TYPE DCGM_FI_PROF_PCIE_RX_BYTES gauge
DCGM_FI_PROF_PCIE_RX_BYTES{{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"}} 1e9
DCGM_FI_PROF_PCIE_RX_BYTES{{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"}} 5e9
"""


def dcgm_set(*utils: tuple[float, float]) -> SignalSet:
    scrapes = [parse_exposition(PAGE.format(u0=u0, u1=u1), 100.0 + i) for i, (u0, u1) in enumerate(utils)]
    return build_signal_set(load_probe("dcgm"), scrapes, "http://gpu-node:9400/metrics")


@pytest.mark.parametrize(
    ("value", "blank"),
    [
        (9223372036854775792.0, True),  # DCGM_INT64_BLANK
        (9223372036854775794.0, True),  # blank + 2: not supported
        (140737488355328.0, True),  # DCGM_FP64_BLANK
        (140737488355330.0, True),  # FP64 blank + 2
        (0.0, False),
        (100.0, False),
        (3.2e10, False),  # 32 GB/s of PCIe is a real number
        (140737488355400.0, False),
    ],
)
def test_blank_sentinels_are_recognised(value: float, blank: bool):
    assert is_blank(value) is blank


def test_percent_becomes_a_ratio_and_mib_become_bytes():
    signals = dcgm_set((40, 60), (80, 100))
    util = signals.get("gpu_utilization_ratio")
    assert util is not None and util.unavailable is None
    assert util.stats["mean"] == pytest.approx(0.7)  # mean over GPUs, then over scrapes
    assert util.stats["max"] == pytest.approx(0.9)
    assert util.by_series == pytest.approx({"gpu=0": 0.6, "gpu=1": 0.8})  # per GPU, across Hostname casing
    assert signals.get("gpu_memory_used_bytes").stats["max"] == 2048 * 1024 * 1024  # the fullest GPU, in bytes


def test_blank_samples_are_missing_never_numbers():
    signals = dcgm_set((50, 50), (50, 50))
    sm = signals.get("sm_active_ratio")
    assert sm.unavailable is None
    assert sm.stats["mean"] == pytest.approx(0.2)  # GPU 1's double blank is dropped, not averaged in
    assert set(sm.by_series) == {"gpu=0"}
    dram = signals.get("dram_active_ratio")
    assert dram.unavailable is not None and "blank" in dram.unavailable  # every sample blank: unavailable
    assert signals.get("implausible_samples").stats["value"] == 0  # blanks are not out-of-range values
    notes = " ".join(signals.anomalies)
    assert "DCGM_FI_PROF_DRAM_ACTIVE" in notes and "DCGM_FI_DEV_MEMORY_TEMP" not in notes  # only fields we read


def test_fields_off_by_default_say_how_to_enable_them():
    nvlink = dcgm_set((50, 50), (50, 50)).get("nvlink_tx_bytes_per_second")
    assert nvlink.unavailable is not None
    assert "DCGM_FI_PROF_NVLINK_TX_BYTES" in nvlink.unavailable and "counters CSV" in nvlink.unavailable


def test_interconnect_is_the_busiest_gpu_on_the_busiest_link():
    signals = dcgm_set((90, 90), (90, 90))
    add_derived(signals)
    assert signals.get("interconnect_bytes_per_second").stats["value"] == pytest.approx(8e9)  # GPU 1: 3e9 + 5e9
    busy = signals.get("sm_idle_while_gpu_busy_ratio").stats["value"]
    assert busy == pytest.approx(1 - 0.2 / 0.9)


def vllm_only() -> SignalSet:
    signals = SignalSet()
    for name in ("requests_running", "requests_waiting"):
        signals.add(Signal(name=name, kind="gauge", unit="requests", stats={"max": 4.0, "mean": 4.0}))
    return signals


def network_reason(signals: SignalSet) -> tuple[bool, str]:
    verdict = build_verdict(signals)
    network = next(c for c in verdict.coverage.classes if c.category is Category.network)
    return network.evaluated, network.reason


def test_network_says_not_evaluated_for_lack_of_telemetry_only_without_dcgm():
    evaluated, reason = network_reason(vllm_only())
    assert not evaluated and "dcgm_url" in reason
    # with a DCGM page whose SM_ACTIVE field is blank everywhere, the reason is the rule's own
    page = PAGE.replace(" 0.2\n", " 140737488355328.0\n").format(u0=90, u1=90)
    dcgm = build_signal_set(load_probe("dcgm"), [parse_exposition(page, 1.0)], "http://gpu-node:9400/metrics")
    merged = merge_signal_sets(vllm_only(), dcgm)
    assert [s.probe for s in merged.sources] == ["dcgm"]
    evaluated, reason = network_reason(merged)
    assert not evaluated and "skipped" in reason and "sm_active_ratio" in reason and "dcgm_url" not in reason


def test_a_bare_dcgm_address_means_its_metrics_page_and_carries_no_credentials():
    from llmdiag.client.endpoint import Connection
    from llmdiag.collect.telemetry.dcgm import dcgm_connection

    server = Connection(base_url="http://llm:8000", api_key="sk-secret", timeout_seconds=2.0)
    for given in ("gpu-node:9400", "http://gpu-node:9400/", "http://gpu-node:9400/metrics"):
        dcgm = dcgm_connection(given, server)
        assert dcgm.resolved_metrics_url() == "http://gpu-node:9400/metrics"
        assert not dcgm.api_key and dcgm.timeout_seconds == 2.0


def test_slow_steps_beside_a_saturated_link_name_network_without_a_rival_penalty():
    signals = SignalSet()
    for name, stats in {
        "gpu_utilization_ratio": {"mean": 1.0},
        "sm_active_ratio": {"mean": 0.2},
        "pcie_tx_bytes_per_second": {"mean": 1e10},
        "pcie_rx_bytes_per_second": {"mean": 1e10},
        "requests_running": {"mean": 10.0, "max": 10.0},
        "requests_waiting": {"mean": 0.0, "max": 0.0},
        "itl_seconds": {"mean": 0.2},
        "kv_cache_usage_ratio": {"max": 0.1},
        "preemptions_per_second": {"rate": 0.0},
    }.items():
        signals.add(Signal(name=name, kind="gauge", unit="", stats=stats))
    verdict = build_verdict(signals)
    fired = [(f.code, f.severity.value) for f in verdict.findings]
    assert fired[:2] == [("NET001", "critical"), ("CMP001", "critical")]
    assert verdict.bottleneck.value == "network"
    assert not any("fired at the same severity" in n for n in verdict.notes)
    # slow steps alone are the SLO breach (advisory), never a rival class: nothing proves the step is the wall
    assert next(f for f in verdict.findings if f.code == "CMP001").advisory


# --- recorded real exporter pages (tests/fixtures/dcgm) ------------------------------------------------------

DCGM_FIXTURES = FIXTURES / "dcgm"
A800_PAGE = DCGM_FIXTURES / "a800-8gpu-mig-idle.prom"
UNCONVERTIBLE = "ERROR - FAILED TO CONVERT TO STRING"


def a800_text() -> str:
    """The recorded page without its unconvertible samples (the page as recorded is read in the test below)."""
    lines = A800_PAGE.read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines if not line.endswith(UNCONVERTIBLE)) + "\n"


def a800_set(scrapes: int = 2) -> SignalSet:
    """The idle A800 page scraped `scrapes` times, 10 s apart: the values do not move."""
    pages = [parse_exposition(a800_text(), 1000.0 + 10 * i) for i in range(scrapes)]
    return build_signal_set(load_probe("dcgm"), pages, "http://msxf-hpc-64-35-ai:9400/metrics")


def test_the_recorded_page_is_read_despite_its_unconvertible_samples():
    scrape = parse_exposition(A800_PAGE.read_text(encoding="utf-8"), 1000.0)
    assert "DCGM_FI_DEV_VGPU_PER_PROCESS_UTILIZATION" not in scrape.series
    assert "FAILED TO CONVERT" in scrape.unavailable["DCGM_FI_DEV_VGPU_PER_PROCESS_UTILIZATION"]
    assert len(scrape.series["DCGM_FI_DEV_SM_CLOCK"]) == 10


def test_recorded_a800_page_eight_gpus_three_of_them_mig_instances():
    scrape = parse_exposition(a800_text(), 1000.0)
    clocks = [dict(key) for key in scrape.series["DCGM_FI_DEV_SM_CLOCK"]]
    assert len(clocks) == 10  # GPU 0 as three MIG instances + GPUs 1-7
    assert sorted({labels["gpu"] for labels in clocks}) == [str(i) for i in range(8)]
    assert sorted(labels["GPU_I_ID"] for labels in clocks if "GPU_I_ID" in labels) == ["3", "5", "6"]
    assert all("Hostname" in labels for labels in clocks)
    # utilisation is a whole-GPU field: the MIG instances have no series
    assert sorted(dict(k)["gpu"] for k in scrape.series["DCGM_FI_DEV_GPU_UTIL"]) == [str(i) for i in range(1, 8)]


def test_recorded_a800_page_values_in_base_units_per_gpu_and_mig_instance():
    signals = a800_set()
    clock = signals.get("sm_clock_hertz")
    assert clock.unavailable is None and clock.stats["min"] == 210e6  # idle GPUs 1-7; the MIG GPU runs 1410 MHz
    assert clock.by_series["gpu=0"] == 1410e6 and clock.by_series["gpu=7"] == 210e6  # device-wide: once per GPU
    assert signals.get("memory_clock_hertz").stats["min"] == 1593e6
    assert signals.get("gpu_temperature_celsius").stats["max"] == 33.0
    used, free = signals.get("gpu_memory_used_bytes"), signals.get("gpu_memory_free_bytes")
    assert used.stats["max"] == 10 * 1048576 and free.stats["min"] == 19957 * 1048576  # a MIG instance's own FB
    assert set(used.by_series) == {"gpu=0,GPU_I_ID=3", "gpu=0,GPU_I_ID=5", "gpu=0,GPU_I_ID=6"} | {
        f"gpu={i}" for i in range(1, 8)
    }
    assert signals.get("gpu_utilization_ratio").stats["mean"] == 0.0
    assert signals.get("pcie_rx_bytes_per_second").by_series["gpu=3"] == 232474.0
    # counters: written without _total under '# TYPE … counter', read by the parser as …_total
    replays = signals.get("pcie_replay_errors_per_second")
    assert replays.unavailable is None and replays.stats == {"rate": 0.0, "increase": 0.0}
    assert replays.source.endswith("DCGM_FI_DEV_PCIE_REPLAY_COUNTER_total")
    assert signals.get("implausible_samples").stats["value"] == 0 and not signals.anomalies


def test_recorded_a800_page_memory_ratio_is_per_instance():
    signals = a800_set()
    add_derived(signals)
    # the fullest is a MIG instance: 10 MiB of 10 + 19957 MiB, not 10 MiB of a whole 80 GB GPU
    assert signals.get("gpu_memory_used_ratio").stats["value"] == pytest.approx(10 / (10 + 19957))


def test_recorded_a800_page_fields_off_by_default_say_how_to_enable_them():
    signals = a800_set()
    add_derived(signals)
    for name, field in [
        ("sm_clock_max_hertz", "DCGM_FI_DEV_MAX_SM_CLOCK"),
        ("gpu_power_limit_watts", "DCGM_FI_DEV_ENFORCED_POWER_LIMIT"),
        ("clocks_throttled_ratio", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"),
        ("pcie_link_generation", "DCGM_FI_DEV_PCIE_LINK_GEN"),
        ("sm_active_ratio", "DCGM_FI_PROF_SM_ACTIVE"),
        ("nvlink_crc_errors_per_second", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
    ]:
        reason = signals.get(name).unavailable
        assert reason is not None and field in reason and "counters CSV (-f)" in reason, (name, reason)
    # a derived signal passes the reason on; the rule that needs it is skipped with it
    assert "DCGM_FI_DEV_MAX_SM_CLOCK" in signals.get("sm_clock_ratio").unavailable
    outcome, _ = evaluate_rule(RULES["CMP005"], signals, Settings())
    assert outcome.status == "skipped" and "DCGM_FI_DEV_MAX_SM_CLOCK" in outcome.reason


def test_readme_sample_blank_is_dropped_and_spaced_labels_parse():
    text = (DCGM_FIXTURES / "readme-quickstart.prom").read_text(encoding="utf-8")
    scrape = parse_exposition(text, 1.0)
    blanks: dict[str, int] = {}
    kept = drop_blanks(scrape, blanks)
    assert blanks == {"DCGM_FI_DEV_MEMORY_TEMP": 1} and not kept.has("DCGM_FI_DEV_MEMORY_TEMP")
    signals = build_signal_set(load_probe("dcgm"), [scrape], "http://localhost:9400/metrics")
    assert signals.get("sm_clock_hertz").stats["last"] == 139e6
    assert signals.get("memory_clock_hertz").by_series == {"gpu=0": 405e6}


# --- derived GPU signals ---------------------------------------------------------------------------------------


def gpu_set(spec: dict[str, tuple[dict[str, float], dict[str, float]]]) -> SignalSet:
    """name → (stats, per-series means) as a probe would leave them."""
    signals = SignalSet()
    for name, (stats, by_series) in spec.items():
        kind = "counter" if name.endswith("_per_second") and "rate" in stats else "gauge"
        signals.add(Signal(name=name, kind=kind, unit="", stats=stats, by_series=by_series))
    return signals


def derived_value(signals: SignalSet, name: str) -> float | str:
    add_derived(signals)
    signal = signals.get(name)
    return signal.unavailable if signal.unavailable is not None else signal.stats["value"]


def test_power_ratio_is_the_hungriest_gpu_over_its_own_limit():
    signals = gpu_set(
        {
            "gpu_power_watts": ({"mean": 400.0}, {"gpu=0": 690.0, "gpu=1": 110.0}),
            "gpu_power_limit_watts": ({"mean": 700.0}, {"gpu=0": 700.0, "gpu=1": 700.0}),
        }
    )
    assert derived_value(signals, "gpu_power_ratio") == pytest.approx(690 / 700)


def test_clock_ratio_is_the_slowest_gpu_and_says_why_when_the_max_is_missing():
    signals = gpu_set(
        {
            "sm_clock_hertz": ({"mean": 1.14e9}, {"gpu=0": 1.98e9, "gpu=2": 1.14e9}),
            "sm_clock_max_hertz": ({"mean": 1.98e9}, {"gpu=0": 1.98e9, "gpu=2": 1.98e9}),
        }
    )
    assert derived_value(signals, "sm_clock_ratio") == pytest.approx(1.14 / 1.98)
    signals.add(Signal.missing("sm_clock_max_hertz", "gauge", "hertz", "not exposed; add DCGM_FI_DEV_MAX_SM_CLOCK"))
    assert "DCGM_FI_DEV_MAX_SM_CLOCK" in derived_value(signals, "sm_clock_ratio")


@pytest.mark.parametrize(
    ("gen", "width", "max_gen", "max_width", "ratio", "capacity"),
    [
        (3, 8, 5, 16, 0.125, 7.88e9),  # Gen3 x8 on a Gen5 x16 card
        (3, 16, 4, 16, 0.985 / 1.969, 15.76e9),  # one generation down: just over a half
        (4, 16, 4, 16, 1.0, 31.504e9),  # full speed
    ],
)
def test_pcie_link_speed_and_capacity(gen, width, max_gen, max_width, ratio, capacity):
    signals = gpu_set(
        {
            "pcie_link_generation": ({"min": gen}, {}),
            "pcie_link_width_lanes": ({"min": width}, {}),
            "pcie_link_max_generation": ({"min": max_gen}, {}),
            "pcie_link_max_width_lanes": ({"min": max_width}, {}),
        }
    )
    assert derived_value(signals, "pcie_link_speed_ratio") == pytest.approx(ratio, rel=1e-3)
    assert signals.get("pcie_link_capacity_bytes_per_second").stats["value"] == pytest.approx(capacity, rel=1e-3)


def test_link_utilization_takes_the_fuller_link_in_its_busier_direction():
    signals = gpu_set(
        {
            "pcie_tx_bytes_per_second": ({"mean": 1e9}, {"gpu=0": 1e9, "gpu=1": 2e10}),
            "pcie_rx_bytes_per_second": ({"mean": 1e9}, {"gpu=0": 1e9, "gpu=1": 5e9}),
            "pcie_link_generation": ({"min": 4}, {"gpu=0": 4, "gpu=1": 4}),
            "pcie_link_width_lanes": ({"min": 16}, {"gpu=0": 16, "gpu=1": 16}),
        }
    )
    assert derived_value(signals, "link_utilization_ratio") == pytest.approx(2e10 / 31.504e9, rel=1e-3)
    # NVLink at 300 of 450 GB/s per direction is fuller than PCIe at 63 %
    signals.add(Signal(name="nvlink_tx_bytes_per_second", kind="gauge", unit="", stats={"mean": 3e11}))
    signals.add(Signal(name="nvlink_rx_bytes_per_second", kind="gauge", unit="", stats={"mean": 1e11}))
    signals.add(Signal(name="nvlink_capacity_bytes_per_second", kind="gauge", unit="", stats={"min": 4.5e11}))
    assert derived_value(signals, "link_utilization_ratio") == pytest.approx(3e11 / 4.5e11)
    # with neither link's capacity known, both reasons are given
    bare = gpu_set({"pcie_tx_bytes_per_second": ({"mean": 1e9}, {}), "pcie_rx_bytes_per_second": ({"mean": 1e9}, {})})
    reason = derived_value(bare, "link_utilization_ratio")
    assert "PCIe: pcie_link_generation" in reason and "NVLink: nvlink_tx_bytes_per_second" in reason


def test_link_errors_add_what_is_collected_and_are_missing_only_when_nothing_is():
    signals = gpu_set(
        {
            "pcie_replay_errors_per_second": ({"rate": 0.5, "increase": 10.0}, {}),
            "nvlink_crc_errors_per_second": ({"rate": 2.0, "increase": 40.0}, {}),
        }
    )
    assert derived_value(signals, "link_errors_per_second") == pytest.approx(2.5)
    assert "pcie_replay_errors_per_second was not collected" in derived_value(SignalSet(), "link_errors_per_second")


def test_memory_ratio_uses_free_where_reported_else_total():
    nvml_like = gpu_set(
        {
            "gpu_memory_used_bytes": ({"max": 78e9}, {"gpu=0": 78e9, "gpu=1": 40e9}),
            "gpu_memory_total_bytes": ({"max": 80e9}, {"gpu=0": 80e9, "gpu=1": 80e9}),
        }
    )
    assert derived_value(nvml_like, "gpu_memory_used_ratio") == pytest.approx(78 / 80)
    assert "was not collected" in derived_value(SignalSet(), "gpu_memory_used_ratio")


def test_a_supplied_roofline_is_kept_and_an_absent_one_says_how_to_get_it():
    signals = SignalSet()
    assert "gpu and model_shape" in derived_value(signals, "roofline_fraction_ratio")
    signals.add(
        Signal(
            name="roofline_fraction_ratio",
            kind="derived",
            unit="ratio",
            stats={"value": 0.83},
            source="decode tokens/s over the hbm_bandwidth ceiling",
        )
    )
    assert derived_value(signals, "roofline_fraction_ratio") == 0.83
    assert signals.get("roofline_fraction_ratio").source.startswith("decode tokens/s")


def test_a_spinning_collective_is_a_stall_headed_by_the_nccl_hang():
    signals = SignalSet(window=Window(duration_seconds=20.0, scrapes=21))
    for name, stats in {
        "gpu_utilization_ratio": {"mean": 1.0},
        "gpu_power_watts": {"mean": 84.0},
        "gpu_power_limit_watts": {"mean": 700.0},
        "sm_active_ratio": {"mean": 0.03},
        "requests_running": {"min": 4.0, "mean": 4.0, "max": 4.0, "last": 4.0},
        "requests_waiting": {"mean": 12.0, "max": 12.0, "min": 12.0, "last": 12.0},
        "generation_tokens_per_second": {"rate": 0.0, "increase": 0.0},
        "prompt_tokens_per_second": {"rate": 0.0, "increase": 0.0},
    }.items():
        signals.add(Signal(name=name, kind="gauge", unit="", stats=stats))
    verdict = build_verdict(signals)
    fired = [(f.code, f.severity.value) for f in verdict.findings if f.category is not Category.sanity]
    # a hang is never a capacity verdict: the NCCL hang (the cause) heads the findings, the stalled engine follows
    assert fired[:2] == [("NET005", "critical"), ("SCH003", "critical")]
    assert verdict.bottleneck.value == "stalled"
    assert all(c < 0.5 for name, c in verdict.class_confidence.items() if name != "stalled")
    assert not any("fired at the same severity" in n for n in verdict.notes)


# --- the simulator's DCGM page over HTTP -----------------------------------------------------------------------


def test_simulator_dcgm_page_carries_the_default_fields_the_gpu_rules_read():
    from llmdiag.sim.load import ClosedLoopLoad
    from llmdiag.sim.presets import get_preset
    from llmdiag.sim.server import SimServer

    preset = get_preset("compute")  # Llama 3 8B on one L4: busy all the time
    with SimServer(preset) as sim, ClosedLoopLoad(sim.url, sim.model, preset.load, max_seconds=20):
        time.sleep(1.5)
        pages = []
        for _ in range(3):
            pages.append(parse_exposition(requests.get(sim.dcgm_url, timeout=10).text, time.time()))
            time.sleep(0.5)
    signals = build_signal_set(load_probe("dcgm"), pages, sim.dcgm_url)
    assert signals.get("sm_clock_hertz").stats["min"] == 2040e6  # a busy L4 at its maximum clock
    assert 30.0 <= signals.get("gpu_temperature_celsius").stats["max"] <= 70.0
    assert signals.get("pcie_replay_errors_per_second").stats["rate"] == 0.0
    add_derived(signals)
    # the default fields alone cannot tell a throttled clock: the reason says what to add to the exporter
    assert "DCGM_FI_DEV_MAX_SM_CLOCK" in signals.get("sm_clock_ratio").unavailable
    assert "DCGM_FI_DEV_ENFORCED_POWER_LIMIT" in signals.get("gpu_power_ratio").unavailable
    assert signals.get("link_errors_per_second").stats["value"] == 0.0


def test_device_wide_fields_count_a_mig_partitioned_gpu_once():
    # GPU 0 is three MIG instances; its power is written on each. Counted once, the mean is over 8 GPUs.
    signals = a800_set()
    per_gpu_watts = [78.174, 55.942, 53.752, 56.990, 58.643, 54.581, 57.145, 55.011]
    power = signals.get("gpu_power_watts")
    assert power.stats["mean"] == pytest.approx(sum(per_gpu_watts) / 8)
    assert len(power.by_series) == 8
    # the framebuffer is per instance, so it keeps one series per instance
    assert len(signals.get("gpu_memory_used_bytes").by_series) == 10
