"""The house's size limits (tests/support/house.py measures them; `python -m tests.support.house` prints them)."""

from __future__ import annotations

from tests.support.house import MAX_FUNCTION_LINES, MAX_MODULE_LINES, MAX_PARAMETERS, measure

FIGURES = measure()


def test_no_module_is_over_the_limit():
    over = {name: lines for name, lines in FIGURES.modules.items() if lines > MAX_MODULE_LINES}
    assert not over, f"split these modules (over {MAX_MODULE_LINES} lines): {over}"


def test_no_function_is_over_the_limit():
    over = [(f.where, f.lines) for f in FIGURES.functions if f.lines > MAX_FUNCTION_LINES]
    assert not over, f"split these functions (over {MAX_FUNCTION_LINES} lines): {over}"


def test_no_function_takes_too_many_parameters():
    over = [(f.where, f.parameters) for f in FIGURES.functions if f.parameters > MAX_PARAMETERS]
    assert not over, f"group these parameters (over {MAX_PARAMETERS}): {over}"


def test_the_figures_see_the_whole_package():
    assert any(name.endswith("engine/evaluate.py") for name in FIGURES.modules)
    assert len(FIGURES.functions) > 500
