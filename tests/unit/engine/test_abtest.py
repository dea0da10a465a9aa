"""The matched A/B (llmdiag.engine.abtest): the block bootstrap's intervals on runs drawn from known distributions,
the refusals, and whatif's prediction beside the measurement.

Runs are made of real ``RequestResult`` objects through ``summarise`` (as `load` makes them), with times drawn
here from a seeded generator: every expected difference is the one put in, not one copied from a run.
"""

from __future__ import annotations

import random

import pytest

from llmdiag.client.result import RequestResult
from llmdiag.engine.abtest import RESAMPLES, Run, Slo, check_comparable, compare, compare_point
from llmdiag.engine.load import summarise
from llmdiag.errors import WorkloadMismatchError
from llmdiag.model import LoadPoint, LoadReport
from llmdiag.model.whatif import Figures, WhatIf
from llmdiag.model.workload import Workload

USERS = 16
WINDOW = 20.0


def request(start: float, ttft: float, gap: float, tokens: int, failed: bool = False) -> RequestResult:
    result = RequestResult(request_id=f"r{start}", started_at=start)
    if failed:
        result.error, result.error_kind, result.status, result.ended_at = "boom", "http", 500, start + ttft
        return result
    result.first_token_at = start + ttft
    result.token_times = [start + ttft + i * gap for i in range(tokens)]
    result.ended_at = result.token_times[-1]
    result.output_tokens, result.output_tokens_from = tokens, "usage"
    return result


def run(seed: int, ttft_mean: float, gap: float = 0.01, tokens: int = 20, fail_every: int = 0) -> LoadPoint:
    """USERS closed-loop users over WINDOW seconds; TTFT exponential-ish around ``ttft_mean`` (a queue's shape)."""
    rng = random.Random(seed)
    results = []
    for _ in range(USERS):
        at = rng.uniform(0, 0.2)
        while at < WINDOW:
            n = len(results)
            failed = bool(fail_every) and n % fail_every == fail_every - 1
            result = request(at, rng.expovariate(1 / ttft_mean), gap * rng.uniform(0.9, 1.1), tokens, failed)
            results.append(result)
            at = result.ended_at + 0.001
    return summarise(results, 0.0, WINDOW + 5, users=USERS, slo_tpot_seconds=0.05, keep_samples=True)


def metric(diffs, name):
    return next(d for d in diffs if d.name == name)


def test_two_runs_of_one_distribution_give_intervals_around_zero():
    before, after = run(1, 0.2), run(2, 0.2)
    diffs = compare_point(before, after, Slo(None, 0.05), seed=0)
    for name in ("ttft_p50_seconds", "ttft_p90_seconds", "per_user_tokens_per_second_p50", "itl_p50_seconds"):
        d = metric(diffs, name)
        assert d.ci_low is not None and d.ci_low <= 0 <= d.ci_high, d
        assert d.change == "no change shown"
    # the point figures are the level's own: the same definitions as load's table
    assert metric(diffs, "ttft_p50_seconds").before == pytest.approx(before.ttft_seconds.p50)
    assert metric(diffs, "itl_p99_seconds").after == pytest.approx(after.itl_seconds.p99, abs=1e-6)  # kept to the µs
    assert metric(diffs, "output_tokens_per_second").before == pytest.approx(before.output_tokens_per_second)


def test_a_slower_first_token_is_found_worse_by_about_what_was_added():
    before, after = run(1, 0.2), run(2, 0.6)  # the median of an exponential is mean × ln 2
    d = metric(compare_point(before, after, Slo(None, 0.05), seed=0), "ttft_p50_seconds")
    assert d.change == "worse" and d.ci_low > 0
    assert d.ci_low < 0.4 * 0.693 < d.ci_high  # the 0.28 s put in lies inside the interval
    # and the difference is the after figure minus the before one
    assert d.difference == pytest.approx(after.ttft_seconds.p50 - before.ttft_seconds.p50)


def test_faster_tokens_are_better_for_users_and_for_the_total():
    before, after = run(1, 0.2, gap=0.02), run(2, 0.2, gap=0.01)
    diffs = compare_point(before, after, Slo(None, 0.05), seed=0)
    assert metric(diffs, "itl_p50_seconds").change == "better" and metric(diffs, "itl_p50_seconds").ci_high < 0
    assert metric(diffs, "per_user_decode_tokens_per_second_p50").change == "better"
    assert metric(diffs, "output_tokens_per_second").change == "better"


def test_errors_and_goodput_come_from_the_failed_requests():
    before, after = run(1, 0.2), run(2, 0.2, fail_every=5)
    diffs = compare_point(before, after, Slo(None, 0.05), seed=0)
    errors = metric(diffs, "error_ratio")
    assert errors.before == 0 and errors.after == pytest.approx(0.2, abs=0.02) and errors.change == "worse"
    assert metric(diffs, "goodput_ratio").change == "worse"


def test_the_interval_is_reproducible_for_a_seed_and_moves_with_another():
    before, after = run(1, 0.2), run(2, 0.3)
    first = compare_point(before, after, Slo(None, 0.05), seed=7)
    again = compare_point(before, after, Slo(None, 0.05), seed=7)
    other = compare_point(before, after, Slo(None, 0.05), seed=8)
    assert [(d.ci_low, d.ci_high) for d in first] == [(d.ci_low, d.ci_high) for d in again]
    assert [(d.ci_low, d.ci_high) for d in first] != [(d.ci_low, d.ci_high) for d in other]


def test_blocks_are_as_long_as_the_users_in_flight():
    point = run(1, 0.2)
    assert Run.of(point, Slo(None, None)).block == USERS
    indices = Run.of(point, Slo(None, None)).resample(random.Random(0))
    assert len(indices) == len(point.samples)
    # consecutive requests travel together: most steps in a resample go to the next request
    steps = sum(1 for a, b in zip(indices, indices[1:], strict=False) if b == (a + 1) % len(indices))
    assert steps >= (USERS - 1) / USERS * len(indices) - USERS


def test_one_request_a_side_has_no_interval_never_a_zero_one():
    tiny = summarise([request(0, 0.1, 0.01, 5)], 0, 10, users=1, keep_samples=True)
    d = metric(compare_point(tiny, tiny, Slo(None, None), seed=0), "ttft_p50_seconds")
    assert d.difference == 0 and d.ci_low is None and d.change == "unavailable"
    assert RESAMPLES >= 1000


def workload(**changes) -> Workload:
    base = dict(
        mode="closed",
        levels=[16.0],
        duration_seconds=40,
        warmup_seconds=2,
        max_requests=20000,
        prompt_tokens="128",
        output_tokens="20",
        seed=0,
        slo_tpot_seconds=0.05,
        model="m",
        server_version="0.33.0",
    )
    return Workload(**{**base, **changes})


def report(point: LoadPoint, recorded: Workload | None) -> LoadReport:
    return LoadReport(model="m", points=[point], workload=recorded)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"levels": [8.0]}, "levels 8 here, 16 in the baseline"),
        ({"seed": 3}, "seed 3 here, 0 in the baseline"),
        ({"output_tokens": "20:40"}, "output_tokens 20:40 here, 20 in the baseline"),
        ({"model": "other"}, "the model differs: the server serves 'other', B.json ran 'm'"),
        ({"server_version": "0.34.0"}, "server version differs: '0.34.0' here, '0.33.0' in B.json"),
        ({"server_version": None}, "server version differs: unknown here, '0.33.0' in B.json"),
    ],
)
def test_runs_that_differ_are_refused_naming_what_differs(changes, words):
    with pytest.raises(WorkloadMismatchError) as error:
        check_comparable(report(run(1, 0.2), workload()), workload(**changes), "B.json")
    assert words in error.value.message


def test_a_plain_load_run_is_no_baseline():
    plain = summarise([request(0, 0.1, 0.01, 5)], 0, 10, users=1)
    with pytest.raises(WorkloadMismatchError, match="records no workload"):
        check_comparable(report(plain, workload()), workload(), "B.json")
    with pytest.raises(WorkloadMismatchError, match="records no workload"):
        check_comparable(report(run(1, 0.2), None), workload(), "B.json")


def test_the_prediction_sits_beside_the_measurement_with_its_band():
    before, after = report(run(1, 0.2), workload()), report(run(2, 0.2), workload())
    prediction = WhatIf(
        modelled=True,
        class_after="healthy",
        next_limit="the batch cap again",
        after=Figures(ttft_p50_seconds=0.15, total_tokens_per_second=900.0, kv_peak_ratio=0.3),
        band_ratio=0.25,
    )
    result = compare(before, after, "B.json", prediction, "W.json")
    [level] = result.levels
    ttft = metric(level.metrics, "ttft_p50_seconds")
    assert (ttft.predicted, ttft.predicted_low, ttft.predicted_high) == pytest.approx((0.15, 0.1125, 0.1875))
    assert metric(level.metrics, "output_tokens_per_second").predicted == 900.0
    assert metric(level.metrics, "ttft_p99_seconds").predicted is None  # whatif gives no p99
    assert level.class_predicted == "healthy" and result.next_limit_predicted == "the batch cap again"
    unmodelled = compare(before, after, "B.json", WhatIf(modelled=False, not_modelled_reason="one scrape"), "W")
    assert unmodelled.prediction_not_modelled == "one scrape"
    assert all(m.predicted is None for m in unmodelled.levels[0].metrics)


def test_an_open_loop_block_is_the_requests_in_flight_by_littles_law():
    # 2 requests a second for 60 s, each 3 s in the system: about 6 in flight at once (n^(1/3) of 120 is 5)
    results = [request(i * 0.5, 0.1, (3.0 - 0.1) / 19, 20) for i in range(120)]
    point = summarise(results, 0.0, 65.0, rate_per_second=2.0, keep_samples=True)
    in_flight = sum(s.e2e_seconds for s in point.samples) / point.window_seconds
    assert 5 < in_flight < 6 and Run.of(point, Slo(None, None)).block == 6
