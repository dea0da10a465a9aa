"""Record and replay on a real vLLM 0.32 (CPU): `llmdiag scan URL --record B` under each state's load, the server
stopped, then `llmdiag analyze B` gives the same verdict JSON byte for byte.

Runs only with LLMDIAG_VLLM_TESTS=1 (see conftest.py). The scan samples the host too: the real server's processes,
found by its port in /proc, are recorded and replayed with its pages and the canary requests' timings.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .loadgen import Load
from .states import STATES
from .test_vllm_states import start_server
from .vllm_cpu import VllmServer

REPO_ROOT = Path(__file__).resolve().parents[2]
SCAN_SECONDS = 15
WARMUP_SECONDS = 8
# the states whose class is told apart by what the bundle holds: no load, a light one, a queue, a full KV cache
RECORDED_STATES = ("idle", "healthy", "scheduling", "memory")

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def llmdiag(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmdiag", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout
    )


def record(server: VllmServer, bundle: Path, users: int, prompt: int, output: int) -> subprocess.CompletedProcess:
    scan = ("scan", server.base_url, "--duration", str(SCAN_SECONDS), "--json", "--fail-on", "never")
    scan += ("--api-key", "sk-real-vllm-0123456789", "--record", str(bundle))
    if not users:
        return llmdiag(*scan)
    with Load(
        server.base_url, server.model_name, users=users, prompt_tokens=prompt, output_tokens=output, max_seconds=300
    ) as load:
        time.sleep(WARMUP_SECONDS)
        assert load.running, f"load ended early: {load.error!r}"
        return llmdiag(*scan)


@pytest.mark.parametrize("state", RECORDED_STATES)
def test_a_real_vllm_scan_replays_byte_for_byte(state: str, tiny_model: Path, tmp_path: Path) -> None:
    spec = STATES[state]
    bundle = tmp_path / f"{state}.tar.gz"
    with start_server(spec, tiny_model) as server:
        live = record(server, bundle, spec.users, spec.prompt_tokens, spec.output_tokens)
        context = f"{live.stderr[-3000:]}\n--- server log:\n{server.log_tail(2000)}"
    assert live.returncode == 0, context
    # the server is gone: the replay reads only the bundle
    replayed = llmdiag("analyze", str(bundle), "--json", "--fail-on", "never", timeout=120)
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout == live.stdout, "the replay's verdict differs from the live one"
    verdict = json.loads(live.stdout)
    assert verdict["bottleneck"] == spec.expected, verdict["summary"]
    probes = [p["probe"] for p in verdict["coverage"]["probes"]]
    assert "host" in probes and "vllm" in probes, probes
    assert b"sk-real-vllm-0123456789" not in gzip.decompress(bundle.read_bytes())
