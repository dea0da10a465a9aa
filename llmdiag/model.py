"""The data that flows between the stages: collect → SignalSet → engine → Verdict → render.

Values are in base units (seconds, bytes, ratios 0–1, per-second rates); the unit is in the signal name.
A value that could not be measured is ``None`` with ``unavailable`` saying why: missing is never zero.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, Field

SCHEMA_VERSION = "1"

SignalKind = Literal["gauge", "counter", "histogram", "info", "derived"]
WindowKind = Literal["window", "lifetime"]


class Bottleneck(str, Enum):
    memory = "memory"
    compute = "compute"
    scheduling = "scheduling"
    network = "network"
    healthy = "healthy"
    idle = "idle"
    unknown = "unknown"


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


class Window(BaseModel):
    kind: WindowKind = "window"
    start_unix: float | None = None
    end_unix: float | None = None
    duration_seconds: float | None = None
    scrapes: int = 0
    note: str = ""


class Signal(BaseModel):
    """One measured quantity over the window.

    ``stats`` holds what the kind allows: gauges ``last/mean/min/max``; counters ``rate/increase``;
    histograms ``p50/p90/p95/p99/mean/count/sum``; derived signals ``value``.
    """

    name: str
    kind: SignalKind
    unit: str
    stats: dict[str, float] = Field(default_factory=dict)
    unavailable: str | None = None
    source: str = ""
    verify: str = ""
    window_seconds: float | None = None
    # per-scrape points (unix time, value) kept for charts and the JSON record: a gauge's value at each scrape;
    # a counter's rate over the interval that ends at that scrape (in ``unit``)
    samples: list[tuple[float, float]] = Field(default_factory=list)
    # histograms: the window's bucket deltas as (upper bound, cumulative count), finite bounds only; the
    # observations above the last bound are ``stats["count"]`` minus the last count
    buckets: list[tuple[float, float]] = Field(default_factory=list)
    # per-label-set breakdown, e.g. per engine, for imbalance checks
    by_series: dict[str, float] = Field(default_factory=dict)

    def stat(self, name: str) -> float | None:
        if self.unavailable is not None:
            return None
        return self.stats.get(name)

    @classmethod
    def missing(cls, name: str, kind: SignalKind, unit: str, reason: str, source: str = "") -> Signal:
        return cls(name=name, kind=kind, unit=unit, unavailable=reason, source=source)


class SourceInfo(BaseModel):
    """What a probe talked to, and what it saw."""

    probe: str
    url: str = ""
    server: str = ""
    models: list[str] = Field(default_factory=list)
    engines: list[str] = Field(default_factory=list)
    ok: bool = True
    note: str = ""
    config: dict[str, str] = Field(default_factory=dict)


class SignalSet(BaseModel):
    signals: dict[str, Signal] = Field(default_factory=dict)
    window: Window = Field(default_factory=Window)
    sources: list[SourceInfo] = Field(default_factory=list)
    # anomalies the collector noticed in the raw data (counter resets, out-of-range values …)
    anomalies: list[str] = Field(default_factory=list)

    def get(self, name: str) -> Signal | None:
        return self.signals.get(name)

    def add(self, signal: Signal) -> None:
        self.signals[signal.name] = signal


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


class Verdict(BaseModel):
    schema_version: str = SCHEMA_VERSION
    tool_version: str = ""
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

    def worst_severity(self) -> Severity | None:
        ranks = [f.severity for f in self.findings]
        return max(ranks, key=lambda s: s.rank) if ranks else None


# ---------------------------------------------------------------------------------------------
# client-side measurements: canary requests in a scan, and `llmdiag load`


class Percentiles(BaseModel):
    """A distribution over requests; ``count`` is how many requests it is over (0: all values None)."""

    count: int = 0
    mean: float | None = None
    p5: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None


class LoadPoint(BaseModel):
    """One load level (a number of closed-loop users, or an arrival rate) and what it measured."""

    users: int | None = None
    rate_per_second: float | None = None
    window_seconds: float
    requests_completed: int = 0
    requests_cancelled: int = 0
    errors: dict[str, int] = Field(default_factory=dict)  # kind (http 503, timeout, stream …) → count
    error_examples: list[str] = Field(default_factory=list)
    ttft_seconds: Percentiles = Field(default_factory=Percentiles)
    itl_seconds: Percentiles = Field(default_factory=Percentiles)
    tpot_seconds: Percentiles = Field(default_factory=Percentiles)
    e2e_seconds: Percentiles = Field(default_factory=Percentiles)
    output_tokens_per_second: float | None = None
    # what each user gets while its answer streams (1 / TPOT), and over the whole request, wait included
    per_user_decode_tokens_per_second: Percentiles = Field(default_factory=Percentiles)
    per_user_tokens_per_second: Percentiles = Field(default_factory=Percentiles)
    # the seed arithmetic: total tokens/s divided by the users, as if each got an equal slice of a fixed rate
    naive_per_user_tokens_per_second: float | None = None
    goodput_requests_per_second: float | None = None
    goodput_ratio: float | None = None
    verdict: Verdict | None = None


class Knee(BaseModel):
    """Where adding load stops paying: the first point whose per-user speed or goodput breaks."""

    users: int | None = None
    rate_per_second: float | None = None
    reason: str
    bottleneck: Bottleneck | None = None


class LoadReport(BaseModel):
    schema_version: str = SCHEMA_VERSION
    tool_version: str = ""
    target: str = ""
    model: str = ""
    mode: Literal["closed", "open"] = "closed"
    prompt_tokens: str = ""
    output_tokens: str = ""
    slo_ttft_seconds: float | None = None
    slo_tpot_seconds: float | None = None
    points: list[LoadPoint] = Field(default_factory=list)
    knee: Knee | None = None
    notes: list[str] = Field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# `llmdiag trace`: PyTorch profiler (Kineto) traces, one file per rank


class CollectiveStats(BaseModel):
    """One collective type on one rank. Kernel durations include the wait for the slowest peer."""

    collective: str  # all_reduce, all_gather … or "unknown" when nothing in the trace tells
    family: str  # nccl, rccl, symm_mem, vllm_custom, quick_ar, trtllm_custom, gloo
    count: int
    total_seconds: float
    sized_count: int = 0  # how many had a message size
    bytes_total: float | None = None
    message_bytes_min: float | None = None
    message_bytes_max: float | None = None
    group_size: int | None = None
    size_source: str = ""  # kernel args, cpu op args, input dims × dtype
    algbw_bytes_per_second: float | None = None
    busbw_bytes_per_second: float | None = None


class RankStats(BaseModel):
    """One rank's GPU time (CPU time on a CPU-only run: see ``timeline``). Shares are of the union of busy time or of
    the span, as named."""

    rank: int | None
    path: str
    device: str = ""
    gpu_events: int = 0
    # what busy/comm/compute are measured on: "gpu" (kernels), "cpu" (a CPU-only run: gloo:* ranges are comm, the
    # cpu_ops of the other threads compute), None when the trace has neither
    timeline: Literal["gpu", "cpu"] | None = None
    span_seconds: float | None = None  # first GPU activity start to last end, all streams
    busy_seconds: float | None = None  # union of kernels, memcpy and memset
    busy_ratio: float | None = None  # busy / span
    comm_seconds: float | None = None  # union of communication kernels
    compute_seconds: float | None = None  # union of the other kernels (memcpy/memset are neither)
    comm_share_ratio: float | None = None  # comm / busy
    exposed_comm_seconds: float | None = None  # comm while no compute kernel runs on the device
    exposed_comm_share_ratio: float | None = None  # exposed comm / span
    overlap_ratio: float | None = None  # (comm ∩ compute) / comm, HTA's comp_comm_overlap
    comm_kernels: int = 0
    untyped_comm_kernels: int = 0
    large_message_busbw_bytes_per_second: float | None = None
    collectives: list[CollectiveStats] = Field(default_factory=list)
    dropped_step: int | None = None  # --hta-compat: the ProfilerStep left out, as HTA does
    notes: list[str] = Field(default_factory=list)


class Straggler(BaseModel):
    """The rank whose collectives start latest on average (against the earliest rank); its peers wait inside theirs."""

    rank: int
    latest_count: int  # matched collectives this rank started last
    matched: int  # collectives matched across all ranks
    skew_seconds: float  # mean of (this rank's start − the other ranks' median start) over the matched collectives
    max_skew_seconds: float  # the largest start spread of any matched collective (latest − earliest)
    lateness_seconds: dict[int, float] = Field(default_factory=dict)  # per rank: mean start − earliest start
    runner_up: int | None = None


class TraceProblem(BaseModel):
    kind: Literal["error", "warning"]
    path: str = ""
    message: str
    hint: str = ""


class TraceReport(BaseModel):
    schema_version: str = SCHEMA_VERSION
    tool_version: str = ""
    paths: list[str] = Field(default_factory=list)
    hta_compat: bool = False
    link: str | None = None
    link_source: str = ""
    expected_busbw_bytes_per_second: float | None = None
    world_size: int | None = None
    ranks: list[RankStats] = Field(default_factory=list)
    straggler: Straggler | None = None
    cross_rank: str = ""  # why no straggler was named, or how the ranks were matched
    problems: list[TraceProblem] = Field(default_factory=list)
    bytes_read: int = 0
    parse_seconds: float | None = None
    verdict: Verdict | None = None


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
    state: Literal["OK", "WARNING", "CRITICAL", "UNKNOWN"] = "UNKNOWN"  # as `llmdiag check` would call it
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


class FleetReport(BaseModel):
    schema_version: str = SCHEMA_VERSION
    tool_version: str = ""
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
