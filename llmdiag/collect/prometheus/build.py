"""Query results -> one SignalSet per instance (the same builder as a scraped page), with DCGM joined by pod or host."""

from __future__ import annotations

import math
import time
from datetime import datetime

from llmdiag.collect.exposition import LabelKey, Scrape, label_key
from llmdiag.collect.prometheus.api import PrometheusSource
from llmdiag.collect.prometheus.plan import (
    DEFAULT_TIMELINE_STEPS,
    MAX_GAUGE_POINTS,
    MIN_WINDOW_INTERVALS,
    SERVER_PROBES,
    TAG,
    PrometheusResult,
    _chosen_wire,
    _histogram_expr,
    _Plan,
    _plan,
    _Query,
    _wire_candidates,
    choose_window,
    discover_interval,
)
from llmdiag.collect.signals import SignalBuilder
from llmdiag.errors import PrometheusQueryError, UsageError, option
from llmdiag.model import Signal, SignalSet, SourceInfo, Window
from llmdiag.schema.loader import load_probe
from llmdiag.schema.probes import ProbeSpec, SignalSpec
from llmdiag.schema.promql import INSTANCE_LABELS, selector_matchers
from llmdiag.schema.promql import duration as _dur
from llmdiag.schema.promql import vector as _vector


class _Runner:
    """Builds the queries for a plan (deduplicated), runs them, and keeps each one's rows or failure."""

    def __init__(self, source: PrometheusSource, plan: _Plan, timeline_step: float | None) -> None:
        self.source = source
        self.plan = plan
        self.timeline_step = timeline_step
        self.queries: dict[tuple[str, str, tuple], _Query] = {}
        if timeline_step is None:
            self.gauge_step = max(plan.interval, plan.window / MAX_GAUGE_POINTS)
        else:
            self.gauge_step = timeline_step

    def window_text(self) -> str:
        return _dur(self.timeline_step if self.timeline_step is not None else self.plan.window)

    def want(self, spec: SignalSpec, wire: str, inner: str) -> _Query:
        """The query for one signal's wire name (shared by signals reading the same name)."""
        w = self.window_text()
        if spec.kind == "counter":
            expr, kind = f"increase({_vector(wire, inner)}[{w}])", "counter"
        elif spec.kind == "histogram":
            expr, kind = _histogram_expr(wire, inner, spec.match, w), "histogram"
        elif spec.kind == "info":
            expr, kind = f"last_over_time({_vector(wire, inner)}[{w}])", "info"
        else:
            fn = "last_over_time"
            averaged = self.gauge_step > self.plan.interval * 1.5 and spec.any_bits is None
            if averaged:
                fn = "avg_over_time"
            expr, kind = f"{fn}({_vector(wire, inner)}[{_dur(self.gauge_step)}])", "gauge"
        mode = "range" if kind == "gauge" or self.timeline_step is not None else "instant"
        key = (expr, mode, ())
        if key not in self.queries:
            self.queries[key] = _Query(expr=expr, kind=kind, wire=wire, mode=mode, step=self.gauge_step)
        return self.queries[key]

    def run(self) -> None:
        plan = self.plan
        for query in self.queries.values():
            try:
                if query.mode == "instant":
                    query.keep(self.source.query(query.expr, plan.end))
                else:
                    start = plan.end - plan.window + (query.step if self.timeline_step is not None else 0.0)
                    query.keep(self.source.query_range(query.expr, start, plan.end, query.step))
            except PrometheusQueryError as exc:
                query.failure = exc.message
                plan.notes.append(exc.message)

    def verify(self, query: _Query) -> str:
        plan = self.plan
        if query.mode == "instant":
            return self.source.curl(query.expr, plan.end)
        return self.source.curl(query.expr, range_=(plan.end - plan.window, plan.end, query.step))


# --------------------------------------------------------------------------------------------------------------------
# turning query rows into signals


def _scrapes_for(
    query: _Query, rows: list[dict], times: list[float], start_of: dict[float, float]
) -> dict[float, list[Scrape]]:
    """For each evaluation time: the scrapes SignalBuilder reads for this query's rows (one instance's rows)."""
    out: dict[float, list[Scrape]] = {}
    wire = query.wire
    for t in times:
        scrapes: list[Scrape] = []
        if query.kind == "gauge":
            by_time: dict[float, dict[LabelKey, float]] = {}
            for row in rows:
                key = label_key(row["metric"], drop=("__name__",))
                for pt, value in row["pts"].items():
                    if start_of[t] + 1e-3 < pt <= t + 1e-3:
                        by_time.setdefault(pt, {})[key] = value
            scrapes = [Scrape(at_unix=pt, series={wire: series}) for pt, series in sorted(by_time.items())]
        elif query.kind in ("counter", "info"):
            series = {}
            for row in rows:
                key = label_key(row["metric"], drop=("__name__",))
                value = row["pts"].get(round(t, 3))
                if value is not None:
                    series[key] = value
            if series:
                zero = Scrape(at_unix=start_of[t], series={wire: dict.fromkeys(series, 0.0)})
                scrapes = [zero, Scrape(at_unix=t, series={wire: series})]
        out[t] = scrapes
    return out


def _histogram_parts(rows: list[dict], t: float) -> tuple[dict[str, dict[LabelKey, float]], dict[str, float]]:
    """The histogram query's rows at time t: bucket/sum/count series (as a scrape holds them) and the quantiles."""
    series: dict[str, dict[LabelKey, float]] = {"_bucket": {}, "_sum": {}, "_count": {}}
    quantiles: dict[str, float] = {}
    for row in rows:
        labels = dict(row["metric"])
        part = labels.pop(TAG, "")
        value = row["pts"].get(round(t, 3))
        if value is None:
            continue
        if part == "bucket":
            series["_bucket"][label_key(labels)] = value
            if labels.get("le") == "+Inf":
                series["_count"][label_key(labels, drop=("le",))] = value
        elif part == "sum":
            series["_sum"][label_key(labels)] = value
        elif part:
            quantiles[part] = value
    return series, quantiles


class _InstanceBuilder:
    """One instance's SignalSet at one evaluation time, from the runner's query rows."""

    def __init__(self, runner: _Runner, key: str, t: float, window: float) -> None:
        self.runner, self.key, self.t, self.window = runner, key, t, window
        self.start = t - window
        self.own = runner.plan.labels[key]
        self.where = f"prometheus {runner.source.display_url}: {key}"

    def rows(self, query: _Query, match=None) -> list[dict]:
        if match is not None:
            return [r for r in query.rows if match(r["metric"])]
        return query.index.get(self.key, [])

    def signal(
        self, probe: ProbeSpec, spec: SignalSpec, wire: str | None, inner: str, match=None
    ) -> tuple[Signal, list[str]]:
        if wire is None:
            reason = (
                f"no series in Prometheus for this instance in the window (looked for "
                f"{', '.join(_wire_candidates(spec))})"
            )
            if spec.missing_note:
                reason += f"; {spec.missing_note}"
            return Signal.missing(spec.name, spec.kind, spec.unit, reason), []
        query = self.runner.want(spec, wire, inner)
        if query.failure is not None:
            return Signal.missing(
                spec.name,
                spec.kind,
                spec.unit,
                f"the Prometheus query failed: {query.failure}",
                source=f"prometheus: {query.expr}",
            ), []
        rows = self.rows(query, match=match)
        common = {"source": f"prometheus: {query.expr}", "verify": spec.verify or self.runner.verify(query)}
        if spec.kind == "histogram":
            parts, quantiles = _histogram_parts(rows, self.t)
            scrapes = [
                Scrape(at_unix=self.start, series={wire + s: dict.fromkeys(v, 0.0) for s, v in parts.items()}),
                Scrape(at_unix=self.t, series={wire + s: v for s, v in parts.items()}),
            ]
        else:
            by_t = _scrapes_for(query, rows, [self.t], {self.t: self.start})
            scrapes = by_t[self.t]
            if spec.divide_by and scrapes:
                other = self.runner.want(
                    SignalSpec(name="_d", kind="gauge", unit="x", metrics=[spec.divide_by], help="-"),
                    spec.divide_by,
                    inner,
                )
                extra = _scrapes_for(other, self.rows(other, match=match), [self.t], {self.t: self.start})[self.t]
                extra_at = {s.at_unix: s.series for s in extra}
                for s in scrapes:
                    s.series.update(extra_at.get(s.at_unix, {}))
        if not scrapes:
            why = "no samples in the window" if rows or query.kind != "histogram" else "no buckets in the window"
            return Signal.missing(
                spec.name,
                spec.kind,
                spec.unit,
                f"Prometheus has {wire} but {why} for this instance",
                source=common["source"],
            ), []
        builder = SignalBuilder(probe, scrapes, self.where)
        signal = builder.build(spec)
        signal.source, signal.verify = common["source"], common["verify"]
        signal.window_seconds = self.window
        if spec.kind == "counter" and signal.unavailable is None:
            signal.samples = []  # one point at the window's end says nothing a chart needs
        if spec.kind == "histogram" and signal.unavailable is None:
            for key, value in quantiles.items():
                if not math.isnan(value) and not math.isinf(value):
                    signal.stats[key] = value * spec.scale
        return signal, builder.anomalies


def _source_info(probe: ProbeSpec, runner: _Runner, key: str, builder: _InstanceBuilder) -> SourceInfo:
    models: set[str] = set()
    engines: set[str] = set()
    config: dict[str, str] = {}
    for query in runner.queries.values():
        for row in builder.rows(query):
            labels = row["metric"]
            if "model_name" in labels:
                models.add(labels["model_name"])
            if "engine" in labels:
                engines.add(labels["engine"])
            elif "dp_rank" in labels:
                engines.add(labels["dp_rank"])
            if probe.config_metric and query.wire == probe.config_metric and query.kind == "info" and not config:
                config = {k: v for k, v in labels.items() if k not in (*INSTANCE_LABELS, "__name__", "model_name")}
    return SourceInfo(
        probe=probe.name,
        url=builder.where,
        server=probe.server,
        models=sorted(models),
        engines=sorted(engines, key=lambda e: (len(e), e)),
        config=config,
        note="; ".join(["read through Prometheus", *probe.notes]),
    )


def _dcgm_host(group: dict[str, str]) -> str:
    return group.get("Hostname") or group.get("hostname") or group.get("instance", "").rsplit(":", 1)[0]


def _server_host(own: dict[str, str]) -> str:
    inst = own.get("instance", "")
    if inst.startswith("["):
        return inst[1:].split("]", 1)[0]
    return inst.rsplit(":", 1)[0] if inst.count(":") == 1 else inst


def _join_dcgm(plan: _Plan, key: str) -> tuple[list[dict[str, str]], str]:
    """The DCGM groups (one per exporter target) that belong to this instance, and how they were joined."""
    own = plan.labels[key]
    if own.get("pod"):
        space = own.get("namespace")
        by_pod = [
            g
            for g in plan.dcgm_groups
            if g.get("pod") == own["pod"] and (not space or g.get("namespace", space) == space)
        ]
        if by_pod:
            return by_pod, f"pod {own['pod']}"
    host = _server_host(own)
    by_host = [g for g in plan.dcgm_groups if host and _dcgm_host(g) == host]
    if by_host:
        return by_host, f"host {host}"
    return [], ""


def _dcgm_signals(runner: _Runner, plan: _Plan, key: str, t: float, window: float) -> SignalSet | SourceInfo:
    dcgm = load_probe("dcgm")
    if not plan.dcgm_names:
        return SourceInfo(
            probe="dcgm",
            server="DCGM exporter",
            ok=False,
            note="DCGM exporter: no DCGM_* series in this Prometheus for the window",
        )
    groups, how = _join_dcgm(plan, key)
    if not groups:
        hosts = sorted({_dcgm_host(g) for g in plan.dcgm_groups})
        pods = sorted({g["pod"] for g in plan.dcgm_groups if g.get("pod")})
        seen = f"hosts {', '.join(hosts[:5])}" + (f"; pods {', '.join(pods[:5])}" if pods else "")
        return SourceInfo(
            probe="dcgm",
            server="DCGM exporter",
            ok=False,
            note=f"DCGM exporter: GPU series are in Prometheus but none share a pod or host with {key} "
            f"(its host {_server_host(plan.labels[key]) or '?'}; DCGM {seen})",
        )
    group_keys = [tuple(sorted(g.items())) for g in groups]

    def mine(labels: dict[str, str]) -> bool:
        return any(all(labels.get(k) == v for k, v in g) for g in group_keys)

    builder = _InstanceBuilder(runner, key, t, window)
    builder.where = f"prometheus {runner.source.display_url}: DCGM joined by {how}"
    out = SignalSet()
    anomalies: list[str] = []
    for spec in dcgm.signal:
        signal, found = builder.signal(dcgm, spec, _chosen_wire(spec, plan.dcgm_names), "", match=mine)
        out.add(signal)
        anomalies += found
    out.anomalies = anomalies
    sharing = [k for k in plan.labels if k != key and _join_dcgm(plan, k)[0] == groups]
    note = f"DCGM series from Prometheus, joined by {how}"
    if sharing:
        note += f"; shared with {len(sharing)} other instance(s) there: GPU figures are that {how.split()[0]}'s"
    out.sources.append(SourceInfo(probe="dcgm", url=builder.where, server="DCGM exporter", note=note))
    return out


def _evaluate(
    source: PrometheusSource, plan: _Plan, runner: _Runner, times: list[float], window: float, inner: str
) -> list[dict[str, SignalSet]]:
    """Declare every query (first pass), run them, then build each instance's SignalSet at each time."""
    server_specs = {name: load_probe(name) for name in SERVER_PROBES}
    dcgm = load_probe("dcgm")
    # first pass: declare the queries the instances need
    for key, probe in plan.probe.items():
        if probe is None:
            continue
        for spec in server_specs[probe].signal:
            wire = _chosen_wire(spec, plan.names[key])
            if wire is not None:
                runner.want(spec, wire, inner)
                if spec.divide_by:
                    runner.want(
                        SignalSpec(name="_d", kind="gauge", unit="x", metrics=[spec.divide_by], help="-"),
                        spec.divide_by,
                        inner,
                    )
    if plan.dcgm_names and plan.dcgm_groups and any(_join_dcgm(plan, k)[0] for k in plan.probe):
        for spec in dcgm.signal:
            wire = _chosen_wire(spec, plan.dcgm_names)
            if wire is not None:
                runner.want(spec, wire, "")
    runner.run()
    out: list[dict[str, SignalSet]] = []
    for t in times:
        sets: dict[str, SignalSet] = {}
        for key in sorted(plan.labels):
            sets[key] = _instance_set(runner, plan, key, t, window, server_specs, inner)
        out.append(sets)
    return out


def _instance_set(
    runner: _Runner, plan: _Plan, key: str, t: float, window: float, server_specs: dict[str, ProbeSpec], inner: str
) -> SignalSet:
    probe_name = plan.probe.get(key)
    builder = _InstanceBuilder(runner, key, t, window)
    signal_set = SignalSet()
    signal_set.window = Window(
        kind="window",
        start_unix=t - window,
        end_unix=t,
        duration_seconds=window,
        scrapes=max(1, int(round(window / plan.interval))),
        note=f"read from Prometheus: PromQL over [{_dur(window)}] ending at "
        f"{datetime.fromtimestamp(t).isoformat(timespec='seconds')}",
    )
    if probe_name is None:
        seen = sorted(plan.names.get(key, set()))
        reason = (
            "Prometheus has this target (up) but no inference-server series from it in the window"
            if not seen
            else f"unrecognised server series ({', '.join(seen[:3])} …)"
        )
        for s in server_specs["vllm"].signal:
            signal_set.add(Signal.missing(s.name, s.kind, s.unit, reason))
        signal_set.sources.append(
            SourceInfo(probe="prometheus", url=builder.where, server="unknown", ok=False, note=reason)
        )
        return signal_set
    probe = server_specs[probe_name]
    for spec in probe.signal:
        signal, anomalies = builder.signal(probe, spec, _chosen_wire(spec, plan.names[key]), inner)
        signal_set.add(signal)
        signal_set.anomalies += anomalies
    from llmdiag.collect.signals import _by_design

    for fixed in probe.by_design:
        signal_set.add(_by_design(probe, fixed, window))
    for name, help_text in (
        (
            "counter_resets",
            "counters or histograms that went backwards in the window (PromQL's increase() handles resets)",
        ),
        ("implausible_samples", "gauge samples outside their valid range"),
    ):
        signal_set.add(Signal(name=name, kind="derived", unit="count", stats={"value": 0.0}, source=help_text))
    signal_set.sources.append(_source_info(probe, runner, key, builder))
    gpu = _dcgm_signals(runner, plan, key, t, window)
    if isinstance(gpu, SourceInfo):
        signal_set.sources.append(gpu)
    else:
        from llmdiag.collect.merge import merge_signal_sets

        merge_signal_sets(signal_set, gpu)
    if probe_name in ("trtllm", "triton"):
        signal_set.anomalies.append(
            f"{probe.server} through Prometheus: only its Prometheus series are read; the JSON iteration statistics "
            "(and what llmdiag estimates from them) are not there"
        )
    return signal_set


def _prepare(
    source: PrometheusSource, selector: str | None, end: float, span: float, interval: float | None = None
) -> tuple[_Plan, str]:
    inner = selector_matchers(selector)
    notes: list[str] = []
    if interval is None:
        interval = discover_interval(source, inner, notes)
    plan = _plan(source, inner, end, span, interval)
    plan.notes = notes + plan.notes
    if not plan.labels:
        where = f" matching {{{inner}}}" if inner else ""
        raise PrometheusQueryError(
            f"Prometheus at {source.display_url} has no inference-server series and no targets{where} between "
            f"{datetime.fromtimestamp(end - span).isoformat(timespec='seconds')} and "
            f"{datetime.fromtimestamp(end).isoformat(timespec='seconds')}",
            f"check {option('selector')} (e.g. '{{job=\"vllm\"}}') and the time range; list the jobs with: "
            f"curl -s {source.display_url}/api/v1/label/job/values",
        )
    return plan, inner


def collect_prometheus(
    source: PrometheusSource,
    selector: str | None = None,
    at_unix: float | None = None,
    window_seconds: float | None = None,
) -> PrometheusResult:
    """Each instance's SignalSet over [at - W, at] (at: now when None). ``window_seconds`` None: the default window
    (60 s, or 4 scrape intervals when longer); a span shorter than 4 intervals is widened, and a note says so."""
    before = source.queries
    notes: list[str] = []
    end = round(time.time() if at_unix is None else at_unix, 3)
    inner = selector_matchers(selector)
    interval = discover_interval(source, inner, notes)
    window, why = choose_window(interval, window_seconds)
    if why:
        notes.append(why)
    plan, inner = _prepare(source, selector, end, window, interval)
    runner = _Runner(source, plan, None)
    sets = _evaluate(source, plan, runner, [end], window, inner)[0]
    notes += plan.notes + source.warnings
    for signal_set in sets.values():
        signal_set.anomalies += [n for n in plan.notes if n.startswith("Prometheus answered")]
    return PrometheusResult(
        instances=sets,
        queries=source.queries - before,
        notes=notes,
        scrape_interval_seconds=interval,
        window_seconds=window,
        end_unix=end,
        prometheus_url=source.display_url,
    )


def collect_prometheus_timeline(
    source: PrometheusSource,
    selector: str | None,
    start_unix: float,
    end_unix: float,
    step_seconds: float | None = None,
) -> list[tuple[float, PrometheusResult]]:
    """The fleet at each step of [start, end]: at time t, each instance's SignalSet over [t - step, t]. The queries
    are range queries, so their number does not grow with the steps or the fleet. ``step_seconds`` None: about
    30 steps, and never under 4 scrape intervals."""
    if end_unix <= start_unix:
        begin, finish = option("start_unix"), option("end_unix")
        raise UsageError(
            f"{finish} must be after {begin}", f"e.g. {begin} 2025-01-31T14:00:00 {finish} 2025-01-31T15:00:00"
        )
    before = source.queries
    notes: list[str] = []
    inner = selector_matchers(selector)
    interval = discover_interval(source, inner, notes)
    span = end_unix - start_unix
    step = step_seconds if step_seconds is not None else span / DEFAULT_TIMELINE_STEPS
    floor = MIN_WINDOW_INTERVALS * interval
    if step < floor:
        if step_seconds is not None:
            notes.append(
                f"{option('step_seconds')} {step_seconds:g} s is under {MIN_WINDOW_INTERVALS} scrape intervals: "
                f"widened to {floor:g} s"
            )
        step = floor
    if span < step:
        raise UsageError(
            f"the range ({span:g} s) is shorter than one step ({step:g} s)",
            f"widen {option('start_unix')}/{option('end_unix')} or give a smaller {option('step_seconds')}",
        )
    step = round(step, 3)
    start_unix = round(start_unix, 3)
    count = int(span // step)
    end = round(start_unix + count * step, 3)
    times = [round(start_unix + (i + 1) * step, 3) for i in range(count)]
    plan, inner = _prepare(source, selector, end, end - start_unix, interval)
    plan.window = end - start_unix
    runner = _Runner(source, plan, step)
    per_time = _evaluate(source, plan, runner, times, step, inner)
    notes += plan.notes + source.warnings
    queries = source.queries - before
    out: list[tuple[float, PrometheusResult]] = []
    for t, sets in zip(times, per_time, strict=True):
        result = PrometheusResult(
            instances=sets,
            queries=queries,
            notes=notes,
            scrape_interval_seconds=interval,
            window_seconds=step,
            end_unix=t,
            prometheus_url=source.display_url,
        )
        out.append((t, result))
    return out
