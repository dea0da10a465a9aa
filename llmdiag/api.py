"""The library entry point: ``diagnose(...) -> Verdict``. The CLI is a thin shell around it."""

from __future__ import annotations

from pathlib import Path

from llmdiag import __version__
from llmdiag.collect import DEFAULT_DURATION_SECONDS, ProgressCallback, collect_files, collect_live
from llmdiag.collect.http import Connection, redact_url
from llmdiag.config import Settings
from llmdiag.engine.evaluate import build_verdict
from llmdiag.model import Verdict


def diagnose(
    connection: Connection,
    duration_seconds: float = DEFAULT_DURATION_SECONDS,
    settings: Settings | None = None,
    on_progress: ProgressCallback | None = None,
) -> Verdict:
    """Scan a live server over a window and judge it."""
    signals = collect_live(connection, duration_seconds, on_progress=on_progress)
    verdict = build_verdict(signals, settings, target=redact_url(connection.base_url))
    verdict.tool_version = __version__
    return verdict


def diagnose_files(paths: list[Path], settings: Settings | None = None, max_bytes: int | None = None) -> Verdict:
    """Judge saved /metrics dumps: one gives lifetime averages, two or more a window between them."""
    kwargs = {"max_bytes": max_bytes} if max_bytes else {}
    signals = collect_files(paths, **kwargs)
    target = str(paths[0]) if len(paths) == 1 else f"{len(paths)} dumps: {paths[0]} … {paths[-1]}"
    verdict = build_verdict(signals, settings, target=target)
    verdict.tool_version = __version__
    return verdict
