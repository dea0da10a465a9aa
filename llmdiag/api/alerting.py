"""The rule catalogue as Prometheus alerting rules (`llmdiag rules export`).

Per server dialect, two groups: ``llmdiag-<server>-recording`` (every signal and derived signal the rules read,
built by llmdiag.schema.promql from the probe specs and probes/signals.toml) and ``llmdiag-<server>-alerts`` (one
alert per rule code and severity). An alert's expression is its rule, as the scan judges it:

- the ladder: critical = past the critical threshold (``>=`` above, ``<=`` below, as llmdiag.engine.evaluate);
  warning = past the warning one, ``unless`` that critical alert is firing on the target (Prometheus's own
  ``ALERTS`` series; the critical rule comes first in the group, so the two never fire together, and a value
  hovering at the critical line still pages as a warning);
- each gate ``and`` its condition; a gate with ``if_missing = "pass"`` ``unless`` its negation, so a server without
  that signal is judged on the rest;
- a rule with ``instead_of`` only where the rule it stands in for has not all its inputs;
- ``unless`` each sanity rule's condition that doubts one of its inputs (``doubts`` in the sanity rule's TOML): a
  broken gauge or a restart never pages as a bottleneck;
- ``unless`` the condition of every class whose cause explains its class (llmdiag.engine.causes.CAUSES, the graph
  the verdict uses), and of every stall rule: the cause pages, its symptoms do not.

DCGM's gauges are joined to each server target (by pod, else by host). Left out, and said so in the file's comments:
rules whose inputs never reach Prometheus (canaries, NVML, host, traces, logs, baselines) or need a per-GPU figure,
fleet-scope rules (they compare replicas: ``llmdiag fleet``), and regression rules (they compare with check's
history).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from llmdiag.config import Settings
from llmdiag.engine.causes import why
from llmdiag.engine.fixes import engine_of
from llmdiag.errors import UsageError, option
from llmdiag.model import BOTTLENECK_CATEGORIES, Category
from llmdiag.schema.loader import find_rule, load_probe, load_rules, load_signal_registry
from llmdiag.schema.promql import (
    MATCH_LABELS,
    SERVER_LABEL,
    Inexpressible,
    Recorder,
    escape,
    number,
    parse_duration,
    selector_matchers,
    window_name,
)
from llmdiag.schema.registry import derived_forms
from llmdiag.schema.rules import Condition, RuleSpec

SERVERS = ("vllm", "sglang", "tgi", "llamacpp", "trtllm", "triton")
FORMATS = ("prometheus", "prometheusrule", "grafana")
DEFAULT_WINDOW = "5m"
DEFAULT_FOR = "2m"
DEFAULT_RUNBOOK_URL = "docs/rules/{code}-{slug}.md"
NEGATED = {">": "<=", ">=": "<", "<": ">=", "<=": ">", "==": "!=", "!=": "=="}
# producers whose signals no Prometheus rule can read, and why
ELSEWHERE = {
    "canary": "canary requests, timed by the client, which only a scan sends",
    "trace": "profiler traces, not in Prometheus",
    "nccl-bench": "the collective benchmark (llmdiag nccl-bench), not in Prometheus",
    "logs": "server logs, not in Prometheus",
    "baseline": "llmdiag check's history of the target, not in Prometheus",
    "fleet": "several replicas side by side (llmdiag fleet)",
    "llamacpp": "llama.cpp's /props slots, not in Prometheus",
    "trtllm-records": "TensorRT-LLM's JSON iteration records, not in Prometheus",
    "probe:nvml": "NVML on the GPU host, not in Prometheus",
    "probe:host": "the host's own counters (/proc), not in Prometheus",
    "probe:dcgm": "DCGM, which this export does not join to the server",
    "nccl-log": "an NCCL debug log, not in Prometheus",
    "nccl-tests": "nccl-tests' output, not in Prometheus",
    "nvidia-smi": "pasted nvidia-smi output, not in Prometheus",
    "ib-ports": "a pasted ibstatus listing, not in Prometheus",
}


@dataclass
class Alert:
    rule: RuleSpec
    value: str  # the ladder's series
    clauses: list[str] = field(default_factory=list)  # the gates and the stand-in guard: "and on (...) (...)", "unless"
    silenced_by: list[str] = field(default_factory=list)  # codes whose condition silences it: sanity, causes, stalls

    def condition(self) -> str:
        """The rule past its warning threshold (at any severity) with its gates: recorded once, read by its own
        alerts and by the guards of the alerts it silences."""
        expr = _past_warning(self.rule, self.value)
        for clause in self.clauses:
            expr = f"({expr}) {clause}"
        return expr


@dataclass
class ServerExport:
    server: str
    recorder: Recorder
    alerts: list[Alert] = field(default_factory=list)
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (code, why)


CONDITION = "llmdiag:rule_past_warning:value"  # + the window: one series per rule code (its `code` label)


def _on(expr: str) -> str:
    return f"on ({', '.join(MATCH_LABELS)}) ({expr})"


def _elsewhere(signal: str) -> str:
    """Why no rule can read a signal this server's page lacks: where it comes from, when not from a server's page
    ('' for another server's metric: the caller says this one lacks it)."""
    declared = load_signal_registry().of(signal)
    if any(d.producer.startswith("probe:") and d.producer not in ELSEWHERE for d in declared):
        return ""
    for item in declared:
        if item.producer in ELSEWHERE:
            return f"{signal}: from {ELSEWHERE[item.producer]}"
    return ""


def _refuse_rule(rule: RuleSpec) -> str:
    """Why a rule is not exported for this server at all; '' when it may be."""
    if rule.scope == "fleet":
        return "fleet scope: it compares replicas (llmdiag fleet judges it)"
    if rule.category is Category.regression:
        return "compares with a baseline from llmdiag check's history, which Prometheus does not hold"
    # not fix.applies_to: it says which engines have flags for the fix, and the scan judges a rule wherever its
    # signals exist (llmdiag.engine.evaluate), giving only the fix's text elsewhere; so does the export
    return ""


def _past_warning(rule: RuleSpec, value: str) -> str:
    """The ladder past its warning threshold: ``>=`` above, ``<=`` below (llmdiag.engine.evaluate)."""
    return f"{value} {'>=' if rule.severity.direction == 'above' else '<='} {number(rule.severity.warning)}"


def _alert(rec: Recorder, rule: RuleSpec) -> Alert:
    """The rule's ladder and gates over this server's recorded series; Inexpressible when an input cannot be read."""
    value = rec.ref(rule.severity.signal, rule.severity.stat)
    if not value.startswith("llmdiag:"):
        raise Inexpressible(f"{rule.severity.signal} is fixed on {rec.probe.name} by design")
    clauses = [clause for gate in rule.gate if (clause := _gated(rec, gate))]
    return Alert(rule=rule, value=value, clauses=clauses)


def _gated(rec: Recorder, gate: Condition) -> str:
    """A gate as a clause: ``and`` its condition, or (if_missing = "pass") ``unless`` its negation; '' for a gate
    that always holds (a constant by design, or a missing signal the gate lets pass)."""
    try:
        read = rec.ref(gate.signal, gate.stat)
    except Inexpressible:
        if gate.if_missing == "pass":
            return ""
        raise
    if not read.startswith("llmdiag:"):  # a constant (by design): the gate holds or never does
        if gate.holds(float(read)):
            return ""
        raise Inexpressible(f"gate {gate.signal} {gate.op} {number(gate.value)} never holds on {rec.probe.name}")
    if gate.if_missing == "pass":
        return f"unless {_on(f'{read} {NEGATED[gate.op]} {number(gate.value)}')}"
    return f"and {_on(f'{read} {gate.op} {number(gate.value)}')}"


def _inputs_present(rec: Recorder, rule: RuleSpec) -> str:
    """Every input of ``rule`` that the scan needs present (severity, gates without if_missing=pass) read by one
    expression that exists only where all of them do."""
    reads = [rec.ref(rule.severity.signal, rule.severity.stat)]
    reads += [rec.ref(g.signal, g.stat) for g in rule.gate if g.if_missing == "skip"]
    vectors = [r for r in reads if r.startswith("llmdiag:")]
    expr = vectors[0]
    for other in vectors[1:]:
        expr = f"{expr} and {_on(other)}"
    return expr


def _doubted(rec: Recorder, sanity: RuleSpec) -> set[str]:
    """The probe signals a sanity rule's finding casts doubt on (its ``doubts``: signal names or kinds)."""
    doubted: set[str] = set()
    for spec in rec.probe.signal:
        bounded = spec.valid_min is not None or spec.valid_max is not None
        if spec.name in sanity.doubts or spec.kind in sanity.doubts or (bounded and "bounded" in sanity.doubts):
            doubted.add(spec.name)
    return doubted


def _as_configured(rule: RuleSpec, settings: Settings) -> RuleSpec:
    """The rule with llmdiag.toml's threshold overrides, as the scan judges it (llmdiag.engine.evaluate)."""
    override = settings.rules.get(rule.code)
    if override is None:
        return rule
    changed = {k: v for k, v in (("warning", override.warning), ("critical", override.critical)) if v is not None}
    return rule.model_copy(update={"severity": rule.severity.model_copy(update=changed)})


def _build_server(server: str, *, inner: str, window_seconds: float, settings: Settings) -> ServerExport:
    slo_tpot_seconds = settings.slo_tpot_seconds
    recorder = Recorder(
        probe=load_probe(server),
        window_seconds=window_seconds,
        inner=inner,
        derived=derived_forms(load_signal_registry()),
        constants={"slo_tpot_seconds": slo_tpot_seconds},
        elsewhere=_elsewhere,
        telemetry=load_probe("dcgm"),
    )
    out = ServerExport(server=server, recorder=recorder)
    rules = [r for r in load_rules() if r.status != "deprecated"]
    for rule in rules:
        refused = _refuse_rule(rule)
        muted = settings.mute_reason(rule.code)
        if muted:
            refused = f"muted in the settings: {muted}"
        if refused:
            out.left_out.append((rule.code, refused))
            continue
        try:
            out.alerts.append(_alert(recorder, _as_configured(rule, settings)))
        except Inexpressible as why:
            out.left_out.append((rule.code, str(why)))
    _guard(out)
    return out


def _guard(out: ServerExport) -> None:
    """What silences each alert: the rule it stands in for having its inputs (a clause of its condition), the sanity
    rules that doubt its inputs, the classes whose cause explains its class (CAUSES), the stall rules."""
    rec = out.recorder
    exported = {a.rule.code for a in out.alerts}
    sanity = [a for a in out.alerts if a.rule.category is Category.sanity and a.rule.doubts]
    causes = [a for a in out.alerts if a.rule.category in BOTTLENECK_CATEGORIES and not a.rule.advisory]
    for alert in out.alerts:
        rule = alert.rule
        if rule.instead_of and rule.instead_of in exported:
            stood_for = find_rule(rule.instead_of)
            assert stood_for is not None  # it is exported, so it is a catalogue rule
            alert.clauses.append(f"unless {_on(_inputs_present(rec, stood_for))}")
        if rule.category not in BOTTLENECK_CATEGORIES:
            continue
        reads = rec.inputs_of(alert.condition())
        alert.silenced_by += [san.rule.code for san in sanity if reads & _doubted(rec, san.rule)]
        for cause in causes:
            explains = why(cause.rule.category, rule.category)
            stalls = cause.rule.stall and not rule.stall
            if cause is not alert and (explains or stalls):
                alert.silenced_by.append(cause.rule.code)


def _condition_read(out: ServerExport, codes: list[str]) -> str:
    """The recorded conditions of these rules, on this server."""
    code = f'code="{codes[0]}"' if len(codes) == 1 else f'code=~"{"|".join(codes)}"'
    return f'{CONDITION}{out.recorder.window}{{{code},{SERVER_LABEL}="{escape(out.server)}"}}'


def _alert_expr(out: ServerExport, alert: Alert, severity: str) -> str:
    """The alert at one severity: its recorded condition, past the critical threshold for the critical one; the
    warning one ``unless`` the critical one fires on that target (not ``unless`` past critical: a value hovering at
    the critical line would restart both for: timers and neither would page); and its silencers."""
    rule = alert.rule
    own = _condition_read(out, [rule.code])
    ladder = rule.severity
    expr = own
    if ladder.critical is not None and severity == "critical":
        expr = f"{own} {'>=' if ladder.direction == 'above' else '<='} {number(ladder.critical)}"
    elif ladder.critical is not None:
        critical = (
            f'ALERTS{{alertname="{_camel(rule.slug)}",code="{escape(rule.code)}",severity="critical",'
            f'alertstate="firing",{SERVER_LABEL}="{escape(out.server)}"}}'
        )
        expr = f"{own} unless {_on(critical)}"
    if alert.silenced_by:
        expr = f"({expr}) unless {_on(_condition_read(out, alert.silenced_by))}"
    return expr


def _camel(slug: str) -> str:
    return "LLMDiag" + "".join(word.capitalize() for word in slug.split("-"))


def _template_text(text: str) -> str:
    """Plain text inside a Go template: its braces cannot open an action."""
    return text.replace("{{", '{{ "{{" }}').replace("}}", '{{ "}}" }}')


def _annotations(alert: Alert, server: str, severity: str, runbook_url: str) -> dict[str, str]:
    rule = alert.rule
    ladder = rule.severity
    past = ">=" if ladder.direction == "above" else "<="
    threshold = ladder.critical if severity == "critical" and ladder.critical is not None else ladder.warning
    summary = (
        f"{_template_text(rule.title)} on {{{{ $labels.instance }}}}: {ladder.signal}.{ladder.stat} = "
        f'{{{{ $value | printf "%.4g" }}}} ({severity} at {past} {number(threshold)})'
    )
    engine = engine_of(server)
    fixes = [rule.fix.text, *rule.fix.for_engine(engine)]
    return {
        "summary": summary,
        "description": _template_text(rule.what) + " Run llmdiag scan on the target for the evidence and the why.",
        "fix": _template_text("\n".join(fixes)),
        "runbook_url": _template_text(runbook_url.replace("{code}", rule.code).replace("{slug}", rule.slug)),
    }


def _groups(out: ServerExport, for_text: str, runbook_url: str) -> list[dict[str, Any]]:
    recording = [
        {"record": r.record, "expr": r.expr, "labels": {SERVER_LABEL: out.server}} for r in out.recorder.rules.values()
    ]
    # after the signals they read (a group's rules run in order)
    recording += [
        {
            "record": CONDITION + out.recorder.window,
            "expr": alert.condition(),
            "labels": {"code": alert.rule.code, "class": alert.rule.category.value, SERVER_LABEL: out.server},
        }
        for alert in out.alerts
    ]
    alerting = []
    for alert in out.alerts:
        # the critical alert first: the group's rules run in order, so the warning one sees it fire at once
        severities = ["critical", "warning"] if alert.rule.severity.critical is not None else ["warning"]
        for severity in severities:
            labels = {
                "severity": severity,
                "code": alert.rule.code,
                "class": alert.rule.category.value,
                SERVER_LABEL: out.server,
            }
            if alert.rule.advisory:
                labels["advisory"] = "true"
            alerting.append(
                {
                    "alert": _camel(alert.rule.slug),
                    "expr": _alert_expr(out, alert, severity),
                    "for": for_text,
                    "labels": labels,
                    "annotations": _annotations(alert, out.server, severity, runbook_url),
                }
            )
    return [
        {"name": f"llmdiag-{out.server}-recording", "rules": recording},
        {"name": f"llmdiag-{out.server}-alerts", "rules": alerting},
    ]


def _comments(exports: list[ServerExport], window: str, for_text: str, settings: Settings) -> str:
    lines = [
        "Generated by `llmdiag rules export` from llmdiag's rule catalogue: do not edit, export again.",
        f"Window {window} (counters' rate/increase, gauges' *_over_time, histogram quantiles); for: {for_text}.",
        f"TPOT SLO {number(settings.slo_tpot_seconds)} s (CMP001). Alerts tell you when; `llmdiag scan` tells you why.",
        *([f"Thresholds overridden by the settings: {', '.join(sorted(settings.rules))}."] if settings.rules else []),
    ]
    for out in exports:
        codes = ", ".join(a.rule.code for a in out.alerts) or "none"
        lines.append(f"{out.server}: alerts for {codes}")
        lines.append(f"{out.server}: not exported:")
        lines += [f"  {code}: {why}" for code, why in out.left_out]
    return "".join(f"# {line}\n".replace("# \n", "#\n") for line in lines)


# --------------------------------------------------------------------------------------------------------------------
# a Grafana dashboard over the recorded signals

PANEL_WIDTH, PANEL_HEIGHT = 12, 8  # two panels a row on Grafana's 24-column grid


def _thresholds(rules: list[RuleSpec]) -> dict[str, Any]:
    """Grafana's ascending threshold steps from the first rule whose ladder reads the panel's series."""
    if not rules:
        return {"mode": "absolute", "steps": [{"color": "green", "value": None}]}
    ladder = rules[0].severity
    marks = [("orange", ladder.warning)] + ([("red", ladder.critical)] if ladder.critical is not None else [])
    if ladder.direction == "above":
        steps = [{"color": "green", "value": None}] + [{"color": c, "value": v} for c, v in marks]
    else:  # below: the lowest values are the worst
        lowest = [{"color": c, "value": v} for c, v in reversed(marks)]
        steps = [{"color": lowest[0]["color"], "value": None}, *lowest[1:], {"color": "green", "value": ladder.warning}]
    return {"mode": "absolute", "steps": steps}


def _panels(out: ServerExport, first_id: int, top: int) -> list[dict[str, Any]]:
    rec = out.recorder
    ladders: dict[tuple[str, str], list[RuleSpec]] = {}
    for alert in out.alerts:
        ladders.setdefault((alert.rule.severity.signal, alert.rule.severity.stat), []).append(alert.rule)
    panels: list[dict[str, Any]] = []
    for record in rec.rules:
        _, signal, stat_window = record.split(":")
        if not stat_window.endswith(rec.window):
            continue  # a per-evaluation value, read by the window's stats
        stat = stat_window.removesuffix(rec.window)
        rules = ladders.get((signal, stat), [])
        index = len(panels)
        drawn = f"; thresholds: {rules[0].code} warning/critical" if rules else ""
        panels.append(
            {
                "id": first_id + index,
                "type": "timeseries",
                "title": f"{signal} {stat} ({rec.window})",
                "description": ", ".join(r.code for r in rules) + drawn if rules else "an input of the rules",
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {
                    "x": (index % 2) * PANEL_WIDTH,
                    "y": top + (index // 2) * PANEL_HEIGHT,
                    "w": PANEL_WIDTH,
                    "h": PANEL_HEIGHT,
                },
                "targets": [{"refId": "A", "expr": rec.read(record), "legendFormat": "{{instance}}"}],
                "fieldConfig": {
                    "defaults": {
                        "thresholds": _thresholds(rules),
                        "custom": {"thresholdsStyle": {"mode": "line+area" if rules else "off"}},
                    },
                    "overrides": [],
                },
            }
        )
    return panels


def _dashboard(exports: list[ServerExport], server: str | None) -> dict[str, Any]:
    """One panel per recorded signal, a row per server dialect."""
    panels: list[dict[str, Any]] = []
    top = 0
    for out in exports:
        panels.append(
            {
                "id": len(panels) + 1,
                "type": "row",
                "title": f"{out.server}",
                "collapsed": False,
                "gridPos": {"x": 0, "y": top, "w": 24, "h": 1},
                "panels": [],
            }
        )
        top += 1
        mine = _panels(out, len(panels) + 1, top)
        panels += mine
        top += ((len(mine) + 1) // 2) * PANEL_HEIGHT
    return {
        "title": f"llmdiag: {server}" if server else "llmdiag",
        "uid": f"llmdiag-{server}" if server else "llmdiag",
        "tags": ["llmdiag"],
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [{"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"}]
        },
        "panels": panels,
    }


class _Dumper(yaml.SafeDumper):
    """Safe YAML, with text of several lines (the fixes) as a literal block: what a person reads in the file."""


def _text(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _text)


def _checked_runbook(template: str) -> str:
    unknown = [name for name in re.findall(r"\{([^}]*)\}", template) if name not in ("code", "slug")]
    if unknown:
        raise UsageError(
            f"{option('runbook_url')} '{template}' has an unknown placeholder {{{unknown[0]}}}",
            "use {code} and {slug}, e.g. https://example.org/runbooks/{code}-{slug}",
        )
    return template


def export_rules(
    *,
    format: str = "prometheus",
    server: str | None = None,
    selector: str | None = None,
    window: str = DEFAULT_WINDOW,
    for_duration: str = DEFAULT_FOR,
    runbook_url: str = DEFAULT_RUNBOOK_URL,
    settings: Settings | None = None,
    slo_tpot_seconds: float | None = None,
) -> str:
    """The rules file (``prometheus``) or a prometheus-operator PrometheusRule (``prometheusrule``), as YAML; or a
    Grafana dashboard (``grafana``, JSON) of the recorded signals, the rules' thresholds drawn.

    ``settings`` (llmdiag.toml): its threshold overrides and muted rules apply as in a scan; ``slo_tpot_seconds``
    wins over its TPOT SLO."""
    if format not in FORMATS:
        raise UsageError(f"{option('format')} '{format}' is not an export format", f"one of {', '.join(FORMATS)}")
    if server is not None and server not in SERVERS:
        raise UsageError(f"{option('server')} '{server}' is not a server llmdiag knows", f"one of {', '.join(SERVERS)}")
    inner = selector_matchers(selector)
    window_seconds = parse_duration(window, option("window"))
    for_seconds = parse_duration(for_duration, option("for_duration"), zero=True)  # 0s: fire at once
    settings = settings or Settings()
    if slo_tpot_seconds is not None:
        if not 0 < slo_tpot_seconds < float("inf"):
            raise UsageError(f"{option('slo_tpot_seconds')} must be positive", "e.g. 0.05 (20 tokens/s per user)")
        settings = settings.model_copy(update={"slo_tpot_seconds": slo_tpot_seconds})
    runbook = _checked_runbook(runbook_url)
    exports = [
        _build_server(name, inner=inner, window_seconds=window_seconds, settings=settings)
        for name in ([server] if server else SERVERS)
    ]
    for_text = window_name(for_seconds)
    groups = [g for out in exports for g in _groups(out, for_text, runbook)]
    document: dict[str, Any] = {"groups": groups}
    if format == "prometheusrule":
        document = {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {
                "name": f"llmdiag-{server}" if server else "llmdiag",
                "labels": {"app.kubernetes.io/name": "llmdiag"},
            },
            "spec": document,
        }
    if format == "grafana":
        return json.dumps(_dashboard(exports, server), indent=1, ensure_ascii=False) + "\n"
    header = _comments(exports, window_name(window_seconds), for_text, settings)
    body = yaml.dump(document, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=4096)
    return header + body
