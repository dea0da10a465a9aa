"""Render a matched A/B (a Comparison): per level, each metric before and after, the difference with its interval,
and whatif's prediction beside it; for the terminal and for Markdown (the HTML is in reports/report.html.j2)."""

from __future__ import annotations

from collections.abc import Callable

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from llmdiag.model.abtest import Comparison, LevelComparison, MetricDiff
from llmdiag.render.format import UNAVAILABLE, milliseconds, rate

CHANGE_STYLE = {
    "better": "green",
    "worse": "red",
    "no change shown": "dim",
    "unavailable": "dim",
    "server gauge": "dim",
}


def value(v: float | None, unit: str) -> str:
    if v is None:
        return UNAVAILABLE
    if unit == "seconds":
        return f"{milliseconds(v)} ms"
    if unit == "ratio":
        return f"{v:.1%}"
    if unit == "requests":
        return f"{v:.1f}"
    if unit == "per second":
        return f"{v:.2f}/s"
    return rate(v)


def signed(v: float | None, unit: str) -> str:
    if v is None:
        return UNAVAILABLE
    sign = "+" if v >= 0 else "−"
    return sign + value(abs(v), unit)


def difference(m: MetricDiff) -> str:
    """'+12.3 ms [+8.1 ms, +16.0 ms]'; without an interval just the difference."""
    if m.difference is None:
        return UNAVAILABLE
    if m.ci_low is None or m.ci_high is None:
        return f"{signed(m.difference, m.unit)} (no interval)"
    return f"{signed(m.difference, m.unit)} [{signed(m.ci_low, m.unit)}, {signed(m.ci_high, m.unit)}]"


def predicted(m: MetricDiff) -> str:
    if m.predicted is None:
        return ""
    if m.predicted_low is not None and m.predicted_high is not None:
        band = f" ({value(m.predicted_low, m.unit)}–{value(m.predicted_high, m.unit)})"
    else:
        band = ""
    inside = ""
    if m.after is not None and m.predicted_low is not None and m.predicted_high is not None:
        inside = ", measured inside" if m.predicted_low <= m.after <= m.predicted_high else ", measured outside"
    return f"{value(m.predicted, m.unit)}{band}{inside}"


def where(level: LevelComparison) -> str:
    return f"{level.users} users" if level.users is not None else f"{level.rate_per_second:g} requests/s"


def class_line(level: LevelComparison) -> str:
    line = f"class {level.class_before or UNAVAILABLE} → {level.class_after or UNAVAILABLE}"
    if level.class_predicted is not None:
        right = "right" if level.class_predicted == level.class_after else "wrong"
        line += f" (predicted {level.class_predicted}: {right})"
    return line


def render_comparison(comparison: Comparison) -> RenderableType:
    with_prediction = any(m.predicted is not None for lv in comparison.levels for m in lv.metrics)
    parts: list[RenderableType] = [
        Text(
            f"A/B against {comparison.baseline}: {comparison.model} · server "
            f"{comparison.server_version or UNAVAILABLE}",
            style="bold",
        )
    ]
    for level in comparison.levels:
        table = Table(
            title=f"{where(level)}: {level.requests_before} → {level.requests_after} requests · {class_line(level)}",
            title_justify="left",
            header_style="bold",
            box=box.SIMPLE_HEAD,
            padding=(0, 1),
            pad_edge=False,
        )
        for title in ("metric", "before", "after", f"after − before [{comparison.confidence_level:.0%} CI]", ""):
            table.add_column(title, no_wrap=True, justify="left" if title in ("metric", "") else "right")
        if with_prediction:
            table.add_column("predicted (band)", no_wrap=True)
        for m in level.metrics:
            row: list[str | Text] = [
                m.label,
                value(m.before, m.unit),
                value(m.after, m.unit),
                difference(m),
                Text(m.change, style=CHANGE_STYLE[m.change]),
            ]
            if with_prediction:
                row.append(predicted(m))
            table.add_row(*row)
        parts.append(table)
    lines = Text()
    if comparison.prediction_not_modelled:
        lines.append(f"  whatif made no prediction: {comparison.prediction_not_modelled}\n", style="yellow")
    if comparison.next_limit_predicted:
        lines.append(f"  predicted next limit: {comparison.next_limit_predicted}\n")
    lines.append(f"  interval: {comparison.method}\n", style="dim")
    for note in comparison.notes:
        lines.append(f"  - {note}\n", style="dim")
    parts.append(lines)
    return Group(*parts)


def comparison_markdown(comparison: Comparison, md: Callable[[str], str] = str) -> list[str]:
    """The A/B as Markdown lines; ``md`` escapes text a server or a user wrote."""
    with_prediction = any(m.predicted is not None for lv in comparison.levels for m in lv.metrics)
    lines = [
        "",
        f"**A/B** against {md(comparison.baseline)} · model {md(comparison.model)} · server "
        f"{md(comparison.server_version or UNAVAILABLE)}",
    ]
    for level in comparison.levels:
        head = "| metric | before | after | after − before (95 % CI) | change |"
        rule = "|---|---:|---:|---:|---|"
        if with_prediction:
            head, rule = head + " predicted |", rule + "---|"
        lines += [
            "",
            f"{where(level)}: {level.requests_before} → {level.requests_after} requests · {md(class_line(level))}",
            "",
            head,
            rule,
        ]
        for m in level.metrics:
            row = f"| {m.label} | {value(m.before, m.unit)} | {value(m.after, m.unit)} | {difference(m)} | {m.change} |"
            lines.append(row + (f" {predicted(m)} |" if with_prediction else ""))
    if comparison.prediction_not_modelled:
        lines.append(f"\n- whatif made no prediction: {md(comparison.prediction_not_modelled)}")
    if comparison.next_limit_predicted:
        lines.append(f"- predicted next limit: {md(comparison.next_limit_predicted)}")
    lines.append(f"- interval: {comparison.method}")
    lines += [f"- {md(n)}" for n in comparison.notes]
    return lines
