"""The queue and batch estimates count only what the window could hold.

vLLM records a request's queue time (and its run time) when the request leaves the stage, so the histogram's sum
over a window holds the time its requests spent in the stage before the window too. The pages here are vLLM
/metrics pages written scrape by scrape (21 scrapes, 1 s apart, vLLM's bucket bounds) and read by the vllm probe,
as a live scan reads them; each test states the numbers it expects from what the pages hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from llmdiag.collect.exposition import parse_exposition
from llmdiag.collect.signals import build_signal_set
from llmdiag.engine.derived import requests_waiting_avg
from llmdiag.engine.evaluate import build_verdict
from llmdiag.model import Bottleneck, Signal, SignalSet, Verdict, Window
from llmdiag.schema.loader import load_probe

T0 = 1_796_020_685.0
SCRAPES = 21  # 1 s apart: a 20 s window
# vLLM's bucket bounds (vllm/v1/metrics/loggers.py)
QUEUE_BOUNDS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)
TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
ITL_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0)
HISTOGRAMS = {
    "vllm:request_queue_time_seconds": QUEUE_BOUNDS,
    "vllm:request_inference_time_seconds": QUEUE_BOUNDS,
    "vllm:request_prefill_time_seconds": QUEUE_BOUNDS,
    "vllm:time_to_first_token_seconds": TTFT_BOUNDS,
    "vllm:inter_token_latency_seconds": ITL_BOUNDS,
}
LABELS = 'engine="0",model_name="m"'


@dataclass
class Pages:
    """A server's cumulative counters and histograms, written out as one /metrics page per scrape."""

    counters: dict[str, float] = field(default_factory=dict)
    observed: dict[str, list[tuple[float, int]]] = field(default_factory=dict)  # (value, how many)
    pages: list[str] = field(default_factory=list)
    left_out: tuple[str, ...] = ()

    def count(self, name: str, increase: float) -> None:
        self.counters[name] = self.counters.get(name, 0.0) + increase

    def observe(self, name: str, value: float, times: int = 1) -> None:
        self.observed.setdefault(name, []).append((value, times))

    def scrape(self, running: float, waiting: float, kv: float) -> None:
        lines = [
            f"vllm:num_requests_running{{{LABELS}}} {running}",
            f"vllm:num_requests_waiting{{{LABELS}}} {waiting}",
            f"vllm:kv_cache_usage_perc{{{LABELS}}} {kv}",
        ]
        for name in ("generation_tokens", "prompt_tokens", "num_preemptions", "request_success"):
            lines += [f"# TYPE vllm:{name} counter", f"vllm:{name}_total{{{LABELS}}} {self.counters.get(name, 0.0)}"]
        for name, bounds in HISTOGRAMS.items():
            if name in self.left_out:
                continue
            seen = self.observed.get(name, [])
            lines.append(f"# TYPE {name} histogram")
            for le in (*bounds, float("inf")):
                below = sum(n for v, n in seen if v <= le)
                lines.append(f'{name}_bucket{{{LABELS},le="{"+Inf" if le == float("inf") else le}"}} {below}')
            lines.append(f"{name}_count{{{LABELS}}} {sum(n for _, n in seen)}")
            lines.append(f"{name}_sum{{{LABELS}}} {sum(v * n for v, n in seen)}")
        self.pages.append("\n".join(lines) + "\n")

    def signal_set(self) -> SignalSet:
        scrapes = [parse_exposition(page, T0 + i) for i, page in enumerate(self.pages)]
        return build_signal_set(load_probe("vllm"), scrapes, "http://vllm:8000/metrics")


def background(pages: Pages) -> None:
    """One light request a second between scrapes: 0.001 s queued, first token at 0.05 s, 0.5 s running."""
    pages.observe("vllm:request_queue_time_seconds", 0.001)
    pages.observe("vllm:time_to_first_token_seconds", 0.05)
    pages.observe("vllm:request_prefill_time_seconds", 0.04)
    pages.observe("vllm:request_inference_time_seconds", 0.5)
    pages.count("prompt_tokens", 100)
    pages.count("request_success", 1)


def waiting(verdict: Verdict) -> float:
    return verdict.signals["requests_waiting_avg"].stats["value"]


def drained_before_the_window(starved_running_gauge: bool = False) -> Pages:
    """10 requests queued 30 s and got their first token before the window; they run on and finish between
    scrapes 14 and 15, when vLLM counts their 30 s of queue time. No scrape sees a request waiting."""
    pages = Pages()
    for k in range(SCRAPES):
        if k >= 1:
            background(pages)
            if k <= 15:
                pages.count("generation_tokens", 1000)  # 10 requests at 100 tokens/s
                pages.observe("vllm:inter_token_latency_seconds", 0.01, 1000)
        if k == 15:
            pages.observe("vllm:request_queue_time_seconds", 30.0, 10)
            pages.observe("vllm:request_inference_time_seconds", 30.0, 10)
            pages.count("request_success", 10)
        held = 10 if k <= 14 else 0
        pages.scrape(running=0 if starved_running_gauge else held, waiting=0, kv=0.2 if k <= 14 else 0.0)
    return pages


def test_a_queue_that_drained_before_the_window_is_not_read_as_queueing():
    signals = drained_before_the_window().signal_set()
    queue = signals.signals["queue_time_seconds"].stats
    # what the histogram says: 10 × 30 s + 20 × 0.001 s, which Little's law alone reads as 15 waiting
    assert queue["count"] == 30 and queue["sum"] == pytest.approx(300.02)
    # counted at t0 + 15 s, each of the 10 can have queued at most 15 s in the window; the light one counted with
    # them is taken at its bucket's 0.3 s there, the other 19 at their own sums (smaller than their buckets)
    assert queue["sum_in_window_max"] == pytest.approx(19 * 0.001 + (0.3 + 10 * 15.0))
    verdict = build_verdict(signals)
    # the waiting gauge read 0 at every scrape, 1 s apart, and SAN004 does not doubt it (the running gauge read
    # 10 in 15 of 21 scrapes): a 30 s wait would have spanned a scrape, so none of it was in the window; each
    # light request's wait fits between two scrapes, at most its 0.3 s bucket
    assert waiting(verdict) == pytest.approx(20 * 0.3 / 20)
    codes = {f.code for f in verdict.findings}
    assert "SCH001" not in codes and "SAN004" not in codes
    assert verdict.bottleneck is Bottleneck.healthy
    # the batch: 10 requests × 15 s in the window (their 30 s counted at t0 + 15) + 20 × 0.5 s, over 20 s
    assert verdict.signals["requests_running_avg"].stats["value"] == pytest.approx((10 * 15.0 + 20 * 0.5) / 20)


def test_with_a_starved_gauge_the_queue_is_clipped_to_what_the_window_held():
    # the same requests, but the running gauge read 0 at every scrape while 8 ran on average: SAN004 says the
    # gauges starve, so their zeros bound nothing and only the window clips the queue
    verdict = build_verdict(drained_before_the_window(starved_running_gauge=True).signal_set())
    assert "SAN004" in {f.code for f in verdict.findings}
    assert waiting(verdict) == pytest.approx((19 * 0.001 + 0.3 + 10 * 15.0) / 20)


def test_a_queue_between_scrapes_inside_the_window_still_reads_as_queueing():
    # bursts of 10 requests land just after each scrape and wait 0.3 s for a slot beside 4 long ones; every
    # scrape falls between bursts, so the waiting gauge reads 0 throughout and is not starved (running reads 4)
    pages = Pages()
    for k in range(SCRAPES):
        if k >= 1:
            pages.observe("vllm:request_queue_time_seconds", 0.3, 10)
            pages.observe("vllm:time_to_first_token_seconds", 0.35, 10)
            pages.observe("vllm:request_prefill_time_seconds", 0.05, 10)
            pages.observe("vllm:request_inference_time_seconds", 0.5, 10)
            pages.observe("vllm:inter_token_latency_seconds", 0.01, 1000)
            pages.count("generation_tokens", 1000)
            pages.count("prompt_tokens", 1000)
            pages.count("request_success", 10)
        pages.scrape(running=4, waiting=0, kv=0.3)
    verdict = build_verdict(pages.signal_set())
    # 200 requests × 0.3 s queued inside the 20 s window: 3 waiting on average, though no scrape saw one
    assert waiting(verdict) == pytest.approx(200 * 0.3 / 20)
    assert verdict.bottleneck is Bottleneck.scheduling
    sch001 = next(f for f in verdict.findings if f.code == "SCH001")
    assert {e.signal: e.value for e in sch001.evidence}["requests_waiting_avg"] == pytest.approx(3.0)


def test_without_the_queue_histogram_the_gauge_alone_says_it():
    pages = Pages(left_out=("vllm:request_queue_time_seconds",))
    for k in range(SCRAPES):
        if k >= 1:
            background(pages)
            pages.observe("vllm:inter_token_latency_seconds", 0.01, 100)
            pages.count("generation_tokens", 100)
        pages.scrape(running=2, waiting=6, kv=0.1)
    verdict = build_verdict(pages.signal_set())
    assert verdict.signals["queue_time_seconds"].unavailable
    assert waiting(verdict) == 6.0
    assert "SCH001" in {f.code for f in verdict.findings}


def test_before_the_gauges_first_reading_a_long_wait_can_still_lie_in_the_window():
    # the waiting gauge was first read 5 s into the window, then every second, always 0: a 30 s wait that ended
    # before that first reading can have its last 5 s inside the window, and no more
    times = [T0 + t for t in range(21)]
    signals = SignalSet(window=Window(start_unix=T0, end_unix=T0 + 20, duration_seconds=20.0, scrapes=21))
    signals.add(
        Signal(
            name="requests_waiting",
            kind="gauge",
            unit="",
            stats={"mean": 0.0, "max": 0.0},
            samples=[(t, 0.0) for t in times[5:]],
        )
    )
    signals.add(
        Signal(
            name="requests_running",
            kind="gauge",
            unit="",
            stats={"mean": 4.0, "max": 4.0},
            samples=[(t, 4.0) for t in times],
        )
    )
    signals.add(
        Signal(
            name="inference_time_seconds",
            kind="histogram",
            unit="seconds",
            stats={"count": 160.0, "sum": 80.0},
            buckets=[(0.5, 160.0)],
        )
    )
    signals.add(
        Signal(
            name="queue_time_seconds",
            kind="histogram",
            unit="seconds",
            stats={"count": 10.0, "sum": 300.0},
            buckets=[(20.0, 0.0), (30.0, 10.0)],
        )
    )
    assert requests_waiting_avg(signals) == pytest.approx(10 * 5.0 / 20)
