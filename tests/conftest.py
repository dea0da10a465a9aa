"""Shared test helpers: run the CLI as a user would, and the paths of recorded fixtures."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT / "tests" / "fixtures"
SHARED = REPO_ROOT.parent / "shared"


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli_in_process(*args: str) -> CliResult:
    """``llmdiag ARGS`` through the console script's entry point (``llmdiag.cli.main``), in this process: the golden
    set, and tests that need this process's fakes."""
    from llmdiag.cli import main

    out, err = io.StringIO(), io.StringIO()
    argv, sys.argv = sys.argv, ["llmdiag", *args]
    code: object = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as exc:
                code = exc.code
    finally:
        sys.argv = argv
    return CliResult(int(code or 0), out.getvalue(), err.getvalue())  # type: ignore[call-overload]


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> CliResult:
    """`python -m llmdiag ARGS` in a subprocess, exactly as a user runs it."""
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    full_env.pop("LLMDIAG_API_KEY", None) if env is None or "LLMDIAG_API_KEY" not in env else None
    proc = subprocess.run(
        [sys.executable, "-m", "llmdiag", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=REPO_ROOT,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def cli():
    return run_cli
