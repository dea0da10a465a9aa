"""Fleets: several replicas of one service (direct targets, or a Prometheus selector's instances)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, Field

from llmdiag.model.report import Report
from llmdiag.model.signals import Signal
from llmdiag.model.verdict import Bottleneck, Finding, RuleOutcome, Severity, State, Verdict


def _state_name(value: object) -> object:
    """A State, or its name: kept as the name (the JSON says "WARNING"), refused when it is not a State's."""
    if isinstance(value, State):
        return value.name
    if isinstance(value, str) and value not in State.__members__:
        raise ValueError(f"not a state: {value!r}; one of {', '.join(State.__members__)}")
    return value


# a State by its name, as `llmdiag check` would call the replica
StateName = Annotated[str, BeforeValidator(_state_name)]

# ---------------------------------------------------------------------------------------------
# fleets: several replicas of one service (direct targets, or a Prometheus selector's instances)


class ReplicaNumbers(BaseModel):
    """The key numbers of one replica over its window; None where the replica did not expose them."""

    request_rate_per_second: float | None = None  # finished requests/s
    requests_running_mean: float | None = None
    requests_waiting_mean: float | None = None
    requests_in_system_mean: float | None = None  # running + waiting
    kv_cache_usage_max_ratio: float | None = None
    ttft_p90_seconds: float | None = None
    generation_tokens_per_second: float | None = None


class FleetTarget(BaseModel):
    """One replica: its verdict, or why it could not be judged (then its class is ``unknown``)."""

    name: str  # the target's name, or the Prometheus instance/pod/model_name label
    url: str = ""  # credentials removed; empty for a Prometheus instance
    bottleneck: Bottleneck = Bottleneck.unknown
    confidence: float | None = None
    state: StateName = State.UNKNOWN.name  # as `llmdiag check` would call it
    worst_severity: Severity | None = None
    primary: str = ""  # the code of the finding that set the class
    summary: str = ""
    numbers: ReplicaNumbers = Field(default_factory=ReplicaNumbers)
    # per-scrape requests waiting (unix time, value), for the report's queue strip
    waiting_samples: list[tuple[float, float]] = Field(default_factory=list)
    error: str | None = None
    hint: str = ""
    flagged_by: list[str] = Field(default_factory=list)  # fleet finding codes that name this replica
    verdict: Verdict | None = None


class FleetFinding(BaseModel):
    """A fleet-level rule that fired (router-uneven-load, replica-worse-than-peers), with the replica it names."""

    finding: Finding
    replica: str
    # the per-replica values the rule compared, replica → value (in the finding's first evidence unit)
    values: dict[str, float] = Field(default_factory=dict)
    compared: str = ""  # what the values are, e.g. "finished requests/s"


class FleetReport(Report):
    kind: Literal["fleet"] = "fleet"
    source: str = ""  # "direct targets", or the Prometheus URL and selector
    at_unix: float | None = None
    window_seconds: float | None = None
    targets: list[FleetTarget] = Field(default_factory=list)  # worst first
    class_counts: dict[str, int] = Field(default_factory=dict)  # bottleneck class → replicas
    imbalance: list[FleetFinding] = Field(default_factory=list)
    fleet_signals: dict[str, Signal] = Field(default_factory=dict)
    fleet_rules: list[RuleOutcome] = Field(default_factory=list)
    timeline: FleetTimeline | None = None
    notes: list[str] = Field(default_factory=list)
    # read through Prometheus: the HTTP requests to its query API (all steps of a timeline), its scrape interval
    queries: int | None = None
    scrape_interval_seconds: float | None = None

    def worst_severity(self) -> Severity | None:
        found = [t.worst_severity for t in self.targets if t.worst_severity is not None]
        found += [f.finding.severity for f in self.imbalance]
        return max(found, key=lambda s: s.rank) if found else None

    def probed(self) -> int:
        return sum(1 for t in self.targets if t.error is None)


class FleetStep(BaseModel):
    """One step of a timeline: each replica's class at that time (absent: no data for it at that step)."""

    at_unix: float
    classes: dict[str, Bottleneck] = Field(default_factory=dict)


class Transition(BaseModel):
    replica: str
    at_unix: float  # the first step showing the new class
    previous_at_unix: float | None = None  # the last step showing the old class
    from_class: Bottleneck
    to_class: Bottleneck


class FleetTimeline(BaseModel):
    """Classes per replica over time, when they changed, and which replica left healthy first."""

    step_seconds: float | None = None
    steps: list[FleetStep] = Field(default_factory=list)
    transitions: list[Transition] = Field(default_factory=list)
    # the first replica to go from healthy/idle to a bottleneck class (ties: every one at that step, by name)
    first_to_go: list[str] = Field(default_factory=list)
    first_to_go_at_unix: float | None = None
    first_to_go_class: Bottleneck | None = None
    # when the fleet's majority class changed: (time, from, to)
    fleet_transitions: list[Transition] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


FleetReport.model_rebuild()
