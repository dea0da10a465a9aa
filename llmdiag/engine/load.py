"""What users got, from the client side: request results → one LoadPoint per load level, and the knee.

A request counts in a point when it *ended* inside the measured window; requests cut off at the deadline are
``cancelled`` and left out of the distributions (they would bias them towards short answers), never counted as
errors. Failures are counted by kind and never dropped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Protocol

from llmdiag.model import Knee, LoadPoint
from llmdiag.model.load import percentiles
from llmdiag.model.workload import RequestSample

# the knee: per-user streaming speed below this share of the lightest load's, or goodput below this ratio
KNEE_SPEED_RATIO = 0.5
KNEE_GOODPUT_RATIO = 0.9
KNEE_ERROR_RATIO = 0.01
ERROR_EXAMPLES = 5


class Result(Protocol):
    """The fields of ``llmdiag.client.result.RequestResult`` this module reads."""

    error: str | None
    error_kind: str | None
    status: int | None
    started_at: float
    ended_at: float
    output_tokens: int | None

    @property
    def ok(self) -> bool: ...
    @property
    def ttft_seconds(self) -> float | None: ...
    @property
    def e2e_seconds(self) -> float | None: ...
    @property
    def tpot_seconds(self) -> float | None: ...
    @property
    def itl_seconds(self) -> list[float]: ...


def error_kind(result: Result) -> str:
    """A short bucket for a failure: 'http 503', 'http 429', 'timeout', 'connect', 'stream'."""
    if result.error_kind == "http" and result.status is not None:
        return f"http {result.status}"
    return result.error_kind or "error"


def meets_slo(result: Result, slo_ttft_seconds: float | None, slo_tpot_seconds: float | None) -> bool:
    ttft, tpot = result.ttft_seconds, result.tpot_seconds
    if slo_ttft_seconds is not None and (ttft is None or ttft > slo_ttft_seconds):
        return False
    return not (slo_tpot_seconds is not None and tpot is not None and tpot > slo_tpot_seconds)


def summarise(
    results: Iterable[Result],
    window_start: float,
    window_end: float,
    *,
    users: int | None = None,
    rate_per_second: float | None = None,
    slo_ttft_seconds: float | None = None,
    slo_tpot_seconds: float | None = None,
    keep_samples: bool = False,
) -> LoadPoint:
    """The load point over [window_start, window_end] (monotonic seconds) from the requests that ended in it;
    with ``keep_samples``, each of them (completed or failed) as a RequestSample, for an A/B comparison."""
    window = window_end - window_start
    completed: list[Result] = []
    cancelled = 0
    errors: Counter[str] = Counter()
    examples: list[str] = []
    kept: list[Result] = []
    for result in results:
        if not window_start <= result.ended_at <= window_end:
            continue
        if result.error_kind != "cancelled":
            kept.append(result)
        if result.ok:
            completed.append(result)
        elif result.error_kind == "cancelled":
            cancelled += 1
        else:
            kind = error_kind(result)
            errors[kind] += 1
            if len(examples) < ERROR_EXAMPLES and result.error:
                examples.append(f"{kind}: {result.error[:200]}")
    output_tokens = sum(r.output_tokens or 0 for r in completed)
    total_rate = output_tokens / window if window > 0 else None
    decode_speeds = [1.0 / r.tpot_seconds for r in completed if r.tpot_seconds]
    overall_speeds = [(r.output_tokens or 0) / r.e2e_seconds for r in completed if r.e2e_seconds]
    gaps = [gap for r in completed for gap in r.itl_seconds]
    good = [r for r in completed if meets_slo(r, slo_ttft_seconds, slo_tpot_seconds)]
    finished = len(completed) + sum(errors.values())
    samples = [sample(r, window_start) for r in kept] if keep_samples else None
    return LoadPoint(
        users=users,
        rate_per_second=rate_per_second,
        window_seconds=window,
        requests_completed=len(completed),
        requests_cancelled=cancelled,
        errors=dict(errors.most_common()),
        error_examples=examples,
        ttft_seconds=percentiles(r.ttft_seconds for r in completed),
        itl_seconds=percentiles(gaps),
        tpot_seconds=percentiles(r.tpot_seconds for r in completed),
        e2e_seconds=percentiles(r.e2e_seconds for r in completed),
        output_tokens_per_second=total_rate,
        per_user_decode_tokens_per_second=percentiles(decode_speeds),
        per_user_tokens_per_second=percentiles(overall_speeds),
        naive_per_user_tokens_per_second=(total_rate / users) if users and total_rate is not None else None,
        goodput_requests_per_second=len(good) / window if window > 0 else None,
        goodput_ratio=len(good) / finished if finished else None,
        samples=samples,
    )


def sample(result: Result, window_start: float) -> RequestSample:
    # microsecond resolution is far below any gap a server shows, and keeps the saved JSON small
    return RequestSample(
        started_seconds=round(result.started_at - window_start, 6),
        ok=result.ok,
        error_kind=None if result.ok else error_kind(result),
        ttft_seconds=result.ttft_seconds,
        tpot_seconds=result.tpot_seconds,
        e2e_seconds=result.e2e_seconds,
        output_tokens=result.output_tokens,
        itl_seconds=[round(gap, 6) for gap in result.itl_seconds] if result.ok else [],
    )


def find_knee(points: Sequence[LoadPoint], slo_given: bool) -> Knee | None:
    """The first point where per-user speed halves against the lightest load, errors pass 1 %, or (with an SLO)
    goodput drops below 90 %. None when no point breaks, or there is nothing to compare with."""
    if len(points) < 2:
        return None
    # speed over the whole request, wait included: a capped batch keeps streaming fast for the few it serves
    # while everyone else queues, so only this one collapses when users stop being served
    base = points[0].per_user_tokens_per_second.p50
    for point in points[1:]:
        speed = point.per_user_tokens_per_second.p50
        finished = point.requests_completed + sum(point.errors.values())
        reason = None
        if base and speed is not None and speed < KNEE_SPEED_RATIO * base:
            reason = (
                f"per-user speed p50 {speed:.1f} tokens/s (wait included) is under half the {base:.1f} "
                f"tokens/s of the lightest load"
            )
        elif finished and sum(point.errors.values()) / finished > KNEE_ERROR_RATIO:
            reason = f"{sum(point.errors.values())} of {finished} requests failed"
        elif slo_given and point.goodput_ratio is not None and point.goodput_ratio < KNEE_GOODPUT_RATIO:
            reason = f"only {point.goodput_ratio:.0%} of requests met the SLO"
        if reason:
            return Knee(
                users=point.users,
                rate_per_second=point.rate_per_second,
                reason=reason,
                bottleneck=point.verdict.bottleneck if point.verdict else None,
            )
    return None
