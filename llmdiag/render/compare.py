"""Render a CompareReport (``capacity --compare``): a table per comparison for the terminal, JSON, and one HTML
page with a table and charts per comparison (the scan report's CSS, script and uPlot, inlined)."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from llmdiag.model.compare import CompareReport, Comparison
from llmdiag.render.format import format_value, rate
from llmdiag.render.html import COLORS, Chart, render_page

MISSING = "—"  # in a table cell: this method does not give the figure (the legend and the JSON say why)
METHOD_SHORT = {"physics": "phys", "simulator": "sim", "naive": "naive"}
METHOD_COLORS = {"physics": COLORS[0], "simulator": COLORS[1], "naive": COLORS[5]}


def _context(report: CompareReport) -> Text:
    i = report.inputs
    where = f"{i.tp} × {i.gpu}" if i.tp > 1 else f"one {i.gpu}"
    return Text(
        f"{i.model} on {where} · {i.users:,} users × ({i.prompt_tokens} prompt + {i.output_tokens} output tokens) · "
        f"max_num_seqs {i.max_num_seqs}, max_num_batched_tokens {i.max_num_batched_tokens} · simulator: "
        f"{i.simulated_users:,} users, {i.measured_seconds:,.1f} s measured (virtual time, seed {i.seed})",
        style="dim",
    )


def cell(value: float | None, unit: str) -> str:
    """A figure without its unit where the header says it (tok/s, a count), else as format_value writes it."""
    if value is None:
        return MISSING
    if unit == "tokens/s":
        return rate(value, whole_from=100, below_one=".3g")
    if unit == "count":
        return f"{value:,.0f}" if value == int(value) else f"{value:,.1f}"
    return format_value(value, unit)


def _table(comparison: Comparison) -> Table:
    table = Table(show_edge=False, pad_edge=False, header_style="bold")
    table.add_column("alternative", overflow="fold")
    table.add_column("method")
    for column in comparison.columns:
        table.add_column(column.label, justify="right", overflow="fold")
    for row in comparison.rows:
        cells = [cell(row.values.get(c.key), c.unit) for c in comparison.columns]
        table.add_row(row.alternative, METHOD_SHORT[row.method], *cells)
    return table


def missing_reasons(comparison: Comparison) -> list[str]:
    """Each distinct reason a cell is empty, with the methods it applies to."""
    reasons: dict[str, set[str]] = {}
    for row in comparison.rows:
        for why in row.unavailable.values():
            reasons.setdefault(why, set()).add(row.method)
    return [f"{MISSING} {', '.join(sorted(methods))}: {why}" for why, methods in reasons.items()]


def _comparison(comparison: Comparison) -> RenderableType:
    parts: list[RenderableType] = [
        Text(f"\n{comparison.title}", style="bold underline"),
        Text(comparison.question, style="dim"),
        _table(comparison),
        Text(comparison.finding, style="bold"),
    ]
    parts += [Text(f"  · {line}", style="dim") for line in comparison.basis]
    parts += [Text(f"  {line}", style="dim") for line in missing_reasons(comparison)]
    return Group(*parts)


def render_compare(report: CompareReport) -> RenderableType:
    return Group(_context(report), *(_comparison(c) for c in report.comparisons))


def render_compare_json(report: CompareReport) -> str:
    return report.model_dump_json(indent=2)


# --- HTML ---------------------------------------------------------------------------------------------------


def two_lines(label: str) -> str:
    """A bar's label over two lines (uPlot draws a newline), broken at the space nearest its middle, so the
    labels of six bars do not run into each other."""
    spaces = [i for i, ch in enumerate(label) if ch == " "]
    if len(label) <= 10 or not spaces:
        return label
    cut = min(spaces, key=lambda i: abs(i - len(label) / 2))
    return label[:cut] + "\n" + label[cut + 1 :]


def compare_charts(comparison: Comparison) -> list[Chart]:
    """One bar chart per chart column: an alternative per bar pair, the physics beside the simulator."""
    alternatives = list(dict.fromkeys(r.alternative for r in comparison.rows))
    units = {c.key: (c.label, c.unit) for c in comparison.columns}
    charts: list[Chart] = []
    for key in comparison.chart_columns:
        label, unit = units[key]
        scale = {"ratio": 100.0, "seconds": 1000.0}.get(unit, 1.0)  # drawn in % and ms
        series: list[dict[str, Any]] = []
        methods = list(dict.fromkeys(r.method for r in comparison.rows))
        for index, method in enumerate(methods):
            by_alternative = {r.alternative: r.values.get(key) for r in comparison.rows if r.method == method}
            values = [by_alternative.get(a) for a in alternatives]
            align = 0 if len(methods) == 1 else (-1 if index == 0 else 1)
            series.append(
                {
                    "label": method,
                    "values": [None if v is None else v * scale for v in values],
                    "color": METHOD_COLORS[method],
                    "bar_size": 0.8 / len(methods),
                    "bar_align": align,
                }
            )
        missing = [f"{s['label']}: {label} ({MISSING}: this method does not give it)" for s in series]
        drawn = [s for s, m in zip(series, missing, strict=True) if any(v is not None for v in s["values"])]
        charts.append(
            Chart(
                id=f"{comparison.name}-{key}",
                title=label,
                y_label={"ratio": f"% of {label}", "seconds": "ms"}.get(unit, unit),
                kind="buckets",
                x_label="alternative",
                x=[float(i) for i in range(len(alternatives))],
                x_labels=[two_lines(a) for a in alternatives],
                series=drawn,
                missing=[m for s, m in zip(series, missing, strict=True) if s not in drawn],
                unavailable=None if drawn else f"no method gives {label}",
            )
        )
    return charts


def render_compare_html(report: CompareReport) -> str:
    """The comparisons as one self-contained page: a table and charts each."""
    sections = [(c, compare_charts(c), missing_reasons(c)) for c in report.comparisons]
    charts = [chart for _, chart_list, _ in sections for chart in chart_list]
    i = report.inputs
    title = f"llmdiag capacity --compare: {i.model} on {i.gpu}"
    context = {"report": report, "sections": sections, "context_line": _context(report).plain, "cell": cell}
    return render_page("compare.html.j2", title, context, charts)
