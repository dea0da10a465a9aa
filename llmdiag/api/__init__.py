"""The library's entry points: every job the CLI does, as a function that returns a model.

    from llmdiag.api import diagnose            # or: from llmdiag import diagnose

Each entry point lives in the module of its job (scan, fleet, check, load, trace, capacity, compare, whatif, nccl)
and is loaded on first use, so a caller that needs one job (``llmdiag trace``) does not load the HTTP and load
stacks of the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# entry point -> the module of llmdiag.api that defines it
ENTRY_POINTS = {
    "diagnose": "scan",
    "diagnose_files": "scan",
    "diagnose_logs": "scan",
    "run_demo": "scan",
    "diagnose_fleet": "fleet",
    "fleet_from_signal_sets": "fleet",
    "diagnose_prometheus": "fleet",
    "fleet_from_prometheus": "fleet",
    "diagnose_prometheus_fleet": "fleet",
    "diagnose_prometheus_fleet_timeline": "fleet",
    "run_check": "check",
    "run_prometheus_check": "check",
    "run_load": "load",
    "analyze_traces": "trace",
    "run_nccl_bench": "nccl",
    "capacity_question": "capacity",
    "run_capacity": "capacity",
    "run_compare": "compare",
    "predict_whatif": "whatif",
    "whatif_file": "whatif",
}

__all__ = [
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

if TYPE_CHECKING:
    from llmdiag.api.capacity import capacity_question, run_capacity
    from llmdiag.api.check import run_check, run_prometheus_check
    from llmdiag.api.compare import run_compare
    from llmdiag.api.fleet import (
        diagnose_fleet,
        diagnose_prometheus,
        diagnose_prometheus_fleet,
        diagnose_prometheus_fleet_timeline,
        fleet_from_prometheus,
        fleet_from_signal_sets,
    )
    from llmdiag.api.load import run_load
    from llmdiag.api.nccl import run_nccl_bench
    from llmdiag.api.scan import diagnose, diagnose_files, diagnose_logs, run_demo
    from llmdiag.api.trace import analyze_traces
    from llmdiag.api.whatif import predict_whatif, whatif_file


def __getattr__(name: str) -> Any:
    module = ENTRY_POINTS.get(name)
    if module is None:
        raise AttributeError(f"module 'llmdiag.api' has no attribute {name!r}")
    return getattr(importlib.import_module(f"llmdiag.api.{module}"), name)
