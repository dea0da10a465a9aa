"""Rendering a CompareReport: a cell shows a figure or the dash whose reason the legend gives (never 0), and a
chart draws each method's bars side by side, leaving out a method that gives none of the figure."""

from __future__ import annotations

from llmdiag.model.compare import CompareColumn, CompareRow, Comparison
from llmdiag.render.compare import MISSING, cell, compare_charts, missing_reasons, two_lines

COLUMNS = [CompareColumn(key="seqs", label="seqs fit", unit="count"), CompareColumn(key="w", label="KV", unit="ratio")]
WHY = "a property of the deployment"


def comparison() -> Comparison:
    return Comparison(
        name="kv",
        title="t",
        question="q",
        columns=COLUMNS,
        rows=[
            CompareRow(alternative="reserved", method="physics", values={"seqs": 56.0, "w": 0.93}),
            CompareRow(
                alternative="reserved", method="simulator", values={"seqs": 32.0, "w": None}, unavailable={"w": WHY}
            ),
            CompareRow(alternative="paged", method="physics", values={"seqs": 655.0, "w": 0.01}),
            CompareRow(
                alternative="paged", method="simulator", values={"seqs": 32.0, "w": None}, unavailable={"w": WHY}
            ),
        ],
        chart_columns=["seqs", "w"],
        finding="f",
    )


def test_a_cell_is_the_figure_or_the_dash_never_zero():
    assert cell(None, "tokens/s") == MISSING
    assert cell(0.0, "count") == "0" and cell(1234.0, "tokens/s") == "1,234" and cell(2.5, "count") == "2.5"
    assert cell(0.147, "tokens/s") == "0.147"
    assert cell(0.125, "seconds") == "125.0 ms" and cell(0.5, "ratio") == "50.0%"
    assert missing_reasons(comparison()) == [f"{MISSING} simulator: {WHY}"]


def test_a_chart_puts_the_methods_side_by_side_and_leaves_out_one_without_figures():
    seqs, waste = compare_charts(comparison())
    assert seqs.x_labels == ["reserved", "paged"]
    assert two_lines("continuous ±90%") == "continuous\n±90%" and two_lines("BF16") == "BF16"
    assert [(s["label"], s["values"], s["bar_align"]) for s in seqs.series] == [
        ("physics", [56.0, 655.0], -1),
        ("simulator", [32.0, 32.0], 1),
    ]
    # the waste is the physics' alone: the simulator's series is named as not drawn, the ratio shown in percent
    assert [s["label"] for s in waste.series] == ["physics"] and waste.series[0]["values"] == [93.0, 1.0]
    assert waste.missing and "simulator" in waste.missing[0]
