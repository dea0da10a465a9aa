"""What the charts read: a counter's rate per scrape interval, and a histogram's window bucket deltas."""

from __future__ import annotations

import math

from llmdiag.collect.exposition import parse_exposition
from llmdiag.collect.signals import build_signal_set
from llmdiag.model import Signal, Verdict
from llmdiag.render.html import scan_charts
from llmdiag.schema.loader import load_probe

SPEC = load_probe("vllm")
LABELS = 'engine="0",model_name="m"'


def page(preempted: float, ttft_buckets: dict[str, float]) -> str:
    lines = [
        "# TYPE vllm:num_preemptions counter",
        f"vllm:num_preemptions_total{{{LABELS}}} {preempted}",
        "# TYPE vllm:time_to_first_token_seconds histogram",
    ]
    for le, count in ttft_buckets.items():
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{{LABELS},le="{le}"}} {count}')
    lines.append(f"vllm:time_to_first_token_seconds_count{{{LABELS}}} {ttft_buckets['+Inf']}")
    lines.append(f"vllm:time_to_first_token_seconds_sum{{{LABELS}}} {ttft_buckets['+Inf'] * 0.3}")
    return "\n".join(lines) + "\n"


def signals():
    pages = [
        (100.0, page(10, {"0.1": 5, "0.5": 8, "1.0": 9, "+Inf": 10})),
        (102.0, page(14, {"0.1": 6, "0.5": 12, "1.0": 15, "+Inf": 17})),
        (103.0, page(14, {"0.1": 6, "0.5": 13, "1.0": 16, "+Inf": 20})),
        (105.0, page(20, {"0.1": 6, "0.5": 13, "1.0": 16, "+Inf": 20})),
    ]
    return build_signal_set(SPEC, [parse_exposition(text, at) for at, text in pages], "test")


def test_counter_samples_are_the_rate_over_each_interval_stamped_at_its_end():
    preemptions = signals().get("preemptions_per_second")
    assert preemptions is not None and preemptions.unavailable is None
    assert preemptions.samples == [(102.0, 2.0), (103.0, 0.0), (105.0, 3.0)]
    assert math.isclose(preemptions.stats["rate"], 10 / 5)


def test_histogram_keeps_the_window_bucket_deltas_without_the_infinite_bound():
    ttft = signals().get("ttft_seconds")
    assert ttft is not None and ttft.unavailable is None
    assert ttft.buckets == [(0.1, 1.0), (0.5, 5.0), (1.0, 7.0)]
    assert ttft.stats["count"] == 10.0  # 3 observations above 1 s: count minus the last bucket
    assert all(math.isfinite(le) for le, _ in ttft.buckets)


def test_the_bucket_record_survives_json():
    ttft = signals().get("ttft_seconds")
    again = Signal.model_validate_json(ttft.model_dump_json())
    assert again.buckets == ttft.buckets and again.samples == ttft.samples


def test_a_result_without_samples_or_buckets_draws_unavailable_boxes_not_empty_charts():
    """An older JSON result (no samples, no buckets) still loads; its charts say why they are missing."""
    set_ = signals()
    for signal in set_.signals.values():
        signal.samples, signal.buckets = [], []
    verdict = Verdict(
        bottleneck="unknown",
        confidence=0.0,
        confidence_label="low",
        summary="s",
        window=set_.window,
        signals=set_.signals,
    )
    charts = {c.id: c for c in scan_charts(verdict)}
    assert all(c.unavailable for c in charts.values())
    assert "no bucket data" in (charts["ttft"].unavailable or "")
    assert "no GPU telemetry" in (charts["gpu_util"].unavailable or "")  # the vLLM probe alone has no GPU signals
    assert "no per-scrape samples" in (charts["preemptions"].unavailable or "")
