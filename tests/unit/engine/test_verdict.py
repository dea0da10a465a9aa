"""From signals to a verdict: class, confidence, coverage and the states with no bottleneck."""

from __future__ import annotations

from llmdiag.engine.evaluate import build_verdict
from llmdiag.model import Bottleneck, Category, Signal, SignalSet, SourceInfo, Window


def make(window_scrapes: int = 21, **signals: dict[str, float] | str) -> SignalSet:
    out = SignalSet(window=Window(duration_seconds=20.0, scrapes=window_scrapes), sources=[SourceInfo(probe="vllm")])
    for name, stats in signals.items():
        if stats == "missing":
            out.add(Signal.missing(name, "gauge", "", "not exposed by this server"))
        else:
            out.add(Signal(name=name, kind="gauge", unit="", stats=stats))
    return out


HEALTHY = dict(
    requests_running={"mean": 4, "max": 4, "min": 4, "last": 4, "p90": 4},
    requests_waiting={"mean": 0, "max": 0, "min": 0, "last": 0, "p90": 0},
    kv_cache_usage_ratio={"mean": 0.001, "max": 0.002, "p90": 0.002},
    preemptions_per_second={"rate": 0.0, "increase": 0.0},
    generation_tokens_per_second={"rate": 900.0, "increase": 18000.0},
    prompt_tokens_per_second={"rate": 450.0, "increase": 9000.0},
    ttft_seconds={"p50": 0.01, "p90": 0.02, "mean": 0.012, "count": 140},
    itl_seconds={"p50": 0.004, "p90": 0.006, "mean": 0.0045, "count": 17000},
    queue_time_seconds={"p50": 0.001, "mean": 0.001, "count": 140, "sum": 0.14},
    prefill_time_seconds={"p50": 0.008, "mean": 0.009, "count": 140},
    # 140 requests × 0.57 s in the batch over a 20 s window: 4 running on average
    inference_time_seconds={"p50": 0.55, "mean": 0.57, "count": 140, "sum": 80.0},
    requests_finished_per_second={"rate": 7.0, "increase": 140.0},
)


def test_light_load_is_healthy_with_user_numbers():
    verdict = build_verdict(make(**HEALTHY))
    assert verdict.bottleneck is Bottleneck.healthy
    assert verdict.findings == []
    assert verdict.experience.per_user_tokens_per_second == 900.0 / 4
    assert "900 output tokens/s across 4.0 running requests (225 tokens/s each)" in verdict.summary
    assert verdict.confidence_label == "high"


def test_no_traffic_is_idle_not_healthy():
    idle = {**HEALTHY}
    idle.update(
        requests_running={"mean": 0, "max": 0, "min": 0, "last": 0, "p90": 0},
        generation_tokens_per_second={"rate": 0.0, "increase": 0.0},
        prompt_tokens_per_second={"rate": 0.0, "increase": 0.0},
        requests_finished_per_second={"rate": 0.0, "increase": 0.0},
        ttft_seconds="missing",
        itl_seconds="missing",
    )
    verdict = build_verdict(make(**idle))
    assert verdict.bottleneck is Bottleneck.idle
    assert verdict.findings == []


def test_missing_core_signals_give_unknown_never_healthy():
    partial = {**HEALTHY, "kv_cache_usage_ratio": "missing"}
    verdict = build_verdict(make(**partial))
    assert verdict.bottleneck is Bottleneck.unknown
    assert "kv_cache_usage_ratio" in verdict.summary


def test_kv_starved_is_memory_even_though_queue_time_also_dominates():
    starved = {**HEALTHY}
    starved.update(
        requests_running={"mean": 1.5, "max": 2, "min": 1, "last": 2, "p90": 2},
        requests_waiting={"mean": 30, "max": 31, "min": 29, "last": 30, "p90": 31},
        kv_cache_usage_ratio={"mean": 0.8, "max": 1.0, "p90": 0.98},
        preemptions_per_second={"rate": 0.6, "increase": 12},
        requests_finished_per_second={"rate": 0.5, "increase": 10.0},
        ttft_seconds={"p50": 20.0, "p90": 40.0, "mean": 22.0, "count": 10},
        queue_time_seconds={"p50": 19.0, "mean": 21.0, "count": 10, "sum": 210.0},
    )
    verdict = build_verdict(make(**starved))
    assert verdict.bottleneck is Bottleneck.memory
    primary = verdict.findings[0]
    assert primary.code == "MEM001"
    evidence = {e.signal: e.value for e in primary.evidence}
    assert evidence["preemptions_per_second"] == 0.6
    assert evidence["preemptions_per_finished_request"] == 12 / 10
    # the gauge (mean 30) beats Little's law (210 s of queueing / 20 s = 10.5): each estimate only reads low
    assert evidence["requests_waiting_avg"] == 30
    # scheduling rules are gated off by the preemptions: memory is the root cause
    assert all(f.category is not Category.scheduling for f in verdict.findings)


def test_max_num_seqs_cap_is_scheduling():
    capped = {**HEALTHY}
    capped.update(
        requests_running={"mean": 2, "max": 2, "min": 2, "last": 2, "p90": 2},
        requests_waiting={"mean": 30, "max": 30, "min": 29, "last": 30, "p90": 30},
        ttft_seconds={"p50": 5.0, "p90": 7.0, "mean": 5.2, "count": 40},
        queue_time_seconds={"p50": 4.9, "mean": 5.0, "count": 40, "sum": 200.0},
    )
    signals = make(**capped)
    verdict = build_verdict(signals)
    assert verdict.bottleneck is Bottleneck.scheduling
    codes = {f.code for f in verdict.findings}
    assert {"SCH001", "SCH002"} <= codes
    sch001 = next(f for f in verdict.findings if f.code == "SCH001")
    # 40 requests waited 5 s each in a 20 s window: 10 by Little's law, but the gauge's mean says 30
    assert {e.signal: e.value for e in sch001.evidence}["requests_waiting_avg"] == 30.0


def test_starved_gauges_fall_back_on_littles_law():
    capped = {**HEALTHY}
    capped.update(
        requests_waiting={"mean": 0, "max": 0, "min": 0, "last": 0, "p90": 0},
        queue_time_seconds={"p50": 4.9, "mean": 5.0, "count": 40, "sum": 200.0},
    )
    verdict = build_verdict(make(**capped))
    assert verdict.signals["requests_waiting_avg"].stats["value"] == 200.0 / 20


def test_network_is_reported_not_evaluated_never_fine():
    verdict = build_verdict(make(**HEALTHY))
    network = next(c for c in verdict.coverage.classes if c.category is Category.network)
    assert network.evaluated is False
    assert "GPU telemetry" in network.reason


def test_sanity_findings_never_raise_the_confidence_and_are_named():
    clean = build_verdict(make(**HEALTHY))
    restarted = make(**HEALTHY)
    restarted.add(Signal(name="counter_resets", kind="derived", unit="count", stats={"value": 3.0}))
    dirty = build_verdict(restarted)
    assert dirty.findings[0].code == "SAN002"
    assert dirty.bottleneck is Bottleneck.healthy
    # the fit found no case where a sanity finding went with a wrong verdict (its weight is held at most 0)
    assert dirty.confidence <= clean.confidence
    assert "metric sanity findings: some numbers are not trustworthy" in dirty.notes


def test_same_signals_give_the_same_verdict():
    first = build_verdict(make(**HEALTHY))
    second = build_verdict(make(**HEALTHY))
    assert (first.bottleneck, first.confidence) == (second.bottleneck, second.confidence)


def test_queue_share_above_one_is_not_trusted():
    # TTFT is observed at the first token, queue time at the finish: a short window can mix populations
    mixed = {**HEALTHY}
    mixed.update(
        ttft_seconds={"p50": 0.5, "p90": 0.9, "mean": 0.56, "count": 40},
        queue_time_seconds={"p50": 3.9, "mean": 0.76, "count": 40, "sum": 30.4},
    )
    verdict = build_verdict(make(**mixed))
    share = verdict.signals["queue_share_of_ttft_ratio"]
    assert share.unavailable and "different requests" in share.unavailable
    assert "SCH002" not in {f.code for f in verdict.findings}


def test_an_advisory_finding_is_shown_but_never_the_class():
    # a healthy server whose GPU is 97 % full and shared with a second process: MEM004 warns of an OOM risk
    shared_gpu = dict(
        HEALTHY,
        gpu_memory_used_bytes={"mean": 78e9, "max": 78e9, "last": 78e9},
        gpu_memory_free_bytes={"mean": 2.4e9, "min": 2.4e9, "last": 2.4e9},
        gpu_process_count={"mean": 2, "max": 2, "last": 2},
    )
    verdict = build_verdict(make(**shared_gpu))
    [finding] = verdict.findings
    assert finding.code == "MEM004" and finding.advisory
    used = next(e for e in finding.evidence if e.signal == "gpu_memory_used_ratio")
    assert used.value == 78e9 / (78e9 + 2.4e9)
    assert verdict.bottleneck is Bottleneck.healthy
