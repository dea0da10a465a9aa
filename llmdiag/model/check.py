"""`llmdiag check`: Nagios states (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN) per target, and the check report."""

from __future__ import annotations

from enum import IntEnum

from pydantic import BaseModel, Field

from llmdiag._version import __version__
from llmdiag.model.fleet import FleetFinding
from llmdiag.model.verdict import Bottleneck, Category, Severity, Verdict


class State(IntEnum):
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
    counted = [Severity.warning if f.category is Category.sanity else f.severity for f in verdict.findings]
    if Severity.critical in counted:
        return State.CRITICAL
    if Severity.warning in counted:
        return State.WARNING
    if verdict.bottleneck is Bottleneck.unknown:
        return State.UNKNOWN
    return State.OK


class TargetResult(BaseModel):
    name: str
    url: str  # credentials removed
    state: State
    verdict: Verdict | None = None
    error: str | None = None
    hint: str = ""
    baseline: str = ""  # what the regression rules compared against, or why nothing
    muted: list[str] = Field(default_factory=list)  # "CODE: reason" of the muted rules


class CheckReport(BaseModel):
    state: State
    at_unix: float
    tool_version: str = __version__
    targets: list[TargetResult]
    history: str | None = None  # the database path, None with --no-history
    # outputs that failed (textfile, pushgateway, history): each is also an UNKNOWN in the state
    output_errors: list[str] = Field(default_factory=list)
    # `check --prometheus`: where the instances were read, and the fleet rules that fired (SCH008, SCH009), which
    # count in the state like a target's findings; fleet_signals: the compared ratios, for perfdata
    source: str = ""
    fleet_findings: list[FleetFinding] = Field(default_factory=list)
    fleet_signals: dict[str, float | None] = Field(default_factory=dict)
