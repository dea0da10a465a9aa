"""PromQL from the catalogue: durations, selectors, and recording rules for every signal a rule reads.

One builder for the two places llmdiag speaks PromQL. The Prometheus fleet mode (llmdiag.collect.prometheus.plan)
takes its durations, selectors and escaping from here and asks for raw series; the rule export
(llmdiag.api.alerting) asks a ``Recorder`` for a signal's stat and gets the name of a recorded series, with the
recording rules that make it:

- a probe spec's signal (probes/<server>.toml): its wire names, newest first, become ``or`` alternatives (the
  first present wins, per instance, as in a scan); label filters (``match``) become matchers, ``fold_labels``
  (copies of one value) a ``max without``, ``divide_by`` a division by that gauge's total, ``scale`` a product;
  engines and ranks are summed (or averaged, per ``aggregate``) per instance;
- counters: ``rate``/``increase`` over the window; gauges: the per-instance value recorded each evaluation, then
  ``avg_over_time``/``max_over_time``/... of it over the window; histograms: ``histogram_quantile`` over bucket
  rates, the mean as rate(_sum) / rate(_count), the count and sum as ``increase`` over the window;
- a derived signal (probes/signals.toml) by its ``promql`` form, written over other signals' ``{signal.stat}``
  (and ``{window_seconds}``): a string, or a list whose largest expressible member is taken (the scan's
  max-of-estimates); or ``promql_unavailable``, the reason it has none;
- a probe's ``[[estimate]]``: a signal its page gives only indirectly, as the scan estimates it;
- DCGM's gauges, joined to each server target by pod, else by host (``telemetry``);
- the collector's sanity counts (counter resets, implausible gauge samples: the signal's own value, divided and
  scaled, out of its valid range) from the probe's own names.

Every recorded series keeps the instance labels and gets ``llmdiag_server`` (a rule label), and every read of a
recorded series selects on it, so one server's rules never read another's series.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from llmdiag.errors import UsageError, option
from llmdiag.schema.probes import ProbeSpec, SignalSpec

# the labels that tell one scrape target (one server process) from another
INSTANCE_LABELS = ("job", "instance", "namespace", "pod")
SERVER_LABEL = "llmdiag_server"  # set on every recorded series by the rule's labels
# what alerts and guards match on: the target and the server dialect it was recorded for
MATCH_LABELS = (*INSTANCE_LABELS, SERVER_LABEL)
RECORD_PREFIX = "llmdiag"
PART_LABEL = "llmdiag_part"  # tells the members of a max-of-estimates apart for one `max without`
HOST_LABEL = "llmdiag_host"  # the host a server target and a DCGM exporter share, for the join
QUANTILE_STATS = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}
GAUGE_OVER_TIME = {"last": "last_over_time", "mean": "avg_over_time", "min": "min_over_time", "max": "max_over_time"}
COUNTER_STATS = ("rate", "increase")
AGGREGATE_OP = {"sum": "sum", "mean": "avg", "max": "max", "min": "min"}
# a derived form's references: {signal.stat}, and the window's length in seconds
REF_RE = re.compile(r"\{([a-z][a-z0-9_]*)\.([a-z0-9_]+)\}")
WINDOW_REF = "{window_seconds}"


# --------------------------------------------------------------------------------------------------------------------
# durations, selectors, escaping


DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
DURATION_HINT = "e.g. 90s, 5m, 1h30m"


def parse_duration(text: str, what: str = "duration", zero: bool = False) -> float:
    """'90s', '5m', '1h30m', '500ms', or plain seconds; positive, or 0 too where ``zero`` allows it."""
    raw = text.strip()
    try:
        value = float(raw)
    except ValueError:
        pieces = DURATION_RE.findall(raw)
        if not pieces or "".join(n + u for n, u in pieces) != raw:
            raise UsageError(f"{what} '{text}' is not a duration", DURATION_HINT) from None
        value = sum(float(n) * UNIT_SECONDS[u] for n, u in pieces)
    if not (value > 0 or (zero and value == 0)) or value == float("inf"):
        raise UsageError(f"{what} '{text}' must be {'0 or more' if zero else 'positive'}", DURATION_HINT)
    return value


def selector_matchers(selector: str | None) -> str:
    """'{job="vllm"}' or 'job="vllm"' → 'job="vllm"' (the inside of the braces); None or '' → ''."""
    if not selector:
        return ""
    inner = selector.strip()
    if inner.startswith("{"):
        if not inner.endswith("}"):
            raise UsageError(
                f"{option('selector')} '{selector}' has no closing brace",
                f"e.g. {option('selector')} '{{job=\"vllm\"}}'",
            )
        inner = inner[1:-1]
    inner = inner.strip().strip(",")
    if inner and not MATCHER_LIST_RE.fullmatch(inner):
        raise UsageError(
            f"{option('selector')} '{selector}' is not a label matcher list",
            f'e.g. {option("selector")} \'{{job="vllm",namespace="prod"}}\'',
        )
    return inner


# label="value" (=, !=, =~, !~; a "double" or 'single' quoted string with backslash escapes, or a `raw` one),
# comma-separated: all of the braces' inside, so a bad matcher is refused here, not by Prometheus (a 400 for a
# query, an invalid rule file for an export)
_STRING = r'(?:"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|`[^`]*`)'
_MATCHER = rf"\s*[A-Za-z_][A-Za-z0-9_]*\s*(?:=~|!~|!=|=)\s*{_STRING}\s*"
MATCHER_LIST_RE = re.compile(f"{_MATCHER}(?:,{_MATCHER})*")


def escape(value: str) -> str:
    """A PromQL string literal's inside."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def vector(name: str, inner: str = "", extra: dict[str, str] | None = None) -> str:
    """``name{inner,extra...}``: a selector with the user's matchers and exact-value ones."""
    matchers = [inner] if inner else []
    matchers += [f'{k}="{escape(v)}"' for k, v in sorted((extra or {}).items())]
    return f"{name}{{{','.join(matchers)}}}" if matchers else name


def duration(seconds: float) -> str:
    """Seconds as a PromQL duration: whole milliseconds."""
    ms = max(1, int(round(seconds * 1000)))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def window_name(seconds: float) -> str:
    """A window as it appears in recording names: 5m, 90s, 1h."""
    whole = int(round(seconds))
    if seconds == 0:
        return "0s"
    if abs(seconds - whole) > 1e-9 or whole <= 0:
        return duration(seconds)
    for unit, size in (("h", 3600), ("m", 60)):
        if whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def number(value: float) -> str:
    """A threshold as PromQL reads it (no exponent surprises, no trailing zeros)."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


# --------------------------------------------------------------------------------------------------------------------
# recording rules


class Inexpressible(Exception):
    """A signal or stat that PromQL over this server's metrics cannot give; the message says why."""


@dataclass(frozen=True)
class Recording:
    record: str
    expr: str


@dataclass(frozen=True)
class DerivedForm:
    """A derived signal's PromQL form from probes/signals.toml: a formula, or a list of estimates (the largest
    expressible one is taken), or the reason there is none."""

    name: str
    promql: tuple[str, ...] = ()
    is_max: bool = False
    unavailable: str = ""


def refs_of(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in REF_RE.finditer(text)]


@dataclass
class Recorder:
    """The recording rules one server's alerts need, made as they are asked for (inputs before what reads them).

    ``derived``: the derived forms by name; ``constants``: signals given as numbers (the TPOT SLO); ``elsewhere``:
    signal name → why it never reaches Prometheus (canaries, NVML, traces ...)."""

    probe: ProbeSpec
    window_seconds: float
    inner: str = ""
    derived: dict[str, DerivedForm] = field(default_factory=dict)
    constants: dict[str, float] = field(default_factory=dict)
    elsewhere: Callable[[str], str] | None = None
    # GPU telemetry beside the server (DCGM): its gauges joined to each server target by pod, else by host, as the
    # fleet mode joins them (llmdiag.collect.prometheus.build._join_dcgm)
    telemetry: ProbeSpec | None = None
    rules: dict[str, Recording] = field(default_factory=dict)
    # recorded name → the probe signals (raw, after derived forms are unfolded) it reads
    inputs: dict[str, frozenset[str]] = field(default_factory=dict)

    @property
    def window(self) -> str:
        return window_name(self.window_seconds)

    def _name(self, signal: str, stat: str) -> str:
        return f"{RECORD_PREFIX}:{signal}:{stat}{self.window}"

    def read(self, record: str) -> str:
        """A recorded series as a later rule reads it: this server's copy only."""
        return vector(record, extra={SERVER_LABEL: self.probe.name})

    def _keep(self, record: str, expr: str, inputs: frozenset[str]) -> str:
        if record not in self.rules:
            self.rules[record] = Recording(record, expr)
            self.inputs[record] = inputs
        return self.read(record)

    def ref(self, signal: str, stat: str) -> str:
        """PromQL reading ``signal``'s ``stat`` for this server: a recorded series (or a number for a constant).
        Raises Inexpressible with the reason."""
        if signal in self.constants:
            return number(self.constants[signal])
        spec = next((s for s in self.probe.signal if s.name == signal), None)
        if spec is not None:
            return self._probe_ref(spec, stat)
        fixed = next((b for b in self.probe.by_design if b.name == signal), None)
        if fixed is not None:
            if fixed.value is None:
                raise Inexpressible(f"{signal}: {fixed.reason}")
            return number(fixed.value)
        estimate = next((e for e in self.probe.estimate if e.name == signal), None)
        if estimate is not None:
            if stat not in estimate.promql:
                raise Inexpressible(f"{signal}: {self.probe.name}'s estimate gives no {stat}")
            record = self._name(signal, stat)
            if record in self.rules:
                return self.read(record)
            expr, inputs = self._fill(estimate.promql[stat])
            return self._keep(record, expr, inputs)
        gpu = next((s for s in self.telemetry.signal if s.name == signal), None) if self.telemetry else None
        if gpu is not None:
            return self._telemetry_ref(gpu, stat)
        if signal in SANITY_COUNTS:
            return self._keep(self._name(signal, stat), SANITY_COUNTS[signal](self), frozenset(self._sanity(signal)))
        form = self.derived.get(signal)
        if form is not None:
            return self._derived_ref(form)
        why = self.elsewhere(signal) if self.elsewhere else ""
        raise Inexpressible(why or f"{signal}: not in {self.probe.name}'s metrics (probes/{self.probe.name}.toml)")

    def inputs_of(self, expr: str) -> frozenset[str]:
        """The probe signals behind the recorded series an expression reads."""
        found: set[str] = set()
        for record, inputs in self.inputs.items():
            if self.read(record) in expr:
                found |= inputs
        return frozenset(found)

    # ---- probe signals

    def _probe_ref(self, spec: SignalSpec, stat: str) -> str:
        if spec.kind == "info":
            raise Inexpressible(f"{spec.name} is a label's value ({spec.label}), which PromQL cannot read as a number")
        inputs = frozenset({spec.name})
        if spec.kind == "gauge" and spec.monotonic and stat in COUNTER_STATS:  # a count kept in a gauge
            expr = self._alternatives(spec, lambda wire: self._counter(spec, wire, stat))
            return self._keep(self._name(spec.name, stat), expr, inputs)
        if spec.kind == "gauge":
            if stat not in GAUGE_OVER_TIME and stat != "p90":
                raise Inexpressible(f"{spec.name} is a gauge, with no {stat}")
            op = AGGREGATE_OP[spec.aggregate]
            now_expr = self._alternatives(spec, lambda wire: self._gauge_now(spec, wire))
            now = self._keep(f"{RECORD_PREFIX}:{spec.name}:{op}", now_expr, inputs)
            return self._over_window(spec, now, stat, inputs)
        if spec.kind == "counter":
            if stat not in ("rate", "increase"):
                raise Inexpressible(f"{spec.name} is a counter, with no {stat}")
            expr = self._alternatives(spec, lambda wire: self._counter(spec, wire, stat))
            return self._keep(self._name(spec.name, stat), expr, inputs)
        if stat not in (*QUANTILE_STATS, "mean", "count", "sum"):
            raise Inexpressible(f"{spec.name}'s {stat} needs each scrape's time, which a rule does not see")
        expr = self._alternatives(spec, lambda wire: self._histogram(spec, wire, stat))
        return self._keep(self._name(spec.name, stat), expr, inputs)

    def _over_window(self, spec: SignalSpec, now: str, stat: str, inputs: frozenset[str]) -> str:
        """A gauge's window stat, over its per-target value recorded each evaluation (``now``)."""
        over = f"quantile_over_time(0.9, {now}[{self.window}])" if stat == "p90" else None
        expr = over or f"{GAUGE_OVER_TIME[stat]}({now}[{self.window}])"
        return self._keep(self._name(spec.name, stat), expr, inputs)

    def _alternatives(self, spec: SignalSpec, one: Callable[[str], str]) -> str:
        parts = [one(wire) for wire in spec.metrics]
        return parts[0] if len(parts) == 1 else " or ".join(f"({p})" for p in parts)

    def _series(self, spec: SignalSpec, wire: str, inner_expr: str | None = None) -> str:
        """A wire's series with the probe's filters, copies folded (inner_expr: a function of the selector)."""
        base = inner_expr or vector(wire, self.inner, spec.match)
        return f"max without ({', '.join(spec.fold_labels)}) ({base})" if spec.fold_labels else base

    def _by(self, extra: str = "") -> str:
        return ", ".join([*INSTANCE_LABELS, *([extra] if extra else [])])

    def _scaled(self, spec: SignalSpec, expr: str) -> str:
        return expr if spec.scale == 1.0 else f"({expr}) * {number(spec.scale)}"

    def _gauge_now(self, spec: SignalSpec, wire: str) -> str:
        series = self._series(spec, wire)
        if spec.divide_by:
            total = f"sum by ({self._by()}) ({vector(spec.divide_by, self.inner)})"
            series = f"({series}) / on ({self._by()}) group_left () ({total} > 0)"
        return self._scaled(spec, f"{AGGREGATE_OP[spec.aggregate]} by ({self._by()}) ({series})")

    def _counter(self, spec: SignalSpec, wire: str, stat: str) -> str:
        moved = f"{stat}({vector(wire, self.inner, spec.match)}[{self.window}])"
        return self._scaled(spec, f"sum by ({self._by()}) ({self._series(spec, wire, moved)})")

    def _histogram(self, spec: SignalSpec, wire: str, stat: str) -> str:
        def over(suffix: str, fn: str, by: str) -> str:
            moved = f"{fn}({vector(wire + suffix, self.inner, spec.match)}[{self.window}])"
            return f"sum by ({by}) ({self._series(spec, wire, moved)})"

        if stat in QUANTILE_STATS:
            q = QUANTILE_STATS[stat]
            return self._scaled(spec, f"histogram_quantile({q}, {over('_bucket', 'rate', self._by('le'))})")
        if stat == "mean":
            return self._scaled(spec, f"{over('_sum', 'rate', self._by())} / {over('_count', 'rate', self._by())}")
        if stat == "count":
            return over("_count", "increase", self._by())
        return self._scaled(spec, over("_sum", "increase", self._by()))

    # ---- GPU telemetry, joined to the server targets

    def _telemetry_ref(self, spec: SignalSpec, stat: str) -> str:
        if spec.kind != "gauge" or spec.any_bits is not None:
            what = "a bit mask" if spec.any_bits is not None else f"a {spec.kind}"
            raise Inexpressible(f"{spec.name}: {what} of DCGM's, which the export does not join to the server yet")
        if stat not in GAUGE_OVER_TIME and stat != "p90":
            raise Inexpressible(f"{spec.name} is a gauge, with no {stat}")
        op = AGGREGATE_OP[spec.aggregate]
        inputs = frozenset({spec.name})
        now = self._keep(
            f"{RECORD_PREFIX}:{spec.name}:{op}", self._alternatives(spec, lambda w: self._joined(spec, w)), inputs
        )
        return self._over_window(spec, now, stat, inputs)

    def _targets(self) -> str:
        """One series per server target of this dialect (any of its names), with the instance labels."""
        names = {n for s in self.probe.signal for n in s.metrics if s.kind in ("gauge", "counter")}
        names |= {n + "_count" for s in self.probe.signal for n in s.metrics if s.kind == "histogram"}
        regex = "|".join(re.escape(n).replace("\\:", ":") for n in sorted(names))
        selector = "{" + ",".join([f'__name__=~"{regex}"', *([self.inner] if self.inner else [])]) + "}"
        return self._keep(f"{RECORD_PREFIX}:targets:group", f"group by ({self._by()}) ({selector})", frozenset())

    def _joined(self, spec: SignalSpec, wire: str) -> str:
        """A telemetry gauge per server target: its pod's GPUs (dcgm-exporter's pod mapping), else its host's (the
        exporter's Hostname label, else its instance's host). A mean over the GPUs, MIG instances counted apiece."""
        op = AGGREGATE_OP[spec.aggregate]
        matchers = [f'{k}="{escape(v)}"' for k, v in sorted(spec.match.items())] + ['pod!=""']
        in_pods = wire + "{" + ",".join(matchers) + "}"
        by_pod = f"{self._targets()} * on (namespace, pod) group_left () ({op} by (namespace, pod) ({in_pods}))"
        tagged = vector(wire, "", spec.match)
        for source, pattern in (("instance", "(.+):[0-9]+"), ("Hostname", "(.+)"), ("hostname", "(.+)")):
            tagged = f'label_replace({tagged}, "{HOST_LABEL}", "$1", "{source}", "{pattern}")'
        hosts = f'label_replace({self._targets()}, "{HOST_LABEL}", "$1", "instance", "(.+):[0-9]+")'
        by_host = f"{hosts} * on ({HOST_LABEL}) group_left () ({op} by ({HOST_LABEL}) ({tagged}))"
        return self._scaled(spec, f"({by_pod}) or max without ({HOST_LABEL}) ({by_host})")

    # ---- the collector's sanity counts

    def _sanity(self, signal: str) -> list[str]:
        """The probe signals a sanity count looks at."""
        if signal == "counter_resets":
            return [s.name for s in self.probe.signal if s.kind in ("counter", "histogram")]
        return [s.name for s in _bounded(self.probe)]

    # ---- derived signals

    def _derived_ref(self, form: DerivedForm) -> str:
        if form.unavailable:
            raise Inexpressible(f"{form.name}: {form.unavailable}")
        record = self._name(form.name, "value")
        if record in self.rules:
            return self.read(record)
        built: list[tuple[str, frozenset[str]]] = []
        reasons: list[str] = []
        for text in form.promql:
            try:
                built.append(self._fill(text))
            except Inexpressible as why:
                reasons.append(str(why))
        if not built or (reasons and not form.is_max):
            raise Inexpressible(f"{form.name} needs {'; '.join(reasons)}")
        inputs = frozenset().union(*(i for _, i in built))
        if len(built) == 1:
            return self._keep(record, built[0][0], inputs)
        tagged = [f'label_replace({expr}, "{PART_LABEL}", "{i}", "", "")' for i, (expr, _) in enumerate(built)]
        return self._keep(record, f"max without ({PART_LABEL}) ({' or '.join(tagged)})", inputs)

    def _fill(self, text: str) -> tuple[str, frozenset[str]]:
        inputs: set[str] = set()

        def one(match: re.Match[str]) -> str:
            read = self.ref(match.group(1), match.group(2))
            inputs.update(self.inputs_of(read))
            return read

        filled = REF_RE.sub(one, text.replace(WINDOW_REF, number(self.window_seconds)))
        return filled, frozenset(inputs)


def _bounded(probe: ProbeSpec) -> list[SignalSpec]:
    return [s for s in probe.signal if s.kind == "gauge" and (s.valid_min is not None or s.valid_max is not None)]


def _counter_resets(rec: Recorder) -> str:
    """Counters and histogram counts that went backwards in the window. resets() drops the metric name, so each
    name is tagged apart before the sum (series of two names would otherwise collide)."""
    names = []
    for spec in rec.probe.signal:
        if spec.kind == "counter":
            names += spec.metrics
        elif spec.kind == "histogram":
            names += [m + "_count" for m in spec.metrics]
    if not names:
        raise Inexpressible(f"{rec.probe.name} exposes no counter")
    parts = [
        f'label_replace(resets({vector(name, rec.inner)}[{rec.window}]), "{PART_LABEL}", "{escape(name)}", "", "")'
        for name in sorted(set(names))
    ]
    return f"sum by ({rec._by()}) ({' or '.join(parts)})"


def _implausible(rec: Recorder) -> str:
    """Samples of bounded gauges outside their valid range, counted over the window (a subquery at the rule
    evaluation interval, the rule's stand-in for every scrape). The bounds apply to the value the signal is, as the
    scan checks it (llmdiag.collect.signals): folded, divided by its total (``divide_by``), aggregated, scaled."""
    parts = []
    for spec in _bounded(rec.probe):
        for wire in spec.metrics:
            raw = rec._gauge_now(spec, wire)
            outside = [f"({raw}) < {number(spec.valid_min)}"] if spec.valid_min is not None else []
            outside += [f"({raw}) > {number(spec.valid_max)}"] if spec.valid_max is not None else []
            counted = f"count_over_time(({' or '.join(outside)})[{rec.window}:])"
            parts.append(f'label_replace({counted}, "{PART_LABEL}", "{escape(wire)}", "", "")')
    if not parts:
        raise Inexpressible(f"{rec.probe.name}'s probe gives no gauge a valid range")
    return f"sum by ({rec._by()}) ({' or '.join(parts)})"


SANITY_COUNTS: dict[str, Callable[[Recorder], str]] = {
    "counter_resets": _counter_resets,
    "implausible_samples": _implausible,
}
