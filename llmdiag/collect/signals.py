"""Apply a probe spec (probes/*.toml) to a list of scrapes: one Signal per spec entry."""

from __future__ import annotations

import math
from itertools import pairwise

from llmdiag.collect.exposition import LabelKey, Scrape, select
from llmdiag.collect.source import gpus_config
from llmdiag.collect.window import counter_increase, gauge_window, histogram_window
from llmdiag.model import Signal, SignalSet, SourceInfo, Window
from llmdiag.schema.probes import ByDesignSpec, ProbeSpec, SignalSpec

# labels that tell series of one metric apart without changing what it measures
SERIES_LABELS = ("engine", "dp_rank", "model_name", "gpu", "GPU_I_ID", "process")

# DCGM's "blank" codes (catalog, general traps): DCGM_INT64_BLANK = 0x7ffffffffffffff0 and the codes just above it
# (not found, not supported, no permission …), and DCGM_FP64_BLANK = 2**47 with its codes. As doubles the int64
# codes all read 2**63. They mean "no data" and must never be averaged as numbers.
DCGM_INT64_BLANK = float(0x7FFFFFFFFFFFFFF0)
DCGM_FP64_BLANK = 140737488355328.0
DCGM_BLANK_CODES = 16


def is_blank(value: float) -> bool:
    """True for a DCGM blank sentinel (int64 or double), i.e. a field with no value."""
    int64_blank = value >= DCGM_INT64_BLANK - DCGM_BLANK_CODES
    return int64_blank or DCGM_FP64_BLANK <= value <= DCGM_FP64_BLANK + DCGM_BLANK_CODES


def drop_blanks(scrape: Scrape, blanks: dict[str, int]) -> Scrape:
    """A copy of the scrape without blank samples; ``blanks`` counts them per sample name."""
    series: dict[str, dict[LabelKey, float]] = {}
    for name, values in scrape.series.items():
        kept = {k: v for k, v in values.items() if not is_blank(v)}
        if len(kept) < len(values):
            blanks[name] = blanks.get(name, 0) + len(values) - len(kept)
        if kept:
            series[name] = kept
    return Scrape(
        at_unix=scrape.at_unix,
        series=series,
        types=scrape.types,
        size_bytes=scrape.size_bytes,
        unavailable=scrape.unavailable,
    )


def _bits_set(scrape: Scrape, name: str, mask: int) -> Scrape:
    """The scrape with ``name``'s bitmask samples read as 1 (any bit of ``mask`` set) or 0."""
    values = scrape.series.get(name)
    if not values:
        return scrape
    flags = {k: float(bool(int(v) & mask)) for k, v in values.items()}
    return Scrape(at_unix=scrape.at_unix, series={**scrape.series, name: flags}, types=scrape.types)


MIG_LABELS = ("GPU_I_ID", "GPU_I_PROFILE")


def _one_per_gpu(scrape: Scrape, name: str) -> Scrape:
    """The scrape with ``name``'s MIG-instance copies of a device-wide value folded into one series per GPU."""
    values = scrape.series.get(name)
    if not values:
        return scrape
    folded: dict[LabelKey, float] = {}
    for key, value in values.items():
        folded.setdefault(tuple((k, v) for k, v in key if k not in MIG_LABELS), value)
    return Scrape(at_unix=scrape.at_unix, series={**scrape.series, name: folded}, types=scrape.types)


def _fold(scrape: Scrape, name: str, labels: list[str]) -> Scrape:
    """The scrape with ``name``'s series that differ only in ``labels`` (copies of one value) counted once."""
    values = scrape.series.get(name)
    if not values or not labels:
        return scrape
    folded: dict[LabelKey, float] = {}
    for key, value in values.items():
        folded.setdefault(tuple((k, v) for k, v in key if k not in labels), value)
    return Scrape(at_unix=scrape.at_unix, series={**scrape.series, name: folded}, types=scrape.types)


def _divided(scrape: Scrape, name: str, by: str) -> Scrape:
    """The scrape with ``name``'s samples divided by ``by``'s total; without a positive total, no samples."""
    total = sum(scrape.series.get(by, {}).values())
    values = scrape.series.get(name, {})
    kept = {k: v / total for k, v in values.items()} if total > 0 else {}
    return Scrape(at_unix=scrape.at_unix, series={**scrape.series, name: kept}, types=scrape.types)


def _series_name(key: LabelKey) -> str:
    labels = dict(key)
    parts = [f"{k}={labels[k]}" for k in SERIES_LABELS if k in labels]
    return ",".join(parts) or "all"


def _wire_name(spec: SignalSpec, scrapes: list[Scrape]) -> str | None:
    suffix = "_bucket" if spec.kind == "histogram" else ""
    for name in spec.metrics:
        if any(s.has(name + suffix) for s in scrapes):
            return name
    return None


class SignalBuilder:
    """Turns scrapes into signals for one probe. ``origin`` is a virtual zero scrape for lifetime mode."""

    def __init__(self, spec: ProbeSpec, scrapes: list[Scrape], source_url: str, origin: Scrape | None = None):
        self.spec = spec
        self.blanks: dict[str, int] = {}
        if spec.blank_sentinels:
            scrapes = [drop_blanks(s, self.blanks) for s in scrapes]
        self.real = scrapes
        self.window_scrapes = ([origin] if origin is not None else []) + scrapes
        self.source_url = source_url
        self.lifetime = origin is not None
        first, last = self.window_scrapes[0].at_unix, self.window_scrapes[-1].at_unix
        self.duration = (last - first) if first is not None and last is not None else None
        self.anomalies: list[str] = []
        self.resets = 0
        self.implausible = 0

    def _source(self, wire: str) -> str:
        return f"{self.spec.name} {self.spec.metrics_path}: {wire}"

    def _verify(self, wire: str, kind: str) -> str:
        grep = f"curl -s {self.source_url} | grep '^{wire}'"
        if kind == "counter":
            # the parser names counter samples *_total; exporters such as dcgm-exporter write the bare name
            grep = f"curl -s {self.source_url} | grep '^{wire.removesuffix('_total')}'"
            return f"{grep}  # run twice, N s apart: rate = difference / N"
        if kind == "histogram":
            return f"curl -s {self.source_url} | grep '^{wire}_bucket'  # difference two reads for the window"
        return grep

    def build(self, spec: SignalSpec) -> Signal:
        wire = _wire_name(spec, self.real)
        if wire is None:
            blank = [m for m in spec.metrics if m in self.blanks]
            told = [s.unavailable[m] for s in reversed(self.real) for m in spec.metrics if m in s.unavailable]
            if blank:
                reason = f"{blank[0]} reads DCGM's blank value (no data or not supported on this GPU) in every scrape"
            elif told:
                reason = told[0]
            else:
                reason = f"not exposed by this server (looked for {', '.join(spec.metrics)})"
            if spec.missing_note:
                reason += f"; {spec.missing_note}"
            return Signal.missing(spec.name, spec.kind, spec.unit, reason)
        common = dict(
            name=spec.name,
            kind=spec.kind,
            unit=spec.unit,
            source=self._source(wire),
            verify=spec.verify or self.spec.verify or self._verify(wire, spec.kind),
            window_seconds=self.duration,
        )
        if wire != spec.metrics[0] and spec.alias_note:
            self.anomalies.append(f"{wire}: older name in use; {spec.alias_note}")
        builder = {
            "gauge": self._gauge,
            "counter": self._counter,
            "histogram": self._histogram,
            "info": self._info,
        }[spec.kind]
        return builder(spec, wire, common)

    def _gauge(self, spec: SignalSpec, wire: str, common: dict) -> Signal:
        scrapes = self.real if not spec.per_gpu else [_one_per_gpu(s, wire) for s in self.real]
        scrapes = [_fold(s, wire, spec.fold_labels) for s in scrapes]
        if spec.divide_by is not None:
            if not any(s.has(spec.divide_by) for s in scrapes):
                return Signal(**common, unavailable=f"{wire} is read over {spec.divide_by}, which is not exposed")
            scrapes = [_divided(s, wire, spec.divide_by) for s in scrapes]
            common = {**common, "source": f"{common['source']} / {spec.divide_by}"}
        if spec.any_bits is not None:
            scrapes = [_bits_set(s, wire, spec.any_bits) for s in scrapes]
        gw = gauge_window(scrapes, wire, spec.match, spec.aggregate)
        if not gw.points:
            return Signal(**common, unavailable=f"{wire} has no series matching {spec.match}")
        if spec.scale != 1.0:
            gw.points = [(t, v * spec.scale) for t, v in gw.points]
            gw.per_series_mean = {k: v * spec.scale for k, v in gw.per_series_mean.items()}
        low = spec.valid_min if spec.valid_min is not None else -math.inf
        high = spec.valid_max if spec.valid_max is not None else math.inf
        bad = [v for v in gw.values if not low <= v <= high]
        if bad:
            self.implausible += len(bad)
            self.anomalies.append(f"{wire} outside [{low:g}, {high:g}] in {len(bad)} scrape(s), e.g. {bad[0]:g}")
            return Signal(**common, unavailable=f"implausible values outside [{low:g}, {high:g}]: not trusted")
        return Signal(
            **common,
            stats=gw.stats(),
            samples=[(t or 0.0, v) for t, v in gw.points],
            by_series={_series_name(k): v for k, v in gw.per_series_mean.items()},
        )

    def _counter(self, spec: SignalSpec, wire: str, common: dict) -> Signal:
        scrapes = self.window_scrapes if not spec.per_gpu else [_one_per_gpu(s, wire) for s in self.window_scrapes]
        scrapes = [_fold(s, wire, spec.fold_labels) for s in scrapes]
        cw = counter_increase(scrapes, wire, spec.match)
        if cw.resets:
            self.resets += cw.resets
            self.anomalies.append(f"{wire} went backwards {cw.resets} time(s): the server restarted in the window")
        if spec.scale != 1.0:
            cw.increase *= spec.scale
            cw.per_series = {k: v * spec.scale for k, v in cw.per_series.items()}
        if not self.duration:
            reason = (
                "a single dump without a process start time has no time base for a rate"
                if self.lifetime
                else "the window has no duration"
            )
            return Signal(**common, stats={"increase": cw.increase}, unavailable=reason)
        per_series = {_series_name(k): v / self.duration for k, v in cw.per_series.items()}
        return Signal(
            **common,
            stats={"rate": cw.increase / self.duration, "increase": cw.increase},
            samples=self._counter_rates(spec, wire),
            by_series=per_series,
        )

    def _counter_rates(self, spec: SignalSpec, wire: str) -> list[tuple[float, float]]:
        """The rate over each interval between real scrapes, stamped at the interval's end (for charts)."""
        scrapes = self.real if not spec.per_gpu else [_one_per_gpu(s, wire) for s in self.real]
        rates: list[tuple[float, float]] = []
        for before, after in pairwise(scrapes):
            if before.at_unix is None or after.at_unix is None or after.at_unix <= before.at_unix:
                continue
            if not select(after, wire, spec.match):
                continue
            increase = counter_increase([before, after], wire, spec.match).increase
            rates.append((after.at_unix, spec.scale * increase / (after.at_unix - before.at_unix)))
        return rates

    def _histogram(self, spec: SignalSpec, wire: str, common: dict) -> Signal:
        hw = histogram_window(self.window_scrapes, wire, spec.match)
        if hw is None:
            return Signal(**common, unavailable=f"{wire} has no buckets")
        if hw.resets:
            self.resets += hw.resets
        if spec.scale != 1.0:
            hw.buckets = [(le * spec.scale, cumulative) for le, cumulative in hw.buckets]
            hw.total *= spec.scale
        if hw.count <= 0:
            return Signal(**common, stats={"count": 0.0}, unavailable="no observations in the window")
        stats = {"count": hw.count, "sum": hw.total}
        start = self.window_scrapes[0].at_unix
        if spec.unit == "seconds" and start is not None:
            # durations are counted when they end: the part that can lie inside the window (queue time before it)
            in_window = hw.sum_in_window_max(start, spec.scale)
            if in_window is not None:
                stats["sum_in_window_max"] = in_window
        for q, key in ((0.5, "p50"), (0.9, "p90"), (0.95, "p95"), (0.99, "p99")):
            value = hw.quantile(q)
            if value is not None:
                stats[key] = value
        if hw.mean is not None:
            stats["mean"] = hw.mean
        finite = [le for le, _ in hw.buckets if not math.isinf(le)]
        overflow = hw.count - (hw.buckets[-2][1] if len(hw.buckets) > 1 else 0.0)
        if finite and overflow > 0.01 * hw.count:
            self.anomalies.append(
                f"{wire}: {overflow:.0f} of {hw.count:.0f} observations exceed the largest bucket "
                f"({finite[-1]:g}); quantiles there are lower bounds"
            )
        buckets = [(le, cumulative) for le, cumulative in hw.buckets if not math.isinf(le)]
        return Signal(**common, stats=stats, buckets=buckets)

    def _info(self, spec: SignalSpec, wire: str, common: dict) -> Signal:
        for scrape in reversed(self.real):
            for key in scrape.series.get(wire, {}):
                raw = dict(key).get(spec.label or "")
                if raw is None:
                    continue
                try:
                    return Signal(**common, stats={"value": float(raw)})
                except (TypeError, ValueError):
                    continue
        return Signal(**common, unavailable=f"{wire} has no numeric label '{spec.label}'")


def build_signal_set(
    spec: ProbeSpec, scrapes: list[Scrape], source_url: str, origin: Scrape | None = None
) -> SignalSet:
    builder = SignalBuilder(spec, scrapes, source_url, origin)
    signal_set = SignalSet()
    for signal_spec in spec.signal:
        signal_set.add(builder.build(signal_spec))
    for fixed in spec.by_design:
        signal_set.add(_by_design(spec, fixed, builder.duration))
    # what the collector itself noticed, as signals the sanity rules can judge
    for name, value, help_text in (
        ("counter_resets", builder.resets, "counters or histograms that went backwards in the window"),
        ("implausible_samples", builder.implausible, "gauge samples outside their valid range"),
    ):
        signal_set.add(Signal(name=name, kind="derived", unit="count", stats={"value": float(value)}, source=help_text))
    read = {m for s in spec.signal for m in s.metrics}
    signal_set.anomalies = builder.anomalies + [
        f"{name}: {count} blank sample(s) (DCGM 'no data') treated as missing"
        for name, count in builder.blanks.items()
        if name in read
    ]
    window_start = builder.window_scrapes[0].at_unix
    signal_set.window = Window(
        kind="lifetime" if builder.lifetime else "window",
        start_unix=window_start,
        end_unix=scrapes[-1].at_unix,
        duration_seconds=builder.duration,
        scrapes=len(scrapes),
        note=("lifetime averages since the server started: one dump has no window" if builder.lifetime else ""),
    )
    signal_set.sources.append(_source_info(spec, scrapes, source_url))
    return signal_set


def _by_design(spec: ProbeSpec, fixed: ByDesignSpec, duration: float | None) -> Signal:
    """A signal the server cannot have: its fixed value (never measured, and the source says so), or missing."""
    source = f"{spec.name}: by design, not measured ({fixed.reason})"
    if fixed.value is None:
        return Signal.missing(fixed.name, fixed.kind, fixed.unit, fixed.reason, source=source)
    if fixed.kind == "counter":
        stats = {"rate": fixed.value, "increase": fixed.value * (duration or 0.0)}
    else:
        stats = dict.fromkeys(("last", "mean", "min", "max", "p90"), fixed.value)
    return Signal(
        name=fixed.name,
        kind=fixed.kind,
        unit=fixed.unit,
        stats=stats,
        source=source,
        verify=f"{spec.server} documentation: {fixed.reason}",
        window_seconds=duration,
    )


def _source_info(spec: ProbeSpec, scrapes: list[Scrape], url: str) -> SourceInfo:
    models: set[str] = set()
    engines: set[str] = set()
    gpu_models: dict[str, str] = {}  # dcgm-exporter's modelName label, per GPU
    last = scrapes[-1]
    for name, series in last.series.items():
        if not name.startswith(tuple(spec.detect_prefixes)):
            continue
        for key in series:
            labels = dict(key)
            if "model_name" in labels:
                models.add(labels["model_name"])
            if "modelName" in labels:
                gpu_models[labels.get("UUID", labels.get("gpu", ""))] = labels["modelName"]
            if "engine" in labels:
                engines.add(labels["engine"])
            elif "dp_rank" in labels:  # SGLang's data-parallel ranks
                engines.add(labels["dp_rank"])
    config: dict[str, str] = {}
    if spec.config_metric and last.has(spec.config_metric):
        first_key = next(iter(last.series[spec.config_metric]))
        config = {k: v for k, v in first_key if k not in SERIES_LABELS}
    if gpu_models:
        config.update(gpus_config(gpu_models.values()))
    return SourceInfo(
        probe=spec.name,
        url=url,
        server=spec.server,
        models=sorted(models),
        engines=sorted(engines, key=lambda e: (len(e), e)),
        config=config,
        note="; ".join(spec.notes),
    )
