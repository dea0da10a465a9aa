"""Client-side statistics of `llmdiag load`: which requests count, percentiles, per-user speeds, goodput, the knee.

Results are real ``RequestResult`` objects with times set by hand, so every expected number is computed here
from the same times, not copied from a run.
"""

from __future__ import annotations

import pytest

from llmdiag.client.result import RequestResult
from llmdiag.engine.load import find_knee, summarise
from llmdiag.model import Bottleneck, Verdict
from llmdiag.model.load import percentiles, quantile


def request(
    start: float, ttft: float, gap: float, tokens: int, error_kind: str | None = None, status: int | None = None
) -> RequestResult:
    result = RequestResult(request_id=f"r{start}", started_at=start)
    if error_kind is not None:
        result.error, result.error_kind, result.status, result.ended_at = "boom", error_kind, status, start + ttft
        return result
    result.first_token_at = start + ttft
    result.token_times = [start + ttft + i * gap for i in range(tokens)]
    result.ended_at = result.token_times[-1]
    result.output_tokens, result.output_tokens_from = tokens, "usage"
    return result


def test_quantile_interpolates_like_numpy():
    values = [1.0, 2.0, 3.0, 4.0]
    assert quantile(values, 0.5) == 2.5 and quantile(values, 0.0) == 1.0 and quantile(values, 1.0) == 4.0
    assert quantile(values, 0.9) == pytest.approx(1.0 + 0.9 * 3)
    assert percentiles([]).count == 0 and percentiles([]).p50 is None  # nothing measured is not zero


def test_only_requests_ending_in_the_window_count_and_failures_are_kept_by_kind():
    results = [
        request(0.0, 0.1, 0.01, 11),  # ends at 0.2: before the window
        request(1.0, 0.1, 0.01, 11),  # ends at 1.2
        request(2.0, 0.2, 0.02, 11),  # ends at 2.4
        request(3.0, 0.5, 0.0, 1, error_kind="http", status=503),
        request(3.5, 0.5, 0.0, 1, error_kind="timeout"),
        request(4.0, 0.5, 0.0, 1, error_kind="cancelled"),
    ]
    point = summarise(results, 1.0, 5.0, users=2)
    assert point.requests_completed == 2 and point.requests_cancelled == 1
    assert point.errors == {"http 503": 1, "timeout": 1}
    assert point.error_examples == ["http 503: boom", "timeout: boom"]
    assert point.ttft_seconds.count == 2 and point.ttft_seconds.p50 == pytest.approx(0.15)
    # 22 tokens over a 4 s window; two users
    assert point.output_tokens_per_second == pytest.approx(22 / 4.0)
    assert point.naive_per_user_tokens_per_second == pytest.approx(22 / 4.0 / 2)
    # streaming speed is 1 / TPOT: 100 and 50 tokens/s
    assert point.per_user_decode_tokens_per_second.p50 == pytest.approx(75.0)
    # over the whole request: 11 tokens in 0.2 s and in 0.4 s
    assert point.per_user_tokens_per_second.p50 == pytest.approx((11 / 0.2 + 11 / 0.4) / 2)
    assert point.itl_seconds.count == 20 and point.itl_seconds.p50 == pytest.approx(0.015)


def test_goodput_counts_requests_meeting_the_slo_among_all_that_finished():
    results = [request(float(i), 0.1 * (i + 1), 0.01, 5) for i in range(4)]  # TTFT 0.1 .. 0.4
    results.append(request(5.0, 0.1, 0.0, 1, error_kind="http", status=429))
    point = summarise(results, 0.0, 10.0, users=1, slo_ttft_seconds=0.25)
    assert point.goodput_ratio == pytest.approx(2 / 5)  # two fast enough, of four done and one failed
    assert point.goodput_requests_per_second == pytest.approx(2 / 10)


def point_with(
    users: int, speed: float, errors: int = 0, goodput: float | None = None, bottleneck: Bottleneck | None = None
):
    results = [request(1.0 + i, 0.05, 1.0 / speed, 11) for i in range(5)]
    results += [request(1.5 + i, 0.1, 0.0, 1, error_kind="http", status=503) for i in range(errors)]
    point = summarise(results, 0.0, 20.0, users=users)
    if goodput is not None:
        point.goodput_ratio = goodput
    if bottleneck is not None:
        point.verdict = Verdict(bottleneck=bottleneck, confidence=0.9, confidence_label="high", summary="", window={})
    return point


def test_the_knee_is_where_per_user_speed_halves_and_names_the_class_there():
    points = [
        point_with(1, 100.0),
        point_with(8, 90.0),
        point_with(32, 30.0, bottleneck=Bottleneck.scheduling),
        point_with(128, 10.0),
    ]
    knee = find_knee(points, slo_given=False)
    assert knee is not None and knee.users == 32 and knee.bottleneck is Bottleneck.scheduling
    assert "under half" in knee.reason


def test_errors_and_missed_slos_make_a_knee_too():
    assert find_knee([point_with(1, 100.0), point_with(8, 95.0, errors=2)], slo_given=False).users == 8
    slo = [point_with(1, 100.0, goodput=1.0), point_with(8, 95.0, goodput=0.7)]
    assert find_knee(slo, slo_given=True).users == 8
    assert find_knee(slo, slo_given=False) is None  # without an SLO, goodput is not judged
    assert find_knee([point_with(1, 100.0)], slo_given=False) is None
