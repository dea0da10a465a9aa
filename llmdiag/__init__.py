"""llmdiag: tells you why your LLM inference server is slow."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llmdiag._version import __version__

__all__ = ["__version__", "diagnose", "diagnose_files", "run_load"]

if TYPE_CHECKING:
    from llmdiag.api import diagnose, diagnose_files, run_load


def __getattr__(name: str) -> Any:
    # the API pulls in the HTTP and load stacks: imported on first use, so `llmdiag trace` and other
    # commands that need none of it start without paying for it
    if name in ("diagnose", "diagnose_files", "run_load"):
        from llmdiag import api

        return getattr(api, name)
    raise AttributeError(f"module 'llmdiag' has no attribute {name!r}")
