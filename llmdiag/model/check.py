"""`llmdiag check`: Nagios states (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN) per target, and the check report.

The state itself (``State``, ``state_of``, ``worst``) is the verdict's Nagios reading and lives with it
(llmdiag.model.verdict); it is named here too, where check's callers look for it.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from llmdiag.model.fleet import FleetFinding
from llmdiag.model.report import Report
from llmdiag.model.verdict import State, Verdict, state_of, worst

__all__ = ["CheckReport", "State", "TargetResult", "state_of", "worst"]


class TargetResult(BaseModel):
    name: str
    url: str  # credentials removed
    state: State
    verdict: Verdict | None = None
    error: str | None = None
    hint: str = ""
    baseline: str = ""  # what the regression rules compared against, or why nothing
    muted: list[str] = Field(default_factory=list)  # "CODE: reason" of the muted rules


class CheckReport(Report):
    state: State
    at_unix: float
    targets: list[TargetResult]
    history: str | None = None  # the database path, None with --no-history
    # outputs that failed (textfile, pushgateway, history): each is also an UNKNOWN in the state
    output_errors: list[str] = Field(default_factory=list)
    # `check --prometheus`: where the instances were read, and the fleet rules that fired (SCH008, SCH009), which
    # count in the state like a target's findings; fleet_signals: the compared ratios, for perfdata
    source: str = ""
    fleet_findings: list[FleetFinding] = Field(default_factory=list)
    fleet_signals: dict[str, float | None] = Field(default_factory=dict)
