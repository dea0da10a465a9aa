"""Tests that need an installed tool: skipped where it is missing, failed where the run asked for them."""

from __future__ import annotations

import os


def require_tool(missing_reason: str | None, required_env: str) -> None:
    """``missing_reason``: why the tool cannot run (None: it can). ``make test`` sets ``required_env=1`` after
    installing the tool, so there a missing tool fails the test instead of skipping it quietly."""
    import pytest

    if missing_reason is None:
        return
    if os.environ.get(required_env) == "1":
        pytest.fail(f"{required_env}=1 but {missing_reason}")
    pytest.skip(missing_reason)
