"""`llmdiag scan URL --trace DIR` against the built-in simulator: the trace's signals and network findings join the
scan's verdict; a --trace that gives no trace is one ERROR/HINT pair and exit 2, before any scraping."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from llmdiag.sim.load import ClosedLoopLoad
from llmdiag.sim.presets import get_preset
from llmdiag.sim.server import SimServer
from tests.conftest import run_cli
from tests.support.required import SHARED_TRACES as TRACES
from tests.support.required import require_traces

DLRM = TRACES / "param-dlrm-8rank"
TRACE_SOURCE = "torch profiler trace"
NET_FROM_TRACES = {"NET006", "NET007", "NET008", "NET009"}


def test_scan_with_a_trace_carries_its_signals_and_findings():
    require_traces(DLRM)
    alone = run_cli("trace", str(DLRM), "--json")
    assert alone.returncode == 1, alone.stderr  # critical NET findings on this set
    trace_report = json.loads(alone.stdout)
    trace_verdict = trace_report["verdict"]
    trace_findings = {f["code"]: f["severity"] for f in trace_verdict["findings"]}
    assert "NET008" in trace_findings and set(trace_findings) <= NET_FROM_TRACES

    preset = get_preset("healthy")
    with SimServer(preset) as sim, ClosedLoopLoad(sim.url, sim.model, preset.load, max_seconds=60):
        time.sleep(1)
        result = run_cli("scan", sim.url, "--duration", "4", "--no-probe", "--json", "--trace", str(DLRM))
    assert result.returncode == 1, result.stderr  # the trace's critical findings fail the scan (--fail-on critical)
    assert "Traceback" not in result.stderr and "ERROR" not in result.stderr
    verdict = json.loads(result.stdout)
    # the scan's own probes ran, and the trace is one more source
    probes = {p["probe"]: p for p in verdict["coverage"]["probes"]}
    assert probes["vllm"]["ok"] and probes["torch_trace"]["note"] == "8 rank trace(s)"
    assert probes["torch_trace"]["url"] == str(DLRM)
    # every trace signal is in the scan's verdict, with the same value as `llmdiag trace` gives
    for name, signal in trace_verdict["signals"].items():
        if signal["source"] != TRACE_SOURCE:
            continue
        got = verdict["signals"][name]
        assert got["source"] == TRACE_SOURCE
        assert got["stats"] == pytest.approx(signal["stats"]), name
    assert verdict["signals"]["straggler_rank"]["stats"]["value"] == 7
    assert verdict["signals"]["comm_share_of_gpu_time_ratio"]["stats"]["value"] == pytest.approx(0.92, abs=0.01)
    # and so is every network finding the trace gives on its own, at the same severity
    scan_findings = {f["code"]: f["severity"] for f in verdict["findings"]}
    assert {c: scan_findings.get(c) for c in trace_findings} == trace_findings
    assert verdict["bottleneck"] == "network"  # a healthy server, but its traced collectives are the problem
    net008 = next(f for f in verdict["findings"] if f["code"] == "NET008")
    assert {e["signal"] for e in net008["evidence"]} >= {"straggler_rank", "straggler_skew_seconds"}


@pytest.mark.parametrize("make", ["missing", "empty", "not-a-trace"])
def test_a_bad_trace_path_is_one_error_and_exit_2(tmp_path: Path, make: str):
    path = tmp_path / "traces"
    if make != "missing":
        path.mkdir()
    if make == "not-a-trace":
        (path / "x.json").write_text('{"hello": [1, 2, 3]}')
    # nothing listens on port 9: the trace is read before the scan starts, so its error comes first
    result = run_cli("scan", "http://127.0.0.1:9", "--duration", "3", "--trace", str(path), timeout=60)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    hints = [line for line in lines if line.startswith("HINT:")]
    assert len(errors) == 1 and len(hints) == 1, lines
    assert lines.index(hints[0]) == lines.index(errors[0]) + 1
    assert errors[0].startswith("ERROR: --trace") and str(path) in errors[0]
    if make == "not-a-trace":  # the file's own problem is said first, as a warning
        assert any(line.startswith("WARNING: trace:") and "not a PyTorch profiler" in line for line in lines)
