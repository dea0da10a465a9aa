"""The fault matrix's server rows on a real vLLM (README "Fault matrix"): the server killed mid-scan and a new
process started on the same port within the window. The simulator plays the same rows in make-test time
(tests/e2e/test_fault_matrix.py); here vLLM's own process tree dies (SIGKILL to its group) and its own counters
and ``process_start_time_seconds`` start again. Runs only with LLMDIAG_VLLM_TESTS=1 (two vLLM starts, ~3-4 min).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_fault_matrix import wait_until_scanning

from .loadgen import Load
from .vllm_cpu import VllmServer, free_port, scrape_metrics

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1500)]


def window_for(startup_seconds: float) -> int:
    """A window a second vLLM starts well inside: its start took 32-90 s on a 2-core machine
    (../shared/reference/vllm-cpu.md), and over 200 s while other work shared the cores; the first start says
    which this machine is now."""
    return int(max(150.0, 1.5 * startup_seconds + 60))


def process_start(base_url: str) -> float:
    [line] = [line for line in scrape_metrics(base_url).splitlines() if line.startswith("process_start_time_seconds ")]
    return float(line.split()[1])


def test_a_real_vllm_killed_and_restarted_mid_scan(tiny_model: Path) -> None:
    port = free_port()
    first = VllmServer(tiny_model, model_name="tiny-llama", port=port, startup_timeout=600).start()
    window = window_for(first.startup_seconds or 0.0)
    second: VllmServer | None = None
    scan: subprocess.Popen[str] | None = None
    try:
        started_first = process_start(first.base_url)
        with Load(first.base_url, "tiny-llama", users=2, output_tokens=64, max_seconds=30):
            time.sleep(3)
            cmd = [sys.executable, "-m", "llmdiag", "scan", first.base_url, "--duration", str(window)]
            scan = subprocess.Popen(
                [*cmd, "--timeout", "5", "--json"],
                cwd=REPO_ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            wait_until_scanning(scan, port, timeout=120)
            time.sleep(8)  # a few scrapes of the first process under load
            assert first.proc is not None
            os.killpg(os.getpgid(first.proc.pid), signal.SIGKILL)  # the whole tree, no goodbye
        first.stop()
        second = VllmServer(tiny_model, model_name="tiny-llama", port=port, startup_timeout=window).start()
        assert process_start(second.base_url) > started_first
        with Load(second.base_url, "tiny-llama", users=2, output_tokens=64, max_seconds=window):
            out, err = scan.communicate(timeout=window + 180)
    finally:
        if scan is not None and scan.poll() is None:
            scan.kill()
        for server in (first, second):
            if server is not None:
                server.stop()
    assert "Traceback" not in err, err
    assert scan.returncode in (0, 1), err
    verdict = json.loads(out)
    notes = " ".join(verdict["notes"])
    # the outage is one line for its run of refused scrapes, and the restart is said
    assert "failed: cannot connect to" in notes and "connection refused" in notes, notes
    assert "restarted in the window" in notes, notes
    assert "SAN002" in {f["code"] for f in verdict["findings"]}
    # each process counted from zero: no negative step, and tokens made by both processes
    for name, signal_ in verdict["signals"].items():
        increase = (signal_.get("stats") or {}).get("increase")
        assert increase is None or increase >= 0, (name, increase)
    assert verdict["signals"]["generation_tokens_per_second"]["stats"]["increase"] > 0
