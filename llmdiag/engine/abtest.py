"""The matched A/B: two runs of one recorded workload, compared metric by metric with a confidence interval.

Refusal first (``check_comparable``): runs whose workload, served model or server version differ measure different
things, so the comparison names the first that differs and stops.

The interval is a seeded **circular block bootstrap over requests**: each run's requests, in the order they were
sent, are resampled in blocks of consecutive requests, the two runs independently, and the statistic recomputed
(``RESAMPLES`` times); the 95 % interval is the 2.5th to 97.5th percentile of the resampled differences. Blocks, not
single requests, because requests that overlap in time share one queue and one batch and so are not independent: a
block is at least as long as the requests in flight at once (the users of a closed loop; Little's law for an open
one) and at least n^(1/3) (the usual block length for a weakly dependent series), at most a quarter of the run.
For inter-token latency, whose gaps within one request are not independent either, a request's gaps travel with
it; past ``MAX_GAPS`` gaps per run every k-th gap of each request is kept for the resampling only, and the
interval is centred on the full data's difference.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import chain
from operator import is_not, itemgetter
from typing import Any, Literal, cast

from llmdiag.errors import WorkloadMismatchError, option
from llmdiag.model.abtest import Comparison, LevelComparison, MetricDiff
from llmdiag.model.load import LoadPoint, LoadReport, quantile
from llmdiag.model.whatif import WhatIf
from llmdiag.model.workload import RequestSample, Workload

RESAMPLES = 1000
CONFIDENCE = 0.95
MAX_GAPS = 4000  # inter-token gaps per run that the resampling sorts (the estimate itself uses them all)
METHOD = (
    "circular block bootstrap over requests in the order they were sent ({resamples} resamples per run, seed "
    "{seed}; block ≥ the requests in flight at once and ≥ n^(1/3)); 95 % percentile interval of after − before"
)


def check_comparable(baseline: LoadReport, workload: Workload, baseline_name: str) -> None:
    """Refuse a baseline that is not a run of this workload, on this model and this server version."""
    recorded = baseline.workload
    if recorded is None or any(p.samples is None for p in baseline.points):
        raise WorkloadMismatchError(
            f"{baseline_name} records no workload: it is a plain load run, not a replay",
            f"make the baseline with {option('save_workload')} or {option('workload')}, then compare",
        )
    before, now = recorded.identity(), workload.identity()
    differing = [key for key in now if before.get(key) != now[key]]
    if differing:
        key = differing[0]
        raise WorkloadMismatchError(
            f"the workload differs from {baseline_name}'s: {key} {_shown(now[key])} here, "
            f"{_shown(before.get(key))} in the baseline",
            f"replay the baseline's own workload ({option('workload')} of the file it was recorded to)",
        )
    if recorded.model != workload.model:
        raise WorkloadMismatchError(
            f"the model differs: the server serves {workload.model!r}, {baseline_name} ran {recorded.model!r}",
            f"compare runs of one model; pick it with {option('model')}, or record a new baseline",
        )
    if recorded.server_version != workload.server_version:
        raise WorkloadMismatchError(
            f"the server version differs: {_version(workload)} here, {_version(recorded)} in {baseline_name}",
            "a server upgrade changes everything at once; record a new baseline on this version",
        )


def _shown(value: object) -> str:
    if isinstance(value, list):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _version(workload: Workload) -> str:
    return repr(workload.server_version) if workload.server_version is not None else "unknown"


# --- the statistics, over the requests of one run (or of a resample of them) ----------------------------------


@dataclass(frozen=True)
class Slo:
    ttft_seconds: float | None
    tpot_seconds: float | None


@dataclass
class Run:
    """One side's requests in send order, as columns (None: not measured for that request), the block length,
    and each request's inter-token gaps (every k-th past MAX_GAPS, for the resampling)."""

    window_seconds: float
    block: int
    ttft: list[float | None]
    per_user: list[float | None]  # output tokens over the whole request, wait included
    decode: list[float | None]  # 1 / TPOT: while the answer streams
    tokens: list[int]  # output tokens of a completed request, 0 otherwise
    good: list[bool]
    failed: list[bool]
    gaps: list[list[float]]
    all_gaps: list[list[float]]

    @classmethod
    def of(cls, point: LoadPoint, slo: Slo) -> Run:
        samples = sorted(point.samples or [], key=lambda s: s.started_seconds)
        total_gaps = sum(len(s.itl_seconds) for s in samples)
        stride = max(1, math.ceil(total_gaps / MAX_GAPS))
        n = len(samples)
        if point.users is not None:
            in_flight = float(point.users)
        else:  # Little's law: arrivals × time in the system
            busy = sum(s.e2e_seconds or 0.0 for s in samples)
            in_flight = busy / point.window_seconds if point.window_seconds else 1.0
        block = max(1, min(max(math.ceil(n ** (1 / 3)), math.ceil(in_flight)), n // 4))
        return cls(
            window_seconds=point.window_seconds,
            block=block,
            ttft=[s.ttft_seconds if s.ok else None for s in samples],
            per_user=[(s.output_tokens or 0) / s.e2e_seconds if s.ok and s.e2e_seconds else None for s in samples],
            decode=[1.0 / s.tpot_seconds if s.ok and s.tpot_seconds else None for s in samples],
            tokens=[(s.output_tokens or 0) if s.ok else 0 for s in samples],
            good=[_good(s, slo) for s in samples],
            failed=[not s.ok for s in samples],
            gaps=[s.itl_seconds[::stride] for s in samples],
            all_gaps=[s.itl_seconds for s in samples],
        )

    def __len__(self) -> int:
        return len(self.tokens)

    def resample(self, rng: random.Random) -> list[int]:
        """n request indices: blocks of ``block`` consecutive requests from random starts, wrapping around."""
        n, block = len(self), self.block
        picked: list[int] = []
        while len(picked) < n:
            start = rng.randrange(n)
            picked.extend(
                range(start, start + block) if start + block <= n else [(start + i) % n for i in range(block)]
            )
        return picked[:n]

    def statistics(self, picked: Sequence[int] | None, full_gaps: bool = False) -> list[float | None]:
        """Every metric of METRICS, in order, over the requests ``picked`` (None: all of them). The columns are
        picked and filtered in C (itemgetter, filter, chain): a thousand resamples of thousands of requests."""
        n = len(self) if picked is None else len(picked)
        take = _all if picked is None else _picker(picked)
        ttft, per_user, decode = (
            cast(list[float], sorted(filter(_present, take(c)))) for c in (self.ttft, self.per_user, self.decode)
        )
        gaps: list[float] = sorted(chain.from_iterable(take(self.all_gaps if full_gaps else self.gaps)))
        return [
            quantile(per_user, 0.5),
            quantile(decode, 0.5),
            quantile(ttft, 0.5),
            quantile(ttft, 0.9),
            quantile(ttft, 0.99),
            quantile(gaps, 0.5),
            quantile(gaps, 0.9),
            quantile(gaps, 0.99),
            sum(take(self.tokens)) / self.window_seconds if self.window_seconds > 0 else None,
            sum(take(self.good)) / n if n else None,
            sum(take(self.failed)) / n if n else None,
        ]


_present = partial(is_not, None)


def _all(column: Sequence[Any]) -> Sequence[Any]:
    return column


def _picker(picked: Sequence[int]) -> Callable[[Sequence[Any]], Sequence[Any]]:
    getter = itemgetter(*picked)
    if len(picked) == 1:  # itemgetter of one index gives the item, not a tuple
        return lambda column: (getter(column),)
    return getter


def _good(r: RequestSample, slo: Slo) -> bool:
    if not r.ok:
        return False
    if slo.ttft_seconds is not None and (r.ttft_seconds is None or r.ttft_seconds > slo.ttft_seconds):
        return False
    return not (slo.tpot_seconds is not None and r.tpot_seconds is not None and r.tpot_seconds > slo.tpot_seconds)


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    unit: Literal["seconds", "tokens/s", "ratio"]
    better: Literal["higher", "lower"]
    predicted_by: str | None = None  # the whatif figure that predicts it


# in the order of Run.statistics
METRICS = (
    Metric(
        "per_user_tokens_per_second_p50",
        "per-user tok/s p50 (wait incl.)",
        "tokens/s",
        "higher",
        "per_user_tokens_per_second_incl_waiting",
    ),
    Metric(
        "per_user_decode_tokens_per_second_p50",
        "per-user tok/s p50 (streaming)",
        "tokens/s",
        "higher",
        "per_user_tokens_per_second",
    ),
    Metric("ttft_p50_seconds", "TTFT p50", "seconds", "lower", "ttft_p50_seconds"),
    Metric("ttft_p90_seconds", "TTFT p90", "seconds", "lower", "ttft_p90_seconds"),
    Metric("ttft_p99_seconds", "TTFT p99", "seconds", "lower"),
    Metric("itl_p50_seconds", "ITL p50", "seconds", "lower"),
    Metric("itl_p90_seconds", "ITL p90", "seconds", "lower"),
    Metric("itl_p99_seconds", "ITL p99", "seconds", "lower"),
    Metric("output_tokens_per_second", "total tok/s", "tokens/s", "higher", "total_tokens_per_second"),
    Metric("goodput_ratio", "goodput (SLO)", "ratio", "higher"),
    Metric("error_ratio", "errors", "ratio", "lower"),
)


# what the server's metrics say over each run's window: one figure a run, so no interval; whatif predicts them
SERVER_FIGURES = (
    # (name, label, signal, stat, unit, predicted by)
    ("requests_running_mean", "running (server, mean)", "requests_running", "mean", "requests", "requests_running"),
    ("requests_waiting_mean", "waiting (server, mean)", "requests_waiting", "mean", "requests", "requests_waiting"),
    ("kv_peak_ratio", "KV peak (server)", "kv_cache_usage_ratio", "max", "ratio", "kv_peak_ratio"),
    ("preemptions_per_second", "preemptions (server)", "preemptions_per_second", "rate", "per second",
     "preemptions_per_second"),
)  # fmt: skip


def server_figures(before: LoadPoint, after: LoadPoint) -> list[MetricDiff]:
    """The server-side figures of both runs' verdicts, where the server exposes them."""
    rows = []
    for name, label, signal, stat, unit, _ in SERVER_FIGURES:
        b, a = (_stat(p, signal, stat) for p in (before, after))
        if b is None and a is None:
            continue
        row = MetricDiff(name=name, label=label, unit=unit, better="lower", before=b, after=a)
        if a is not None and b is not None:
            row.difference, row.change = a - b, "server gauge"
        rows.append(row)
    return rows


def _stat(point: LoadPoint, signal: str, stat: str) -> float | None:
    found = point.verdict.signals.get(signal) if point.verdict is not None else None
    return found.stat(stat) if found is not None else None


# --- the bootstrap ------------------------------------------------------------------------------------------


def compare_point(before: LoadPoint, after: LoadPoint, slo: Slo, seed: int) -> list[MetricDiff]:
    """Every metric of METRICS: before, after, the difference and its bootstrap interval."""
    runs = Run.of(before, slo), Run.of(after, slo)
    full = [run.statistics(None, full_gaps=True) for run in runs]
    # the same statistics on the strided gaps: the resampled differences are centred on these
    centre = [run.statistics(None) for run in runs]
    rng = random.Random(seed)
    shifts: list[list[float]] = [[] for _ in METRICS]
    if all(len(run) >= 2 for run in runs):
        for _ in range(RESAMPLES):
            b, a = (run.statistics(run.resample(rng)) for run in runs)
            for k, (vb, va, cb, ca) in enumerate(zip(b, a, centre[0], centre[1], strict=True)):
                if vb is not None and va is not None and cb is not None and ca is not None:
                    shifts[k].append((va - vb) - (ca - cb))
    return [_diff(m, full[0][k], full[1][k], shifts[k]) for k, m in enumerate(METRICS)]


def _diff(metric: Metric, before: float | None, after: float | None, shifts: list[float]) -> MetricDiff:
    diff = MetricDiff(
        name=metric.name, label=metric.label, unit=metric.unit, better=metric.better, before=before, after=after
    )
    if before is None or after is None:
        return diff
    diff.difference = after - before
    # at least half the resamples must give the statistic, or the interval says nothing
    if len(shifts) < RESAMPLES // 2:
        return diff
    shifts.sort()
    tail = (1 - CONFIDENCE) / 2
    low, high = quantile(shifts, tail), quantile(shifts, 1 - tail)
    assert low is not None and high is not None
    diff.ci_low, diff.ci_high = diff.difference + low, diff.difference + high
    if diff.ci_low > 0 or diff.ci_high < 0:
        higher = diff.ci_low > 0
        diff.change = "better" if higher == (metric.better == "higher") else "worse"
    else:
        diff.change = "no change shown"
    return diff


def _attach_prediction(metrics: list[MetricDiff], prediction: WhatIf) -> None:
    figures = prediction.after.model_dump()
    band = prediction.band_ratio
    predicted_by = {m.name: m.predicted_by for m in METRICS} | {row[0]: row[5] for row in SERVER_FIGURES}
    for diff in metrics:
        figure = predicted_by.get(diff.name)
        value = figures.get(figure) if figure else None
        if value is None:
            continue
        diff.predicted = value
        if band is not None:
            diff.predicted_low, diff.predicted_high = value * (1 - band), value * (1 + band)


def compare(
    baseline: LoadReport,
    run: LoadReport,
    baseline_name: str,
    prediction: WhatIf | None = None,
    prediction_name: str = "",
) -> Comparison:
    """The A/B of ``run`` against ``baseline`` (refused unless comparable), level by level."""
    assert run.workload is not None, "a replay carries its workload"
    check_comparable(baseline, run.workload, baseline_name)
    workload = run.workload
    slo = Slo(workload.slo_ttft_seconds, workload.slo_tpot_seconds)
    result = Comparison(
        baseline=baseline_name,
        model=workload.model,
        server_version=workload.server_version,
        confidence_level=CONFIDENCE,
        resamples=RESAMPLES,
        seed=workload.seed,
        method=METHOD.format(resamples=RESAMPLES, seed=workload.seed),
    )
    if prediction is not None:
        result.prediction_source = prediction_name
        result.prediction_changes = dict(prediction.changes)
        result.next_limit_predicted = prediction.next_limit
        if not prediction.modelled:
            result.prediction_not_modelled = prediction.not_modelled_reason or "whatif made no prediction"
    for before, after in zip(baseline.points, run.points, strict=True):
        level = LevelComparison(
            users=after.users,
            rate_per_second=after.rate_per_second,
            requests_before=len(before.samples or []),
            requests_after=len(after.samples or []),
            metrics=compare_point(before, after, slo, workload.seed) + server_figures(before, after),
            class_before=before.verdict.bottleneck.value if before.verdict is not None else None,
            class_after=after.verdict.bottleneck.value if after.verdict is not None else None,
        )
        if prediction is not None and prediction.modelled:
            _attach_prediction(level.metrics, prediction)
            level.class_predicted = prediction.class_after
        if min(level.requests_before, level.requests_after) < 2:
            result.notes.append(f"{_where(after)}: too few requests on one side for an interval")
        result.levels.append(level)
    return result


def _where(point: LoadPoint) -> str:
    return f"{point.users} users" if point.users is not None else f"{point.rate_per_second:g} requests/s"
