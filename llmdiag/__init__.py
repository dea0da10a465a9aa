"""llmdiag: tells you why your LLM inference server is slow.

The public API: the entry points of ``llmdiag.api`` (one per job the CLI does, each returning a model; see
``llmdiag.api.ENTRY_POINTS``) and the models a caller reads first (``Verdict``, ``Finding``, ``SignalSet``; every
other model is in ``llmdiag.model``)::

    from llmdiag import diagnose, Verdict

Each name is imported on first use (PEP 562), so ``import llmdiag`` loads nothing but the version, and a caller of
one job (``llmdiag trace``) does not pay for the HTTP and load stacks of the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from llmdiag._version import __version__

__all__ = [
    "Finding",
    "SignalSet",
    "Verdict",
    "__version__",
    "analyze_traces",
    "capacity_question",
    "diagnose",
    "diagnose_files",
    "diagnose_fleet",
    "diagnose_logs",
    "diagnose_prometheus",
    "diagnose_prometheus_fleet",
    "diagnose_prometheus_fleet_timeline",
    "fleet_from_prometheus",
    "fleet_from_signal_sets",
    "predict_whatif",
    "run_capacity",
    "run_check",
    "run_compare",
    "run_demo",
    "run_load",
    "run_nccl_bench",
    "run_prometheus_check",
    "whatif_file",
]

# the names that come from llmdiag.model; the others from llmdiag.api
MODELS = ("Finding", "SignalSet", "Verdict")

if TYPE_CHECKING:
    from llmdiag.api import (
        analyze_traces,
        capacity_question,
        diagnose,
        diagnose_files,
        diagnose_fleet,
        diagnose_logs,
        diagnose_prometheus,
        diagnose_prometheus_fleet,
        diagnose_prometheus_fleet_timeline,
        fleet_from_prometheus,
        fleet_from_signal_sets,
        predict_whatif,
        run_capacity,
        run_check,
        run_compare,
        run_demo,
        run_load,
        run_nccl_bench,
        run_prometheus_check,
        whatif_file,
    )
    from llmdiag.model import Finding, SignalSet, Verdict


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'llmdiag' has no attribute {name!r}")
    return getattr(importlib.import_module("llmdiag.model" if name in MODELS else "llmdiag.api"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
