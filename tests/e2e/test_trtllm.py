"""TensorRT-LLM (trtllm-serve JSON iteration stats and /prometheus/metrics) and Triton's TensorRT-LLM backend:
real recorded records parsed into signals, and the simulator's trtllm and triton dialects scanned live, with the
same classes as the vLLM dialect. Part B of issue 8."""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests

from llmdiag.client.endpoint import Connection
from llmdiag.collect.detect import detect_live
from llmdiag.collect.files import collect_files
from llmdiag.collect.live import collect_live
from llmdiag.collect.servers.trtllm import missing_records, signals_from_iteration_records
from llmdiag.engine.evaluate import build_verdict
from llmdiag.sim.load import ClosedLoopLoad
from llmdiag.sim.presets import get_preset
from llmdiag.sim.server import SimServer
from tests.conftest import FIXTURES, run_cli

RECORDS = FIXTURES / "trtllm"
WARMUP_SECONDS = 2.0
SCAN_SECONDS = 3.0


def load(name: str) -> list[dict]:
    return json.loads((RECORDS / name).read_text())


def test_real_trt_backend_record_maps_to_vllm_vocabulary():
    signals = signals_from_iteration_records(load("iteration-stats-trt-backend-1.0.0rc4.json"), window_seconds=1.0)
    assert signals.get("requests_running").stats["last"] == 1
    assert signals.get("requests_waiting").stats["last"] == 0
    assert signals.get("kv_cache_usage_ratio").stats["last"] == pytest.approx(3 / 22955)
    assert signals.get("kv_cache_blocks").stats["value"] == 22955
    assert signals.get("kv_cache_block_size_tokens").stats["value"] == 32
    assert signals.get("itl_seconds").stats["mean"] == pytest.approx(0.013021209)
    assert signals.get("generation_tokens_per_second").stats["increase"] == 1  # one generation request, 1 token
    assert signals.get("preemptions_per_second").stats["rate"] == 0


def test_real_long_prompt_record_queues_with_room_and_names_guaranteed_no_evict():
    # issue #3376's executor record: 7 queued, 1 active of 16, 16000 of 17800 context tokens, KV 76 % allocated
    signals = signals_from_iteration_records(load("iteration-stats-executor-long-prompt.json"), window_seconds=2.0)
    assert signals.get("requests_waiting").stats["last"] == 7
    assert signals.get("kv_cache_usage_ratio").stats["last"] == pytest.approx(5495 / 7240)
    assert signals.get("prompt_tokens_per_second").stats["increase"] == 16000
    assert signals.get("queue_time_seconds").stats["mean"] == pytest.approx(0.091039e-3)
    assert signals.get("queued_with_batch_room_ratio").stats["value"] == 1.0
    assert any("GUARANTEED_NO_EVICT" in a for a in signals.anomalies)


def test_guaranteed_no_evict_queueing_is_memory_not_a_batch_cap():
    """Issue #3376's record: 7 queued beside 1 of 16 active, the token budget with room, nothing paused, 76 % of
    blocks allocated. Under GUARANTEED_NO_EVICT that is KV reserved for whole sequences: MEM006 names memory, and
    where SCH001 also fires (fast steps, KV gauge low) memory outranks it at the same severity."""
    record = load("iteration-stats-executor-long-prompt.json")[0]
    verdict = build_verdict(signals_from_iteration_records([record], window_seconds=2.0))
    assert verdict.bottleneck.value == "memory" and verdict.findings[0].code == "MEM006"
    numbers = {e.signal: e.value for e in verdict.findings[0].evidence}
    assert numbers["queued_with_batch_room_ratio"] == 1.0
    assert numbers["requests_waiting_avg"] == 7
    assert numbers["kv_cache_usage_ratio"] == pytest.approx(5495 / 7240)
    assert numbers["requests_running"] == 1 and numbers["max_active_requests"] == 16
    # the same state over 20 decoding iterations: fast steps, so SCH001 fires too, and memory still leads
    steps = [
        {
            **record,
            "iter": record["iter"] + i,
            "iterLatencyMS": 8.0,
            "inflightBatchingStats": {**record["inflightBatchingStats"], "numGenRequests": 1, "numCtxTokens": 0},
        }
        for i in range(20)
    ]
    verdict = build_verdict(signals_from_iteration_records(steps, window_seconds=2.0))
    fired = {f.code: f.severity.value for f in verdict.findings}
    assert fired["MEM006"] == fired["SCH001"] == "critical", fired
    assert verdict.bottleneck.value == "memory" and verdict.findings[0].code == "MEM006"


def test_saved_json_dump_is_analyzed_over_its_records_timestamps(tmp_path):
    records = load("iteration-stats-executor-long-prompt.json") + load("iteration-stats-trt-backend-1.0.0rc4.json")
    dump = tmp_path / "metrics.json"
    dump.write_text(json.dumps(records))
    signals = collect_files([dump], probe="trtllm")
    assert signals.get("requests_waiting").stats["max"] == 7
    assert signals.window.duration_seconds > 0
    with pytest.raises(Exception, match="TensorRT-LLM's JSON iteration stats"):
        collect_files([dump], probe="vllm")


def test_holes_in_iter_numbers_are_counted():
    assert missing_records([1, 2, 3, 7, 8], before=0) == (3, 8, 1)
    assert missing_records([10, 20, 30, 50], stride=10) == (1, 4, 10)
    assert missing_records([5, 6, 7], before=4) == (0, 3, 1)


def scan(dialect: str, preset_name: str, probe: str, path: str | None = None, during=None):
    preset = get_preset(preset_name)
    with SimServer(preset, dialect=dialect) as sim, ClosedLoopLoad(sim.url, sim.model, preset.load, max_seconds=30):
        time.sleep(WARMUP_SECONDS)
        stop = threading.Event()
        thief = None
        if during is not None:
            thief = threading.Thread(target=during, args=(sim.url, stop), daemon=True)
            thief.start()
        try:
            conn = Connection(sim.url, metrics_url=sim.url + path if path else None)
            signals = collect_live(conn, SCAN_SECONDS, probe=probe)
        finally:
            stop.set()
            if thief is not None:
                thief.join(5)
    return signals, build_verdict(signals)


def scan_cli(dialect: str, preset_name: str, *extra: str) -> dict:
    """``llmdiag scan URL`` as a user runs it: no --server, the server detected from what it answers."""
    preset = get_preset(preset_name)
    with SimServer(preset, dialect=dialect) as sim, ClosedLoopLoad(sim.url, sim.model, preset.load, max_seconds=60):
        time.sleep(WARMUP_SECONDS)
        extra = tuple(a.replace("URL", sim.url) for a in extra)
        result = run_cli(
            "scan", sim.url, "--no-nvml", "--duration", "4", "--json", "--fail-on", "never", *extra, timeout=90
        )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def value(verdict: dict, signal: str, stat: str) -> float:
    entry = verdict["signals"][signal]
    assert entry.get("unavailable") is None, (signal, entry.get("unavailable"))
    return entry["stats"][stat]


@pytest.mark.parametrize(
    ("dialect", "extra", "preset", "code", "detected"),
    [
        # JSON records at /metrics (pauses are preemptions), the trtllm_ page beside them for TTFT
        ("trtllm", (), "memory", "MEM001", "TensorRT-LLM"),
        ("trtllm", (), "scheduling", "SCH001", "TensorRT-LLM"),
        ("trtllm", (), "healthy", None, "TensorRT-LLM"),
        # the Prometheus page alone: paused requests only as a sampled gauge, so the no-preemption memory rule
        ("trtllm", ("--metrics-url", "URL/prometheus/metrics"), "memory", "MEM003", "TensorRT-LLM"),
        ("triton", (), "memory", "MEM003", "Triton (TensorRT-LLM backend)"),
        ("triton", (), "scheduling", "SCH001", "Triton (TensorRT-LLM backend)"),
        ("triton", (), "healthy", None, "Triton (TensorRT-LLM backend)"),
    ],
)
def test_scan_detects_the_dialect_and_gives_the_vllm_class(dialect, extra, preset, code, detected):
    verdict = scan_cli(dialect, preset, *extra)
    expected = get_preset(preset).expected
    assert verdict["bottleneck"] == expected, [(f["code"], f["summary"]) for f in verdict["findings"]]
    note = verdict["coverage"]["probes"][0]["note"]
    assert note.startswith(f"server: detected {detected}"), note
    prefix = "'nv_trt_llm_'" if dialect == "triton" else "'trtllm_'"
    assert prefix in note  # detected by its metric names (the JSON page itself is not Prometheus)
    if code is None:
        assert not [f for f in verdict["findings"] if f["category"] != "sanity"]
        assert value(verdict, "ttft_seconds", "p50") < 0.1  # the server's own TTFT (trtllm_ / first-response ms)
        assert value(verdict, "requests_waiting", "mean") < 1
        assert value(verdict, "kv_cache_usage_ratio", "max") < 0.2
        assert value(verdict, "generation_tokens_per_second", "rate") > 1000
        assert verdict["summary"].startswith("Healthy: ")
        return
    lead = verdict["findings"][0]
    # where pauses are only a sampled gauge, a window that samples some gives MEM001 (its preemption estimate) the
    # lead over MEM003: either names the full KV cache
    sampled_pauses = dialect == "triton" or extra
    assert lead["code"] == code or (sampled_pauses and {lead["code"], code} <= {"MEM001", "MEM003"}), lead["code"]
    numbers = {e["signal"]: e["value"] for e in lead["evidence"]}
    if expected == "memory":
        assert numbers["requests_waiting_avg"] > 5
        assert value(verdict, "kv_cache_usage_ratio", "max") >= 0.9
        assert value(verdict, "kv_cache_blocks", "value") == 1512  # the preset's pool
    if code == "MEM001":
        assert numbers["preemptions_per_second"] > 0  # numPausedRequests summed over the records
        assert value(verdict, "iteration_records_missing_ratio", "value") == 0
    if code == "MEM003":
        assert numbers["preemptions_per_second"] == 0 or dialect == "trtllm"
    if expected == "scheduling":
        assert numbers["requests_running"] == 4  # --max-num-seqs 4 → maxNumActiveRequests / request_type="max"
        assert numbers["requests_waiting_avg"] > 20
        assert numbers["kv_cache_usage_ratio"] < 0.1
        assert numbers["itl_seconds"] < 0.05


def test_trtllm_without_its_prometheus_page_is_detected_by_owned_by():
    """trtllm-serve without return_perf_metrics answers JSON at /metrics and nothing Prometheus: /v1/models'
    owned_by 'tensorrt_llm' (ModelCard's default in tensorrt_llm/serve/openai_protocol.py) names it."""
    with SimServer("healthy", dialect="trtllm") as sim:
        found = detect_live(Connection(base_url=sim.url, metrics_url=f"{sim.url}/dcgm/metrics"))
    assert found.probe == "trtllm" and found.reason == "/v1/models says owned_by 'tensorrt_llm'"


def steal(url: str, stop: threading.Event) -> None:
    while not stop.is_set():
        requests.get(url + "/metrics", timeout=5)
        stop.wait(0.15)


def test_a_second_scraper_draining_metrics_is_reported():
    signals, verdict = scan("trtllm", "healthy", "trtllm", during=steal)
    assert signals.get("iteration_records_missing_ratio").stats["value"] > 0.2
    note = next(n for n in verdict.notes if "iteration records missing" in n)
    assert "another scraper" in note and "/prometheus/metrics" in note


def test_prometheus_page_absent_says_which_options_enable_it():
    signals, _ = scan("trtllm", "healthy", "trtllm", path="/prometheus/metrics")
    assert signals.get("requests_running").unavailable is None  # the simulator serves it; now an absent one:
    from llmdiag.collect.exposition import parse_exposition
    from llmdiag.collect.signals import build_signal_set
    from llmdiag.schema.loader import load_probe

    page = parse_exposition('request_success_total{model_name="m"} 3.0\n', 1.0)
    built = build_signal_set(load_probe("trtllm"), [page, page], "x")
    assert "enable_iter_perf_stats: true" in built.get("requests_running").unavailable
    assert "return_perf_metrics: true" in built.get("ttft_seconds").unavailable
