"""A check report as Nagios plugin output: one status line with perfdata, then one line per finding.

    LLMDIAG CRITICAL - memory: 2.00 preemptions/s … (MEM001) | kv_cache_usage_ratio=0.98;;;0;1 …
    <long text: each target, its findings, its baseline>

Perfdata follows the plugin guidelines: ``'label'=value[UOM];[warn];[crit];[min];[max]``, base units
(``s`` for seconds, plain numbers for ratios and rates), ``U`` for a value that could not be measured (never 0).
Where a rule's severity ladder is on the signal, warn and crit are its thresholds (with llmdiag.toml's
overrides), as Nagios ranges: ``X`` alerts above X, ``X:`` alerts below X.
"""

from __future__ import annotations

import re

from llmdiag.config import Settings
from llmdiag.model import CheckReport, State, TargetResult, Verdict
from llmdiag.render.format import confidence_words, window_words
from llmdiag.schema.loader import load_rules
from llmdiag.schema.rules import RuleSpec

# label, signal, stat, UOM, min, max: always reported (U when unavailable)
# (label, signal, stat, unit of measure, min, max): min and max are the perfdata's bounds, None when open
PerfItem = tuple[str, str, str, str, float | None, float | None]
PERFDATA: tuple[PerfItem, ...] = (
    ("kv_cache_usage_ratio", "kv_cache_usage_ratio", "max", "", 0, 1),
    ("requests_running", "requests_running_avg", "value", "", 0, None),
    ("requests_waiting", "requests_waiting_avg", "value", "", 0, None),
    ("preemptions_per_second", "preemptions_per_second", "rate", "", 0, None),
    ("generation_tokens_per_second", "generation_tokens_per_second", "rate", "", 0, None),
    ("ttft_p95_seconds", "ttft_seconds", "p95", "s", 0, None),
    ("tpot_p95_seconds", "tpot_seconds", "p95", "s", 0, None),
    ("itl_p50_seconds", "itl_seconds", "p50", "s", 0, None),
    # how long the engine has made no progress with requests in it: the stall rules' ladder (SCH003, MEM007, SCH011)
    ("no_progress_seconds", "no_progress_seconds", "value", "s", 0, None),
)
UOM = {"seconds": "s", "bytes": "B", "ratio": ""}
PLAIN_LABEL = re.compile(r"^[A-Za-z0-9_.:/-]+$")


def number(value: float) -> str:
    """Plain decimal (the guidelines' [-0-9.]), never exponent notation."""
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def label_text(label: str) -> str:
    label = label.replace("'", "").replace("=", "_")
    return label if PLAIN_LABEL.match(label) else f"'{label}'"


def clean(text: str) -> str:
    """The status text may not hold '|' (it starts perfdata) or line breaks."""
    return " ".join(text.replace("|", "/").split())


def _ladders(settings: Settings) -> dict[tuple[str, str], tuple[RuleSpec, float, float | None]]:
    out: dict[tuple[str, str], tuple[RuleSpec, float, float | None]] = {}
    for rule in load_rules():
        if settings.mute_reason(rule.code):
            continue
        override = settings.rules.get(rule.code)
        warning = override.warning if override and override.warning is not None else rule.severity.warning
        critical = override.critical if override and override.critical is not None else rule.severity.critical
        out.setdefault((rule.severity.signal, rule.severity.stat), (rule, warning, critical))
    return out


def _range(rule: RuleSpec, value: float | None) -> str:
    if value is None:
        return ""
    return number(value) if rule.severity.direction == "above" else f"{number(value)}:"


def _value(verdict: Verdict, signal: str, stat: str) -> float | None:
    found = verdict.signals.get(signal)
    return found.stat(stat) if found is not None else None


def perfdata(result: TargetResult, settings: Settings, prefix: str = "") -> list[str]:
    verdict = result.verdict
    if verdict is None:
        return []
    ladders = _ladders(settings)
    wanted: list[PerfItem] = list(PERFDATA)
    # the ladder signal of each finding, when it is not one of the fixed ones
    fixed = {(signal, stat) for _, signal, stat, *_ in PERFDATA}
    for finding in verdict.findings:
        ev = finding.evidence[0]
        if (ev.signal, ev.stat) in fixed:
            continue
        fixed.add((ev.signal, ev.stat))
        label = ev.signal if ev.stat in ("value", "rate") else f"{ev.signal}_{ev.stat}"
        wanted.append((label, ev.signal, ev.stat, UOM.get(ev.unit, ""), None, None))
    items = []
    for label, signal, stat, uom, lo, hi in wanted:
        value = _value(verdict, signal, stat)
        ladder = ladders.get((signal, stat))
        warn = _range(ladder[0], ladder[1]) if ladder else ""
        crit = _range(ladder[0], ladder[2]) if ladder else ""
        shown = f"{number(value)}{uom}" if value is not None else "U"
        bounds = ";".join("" if b is None else number(b) for b in (lo, hi))
        item = f"{label_text(prefix + label)}={shown};{warn};{crit};{bounds}"
        items.append(re.sub(r";+$", "", item))
    return items


def fleet_perfdata(report: CheckReport, settings: Settings) -> list[str]:
    """`check --prometheus`: the fleet's peer ratios (``fleet_<signal>``), with the fleet rules' thresholds."""
    ladders = _ladders(settings)
    items = []
    for signal, value in sorted(report.fleet_signals.items()):
        ladder = ladders.get((signal, "value"))
        warn = _range(ladder[0], ladder[1]) if ladder else ""
        crit = _range(ladder[0], ladder[2]) if ladder else ""
        shown = number(value) if value is not None else "U"
        items.append(re.sub(r";+$", "", f"{label_text('fleet_' + signal)}={shown};{warn};{crit};0"))
    return items


def _headline(result: TargetResult) -> str:
    if result.verdict is None:
        return f"cannot check {result.url}: {result.error}"
    verdict = result.verdict
    if verdict.findings:
        top = verdict.findings[0]
        return f"{verdict.bottleneck.value}: {top.summary} ({top.code})"
    summary = verdict.summary.split(": ", 1)[1] if ": " in verdict.summary else verdict.summary
    return f"{verdict.bottleneck.value}: {summary}"


def _window(verdict: Verdict) -> str:
    words = window_words(verdict.window.kind)
    return words if words is not None else f"{verdict.window.duration_seconds or 0:.0f} s window"


def _details(result: TargetResult, several: bool) -> list[str]:
    indent = "  " if several else ""
    lines = []
    if several:
        what = result.verdict.bottleneck.value if result.verdict is not None else "not diagnosed"
        lines.append(f"{result.name} ({result.url}): {result.state.name} {what}")
    if result.verdict is None:
        lines.append(f"{indent}ERROR: {result.error}")
        if result.hint:
            lines.append(f"{indent}HINT: {result.hint}")
        return lines
    verdict = result.verdict
    if not several:
        lines.append(
            f"{result.name}: {verdict.bottleneck.value}, confidence {verdict.confidence:.2f} "
            f"({confidence_words(verdict.confidence_label, verdict.window.kind)}), {_window(verdict)}"
        )
    else:
        lines.append(
            f"{indent}confidence {verdict.confidence:.2f} "
            f"({confidence_words(verdict.confidence_label, verdict.window.kind)}), {_window(verdict)}"
        )
    for finding in verdict.findings:
        lines.append(f"{indent}{finding.severity.value.upper()} {finding.code} {finding.slug}: {finding.summary}")
    if not verdict.findings:
        lines.append(f"{indent}no findings: {verdict.summary}")
    lines.append(f"{indent}{result.baseline}")
    lines.extend(f"{indent}muted {m}" for m in result.muted)
    return lines


def render_nagios(report: CheckReport, settings: Settings) -> str:
    results = report.targets
    several = len(results) > 1
    if not several:
        [result] = results
        head = _headline(result)
        perf = perfdata(result, settings)
    else:
        parts = []
        for r in results:
            if r.verdict is None:
                parts.append(f"{r.name} {r.state.name} {'no data' if report.source else 'unreachable'}")
            else:
                code = f" ({r.verdict.findings[0].code})" if r.verdict.findings else ""
                parts.append(f"{r.name} {r.state.name} {r.verdict.bottleneck.value}{code}")
        head = f"{len(results)} targets: " + ", ".join(parts)
        perf = [item for r in results for item in perfdata(r, settings, prefix=f"{r.name}_")]
    if report.fleet_findings:
        head += "; fleet: " + ", ".join(f"{f.finding.code} {f.replica}" for f in report.fleet_findings)
    perf += fleet_perfdata(report, settings)
    first = f"LLMDIAG {report.state.name} - {clean(head)}"
    if perf:
        first += " | " + " ".join(perf)
    long = [f"source: {clean(report.source)}"] if report.source else []
    for item in report.fleet_findings:
        f = item.finding
        long.append(clean(f"fleet {f.severity.value.upper()} {f.code} {f.slug}: {f.summary}"))
    long += [clean(line) for r in results for line in _details(r, several)]
    long += [f"UNKNOWN: {clean(e)}" for e in report.output_errors]
    return "\n".join([first, *long]) + "\n"


__all__ = ["render_nagios", "perfdata", "State"]
