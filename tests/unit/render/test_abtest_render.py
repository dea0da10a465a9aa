"""How the matched A/B reads (llmdiag.render.abtest): signed differences with their interval, a missing side as
unavailable (never 0), whatif's prediction with its band and whether the measurement fell inside it."""

from __future__ import annotations

from rich.console import Console

from llmdiag.model.abtest import Comparison, LevelComparison, MetricDiff
from llmdiag.render.abtest import comparison_markdown, difference, predicted, render_comparison


def ttft(**fields: object) -> MetricDiff:
    return MetricDiff(name="ttft_p50_seconds", label="TTFT p50", unit="seconds", better="lower", **fields)


def test_a_difference_reads_with_its_sign_and_interval():
    shown = ttft(before=1.0, after=0.25, difference=-0.75, ci_low=-0.8, ci_high=-0.7, change="better")
    assert difference(shown) == "−750 ms [−800 ms, −700 ms]"
    assert difference(ttft(before=1.0, after=1.1, difference=0.1)) == "+100 ms (no interval)"
    assert difference(ttft(before=None, after=1.0)) == "unavailable"


def test_the_prediction_says_whether_the_measurement_fell_in_its_band():
    inside = ttft(after=0.21, predicted=0.2, predicted_low=0.15, predicted_high=0.25)
    assert predicted(inside) == "200 ms (150 ms–250 ms), measured inside"
    outside = ttft(after=0.4, predicted=0.2, predicted_low=0.15, predicted_high=0.25)
    assert predicted(outside).endswith("measured outside")
    assert predicted(ttft(after=0.4)) == ""


def comparison() -> Comparison:
    level = LevelComparison(
        users=16,
        requests_before=61,
        requests_after=236,
        class_before="scheduling",
        class_after="healthy",
        class_predicted="healthy",
        metrics=[ttft(before=1.0, after=0.013, difference=-0.987, ci_low=-1.02, ci_high=-0.95, change="better",
                      predicted=0.02, predicted_low=0.015, predicted_high=0.025)],
    )  # fmt: skip
    return Comparison(baseline="before.json", model="m", server_version="0.33.0", levels=[level], method="bootstrap")


def test_terminal_and_markdown_carry_the_row_the_class_and_the_method():
    console = Console(width=200, record=True)
    console.print(render_comparison(comparison()))
    text = console.export_text()
    assert "16 users: 61 → 236 requests · class scheduling → healthy (predicted healthy: right)" in text
    assert "−987 ms [−1020 ms, −950 ms]" in text and "better" in text and "interval: bootstrap" in text
    markdown = "\n".join(comparison_markdown(comparison()))
    assert "| TTFT p50 | 1000 ms | 13.0 ms | −987 ms [−1020 ms, −950 ms] | better | 20.0 ms" in markdown
