"""The verdict: the bottleneck class, its findings with their evidence, the coverage and what users experience."""

from __future__ import annotations

from enum import Enum, IntEnum
from typing import Literal

from pydantic import BaseModel, Field

from llmdiag.model.report import Report
from llmdiag.model.signals import Signal, SourceInfo, Window
from llmdiag.model.whatif import FixEffect, WhatIfInputs


class Bottleneck(str, Enum):
    memory = "memory"
    compute = "compute"
    scheduling = "scheduling"
    network = "network"
    healthy = "healthy"
    idle = "idle"
    unknown = "unknown"
    # no progress while requests run or wait: a hang, never a capacity class (schema_version "2")
    stalled = "stalled"


class Category(str, Enum):
    """What a rule judges. The first four are bottleneck classes; sanity findings only lower confidence;
    regression findings (a check against its own history) say what got worse, never what limits the server."""

    memory = "memory"
    compute = "compute"
    scheduling = "scheduling"
    network = "network"
    sanity = "sanity"
    regression = "regression"


BOTTLENECK_CATEGORIES = (Category.memory, Category.compute, Category.scheduling, Category.network)


class Severity(str, Enum):
    warning = "warning"
    critical = "critical"

    @property
    def rank(self) -> int:
        return {"warning": 1, "critical": 2}[self.value]


class Evidence(BaseModel):
    signal: str
    stat: str
    value: float | None
    unit: str
    threshold: float | None = None
    op: str = ""
    source: str = ""
    window_seconds: float | None = None
    verify: str = ""


class Finding(BaseModel):
    code: str
    slug: str
    title: str
    category: Category
    severity: Severity
    summary: str
    evidence: list[Evidence]
    why: str = ""
    # the rule's fix text, then the flags of the engine the verdict is about (llmdiag.engine.fixes.verdict_engine)
    fixes: list[str] = Field(default_factory=list)
    # every engine's flags for this rule, engine → flags (vllm, sglang, trtllm, tgi, llamacpp)
    engine_fixes: dict[str, list[str]] = Field(default_factory=dict)
    # how far past its critical threshold the ladder signal is: orders findings of equal severity
    margin: float = 0.0
    # shown, but never the verdict's class (rules with ``advisory = true``)
    advisory: bool = False
    # the engine made no progress while requests ran or waited (rules with ``stall = true``): heads the findings and
    # makes the verdict ``stalled``
    stall: bool = False
    # what the fix would buy on this window (llmdiag.engine.whatif), one entry per way the rule's fix is applied, or
    # why it is not modelled (schema "3")
    predicted: list[FixEffect] = Field(default_factory=list)


class RuleOutcome(BaseModel):
    code: str
    status: Literal["fired", "passed", "skipped", "muted"]
    reason: str = ""


class ClassCoverage(BaseModel):
    category: Category
    evaluated: bool
    rules_run: int = 0
    rules_skipped: int = 0
    reason: str = ""


class Coverage(BaseModel):
    probes: list[SourceInfo] = Field(default_factory=list)
    classes: list[ClassCoverage] = Field(default_factory=list)
    rules: list[RuleOutcome] = Field(default_factory=list)


class Experience(BaseModel):
    """What users see: from the server's own histograms, and from the scan's canary requests (``client_*``)."""

    ttft_p50_seconds: float | None = None
    ttft_p90_seconds: float | None = None
    itl_p50_seconds: float | None = None
    itl_p90_seconds: float | None = None
    # the tail that `llmdiag check` keeps in its history and compares against its baseline
    ttft_p95_seconds: float | None = None
    tpot_p95_seconds: float | None = None
    per_user_tokens_per_second: float | None = None
    per_user_tokens_per_second_incl_waiting: float | None = None
    requests_running_mean: float | None = None
    requests_waiting_mean: float | None = None
    generation_tokens_per_second: float | None = None
    client_requests: int | None = None
    client_ttft_p50_seconds: float | None = None
    client_ttft_p90_seconds: float | None = None
    client_tpot_p50_seconds: float | None = None


class Roofline(BaseModel):
    """Measured decode throughput against the physics ceiling for the named GPU and model."""

    gpu: str
    model: str
    tp: int
    batch_sequences: float
    context_tokens: float
    ceiling_tokens_per_second: float
    measured_tokens_per_second: float
    fraction_of_ceiling_ratio: float
    bound_by: str  # what sets the ceiling at this batch: compute (math) or hbm_bandwidth, interconnect …


class ConfidenceFactor(BaseModel):
    """One factor of the fitted confidence (llmdiag.engine.confidence): its value here and its fitted weight; the
    confidence is σ(Σ value·weight), then the decided caps (one snapshot, unknown)."""

    value: float
    weight: float


class Verdict(Report):
    target: str = ""
    bottleneck: Bottleneck
    confidence: float
    confidence_label: Literal["high", "medium", "low"]
    summary: str
    window: Window
    findings: list[Finding] = Field(default_factory=list)
    coverage: Coverage = Field(default_factory=Coverage)
    experience: Experience = Field(default_factory=Experience)
    roofline: Roofline | None = None
    signals: dict[str, Signal] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    # how far each bottleneck class that fired can be trusted as the cause: the verdict's own class has the verdict's
    # confidence; beside a stall every capacity class stays below 0.5 (a hang is not a capacity limit)
    class_confidence: dict[str, float] = Field(default_factory=dict)
    # what the confidence is made of (empty in a result saved before the confidence was fitted)
    confidence_factors: dict[str, ConfidenceFactor] = Field(default_factory=dict)
    # what a what-if prediction needs from the window (llmdiag.engine.whatif_inputs; schema "3"; None in older files)
    whatif_inputs: WhatIfInputs | None = None

    @property
    def snapshot(self) -> bool:
        """Judged from one moment (gauges only, no rates)."""
        return self.window.kind == "snapshot"

    def worst_severity(self) -> Severity | None:
        ranks = [f.severity for f in self.findings]
        return max(ranks, key=lambda s: s.rank) if ranks else None


# ---------------------------------------------------------------------------------------------
# the Nagios reading of a verdict (`llmdiag check`, and each replica of a fleet)


class State(IntEnum):
    """Nagios states: the value is the plugin's exit code. The one definition: a fleet's replicas carry its name."""

    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3

    @property
    def rank(self) -> int:
        """Worse is higher: CRITICAL > WARNING > UNKNOWN > OK."""
        return {State.OK: 0, State.UNKNOWN: 1, State.WARNING: 2, State.CRITICAL: 3}[self]


def worst(states: list[State]) -> State:
    return max(states, key=lambda s: s.rank) if states else State.UNKNOWN


def state_of(verdict: Verdict) -> State:
    if verdict.bottleneck is Bottleneck.stalled:  # a hung engine serves nobody, whatever its findings' severity
        return State.CRITICAL
    counted = [Severity.warning if f.category is Category.sanity else f.severity for f in verdict.findings]
    if Severity.critical in counted:
        return State.CRITICAL
    if Severity.warning in counted:
        return State.WARNING
    if verdict.bottleneck is Bottleneck.unknown:
        return State.UNKNOWN
    return State.OK
