"""Idle needs positive evidence that nothing was served: a counter of finished requests or tokens, or a latency
histogram's count, that stayed at zero (the scan's own canary requests excepted). Gauges at 0 are one reading each:
they say nothing of the requests that came and went between readings, and a missing counter is not a zero one.

The SignalSets are built the way the readers build them (tests/unit/engine/test_stalls.py's ``Readings``): a live
scan gives one reading a second, counters as the rate over each interval; a single saved page without
``process_start_time_seconds`` gives the gauges at that moment, the counters' totals since the server started
(unavailable as rates) and the histograms' counts since the start.
"""

from __future__ import annotations

from pathlib import Path

from llmdiag.collect.files import collect_files, read_dump
from llmdiag.engine.evaluate import build_verdict
from llmdiag.model import Bottleneck, Signal, SignalSet, SourceInfo, Window
from tests.unit.engine.test_stalls import Readings

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
ONE_MOMENT = "one page is one moment: a rate needs two timed pages (or process_start_time_seconds and the page's time)"


def quiet_gauges(n: int) -> dict[str, list[float]]:
    return {"requests_running": [0.0] * n, "requests_waiting": [0.0] * n}


def histogram(name: str, count: float, mean: float) -> Signal:
    stats = {"count": count, "sum": count * mean, "mean": mean, "p50": mean, "p90": 2 * mean}
    return Signal(name=name, kind="histogram", unit="s", stats=stats)


def test_tgi_window_that_finished_requests_with_its_gauges_at_zero_is_not_idle():
    # 20 s of TGI at 10 requests/s, each request short enough to fall between the 1 s readings of the batch and
    # queue gauges: 200 requests finished and 5000 inter-token times were observed, the gauges read 0 throughout
    n = 21
    readings = Readings(interval=1.0, gauges=quiet_gauges(n), rates={"requests_finished_per_second": [10.0] * n})
    signals = readings.signal_set("tgi")
    signals.add(histogram("itl_seconds", 5000.0, 0.02))
    verdict = build_verdict(signals)
    assert verdict.bottleneck is not Bottleneck.idle, verdict.summary
    # TGI has no TTFT histogram and this window no canary requests: healthy cannot be claimed either
    assert verdict.bottleneck is Bottleneck.unknown
    assert "ttft_seconds" in verdict.summary
    said = " ".join(verdict.notes)
    assert "200 requests finished" in said and "5000 inter-token" in said and "read 0" in said


def test_vllm_window_that_served_requests_between_gauge_readings_is_judged_on_its_latencies():
    n = 21
    readings = Readings(
        interval=1.0,
        gauges={**quiet_gauges(n), "kv_cache_usage_ratio": [0.0] * n},
        rates={
            "requests_finished_per_second": [2.0] * n,
            "generation_tokens_per_second": [60.0] * n,
            "prompt_tokens_per_second": [40.0] * n,
            "preemptions_per_second": [0.0] * n,
        },
    )
    signals = readings.signal_set("vllm")
    signals.add(histogram("ttft_seconds", 40.0, 0.012))
    signals.add(histogram("itl_seconds", 1160.0, 0.004))
    verdict = build_verdict(signals)
    assert verdict.bottleneck is Bottleneck.healthy, verdict.summary
    assert any("40 requests finished" in note for note in verdict.notes)


def test_gauges_alone_cannot_show_an_idle_window():
    # a page that exposes only the batch and queue gauges (no finished-request counter, no token counter, no latency
    # histogram): nothing ran at any reading, but whatever came and went between the readings is not counted
    n = 11
    signals = Readings(interval=1.0, gauges=quiet_gauges(n)).signal_set("tgi")
    verdict = build_verdict(signals)
    assert verdict.bottleneck is Bottleneck.unknown, verdict.summary
    assert "no finished-request count" in verdict.summary


def test_a_window_whose_counters_stayed_at_zero_is_idle():
    n = 21
    readings = Readings(
        interval=1.0,
        gauges={**quiet_gauges(n), "kv_cache_usage_ratio": [0.0] * n},
        rates={"requests_finished_per_second": [0.0] * n, "generation_tokens_per_second": [0.0] * n},
    )
    verdict = build_verdict(readings.signal_set("vllm"))
    assert verdict.bottleneck is Bottleneck.idle, verdict.summary
    assert "20 s window" in verdict.summary


def test_the_scans_own_canary_requests_do_not_count_as_work():
    # three canaries, one at a time: one running at most, three finished, their 3 x 16 tokens out and 3 x 9 in
    n = 21
    readings = Readings(
        interval=1.0,
        gauges={
            "requests_running": [0.0] * 10 + [1.0] * 3 + [0.0] * 8,
            "requests_waiting": [0.0] * n,
            "kv_cache_usage_ratio": [0.0] * n,
        },
        rates={
            "requests_finished_per_second": [0.0] * 12 + [3.0] + [0.0] * 8,
            "generation_tokens_per_second": [0.0] * 12 + [48.0] + [0.0] * 8,
            "prompt_tokens_per_second": [0.0] * 12 + [27.0] + [0.0] * 8,
        },
    )
    signals = readings.signal_set("vllm")
    signals.add(histogram("ttft_seconds", 3.0, 0.02))
    signals.add(histogram("itl_seconds", 45.0, 0.005))
    for name, value in (("client_requests_sent", 3.0), ("client_output_tokens", 48.0), ("client_prompt_tokens", 27.0)):
        signals.add(Signal(name=name, kind="derived", unit="", stats={"value": value}))
    verdict = build_verdict(signals)
    assert verdict.bottleneck is Bottleneck.idle, verdict.summary
    assert "besides this scan's 3 canary requests" in verdict.summary
    # one request more than the canaries is traffic
    signals.signals["ttft_seconds"] = histogram("ttft_seconds", 4.0, 0.02)
    assert build_verdict(signals).bottleneck is not Bottleneck.idle


def snapshot(finished: float, e2e_count: float) -> SignalSet:
    """One saved vLLM page without process_start_time_seconds, as collect.files builds it: the gauges at that moment,
    the counters' totals since the server started (no rate), the histograms' counts since the start."""
    out = SignalSet(window=Window(kind="snapshot", scrapes=1), sources=[SourceInfo(probe="vllm")])
    for name, value in (("requests_running", 0.0), ("requests_waiting", 0.0), ("kv_cache_usage_ratio", 0.0)):
        stats = {"last": value, "mean": value, "min": value, "max": value, "p90": value}
        out.add(Signal(name=name, kind="gauge", unit="", stats=stats))
    for name, total in (("requests_finished_per_second", finished), ("preemptions_per_second", 0.0)):
        out.add(Signal(name=name, kind="counter", unit="", stats={"increase": total}, unavailable=ONE_MOMENT))
    if e2e_count:
        out.add(histogram("e2e_latency_seconds", e2e_count, 0.24))
    else:
        out.add(Signal(name="e2e_latency_seconds", kind="histogram", unit="s", stats={"count": 0.0},
                       unavailable="no observations in the window"))  # fmt: skip
    return out


def test_one_page_with_nothing_running_but_requests_served_since_the_start_is_unknown():
    verdict = build_verdict(snapshot(finished=132.0, e2e_count=132.0))
    assert verdict.bottleneck is Bottleneck.unknown, verdict.summary
    assert "132 requests finished" in verdict.summary
    assert verdict.summary.endswith("(judged from one snapshot: gauges at one moment, no rates)")
    assert verdict.confidence < 0.5


def test_one_page_of_a_server_that_never_served_a_request_is_idle():
    verdict = build_verdict(snapshot(finished=0.0, e2e_count=0.0))
    assert verdict.bottleneck is Bottleneck.idle, verdict.summary
    assert "snapshot" in verdict.summary and verdict.confidence < 0.5


def test_real_idle_page_without_its_process_start_time_is_idle_from_its_zero_counts():
    # vLLM 0.32.0 before any request; the process collector's series left out as a server without it exposes the page
    path = FIXTURES / "vllm-0.32.0" / "idle" / "scrape-01.prom"
    page = read_dump(path)
    page.series.pop("process_start_time_seconds")
    signals = collect_files([path], "vllm", scrapes=[page])
    assert signals.window.kind == "snapshot"
    assert signals.signals["e2e_latency_seconds"].stats["count"] == 0.0
    verdict = build_verdict(signals)
    assert verdict.bottleneck is Bottleneck.idle, verdict.summary


def test_real_tgi_page_with_its_gauges_at_zero_and_no_counter_is_unknown():
    # IBM's TGIS adapter page: queue and batch gauges read 0; the stored excerpt stops before any request counter
    path = FIXTURES / "field" / "tgi-ibm-vllm-18-tgis-metrics-page" / "metrics.prom"
    verdict = build_verdict(collect_files([path], "tgi"))
    assert verdict.bottleneck is Bottleneck.unknown, verdict.summary
    assert verdict.signals["requests_running"].stats["max"] == 0.0


def log_line(generation_per_second: float) -> SignalSet:
    """One vLLM stat line ('Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: G tokens/s, Running: 0
    reqs, ...'), as collect.logs builds one moment: the gauges, and each throughput as the line printed it."""
    out = SignalSet(window=Window(kind="snapshot", scrapes=1), sources=[SourceInfo(probe="vllm-log")])
    for name in ("requests_running", "requests_waiting", "kv_cache_usage_ratio"):
        stats = {"last": 0.0, "mean": 0.0, "min": 0.0, "max": 0.0, "p90": 0.0}
        out.add(Signal(name=name, kind="gauge", unit="", stats=stats))
    for name, rate in (("generation_tokens_per_second", generation_per_second), ("prompt_tokens_per_second", 0.0)):
        out.add(Signal(name=name, kind="counter", unit="tokens/s", stats={"rate": rate}))
    return out


def test_one_stat_line_that_printed_no_throughput_is_idle_and_one_that_printed_some_is_not():
    quiet = build_verdict(log_line(0.0))
    assert quiet.bottleneck is Bottleneck.idle, quiet.summary
    served = build_verdict(log_line(37.4))
    assert served.bottleneck is not Bottleneck.idle, served.summary
    assert any("output tokens generated at 37.4/s" in note for note in served.notes)
