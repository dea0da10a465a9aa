"""probes/dcgm.toml applied to dcgm-exporter pages: units scaled, blank sentinels missing, several GPUs."""

from __future__ import annotations

import pytest

from llmdiag.collect import merge_signal_sets
from llmdiag.collect.prometheus import parse_exposition
from llmdiag.collect.signals import build_signal_set, is_blank
from llmdiag.engine.derived import add_derived
from llmdiag.engine.evaluate import build_verdict
from llmdiag.engine.loader import load_probe
from llmdiag.model import Category, Signal, SignalSet

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
    assert not evaluated and "--dcgm-url" in reason
    # with a DCGM page whose SM_ACTIVE field is blank everywhere, the reason is the rule's own
    page = PAGE.replace(" 0.2\n", " 140737488355328.0\n").format(u0=90, u1=90)
    dcgm = build_signal_set(load_probe("dcgm"), [parse_exposition(page, 1.0)], "http://gpu-node:9400/metrics")
    merged = merge_signal_sets(vllm_only(), dcgm)
    assert [s.probe for s in merged.sources] == ["dcgm"]
    evaluated, reason = network_reason(merged)
    assert not evaluated and "skipped" in reason and "sm_active_ratio" in reason and "--dcgm-url" not in reason


def test_a_bare_dcgm_address_means_its_metrics_page_and_carries_no_credentials():
    from llmdiag.collect import dcgm_connection
    from llmdiag.collect.http import Connection

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
    assert any("CMP001" in n and "symptom" in n for n in verdict.notes)
