"""Render a FleetReport (several replicas side by side) for the terminal, and its timeline. Never prints."""

from __future__ import annotations

from rich.console import Group, JustifyMethod, RenderableType
from rich.table import Table
from rich.text import Text

from llmdiag.model import Bottleneck, FleetReport, FleetTimeline
from llmdiag.render.format import UNAVAILABLE, clock, format_value, when
from llmdiag.render.terminal import CLASS_STYLE, SEVERITY_STYLE

STATE_STYLE = {"CRITICAL": "bold red", "WARNING": "bold yellow", "UNKNOWN": "dim", "OK": "green"}


def _counts(report: FleetReport) -> Text:
    line = Text()
    total = len(report.targets)
    line.append(f"{total} replica{'s' if total != 1 else ''}: ", style="bold")
    for index, (name, count) in enumerate(report.class_counts.items()):
        if index:
            line.append("  ")
        line.append(f" {count} {name} ", style=CLASS_STYLE[Bottleneck(name)])
    return line


def _table(report: FleetReport) -> Table:
    table = Table(box=None, header_style="bold", padding=(0, 1), pad_edge=False)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("replica", "left"),
        ("class", "left"),
        ("conf", "right"),
        ("state", "left"),
        ("req/s", "right"),
        ("running", "right"),
        ("waiting", "right"),
        ("KV max", "right"),
        ("TTFT p90", "right"),
        ("out tok/s", "right"),
        ("why", "left"),
    )
    for title, justify in columns:
        table.add_column(title, justify=justify, no_wrap=title != "why")
    for t in report.targets:
        n = t.numbers
        if t.error is not None:
            why = Text(f"{t.error}" + (f" (HINT: {t.hint})" if t.hint else ""), style="yellow")
        else:
            bits = [t.primary] if t.primary else []
            bits += [f"flagged by {code}" for code in t.flagged_by]
            why = Text(" · ".join(bits), style="bold" if t.flagged_by else "")
        table.add_row(
            t.name,
            Text(f" {t.bottleneck.value} ", style=CLASS_STYLE[t.bottleneck]),
            f"{t.confidence:.2f}" if t.confidence is not None else "",
            Text(t.state, style=STATE_STYLE[t.state]),
            format_value(n.request_rate_per_second, "requests/s").replace(" req/s", ""),
            format_value(n.requests_running_mean, "requests").replace(" req", ""),
            format_value(n.requests_waiting_mean, "requests").replace(" req", ""),
            format_value(n.kv_cache_usage_max_ratio, "ratio"),
            format_value(n.ttft_p90_seconds, "seconds"),
            format_value(n.generation_tokens_per_second, "tokens/s").replace(" tok/s", ""),
            why,
        )
    return table


def _imbalance(report: FleetReport) -> RenderableType:
    parts: list[RenderableType] = []
    for item in report.imbalance:
        f = item.finding
        head = Text()
        head.append(f"{f.severity.value.upper():8}", style=SEVERITY_STYLE[f.severity])
        head.append(f" {f.code} {f.title}  ", style="bold")
        head.append(f"[{f.slug}]", style="dim")
        unit = "seconds" if "TTFT" in item.compared else "requests/s" if "requests/s" in item.compared else "requests"
        values = ", ".join(
            f"{name} {format_value(v, unit)}" for name, v in sorted(item.values.items(), key=lambda kv: -kv[1])
        )
        body = Text(f"  {f.summary}\n  {item.compared} per replica: {values}\n")
        for e in f.evidence[1:]:
            if e.signal.endswith("_over_peers_ratio"):
                shown = f"{e.value:.2f}x" if e.value is not None else UNAVAILABLE
                body.append(f"  {e.signal} = {shown}\n", style="dim")
        if f.fixes:
            body.append(f"  Fix: {f.fixes[0]}\n")
        parts += [head, body]
    if not parts:
        judged = report.fleet_rules
        reasons = "; ".join(f"{o.code} {o.status}: {o.reason}" for o in judged)
        parts.append(Text(f"  none ({reasons})\n", style="dim"))
    return Group(*parts)


# one letter per class in the terminal's strip (its colour is the class's); no data is a dim dot, never healthy
CLASS_LETTER = {
    Bottleneck.memory: "M",
    Bottleneck.compute: "C",
    Bottleneck.scheduling: "S",
    Bottleneck.network: "N",
    Bottleneck.healthy: "h",
    Bottleneck.idle: "i",
    Bottleneck.unknown: "?",
    Bottleneck.stalled: "X",
}
MAX_STRIP_COLUMNS = 72


def timeline_strip(timeline: FleetTimeline, order: list[str] | None = None) -> Text:
    """One row per replica, one letter per step coloured by its class (longer timelines: every k-th step)."""
    steps = timeline.steps[:: max(1, -(-len(timeline.steps) // MAX_STRIP_COLUMNS))]
    names = sorted({n for s in steps for n in s.classes})
    if order:
        names = [n for n in order if n in names] + [n for n in names if n not in order]
    out = Text()
    if not steps or not names:
        return out
    width = max(len(n) for n in names)
    short = steps[-1].at_unix - steps[0].at_unix < 3600
    first, last = clock(steps[0].at_unix, short), clock(steps[-1].at_unix, short)
    every = f", every {len(timeline.steps) // len(steps)} step(s)" if len(steps) < len(timeline.steps) else ""
    out.append(f"  {'':{width}}  {first} … {last} UTC (one column per step{every})\n", style="dim")
    for name in names:
        out.append(f"  {name:{width}}  ")
        for step in steps:
            cls = step.classes.get(name)
            if cls is None:
                out.append("·", style="dim")
            else:
                out.append(CLASS_LETTER[cls], style=CLASS_STYLE[cls])
        out.append("\n")
    used = [b for b in Bottleneck if any(s.classes.get(n) is b for s in steps for n in names)]
    legend = "  ".join(f"{CLASS_LETTER[b]} {b.value}" for b in used)
    out.append(f"  {'':{width}}  {legend}  · no data\n", style="dim")
    return out


def render_timeline(timeline: FleetTimeline, order: list[str] | None = None) -> RenderableType:
    lines = Text()
    lines.append_text(timeline_strip(timeline, order))
    if timeline.first_to_go:
        cls = timeline.first_to_go_class.value if timeline.first_to_go_class else "?"
        lines.append(
            f"  first to go: {', '.join(timeline.first_to_go)} → {cls} at {when(timeline.first_to_go_at_unix)}\n",
            style="bold",
        )
    else:
        lines.append("  no replica went from healthy/idle to a bottleneck class in these steps\n", style="dim")
    for t in timeline.fleet_transitions:
        lines.append(f"  {when(t.at_unix)}  the fleet: {t.from_class.value} → {t.to_class.value}\n")
    for t in timeline.transitions:
        lines.append(f"  {when(t.at_unix)}  {t.replica}: {t.from_class.value} → {t.to_class.value}\n", style="dim")
    for note in timeline.notes:
        lines.append(f"  - {note}\n", style="dim")
    return lines


def render_fleet(report: FleetReport) -> RenderableType:
    context = f"{report.source} · {when(report.at_unix)}"
    if report.window_seconds is not None:
        context += f" · window {report.window_seconds:g} s each"
    if report.queries is not None:
        context += f" · {report.queries} PromQL queries"
        if report.scrape_interval_seconds is not None:
            context += f", scrape every {report.scrape_interval_seconds:g} s"
    parts: list[RenderableType] = [Text(context, style="dim"), _counts(report), Text("")]
    parts.append(Text("Replicas, worst first", style="bold underline"))
    parts.append(_table(report))
    parts.append(Text("\nImbalance across replicas", style="bold underline"))
    parts.append(_imbalance(report))
    if report.timeline is not None:
        parts.append(Text("Timeline", style="bold underline"))
        parts.append(render_timeline(report.timeline, [t.name for t in report.targets]))
    if report.notes:
        parts.append(Text("Notes", style="bold underline"))
        parts.append(Text("".join(f"  - {n}\n" for n in report.notes), style="dim"))
    return Group(*parts)
