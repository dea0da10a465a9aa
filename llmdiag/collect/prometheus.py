"""Read Prometheus text exposition and turn a series of scrapes into windowed values.

Parsing is prometheus_client's parser; this module adds what a diagnosis needs on top:
counter increases with reset handling, histogram quantiles from bucket deltas inside the window
(the same interpolation as PromQL's ``histogram_quantile``), and gauge statistics across scrapes.

A single scrape can still be judged with *lifetime* values: the window then starts at a virtual
empty scrape at the process start time, where every counter and histogram was zero.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise

from prometheus_client.parser import text_string_to_metric_families

from llmdiag.errors import ExpositionParseError, NotMetricsError

LabelKey = tuple[tuple[str, str], ...]


def label_key(labels: Mapping[str, str], drop: Iterable[str] = ()) -> LabelKey:
    dropped = set(drop)
    return tuple(sorted((k, v) for k, v in labels.items() if k not in dropped))


@dataclass
class Scrape:
    """One parsed exposition: sample name → {label set → value}."""

    at_unix: float | None
    series: dict[str, dict[LabelKey, float]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    size_bytes: int = 0
    # sample name → why it has no value (a local probe's call failed); exposition pages leave this empty
    unavailable: dict[str, str] = field(default_factory=dict)

    def names(self) -> set[str]:
        return set(self.series)

    def has(self, name: str) -> bool:
        return bool(self.series.get(name))


def parse_exposition(text: str, at_unix: float | None, origin: str = "metrics page") -> Scrape:
    stripped = text.lstrip()
    if not stripped:
        raise NotMetricsError(f"{origin} is empty")
    if stripped.startswith("<"):
        raise NotMetricsError(f"{origin} is an HTML/XML page, not Prometheus metrics")
    if stripped.startswith(("{", "[")):
        raise NotMetricsError(
            f"{origin} is JSON, not Prometheus text",
            "TensorRT-LLM's /metrics is JSON iteration stats: point --metrics-url at /prometheus/metrics",
        )
    if not text.endswith("\n"):
        # every exporter ends the page with a newline; a missing one means the body was cut off
        raise ExpositionParseError(f"{origin} ends mid-line: the exposition is truncated")
    scrape = Scrape(at_unix=at_unix, size_bytes=len(text))
    try:
        _parse_into(scrape, text)
    except Exception as exc:  # the parser raises ValueError, IndexError, KeyError… on garbage
        # dcgm-exporter writes 'ERROR - FAILED TO CONVERT TO STRING' for fields it cannot read: drop such samples,
        # say which, and keep the rest of the page; a page that is garbage throughout still fails
        kept, unreadable = _drop_unreadable_samples(text)
        if not unreadable:
            raise ExpositionParseError(f"{origin} is not valid Prometheus text: {exc}") from None
        scrape = Scrape(at_unix=at_unix, size_bytes=len(text))
        try:
            _parse_into(scrape, kept)
        except Exception:
            scrape.series.clear()
        if not scrape.series:
            raise ExpositionParseError(f"{origin} is not valid Prometheus text: {exc}") from None
        for name, value in unreadable.items():
            scrape.unavailable[name] = f"the exporter wrote '{value}' instead of a number"
    if not scrape.series:
        raise NotMetricsError(f"{origin} holds no metric samples")
    return scrape


def _parse_into(scrape: Scrape, text: str) -> None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            scrape.series.setdefault(sample.name, {})[label_key(sample.labels)] = float(sample.value)
            scrape.types.setdefault(sample.name, family.type)


def _drop_unreadable_samples(text: str) -> tuple[str, dict[str, str]]:
    """The page without sample lines whose value is not a number, and those samples' names → what they held."""
    kept: list[str] = []
    unreadable: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, rest = line.partition("{") if "{" in line.split(" ", 1)[0] else line.partition(" ")
            value = rest.rpartition("}")[2].strip() if "{" in line.split(" ", 1)[0] else rest.strip()
            try:
                float(value.split()[0] if value else "")
            except ValueError:
                unreadable[name.strip()] = value
                continue
        kept.append(line)
    return "\n".join(kept) + "\n", unreadable


def _matches(key: LabelKey, match: Mapping[str, str]) -> bool:
    if not match:
        return True
    labels = dict(key)
    return all(labels.get(k) == v for k, v in match.items())


def select(scrape: Scrape, name: str, match: Mapping[str, str] = ()) -> dict[LabelKey, float]:
    return {k: v for k, v in scrape.series.get(name, {}).items() if _matches(k, dict(match))}


# ---------------------------------------------------------------------------------------------
# counters


@dataclass
class CounterWindow:
    increase: float
    per_series: dict[LabelKey, float]
    resets: int


def counter_increase(scrapes: list[Scrape], name: str, match: Mapping[str, str] = ()) -> CounterWindow:
    """Sum of per-series increases between consecutive scrapes.

    A value lower than the one before is a reset (process restart): the counter restarted from zero,
    so the new value itself is the increase. A series absent from the previous scrape started at zero.
    """
    per_series: dict[LabelKey, float] = {}
    resets = 0
    for before, after in pairwise(scrapes):
        prev = select(before, name, match)
        for key, value in select(after, name, match).items():
            old = prev.get(key, 0.0)
            if value < old:
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

    def quantile(self, q: float) -> float | None:
        return bucket_quantile(q, self.buckets)

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count > 0 else None


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


def histogram_window(scrapes: list[Scrape], base: str, match: Mapping[str, str] = ()) -> HistogramWindow | None:
    """Bucket deltas between consecutive scrapes, with per-series reset handling. None if no buckets."""
    if not any(scrapes[i].has(f"{base}_bucket") for i in range(len(scrapes))):
        return None
    summed: dict[float, float] = {}
    count = total = 0.0
    resets = 0
    for before, after in pairwise(scrapes):
        prev_b = _bucket_series(before, base, match)
        prev_sum = select(before, f"{base}_sum", match)
        prev_cnt = select(before, f"{base}_count", match)
        after_sum = select(after, f"{base}_sum", match)
        after_cnt = select(after, f"{base}_count", match)
        for key, bounds in _bucket_series(after, base, match).items():
            old = prev_b.get(key, {})
            cnt_now = after_cnt.get(key, bounds.get(math.inf, 0.0))
            cnt_old = prev_cnt.get(key, old.get(math.inf, 0.0))
            reset = cnt_now < cnt_old
            resets += reset
            for le, value in bounds.items():
                summed[le] = summed.get(le, 0.0) + (value if reset else value - old.get(le, 0.0))
            count += cnt_now if reset else cnt_now - cnt_old
            sum_now = after_sum.get(key, 0.0)
            total += sum_now if reset else sum_now - prev_sum.get(key, 0.0)
    buckets = sorted(summed.items())
    if buckets and not math.isinf(buckets[-1][0]):
        buckets.append((math.inf, count))
    return HistogramWindow(buckets=buckets, count=count, total=total, resets=resets)


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


AGGREGATORS = {
    "sum": sum,
    "mean": lambda vs: sum(vs) / len(vs),
    "max": max,
    "min": min,
}


def gauge_window(
    scrapes: list[Scrape], name: str, match: Mapping[str, str] = (), aggregate: str = "sum"
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
