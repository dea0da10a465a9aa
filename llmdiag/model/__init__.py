"""The data that flows between the stages: collect → SignalSet → engine → Verdict (and the other reports) → render.

Values are in base units (seconds, bytes, ratios 0–1, per-second rates); the unit is in the signal name.
A value that could not be measured is ``None`` with ``unavailable`` saying why: missing is never zero.
Every model is importable from here (``from llmdiag.model import Verdict``); each lives in its own module, imported
on first use, so a command that reads one kind of report (``llmdiag trace``) does not build every other model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# where to look for a name, the modules most callers need first
MODULES = ("report", "signals", "verdict", "whatif", "check", "trace", "load", "fleet", "capacity", "nccl")

if TYPE_CHECKING:
    from llmdiag.model.capacity import (
        CapacityInputs,
        CapacityReport,
        HardwareFacts,
        MemoryReport,
        ModelFacts,
        OperatingPoint,
        Resource,
        ResourceUse,
        SeedArithmetic,
        SimulatedCapacity,
        TtftBurst,
    )
    from llmdiag.model.check import CheckReport, TargetResult
    from llmdiag.model.fleet import (
        FleetFinding,
        FleetReport,
        FleetStep,
        FleetTarget,
        FleetTimeline,
        ReplicaNumbers,
        Transition,
    )
    from llmdiag.model.load import Knee, LoadPoint, LoadReport, Percentiles
    from llmdiag.model.nccl import (
        BenchLink,
        CollectiveMeasurement,
        MemoryCopyProbe,
        NcclBenchOptions,
        NcclBenchReport,
    )
    from llmdiag.model.report import SCHEMA_VERSION, Report, Versioned
    from llmdiag.model.signals import Signal, SignalKind, SignalSet, SourceInfo, Window, WindowKind
    from llmdiag.model.trace import CollectiveStats, RankStats, Straggler, TraceProblem, TraceReport
    from llmdiag.model.verdict import (
        BOTTLENECK_CATEGORIES,
        Bottleneck,
        Category,
        ClassCoverage,
        ConfidenceFactor,
        Coverage,
        Evidence,
        Experience,
        Finding,
        Roofline,
        RuleOutcome,
        Severity,
        State,
        Verdict,
        state_of,
        worst,
    )
    from llmdiag.model.whatif import CHANGE_NAMES, Figures, FixEffect, WhatIf, WhatIfInputs

__all__ = [
    "BOTTLENECK_CATEGORIES",
    "CHANGE_NAMES",
    "Figures",
    "FixEffect",
    "WhatIf",
    "WhatIfInputs",
    "BenchLink",
    "Bottleneck",
    "CapacityInputs",
    "CapacityReport",
    "Category",
    "CheckReport",
    "ClassCoverage",
    "CollectiveMeasurement",
    "CollectiveStats",
    "ConfidenceFactor",
    "Coverage",
    "Evidence",
    "Experience",
    "Finding",
    "FleetFinding",
    "FleetReport",
    "FleetStep",
    "FleetTarget",
    "FleetTimeline",
    "HardwareFacts",
    "Knee",
    "LoadPoint",
    "LoadReport",
    "MemoryCopyProbe",
    "MemoryReport",
    "ModelFacts",
    "NcclBenchOptions",
    "NcclBenchReport",
    "OperatingPoint",
    "Percentiles",
    "RankStats",
    "ReplicaNumbers",
    "Report",
    "Resource",
    "ResourceUse",
    "Roofline",
    "RuleOutcome",
    "SCHEMA_VERSION",
    "SeedArithmetic",
    "Severity",
    "Signal",
    "SignalKind",
    "SignalSet",
    "SimulatedCapacity",
    "SourceInfo",
    "State",
    "Straggler",
    "TargetResult",
    "TraceProblem",
    "TraceReport",
    "Transition",
    "TtftBurst",
    "Verdict",
    "Versioned",
    "Window",
    "WindowKind",
    "state_of",
    "worst",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        for module in MODULES:
            found = importlib.import_module(f"llmdiag.model.{module}")
            if hasattr(found, name):
                value = getattr(found, name)
                globals()[name] = value  # found once
                return value
    raise AttributeError(f"module 'llmdiag.model' has no attribute {name!r}")
