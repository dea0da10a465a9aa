"""Fixes per engine: the verdict's server picks which engine's flags come first, in every renderer.

Two live scans of the simulator's memory preset (4 s windows), one in SGLang's dialect and one in vLLM's (the
default): each verdict is saved as JSON, rendered as Markdown with `llmdiag report` as a user would, and for the
terminal from the saved verdict; the detected engine's KV-cache flag is shown under its name, the other engine's is
not.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
from rich.console import Console

from llmdiag.engine.fixes import engine_fixes, engine_of, fix_view, fixes_for, verdict_engine
from llmdiag.model import Finding, SourceInfo, Verdict
from llmdiag.model.io import load_result
from llmdiag.render.html import render_html
from llmdiag.render.terminal import render_terminal
from llmdiag.schema.loader import find_rule
from llmdiag.sim.load import ClosedLoopLoad
from llmdiag.sim.presets import get_preset
from llmdiag.sim.server import SimServer
from tests.conftest import run_cli

SGLANG_KV = "--mem-fraction-static"
VLLM_KV = "--gpu-memory-utilization"


def test_engine_of_probe_names():
    assert engine_of("sglang") == "sglang" and engine_of("sglang-log") == "sglang"
    assert engine_of("triton") == "trtllm"  # Triton's TensorRT-LLM backend takes TensorRT-LLM's options
    assert engine_of("dcgm") == "vllm" and engine_of("") == "vllm"  # unknown: vLLM


def _verdict(probe: str, finding: Finding) -> Verdict:
    verdict = Verdict(
        bottleneck="memory", confidence=0.9, confidence_label="high", summary="s", window={}, findings=[finding]
    )
    verdict.coverage.probes = [SourceInfo(probe=probe)]
    return verdict


def test_fix_view_puts_the_engine_first_and_keeps_the_others():
    rule = find_rule("MEM001")
    assert rule is not None
    finding = Finding(
        code="MEM001",
        slug="s",
        title="t",
        category="memory",
        severity="critical",
        summary="s",
        evidence=[],
        fixes=fixes_for(rule, "trtllm"),
        engine_fixes=engine_fixes(rule),
    )
    verdict = _verdict("triton", finding)
    view = fix_view(finding, verdict_engine(verdict))
    assert view is not None and view.title == "TensorRT-LLM" and view.own == rule.fix.trtllm
    assert [title for title, _ in view.others] == ["vLLM", "SGLang"]  # TGI and llama.cpp: MEM001 cannot fire there
    html = render_html(verdict)
    # the detected engine's flags in the open, the others folded away
    assert html.index("free_gpu_memory_fraction") < html.index('<details class="other-engines">') < html.index(VLLM_KV)
    # a verdict saved before engine_fixes existed still shows its own engine's flags
    old = finding.model_copy(update={"engine_fixes": {}})
    old_view = fix_view(old, "trtllm")
    assert old_view is not None and old_view.own == rule.fix.trtllm and old_view.others == []


def _scan_and_render(tmp_path: Path, dialect: str) -> tuple[str, str]:
    preset = get_preset("memory")
    with SimServer(preset, dialect=dialect) as sim, ClosedLoopLoad(sim.url, sim.model, preset.load, max_seconds=60):
        time.sleep(2.0)
        scan = run_cli("scan", sim.url, "--no-nvml", "--duration", "4", "--json", "--fail-on", "never", timeout=90)
    assert scan.returncode == 0, scan.stderr
    saved = tmp_path / f"{dialect}.json"
    saved.write_text(scan.stdout)
    verdict = json.loads(scan.stdout)
    assert verdict["bottleneck"] == "memory", verdict["summary"]
    markdown = run_cli("report", str(saved), "--markdown")
    assert markdown.returncode == 0, markdown.stderr
    loaded = load_result(saved)
    assert isinstance(loaded, Verdict)
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(render_terminal(loaded))
    return console.export_text(), markdown.stdout


@pytest.mark.parametrize(
    ("dialect", "title", "own", "other"),
    [
        ("sglang", "SGLang", SGLANG_KV, VLLM_KV),
        ("vllm", "vLLM", VLLM_KV, SGLANG_KV),
    ],
)
def test_memory_scan_shows_the_detected_engines_flags(tmp_path, dialect, title, own, other):
    terminal, markdown = _scan_and_render(tmp_path, dialect)
    for output in (terminal, markdown):
        assert own in output, output
        assert other not in output, output  # the other engine's flags are one command away, not printed
        assert f"{title}:" in output
        assert "llmdiag rules show MEM" in output
