"""The terminal report: coverage by class by default, each skipped rule only under verbose; shared formatting."""

from __future__ import annotations

import ast
import io
import subprocess
import sys

import pytest
from rich.console import Console

from llmdiag.api import diagnose_files
from llmdiag.model import RuleOutcome, SourceInfo, Verdict
from llmdiag.render.format import clock, format_value, milliseconds, rate, when
from llmdiag.render.terminal import render_terminal
from tests.conftest import REPO_ROOT

RENDER = REPO_ROOT / "llmdiag" / "render"


@pytest.fixture(scope="module")
def verdict() -> Verdict:
    verdict = diagnose_files(sorted((REPO_ROOT / "tests/fixtures/vllm-0.32.0/memory").glob("*.prom")))
    verdict.coverage.probes.append(
        SourceInfo(probe="nvml", server="NVML", ok=False, note="GPU telemetry: unavailable (no NVIDIA driver found)")
    )
    verdict.coverage.rules.append(RuleOutcome(code="SCH002", status="muted", reason="known batch cap"))
    return verdict


def _text(verdict: Verdict, verbose: bool) -> str:
    console = Console(width=200, record=True, file=io.StringIO(), color_system=None)
    console.print(render_terminal(verdict, verbose=verbose))
    return console.export_text()


def test_default_coverage_is_one_line_per_class_and_the_unread_sources(verdict: Verdict):
    text = _text(verdict, verbose=False)
    coverage = text.split("\nCoverage\n", 1)[1]
    skipped = [r for r in verdict.coverage.rules if r.status == "skipped"]
    assert len(skipped) > 10  # the JSON keeps them all
    assert not any(f"{r.code} skipped:" in coverage for r in skipped)
    memory = [r for r in verdict.coverage.rules if r.code.startswith("MEM")]
    ran = sum(r.status != "skipped" for r in memory)
    assert f"memory      evaluated ({ran} rules, {len(memory) - ran} skipped)" in coverage
    assert "network     not evaluated:" in coverage
    assert "GPU telemetry: unavailable (no NVIDIA driver found)" in coverage
    assert "SCH002 muted: known batch cap" in coverage  # a muted rule is the user's own choice: always said


def test_verbose_lists_every_skipped_rule_and_why(verdict: Verdict):
    text = _text(verdict, verbose=True)
    for outcome in (r for r in verdict.coverage.rules if r.status == "skipped"):
        assert f"{outcome.code} skipped: {outcome.reason[:30]}" in " ".join(text.split())


def test_shared_formatting_keeps_each_table_s_figures():
    assert [milliseconds(s) for s in (None, 0.25, 0.0123)] == ["unavailable", "250", "12.3"]  # load table
    assert milliseconds(0.0123, 2, "n/a") == "12.30" and milliseconds(None, 2, "n/a") == "n/a"  # trace table
    assert [rate(v) for v in (None, 1234.0, 12.34, 0.44)] == ["unavailable", "1,234", "12.3", "0.4"]  # load
    assert [rate(v, whole_from=1000, below_one=".3g") for v in (1234.0, 123.4, 0.0123)] == ["1,234", "123.4", "0.0123"]
    assert rate(12.6, whole_from=0) == "13"  # history
    assert format_value(0.0123, "seconds") == "12.3 ms" and format_value(None, "seconds") == "unavailable"
    assert when(0.0) == "1970-01-01 00:00:00 UTC" and clock(3661.0) == "01:01:01" and clock(3661.0, False) == "01:01"


def test_nothing_in_render_prints():
    for path in RENDER.glob("*.py"):
        calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]
        printing = [n.lineno for n in calls if isinstance(n.func, ast.Name) and n.func.id == "print"]
        assert not printing, f"{path.name} prints at lines {printing}: a renderer returns text or renderables"


def test_renderers_import_without_the_cli():
    modules = sorted(f"llmdiag.render.{p.stem}" for p in RENDER.glob("*.py") if p.stem != "__init__")
    above = "m == 'llmdiag.cli' or m.startswith(('typer', 'llmdiag.api', 'llmdiag.collect'))"
    code = f"import sys; [__import__(m) for m in {modules!r}]; print(sorted(m for m in sys.modules if {above}))"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    assert found.stdout.strip() == "[]"
