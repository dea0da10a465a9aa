"""Tests that need an installed tool or shared data: skipped where it is missing, failed where the run asked for
them (``make test`` sets the ``LLMDIAG_*_TESTS=1`` variables, so nothing it should run is skipped quietly)."""

from __future__ import annotations

import os
from pathlib import Path

# The real Kineto trace sets, read in place next to the checkout (../shared/traces), never copied into it.
SHARED_TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
TRACES_ENV = "LLMDIAG_TRACE_TESTS"


def require_tool(missing_reason: str | None, required_env: str) -> None:
    """``missing_reason``: why the tool cannot run (None: it can). ``make test`` sets ``required_env=1`` after
    installing the tool, so there a missing tool fails the test instead of skipping it quietly."""
    import pytest

    if missing_reason is None:
        return
    if os.environ.get(required_env) == "1":
        pytest.fail(f"{required_env}=1 but {missing_reason}")
    pytest.skip(missing_reason)


def require_traces(path: Path = SHARED_TRACES) -> None:
    """The trace tests read ``path`` (a set under ../shared/traces): a skip outside ``make test``, a failure in
    it (``LLMDIAG_TRACE_TESTS=1``), where ../shared/traces must sit next to the checkout."""
    missing = None if path.exists() else f"{path} is not here (the real Kineto trace sets, ../shared/traces)"
    require_tool(missing, TRACES_ENV)
