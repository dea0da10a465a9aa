"""Shapes from real field threads (tests/fixtures/field): what the engine says of each, from any log.

Each test reads a real excerpt through the log reader, or builds the shape by hand the way the readers build it, and
asserts the class and the evidence values visible in the input.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmdiag.collect.logs import collect_logs
from llmdiag.engine.evaluate import build_verdict
from llmdiag.model import Bottleneck, Signal, SignalSet, SourceInfo, Verdict, Window

FIELD = Path(__file__).parents[2] / "fixtures" / "field"
T0 = 1_736_132_291.0
CAPACITY = ("memory", "compute", "scheduling", "network")


def field_verdict(case: str) -> Verdict:
    return build_verdict(collect_logs([FIELD / case / "server.log"]))


def evidence(verdict: Verdict, code: str) -> dict[str, float | None]:
    finding = next(f for f in verdict.findings if f.code == code)
    return {f"{e.signal}.{e.stat}": e.value for e in finding.evidence}


def test_sglang_decode_batches_without_a_cuda_graph_are_compute():
    # two decode lines: '#running-req: 48 ... cuda graph: False, gen throughput (token/s): 5452.63 / 5399.46'
    verdict = field_verdict("sglang-fastrl-4-decode-without-cuda-graph")
    assert verdict.bottleneck is Bottleneck.compute
    assert verdict.findings[0].code == "CMP007"
    found = evidence(verdict, "CMP007")
    assert found["cuda_graph_batches_ratio.mean"] == 0.0
    assert found["requests_running.max"] == 48


def test_token_usage_pinned_at_one_while_two_requests_decode_is_memory():
    # five decode lines: 'token usage: 1.00', '#running-req: 2', '#queue-req: 0', ~10.9 tokens/s
    verdict = field_verdict("sglang-2746-deepseek-v3-decode-oom")
    assert verdict.bottleneck is Bottleneck.memory
    assert {"MEM005", "MEM010"} <= {f.code for f in verdict.findings}
    # the retraction after the last decode line counts (once: its 8 TP ranks log the same scheduler decision)
    assert verdict.signals["preemptions_per_second"].stats["increase"] == 1
    assert verdict.signals["preemptions_reported"].stats["last"] == 1
    found = evidence(verdict, "MEM010")
    assert found["kv_cache_usage_ratio.min"] == 1.0
    assert found["requests_running.min"] == 2
    assert found["requests_waiting_avg.value"] == 0


def test_a_prefill_burst_being_admitted_is_no_admission_cap():
    # seven prefill lines: '#queue-req' 0, 38, 34, 30, 26, 22, 18 while '#running-req' grows 0 to 21
    verdict = field_verdict("sglang-1612-hang-after-prefill")
    assert "scheduling" not in verdict.class_confidence
    outcome = next(o for o in verdict.coverage.rules if o.code == "SCH012")
    assert outcome.status == "passed" and "queue_clears_in_window_ratio" in outcome.reason
    cleared = verdict.signals["queue_clears_in_window_ratio"].stats["value"]
    # the log's own clock ([16:43:29 TP0] … [16:43:33 TP0], one reading a second): 38 at :29 fell to 18 at :33,
    # 5 a second, so the 18 left take 3.6 s of the 4 s the readings span
    assert cleared == pytest.approx((18 / ((38 - 18) / (33 - 29))) / (33 - 29))


def log_window(gauges: dict[str, list[float]], rates: dict[str, list[float]], interval: float = 8.0) -> SignalSet:
    n = len(next(iter(gauges.values())))
    times = [T0 + i * interval for i in range(n)]
    duration = times[-1] - times[0]
    out = SignalSet(
        window=Window(kind="window", start_unix=times[0], end_unix=times[-1], duration_seconds=duration, scrapes=n),
        sources=[SourceInfo(probe="sglang-log")],
    )
    for name, values in gauges.items():
        stats = {
            "last": values[-1],
            "mean": sum(values) / n,
            "min": min(values),
            "max": max(values),
            "p90": max(values),
        }
        out.add(Signal(name=name, kind="gauge", unit="", stats=stats, samples=list(zip(times, values, strict=True))))
    for name, values in rates.items():
        increase = sum(v * interval for v in values[1:])
        stats = {"rate": increase / duration, "increase": increase}
        out.add(
            Signal(
                name=name, kind="counter", unit="", stats=stats, samples=list(zip(times[1:], values[1:], strict=True))
            )
        )
    return out


def test_retractions_with_the_kv_cache_full_and_no_queue_sampled_are_memory():
    # a retraction re-queues the request and it is re-admitted before the next stat line: the queue reads 0
    signals = log_window(
        {
            "requests_running": [8.0] * 5,
            "requests_waiting": [0.0] * 5,
            "kv_cache_usage_ratio": [0.95, 0.96, 0.94, 0.97, 0.95],
        },
        {"generation_tokens_per_second": [240.0] * 5, "preemptions_per_second": [0.0, 0.125, 0.0, 0.125, 0.0]},
    )
    verdict = build_verdict(signals)
    assert verdict.bottleneck is Bottleneck.memory
    assert "MEM005" in [f.code for f in verdict.findings]
    found = evidence(verdict, "MEM005")
    # two retractions in the 32 s the four intervals span
    assert found["preemptions_per_second.rate"] == pytest.approx(2 / 32)
    assert found["kv_cache_usage_ratio.max"] == 0.97


def test_one_stat_line_at_zero_tokens_with_a_full_cache_and_a_queue_is_not_capacity():
    # vLLM's stat line of a stuck engine: 'Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0
    # tokens/s, Running: 35 reqs, Pending: 115 reqs, GPU KV cache usage: 99.0%'
    signals = SignalSet(window=Window(kind="snapshot", scrapes=1), sources=[SourceInfo(probe="vllm-log")])
    for name, value in (("requests_running", 35.0), ("requests_waiting", 115.0), ("kv_cache_usage_ratio", 0.99)):
        stats = {"last": value, "mean": value, "min": value, "max": value, "p90": value}
        signals.add(Signal(name=name, kind="gauge", unit="", stats=stats, samples=[(T0, value)]))
    for name in ("generation_tokens_per_second", "prompt_tokens_per_second"):
        signals.add(Signal(name=name, kind="counter", unit="", stats={"rate": 0.0}))
    verdict = build_verdict(signals)
    assert not any(verdict.class_confidence.get(c, 0.0) >= 0.5 for c in CAPACITY)
    outcome = next(o for o in verdict.coverage.rules if o.code == "MEM008")
    assert outcome.status == "passed" and "tokens_processed_per_second.value = 0" in outcome.reason
    assert verdict.signals["tokens_processed_per_second"].stats["value"] == 0.0
