"""Parser and window maths against hand-computed values."""

from __future__ import annotations

import math

import pytest

from llmdiag.collect.exposition import Scrape, parse_exposition
from llmdiag.collect.window import bucket_quantile, counter_increase, gauge_window, histogram_window
from llmdiag.errors import ExpositionParseError, NotMetricsError


def scrape(at: float, text: str) -> Scrape:
    return parse_exposition(text, at)


def counter_text(values: dict[str, float]) -> str:
    lines = ["# TYPE vllm:num_preemptions counter"]
    lines += [f'vllm:num_preemptions_total{{engine="{e}",model_name="m"}} {v}' for e, v in values.items()]
    return "\n".join(lines) + "\n"


def test_counter_increase_handles_reset():
    # 10 → 15 (+5), restart → 3 (+3 since the new process started at 0), → 7 (+4)
    scrapes = [scrape(t, counter_text({"0": v})) for t, v in enumerate([10, 15, 3, 7])]
    window = counter_increase(scrapes, "vllm:num_preemptions_total")
    assert window.increase == 12
    assert window.resets == 1


def test_a_new_process_start_time_is_a_restart_even_when_the_counter_grew():
    # two real pages of two vLLM processes (tests/fixtures/vllm-0.32.0: healthy started at 1796001437.71, admission
    # at 1796001597.82): the second process's /v1/completions count, 146, is past the first's 132, yet it is all
    # the new process's own: counted from zero, not as 14
    from tests.conftest import FIXTURES

    pages = [FIXTURES / "vllm-0.32.0" / state / "scrape-01.prom" for state in ("healthy", "admission")]
    scrapes = [parse_exposition(page.read_text(), at) for at, page in enumerate(pages)]
    match = {"handler": "/v1/completions", "method": "POST", "status": "2xx"}
    window = counter_increase(scrapes, "http_requests_total", match)
    assert window.increase == 146 and window.resets == 1
    ttft = histogram_window(scrapes, "vllm:time_to_first_token_seconds")
    admission_ttft_count = scrapes[1].series["vllm:time_to_first_token_seconds_count"]
    assert ttft is not None and ttft.resets == 1 and ttft.count == sum(admission_ttft_count.values())
    # the same process read twice is no restart
    same = [parse_exposition(page.read_text(), at) for at, page in enumerate([pages[0], pages[0]])]
    assert counter_increase(same, "http_requests_total", match).resets == 0


def test_counter_series_appearing_mid_window_counts_from_zero():
    scrapes = [scrape(0, counter_text({"0": 1})), scrape(1, counter_text({"0": 2, "1": 4}))]
    window = counter_increase(scrapes, "vllm:num_preemptions_total")
    assert window.increase == 1 + 4
    assert len(window.per_series) == 2


def histogram_text(cumulative: dict[str, float], total: float, engine: str = "0") -> str:
    lines = ["# TYPE vllm:time_to_first_token_seconds histogram"]
    for le, count in cumulative.items():
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{engine="{engine}",le="{le}"}} {count}')
    lines.append(f'vllm:time_to_first_token_seconds_count{{engine="{engine}"}} {cumulative["+Inf"]}')
    lines.append(f'vllm:time_to_first_token_seconds_sum{{engine="{engine}"}} {total}')
    return "\n".join(lines) + "\n"


def test_histogram_quantiles_come_from_bucket_deltas_inside_the_window():
    before = histogram_text({"0.1": 5, "0.5": 10, "1.0": 10, "+Inf": 10}, total=2.0)
    after = histogram_text({"0.1": 15, "0.5": 40, "1.0": 50, "+Inf": 50}, total=22.0)
    hw = histogram_window([scrape(0, before), scrape(10, after)], "vllm:time_to_first_token_seconds")
    assert hw is not None
    # deltas: ≤0.1: 10, ≤0.5: 30, ≤1.0: 40, +Inf: 40
    assert hw.count == 40
    assert hw.mean == pytest.approx(20.0 / 40)
    # p50: rank 20 lies in (0.1, 0.5] holding ranks 10..30 → 0.1 + 0.4 × 10/20
    assert hw.quantile(0.5) == pytest.approx(0.3)
    # p90: rank 36 in (0.5, 1.0] holding 30..40 → 0.5 + 0.5 × 6/10
    assert hw.quantile(0.9) == pytest.approx(0.8)
    assert hw.quantile(0.99) == pytest.approx(0.98)


def test_histogram_lifetime_totals_do_not_leak_into_the_window():
    # 1000 slow requests before the window, 10 fast ones inside it: the window p50 must be fast
    before = histogram_text({"0.1": 0, "10.0": 1000, "+Inf": 1000}, total=5000)
    after = histogram_text({"0.1": 10, "10.0": 1010, "+Inf": 1010}, total=5000.5)
    hw = histogram_window([scrape(0, before), scrape(5, after)], "vllm:time_to_first_token_seconds")
    assert hw is not None and hw.count == 10
    assert hw.quantile(0.5) <= 0.1


def test_histogram_reset_uses_the_new_process_counts():
    before = histogram_text({"0.1": 50, "+Inf": 60}, total=30)
    after = histogram_text({"0.1": 4, "+Inf": 4}, total=0.2)  # restarted: fewer than before
    hw = histogram_window([scrape(0, before), scrape(5, after)], "vllm:time_to_first_token_seconds")
    assert hw is not None
    assert hw.resets == 1
    assert hw.count == 4
    assert hw.total == pytest.approx(0.2)


def test_durations_counted_in_the_window_are_clipped_to_what_it_held():
    # scrapes at 100, 102 and 110 s: 2 durations of 30 s counted by the 102 s scrape, 1 of 0.05 s and 1 over the
    # last bound (sum says 40 s) by the 110 s scrape. The 30 s ones ended by 102 s, so at most 2 s of each lies
    # after 100 s; the +Inf one at most 10 s; the short one at its 0.1 s bound, the interval at its sum
    first = histogram_text({"0.1": 0, "60.0": 0, "+Inf": 0}, total=0.0)
    second = histogram_text({"0.1": 0, "60.0": 2, "+Inf": 2}, total=60.0)
    third = histogram_text({"0.1": 1, "60.0": 3, "+Inf": 4}, total=100.05)
    hw = histogram_window(
        [scrape(100, first), scrape(102, second), scrape(110, third)], "vllm:time_to_first_token_seconds"
    )
    assert hw is not None and hw.total == pytest.approx(100.05)
    assert hw.sum_in_window_max(100.0) == pytest.approx(2 * 2.0 + min(40.05, 0.1 + 10.0))
    # a value in milliseconds (scale 0.001): the bounds and the sums are scaled before the clip
    assert hw.sum_in_window_max(109.99, scale=0.001) == pytest.approx(2 * 0.0 + min(0.04005, 0.0001 + 0.01))


def test_histograms_sum_over_engines():
    def two_engines(a: float, b: float) -> str:
        body = histogram_text({"0.1": a, "+Inf": a}, total=a * 0.05, engine="0")
        return body + "".join(
            line + "\n" for line in histogram_text({"0.1": b, "+Inf": b}, total=b * 0.05, engine="1").splitlines()[1:]
        )

    scrapes = [scrape(0, two_engines(0, 0)), scrape(1, two_engines(3, 7))]
    hw = histogram_window(scrapes, "vllm:time_to_first_token_seconds")
    assert hw is not None and hw.count == 10


def test_quantile_in_the_overflow_bucket_is_the_largest_finite_bound():
    assert bucket_quantile(0.99, [(1.0, 1), (10.0, 2), (math.inf, 100)]) == 10.0


def test_quantile_of_an_empty_window_is_none():
    assert bucket_quantile(0.5, [(1.0, 0), (math.inf, 0)]) is None


def gauge_text(name: str, per_engine: dict[str, float]) -> str:
    lines = [f"# TYPE {name} gauge"]
    lines += [f'{name}{{engine="{e}",model_name="m"}} {v}' for e, v in per_engine.items()]
    return "\n".join(lines) + "\n"


def test_gauge_stats_over_scrapes():
    values = [1.0, 3.0, 2.0]
    scrapes = [scrape(t, gauge_text("vllm:num_requests_waiting", {"0": v})) for t, v in enumerate(values)]
    stats = gauge_window(scrapes, "vllm:num_requests_waiting").stats()
    assert stats == {"last": 2.0, "mean": 2.0, "min": 1.0, "max": 3.0, "p90": 3.0}


def test_gauge_aggregation_across_engines():
    scrapes = [scrape(0, gauge_text("vllm:kv_cache_usage_perc", {"0": 0.2, "1": 0.6}))]
    assert gauge_window(scrapes, "vllm:kv_cache_usage_perc", aggregate="mean").stats()["mean"] == pytest.approx(0.4)
    assert gauge_window(scrapes, "vllm:kv_cache_usage_perc", aggregate="sum").stats()["mean"] == pytest.approx(0.8)
    per_series = gauge_window(scrapes, "vllm:kv_cache_usage_perc").per_series_mean
    assert sorted(per_series.values()) == [0.2, 0.6]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("", NotMetricsError),
        ("<!doctype html><html><body>Login</body></html>\n", NotMetricsError),
        ('{"iterCounter": 1}\n', NotMetricsError),
        ('vllm:num_requests_running{model_name="m",eng', ExpositionParseError),
        ("hello world this is not metrics\n", ExpositionParseError),
        ("# only a comment\n", NotMetricsError),
    ],
)
def test_bad_pages_raise_typed_errors(body: str, error: type[Exception]):
    with pytest.raises(error):
        parse_exposition(body, 0.0)


def test_created_and_total_names_are_kept_apart():
    text = (
        "# TYPE vllm:num_preemptions counter\n"
        'vllm:num_preemptions_total{engine="0"} 4.0\n'
        'vllm:num_preemptions_created{engine="0"} 1.7e9\n'
    )
    parsed = scrape(0, text)
    assert parsed.has("vllm:num_preemptions_total")
    window = counter_increase([Scrape(at_unix=None), parsed], "vllm:num_preemptions_total")
    assert window.increase == 4.0
