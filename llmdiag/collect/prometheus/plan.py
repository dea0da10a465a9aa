"""What to ask: the window and scrape interval, the instances, and the PromQL generated from the probe specs.

Durations, selectors and escaping are llmdiag.schema.promql's, shared with the rule export (llmdiag rules export)."""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from datetime import datetime

from llmdiag.collect.prometheus.api import PrometheusSource
from llmdiag.errors import PrometheusQueryError, UsageError
from llmdiag.model import SignalSet
from llmdiag.schema.loader import load_probe
from llmdiag.schema.probes import ProbeSpec, SignalSpec
from llmdiag.schema.promql import INSTANCE_LABELS, parse_duration
from llmdiag.schema.promql import selector_matchers as selector_matchers  # re-exported: the fleet mode's option
from llmdiag.schema.promql import vector as _vector

SERVER_PROBES = ("vllm", "sglang", "tgi", "llamacpp", "trtllm", "triton")
QUANTILES = ((0.5, "p50"), (0.9, "p90"), (0.95, "p95"), (0.99, "p99"))
TAG = "llmdiag_part"  # a label the histogram query adds to tell its parts apart
MIN_WINDOW_INTERVALS = 4  # a rate needs samples: W is at least this many scrape intervals
DEFAULT_WINDOW_SECONDS = 60.0
MAX_GAUGE_POINTS = 120  # per series, per gauge query: longer windows average over longer steps
DEFAULT_TIMELINE_STEPS = 30
FALLBACK_INTERVAL_SECONDS = 15.0  # Prometheus's default scrape_interval, when nothing better is known


# --------------------------------------------------------------------------------------------------------------------
# times, windows and the selector


def parse_time(text: str, what: str = "time", now: float | None = None) -> float:
    """Unix seconds, an ISO 8601 time (a naive one is local time), a time of day (HH:MM[:SS], the last one), 'now',
    or a span ago ('10m' = ten minutes ago)."""
    now = time.time() if now is None else now
    raw = text.strip()
    if raw == "now":
        return now
    try:
        value = float(raw)
        if value > 1e8:  # unix seconds; smaller numbers read as seconds ago
            return value
        return now - value
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        pass
    if re.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?", raw):  # a time of day: today's, or yesterday's if still to come
        hms = [int(x) for x in raw.split(":")] + [0]
        today = datetime.fromtimestamp(now).replace(hour=hms[0], minute=hms[1], second=hms[2], microsecond=0)
        stamp = today.timestamp()
        return stamp if stamp <= now else stamp - 86400.0
    try:
        return now - parse_duration(raw.removesuffix(" ago").removesuffix("ago").strip().lstrip("-"), what)
    except UsageError:
        hint = "give unix seconds, an ISO time (2025-01-31T14:05:00Z) or a span ago (10m)"
        raise UsageError(f"{what} '{text}' is not a time", hint) from None


def simple_matchers(inner: str) -> dict[str, str]:
    """The ``label="value"`` equality matchers of a selector (to pick its targets' scrape interval)."""
    return dict(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"([^"]*)"', inner))


# --------------------------------------------------------------------------------------------------------------------
# results


@dataclass
class PrometheusResult:
    """One evaluation: a SignalSet per instance (key: 'job/instance', or 'namespace/pod' in Kubernetes)."""

    instances: dict[str, SignalSet] = field(default_factory=dict)
    queries: int = 0  # HTTP requests made to the query API for this result (a timeline: for all its steps)
    notes: list[str] = field(default_factory=list)
    scrape_interval_seconds: float | None = None
    window_seconds: float | None = None
    end_unix: float | None = None
    prometheus_url: str = ""


@dataclass
class _Plan:
    """What one evaluation asks: the window and, per instance, which server and which wire names it has."""

    inner: str
    end: float
    window: float
    interval: float
    # instance key → its instance labels
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    # instance key → metric names seen for it in the window
    names: dict[str, set[str]] = field(default_factory=dict)
    # instance key → probe name (vllm, sglang …), or None: nothing recognised
    probe: dict[str, str | None] = field(default_factory=dict)
    dcgm_names: set[str] = field(default_factory=set)
    dcgm_groups: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def instance_key(labels: dict[str, str]) -> str:
    if labels.get("pod"):
        return f"{labels['namespace']}/{labels['pod']}" if labels.get("namespace") else labels["pod"]
    job, inst = labels.get("job", ""), labels.get("instance", "")
    return f"{job}/{inst}" if job and inst else (inst or job or "(no instance label)")


def _wire_candidates(spec: SignalSpec) -> list[str]:
    """The names a signal may be stored under in Prometheus (histograms: their _count series)."""
    return [m + "_count" if spec.kind == "histogram" else m for m in spec.metrics]


def _all_names(spec: ProbeSpec) -> set[str]:
    names = {n for s in spec.signal for n in _wire_candidates(s)}
    names |= {s.divide_by for s in spec.signal if s.divide_by}
    if spec.config_metric:
        names.add(spec.config_metric)
    return names


def _name_regex(names: set[str]) -> str:
    return "|".join(re.escape(n).replace("\\:", ":") for n in sorted(names))


def _chosen_wire(spec: SignalSpec, names: set[str]) -> str | None:
    for metric, candidate in zip(spec.metrics, _wire_candidates(spec), strict=True):
        if candidate in names:
            return metric
    return None


def _scrape_interval(text: object) -> float | None:
    """A target's scrapeInterval ('15s', '1m'), or None where the answer holds something else."""
    if not isinstance(text, str) or not text:
        return None
    try:
        seconds = parse_duration(text)
    except UsageError:
        return None
    return seconds if seconds < math.inf else None


def discover_interval(source: PrometheusSource, inner: str, notes: list[str]) -> float:
    """The scrape interval of the selected targets: /api/v1/targets, else sample spacing, else 15 s (noted)."""
    targets = source.targets()
    wanted = simple_matchers(inner)
    if targets:
        chosen = [t for t in targets if all(t.get("labels", {}).get(k) == v for k, v in wanted.items())] or targets
        intervals = [i for t in chosen if (i := _scrape_interval(t.get("scrapeInterval"))) is not None]
        if intervals:
            return max(intervals)
    try:  # Mimir, Thanos: no targets API; the spacing of `up`'s samples over 5 minutes
        rows = source.query(f"max(count_over_time({_vector('up', inner)}[5m]))", time.time())
        count = float(rows[0]["value"][1]) if rows and "value" in rows[0] else 0.0
        if 2 <= count < math.inf:
            return 300.0 / count
    except PrometheusQueryError:
        pass
    notes.append(f"scrape interval unknown (no targets API, no 'up' samples): assumed {FALLBACK_INTERVAL_SECONDS:g} s")
    return FALLBACK_INTERVAL_SECONDS


def _plan(source: PrometheusSource, inner: str, end: float, span: float, interval: float) -> _Plan:
    """Which instances the selector has over [end - span, end], which server each runs, and the DCGM series."""
    plan = _Plan(inner=inner, end=end, window=span, interval=interval)
    server_specs = [load_probe(name) for name in SERVER_PROBES]
    names = set().union(*(_all_names(s) for s in server_specs))
    selector = "{" + ",".join([f'__name__=~"{_name_regex(names)}"'] + ([inner] if inner else [])) + "}"
    rows = source.series(selector, end - span, end)
    up = source.series("{" + ",".join(['__name__="up"'] + ([inner] if inner else [])) + "}", end - span, end)
    for labels in [*rows, *up]:
        own = {k: labels[k] for k in INSTANCE_LABELS if labels.get(k)}
        key = instance_key(own)
        plan.labels.setdefault(key, own)
        plan.names.setdefault(key, set())
        if labels.get("__name__") != "up":
            plan.names[key].add(labels["__name__"])
    for key, seen in plan.names.items():
        best, score = None, 0
        for spec in server_specs:
            hits = sum(1 for n in seen if n.startswith(tuple(spec.detect_prefixes)))
            if hits > score:
                best, score = spec.name, hits
        plan.probe[key] = best
    dcgm = load_probe("dcgm")
    dcgm_rows = source.series("{" + f'__name__=~"{_name_regex(_all_names(dcgm))}"' + "}", end - span, end)
    plan.dcgm_names = {r["__name__"] for r in dcgm_rows}
    groups: dict[tuple, dict[str, str]] = {}
    for r in dcgm_rows:
        group = {k: r[k] for k in ("job", "instance", "namespace", "pod", "Hostname", "hostname") if r.get(k)}
        groups.setdefault(tuple(sorted(group.items())), group)
    plan.dcgm_groups = list(groups.values())
    return plan


# --------------------------------------------------------------------------------------------------------------------
# queries


@dataclass
class _Query:
    """One PromQL expression and where its answer goes."""

    expr: str
    kind: str  # counter | gauge | histogram | info
    wire: str
    mode: str  # instant | range
    step: float = 0.0
    failure: str | None = None
    rows: list[dict] = field(default_factory=list)
    # instance key → its rows, each with "pts": {unix time (ms-rounded): value}
    index: dict[str, list[dict]] = field(default_factory=dict)

    def keep(self, rows: list[dict]) -> None:
        self.rows = rows
        for row in rows:
            raw = row["values"] if "values" in row else [row["value"]]
            row["pts"] = {round(float(t), 3): float(v) for t, v in raw if not math.isnan(float(v))}
            own = {k: row["metric"][k] for k in INSTANCE_LABELS if row["metric"].get(k)}
            self.index.setdefault(instance_key(own), []).append(row)


def _group_by(extra: list[str]) -> str:
    return ", ".join([*INSTANCE_LABELS, *extra])


def _histogram_expr(wire: str, inner: str, match: dict[str, str], window: str) -> str:
    by = _group_by(sorted(match))
    bucket = f"sum by ({by}, le) (rate({_vector(wire + '_bucket', inner, match)}[{window}]))"
    parts = [f'label_replace(histogram_quantile({q:g}, {bucket}), "{TAG}", "{key}", "", "")' for q, key in QUANTILES]
    parts.append(
        f"label_replace(sum by ({by}, le) (increase({_vector(wire + '_bucket', inner, match)}[{window}])), "
        f'"{TAG}", "bucket", "", "")'
    )
    parts.append(
        f"label_replace(sum by ({by}) (increase({_vector(wire + '_sum', inner, match)}[{window}])), "
        f'"{TAG}", "sum", "", "")'
    )
    return " or ".join(parts)


# --------------------------------------------------------------------------------------------------------------------
# the public functions


def choose_window(interval: float, span: float | None) -> tuple[float, str]:
    """W from the requested span and the scrape interval: at least MIN_WINDOW_INTERVALS intervals."""
    floor = MIN_WINDOW_INTERVALS * interval
    if span is None:
        return max(DEFAULT_WINDOW_SECONDS, floor), ""
    if span < floor:
        return floor, (
            f"the requested {span:g} s is under {MIN_WINDOW_INTERVALS} scrape intervals "
            f"({interval:g} s each): widened to {floor:g} s"
        )
    return span, ""
