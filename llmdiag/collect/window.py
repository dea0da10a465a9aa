"""Counters, histograms and gauges over a window of scrapes: increases, bucket deltas and quantiles, gauge
statistics."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise

from llmdiag.collect.exposition import ANY_LABELS, LabelKey, Scrape, label_key, select

# ---------------------------------------------------------------------------------------------
# counters

PROCESS_START = "process_start_time_seconds"


def restarted(before: Scrape, after: Scrape) -> bool:
    """The page's process started again between two scrapes: its ``process_start_time_seconds`` moved. Every
    counter of ``after`` then counts from zero, even one that has already grown past its value in ``before``
    (a long outage, a busy new process), which going backwards alone would miss."""
    old, new = select(before, PROCESS_START), select(after, PROCESS_START)
    return any(key in old and new[key] != old[key] for key in new)


@dataclass
class CounterWindow:
    increase: float
    per_series: dict[LabelKey, float]
    resets: int


def counter_increase(scrapes: list[Scrape], name: str, match: Mapping[str, str] = ANY_LABELS) -> CounterWindow:
    """Sum of per-series increases between consecutive scrapes.

    A value lower than the one before is a reset (process restart), as is a new process start time: the counter
    restarted from zero, so the new value itself is the increase. A series absent from the previous scrape started
    at zero.
    """
    per_series: dict[LabelKey, float] = {}
    resets = 0
    for before, after in pairwise(scrapes):
        prev = select(before, name, match)
        new_process = restarted(before, after)
        for key, value in select(after, name, match).items():
            old = prev.get(key, 0.0)
            if value < old or (new_process and key in prev):
                resets += 1
                delta = value
            else:
                delta = value - old
            per_series[key] = per_series.get(key, 0.0) + delta
    return CounterWindow(sum(per_series.values()), per_series, resets)


# ---------------------------------------------------------------------------------------------
# histograms


@dataclass
class HistogramWindow:
    """Bucket counts (cumulative, by upper bound) observed inside the window, summed over series."""

    buckets: list[tuple[float, float]]  # (upper bound, cumulative count), sorted, last is +Inf
    count: float
    total: float
    resets: int = 0
    # per interval between scrapes: (the later scrape's time, bucket deltas by upper bound, count, sum)
    intervals: list[tuple[float, dict[float, float], float, float]] = field(default_factory=list)

    def quantile(self, q: float) -> float | None:
        return bucket_quantile(q, self.buckets)

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count > 0 else None

    def sum_in_window_max(self, start_unix: float, scale: float = 1.0) -> float | None:
        """The most of ``total`` (a sum of durations, in seconds after ``scale``) that can lie after ``start_unix``.

        A server observes a duration when it ends (vLLM: queue time when the request is scheduled or finishes),
        so a request that queued before the window is counted in full by the first scrape after it ends. An
        observation first counted by a scrape at t_k ended by t_k, so at most t_k - start of it lies inside the
        window; its bucket bounds it too. Per interval: min(its sum, Σ bucket count × min(upper bound, t_k -
        start)), the +Inf bucket at t_k - start. None when an interval has no time."""
        bound = 0.0
        for end_unix, deltas, count, total in self.intervals:
            inside = end_unix - start_unix
            if math.isnan(inside):
                return None
            inside = max(inside, 0.0)
            by_buckets, below = 0.0, 0.0
            for upper, cumulative in sorted(deltas.items()):
                in_bucket = max(cumulative - below, 0.0)
                by_buckets += in_bucket * min(upper * scale, inside)
                below = max(below, cumulative)
            by_buckets += max(count - below, 0.0) * inside  # above the largest bound (or no +Inf bucket)
            bound += min(total * scale, by_buckets)
        return bound


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """PromQL ``histogram_quantile``: linear interpolation inside the bucket holding the rank.

    Returns None when there are no observations. A rank in the +Inf bucket returns the largest
    finite bound, as Prometheus does (the true value is larger: callers treat it as a lower bound).
    """
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for upper, cumulative in buckets:
        if cumulative >= rank:
            if math.isinf(upper):
                return lower_bound
            if cumulative == lower_count:
                return upper
            if upper <= 0:
                return upper
            return lower_bound + (upper - lower_bound) * (rank - lower_count) / (cumulative - lower_count)
        lower_bound, lower_count = upper, cumulative
    return lower_bound


def _bucket_series(scrape: Scrape, base: str, match: Mapping[str, str]) -> dict[LabelKey, dict[float, float]]:
    out: dict[LabelKey, dict[float, float]] = {}
    for key, value in select(scrape, f"{base}_bucket", match).items():
        labels = dict(key)
        le = labels.pop("le", None)
        if le is None:
            continue
        out.setdefault(label_key(labels), {})[float(le)] = value
    return out


def histogram_window(scrapes: list[Scrape], base: str, match: Mapping[str, str] = ANY_LABELS) -> HistogramWindow | None:
    """Bucket deltas between consecutive scrapes, with per-series reset handling. None if no buckets."""
    if not any(scrapes[i].has(f"{base}_bucket") for i in range(len(scrapes))):
        return None
    summed: dict[float, float] = {}
    count = total = 0.0
    resets = 0
    intervals: list[tuple[float, dict[float, float], float, float]] = []
    for before, after in pairwise(scrapes):
        step: dict[float, float] = {}
        step_count = step_total = 0.0
        prev_b = _bucket_series(before, base, match)
        prev_sum = select(before, f"{base}_sum", match)
        prev_cnt = select(before, f"{base}_count", match)
        after_sum = select(after, f"{base}_sum", match)
        after_cnt = select(after, f"{base}_count", match)
        new_process = restarted(before, after)
        for key, bounds in _bucket_series(after, base, match).items():
            old = prev_b.get(key, {})
            cnt_now = after_cnt.get(key, bounds.get(math.inf, 0.0))
            cnt_old = prev_cnt.get(key, old.get(math.inf, 0.0))
            reset = cnt_now < cnt_old or (new_process and bool(old))
            resets += reset
            for le, value in bounds.items():
                step[le] = step.get(le, 0.0) + (value if reset else value - old.get(le, 0.0))
            step_count += cnt_now if reset else cnt_now - cnt_old
            sum_now = after_sum.get(key, 0.0)
            step_total += sum_now if reset else sum_now - prev_sum.get(key, 0.0)
        for le, value in step.items():
            summed[le] = summed.get(le, 0.0) + value
        count += step_count
        total += step_total
        at = after.at_unix if after.at_unix is not None else math.nan
        intervals.append((at, step, step_count, step_total))
    buckets = sorted(summed.items())
    if buckets and not math.isinf(buckets[-1][0]):
        buckets.append((math.inf, count))
    return HistogramWindow(buckets=buckets, count=count, total=total, resets=resets, intervals=intervals)


# ---------------------------------------------------------------------------------------------
# gauges


@dataclass
class GaugeWindow:
    points: list[tuple[float | None, float]]  # (scrape time, aggregated value)
    per_series_mean: dict[LabelKey, float]

    @property
    def values(self) -> list[float]:
        return [v for _, v in self.points]

    def stats(self) -> dict[str, float]:
        values = self.values
        if not values:
            return {}
        ordered = sorted(values)
        p90 = ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]
        return {
            "last": values[-1],
            "mean": sum(values) / len(values),
            "min": ordered[0],
            "max": ordered[-1],
            "p90": p90,
        }


AGGREGATORS: dict[str, Callable[[list[float]], float]] = {
    "sum": sum,
    "mean": lambda vs: sum(vs) / len(vs),
    "max": max,
    "min": min,
}


def gauge_window(
    scrapes: list[Scrape], name: str, match: Mapping[str, str] = ANY_LABELS, aggregate: str = "sum"
) -> GaugeWindow:
    agg = AGGREGATORS[aggregate]
    points: list[tuple[float | None, float]] = []
    per_series: dict[LabelKey, list[float]] = {}
    for scrape in scrapes:
        found = select(scrape, name, match)
        if not found:
            continue
        points.append((scrape.at_unix, float(agg(list(found.values())))))
        for key, value in found.items():
            per_series.setdefault(key, []).append(value)
    return GaugeWindow(points, {k: sum(v) / len(v) for k, v in per_series.items()})
