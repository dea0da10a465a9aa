"""Render a Verdict for the terminal as rich renderables. The CLI prints them; this module never does."""

from __future__ import annotations

from rich.console import Group, JustifyMethod, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from llmdiag.engine.fixes import DEFAULT_ENGINE, fix_view, verdict_engine
from llmdiag.model import Bottleneck, Evidence, Finding, Severity, Verdict
from llmdiag.render.format import BOUND_WORDS, CAPACITY_CLASSES, confidence_words, format_value, window_words
from llmdiag.render.whatif import effect_line

CLASS_STYLE = {
    Bottleneck.memory: "bold white on red",
    Bottleneck.compute: "bold white on dark_orange3",
    Bottleneck.scheduling: "bold black on yellow",
    Bottleneck.network: "bold white on magenta",
    Bottleneck.healthy: "bold white on green",
    Bottleneck.idle: "bold white on blue",
    Bottleneck.unknown: "bold white on grey42",
    Bottleneck.stalled: "bold white on dark_red",
}
SEVERITY_STYLE = {Severity.critical: "bold red", Severity.warning: "bold yellow"}


def _headline(verdict: Verdict) -> RenderableType:
    label = "BOUND" if verdict.bottleneck.value in CAPACITY_CLASSES else ""
    tag = f" {verdict.bottleneck.value.upper()}{'-' + label if label else ''} "
    line = Text()
    line.append(tag, style=CLASS_STYLE[verdict.bottleneck])
    words = confidence_words(verdict.confidence_label, verdict.window.kind)
    line.append(f"  confidence {verdict.confidence:.2f} ({words})", style="bold")
    return Group(line, Text(verdict.summary))


def _context(verdict: Verdict) -> Text:
    bits = [verdict.target]
    for probe in verdict.coverage.probes:
        if not probe.ok:
            continue
        if probe.server:
            bits.append(probe.server)
        if probe.models:
            bits.append("model " + ", ".join(probe.models))
        if len(probe.engines) > 1:
            bits.append(f"{len(probe.engines)} engines")
    window = verdict.window
    if (words := window_words(window.kind)) is not None:
        bits.append(words)
    elif window.duration_seconds is not None:
        bits.append(f"window {window.duration_seconds:.0f} s, {window.scrapes} scrapes")
    return Text(" · ".join(b for b in bits if b), style="dim")


def _evidence_table(evidence: list[Evidence]) -> Table:
    rows = []
    for item in evidence:
        threshold = f"{item.op} {format_value(item.threshold, item.unit)}" if item.threshold is not None else ""
        name = item.signal if item.stat == "value" else f"{item.signal} {item.stat}"
        rows.append((name, format_value(item.value, item.unit), threshold, item.source))
    table = Table(show_header=True, header_style="dim", box=None, padding=(0, 1), pad_edge=False)
    # numbers are never cut; only the source column gives way on a narrow terminal
    columns: tuple[tuple[str, JustifyMethod], ...] = (("signal", "left"), ("value", "right"), ("threshold", "right"))
    for index, (title, justify) in enumerate(columns):
        width = max([len(title)] + [len(row[index]) for row in rows])
        table.add_column(title, justify=justify, no_wrap=True, min_width=width)
    table.add_column("source", style="dim", no_wrap=True, overflow="ellipsis")
    for row in rows:
        table.add_row(*row)
    return table


def _fixes(finding: Finding, engine: str) -> Text:
    """The fix text, then the detected engine's flags under its name; the others are one command away."""
    fixes = Text()
    view = fix_view(finding, engine)
    if view is None:
        return fixes
    fixes.append(f"  Fix: {view.text}\n")
    if view.own:
        fixes.append(f"    {view.title}:\n", style="bold")
        for flag in view.own:
            fixes.append(f"    • {flag}\n", style="cyan")
    if view.others:
        titles = ", ".join(title for title, _ in view.others)
        fixes.append(f"    {titles}: llmdiag rules show {finding.code}\n", style="dim")
    modelled = [e for e in finding.predicted if e.modelled]
    if modelled:
        fixes.append("    Predicted (llmdiag whatif):\n", style="bold")
        for effect in modelled:
            fixes.append(f"    ▸ {effect_line(effect)}\n")
    return fixes


def _finding(finding: Finding, verbose: bool, engine: str = DEFAULT_ENGINE) -> RenderableType:
    head = Text()
    head.append(f"{finding.severity.value.upper():8}", style=SEVERITY_STYLE[finding.severity])
    head.append(f" {finding.code} ", style="bold")
    head.append(f"{finding.title}  ", style="bold")
    head.append(f"[{finding.slug}]", style="dim")
    if finding.advisory:
        head.append("  advisory: not what limits the server now", style="dim italic")
    fixes = _fixes(finding, engine)
    return Group(
        head,
        Text(f"  {finding.summary}"),
        Text(f"  Why: {finding.why}", style="dim") if finding.why and verbose else Text(""),
        _evidence_table(finding.evidence),
        fixes,
    )


def _experience(verdict: Verdict) -> Table:
    exp = verdict.experience
    table = Table(box=None, show_header=False, padding=(0, 2), pad_edge=False)
    table.add_row(
        "time to first token p50 / p90",
        f"{format_value(exp.ttft_p50_seconds, 'seconds')} / {format_value(exp.ttft_p90_seconds, 'seconds')}",
    )
    if exp.client_requests:
        table.add_row(
            f"  seen by {exp.client_requests} canary requests",
            f"{format_value(exp.client_ttft_p50_seconds, 'seconds')} / "
            f"{format_value(exp.client_ttft_p90_seconds, 'seconds')}",
        )
        table.add_row("  canary time per output token p50", format_value(exp.client_tpot_p50_seconds, "seconds"))
    table.add_row(
        "inter-token latency p50 / p90",
        f"{format_value(exp.itl_p50_seconds, 'seconds')} / {format_value(exp.itl_p90_seconds, 'seconds')}",
    )
    table.add_row("output tokens/s, whole server", format_value(exp.generation_tokens_per_second, "tokens/s"))
    running = format_value(exp.requests_running_mean, "requests")
    waiting = format_value(exp.requests_waiting_mean, "requests")
    table.add_row("requests running / waiting (mean)", f"{running} / {waiting}")
    table.add_row("output tokens/s per running request", format_value(exp.per_user_tokens_per_second, "tokens/s"))
    table.add_row(
        "output tokens/s per user, queue included",
        format_value(exp.per_user_tokens_per_second_incl_waiting, "tokens/s"),
    )
    return table


def _roofline(verdict: Verdict) -> Text:
    r = verdict.roofline
    assert r is not None
    where = f"{r.model} on {r.tp} × {r.gpu}"
    return Text(
        f"  decode {format_value(r.measured_tokens_per_second, 'tokens/s')} is "
        f"{r.fraction_of_ceiling_ratio:.0%} of the {format_value(r.ceiling_tokens_per_second, 'tokens/s')} ceiling "
        f"for {r.batch_sequences:.1f} sequences at ~{r.context_tokens:.0f} tokens ({where}); "
        f"at this batch the ceiling is set by {BOUND_WORDS.get(r.bound_by, r.bound_by)}\n"
    )


def _coverage(verdict: Verdict, verbose: bool = False) -> RenderableType:
    """The sources that could not be read, one line per class, and the muted rules; each skipped rule and why only
    when ``verbose`` (a scan without GPU telemetry or history skips some twenty). The JSON keeps every outcome."""
    lines = Text()
    for index, probe in enumerate(verdict.coverage.probes):
        if not probe.ok:
            lines.append(f"  {probe.note}\n", style="yellow")
        elif index > 0:  # telemetry beside the server: what it read
            details = "; ".join(f"{k} {v}" for k, v in probe.config.items())
            lines.append(f"  {probe.server} {probe.url}" + (f": {details}" if details else "") + "\n", style="green")
    for cls in verdict.coverage.classes:
        if cls.evaluated:
            lines.append(f"  {cls.category.value:11} evaluated ({cls.rules_run} rules", style="green")
            lines.append(f", {cls.rules_skipped} skipped)\n" if cls.rules_skipped else ")\n", style="green")
        else:
            lines.append(f"  {cls.category.value:11} not evaluated: {cls.reason}\n", style="yellow")
    shown = ("skipped", "muted") if verbose else ("muted",)
    for outcome in (r for r in verdict.coverage.rules if r.status in shown):
        lines.append(f"  {outcome.code} {outcome.status}: {outcome.reason}\n", style="dim")
    return lines


def render_terminal(verdict: Verdict, verbose: bool = False) -> RenderableType:
    parts: list[RenderableType] = [_context(verdict), Panel(_headline(verdict), expand=False)]
    if verdict.findings:
        parts.append(Text("\nFindings", style="bold underline"))
        engine = verdict_engine(verdict)
        parts += [_finding(f, verbose, engine) for f in verdict.findings]
    parts.append(Text("\nWhat users see now", style="bold underline"))
    parts.append(_experience(verdict))
    if verdict.roofline is not None:
        parts.append(Text("\nAgainst the hardware ceiling", style="bold underline"))
        parts.append(_roofline(verdict))
    parts.append(Text("\nCoverage", style="bold underline"))
    parts.append(_coverage(verdict, verbose))
    if verdict.notes:
        parts.append(Text("Notes", style="bold underline"))
        parts.append(Text("".join(f"  - {n}\n" for n in verdict.notes), style="dim"))
    if verbose:
        parts.append(render_signal_table(verdict))
    return Group(*parts)


def render_signal_table(verdict: Verdict) -> Table:
    table = Table(title="Signals", show_lines=False)
    table.add_column("signal")
    table.add_column("kind", style="dim")
    table.add_column("stats")
    table.add_column("source", style="dim")
    for name, signal in sorted(verdict.signals.items()):
        if signal.unavailable is not None:
            stats = Text(f"unavailable: {signal.unavailable}", style="yellow")
        else:
            stats = Text(", ".join(f"{k}={format_value(v, signal.unit)}" for k, v in signal.stats.items()))
        table.add_row(name, signal.kind, stats, signal.source)
    return table
