"""Pydantic models of the catalogue files: probe specs (probes/*.toml) and rules (rules/**/*.toml)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from llmdiag.model import Category

STAT_NAMES = {
    "gauge": {"last", "mean", "min", "max", "p90"},
    "counter": {"rate", "increase"},
    "histogram": {"p50", "p90", "p95", "p99", "mean", "count", "sum"},
    "info": {"value"},
    "derived": {"value"},
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------------------------------------
# probe specs


class SignalSpec(_Strict):
    """How one signal is read from a server's metrics. The first name in ``metrics`` that is present wins."""

    name: str
    kind: Literal["gauge", "counter", "histogram", "info"]
    unit: str
    metrics: list[str] = Field(min_length=1)
    help: str
    match: dict[str, str] = Field(default_factory=dict)
    aggregate: Literal["sum", "mean", "max", "min"] = "sum"
    # multiplies every sample into the signal's unit (percent → ratio 0.01, MiB → bytes 1048576);
    # valid_min / valid_max are in the scaled unit
    scale: float = 1.0
    valid_min: float | None = None
    valid_max: float | None = None
    # bitmask gauges (clock event reasons): a sample reads 1 when any of these bits is set, else 0, so the
    # gauge's mean is the share of samples with one of those reasons active
    any_bits: int | None = None
    # a device-wide field that DCGM repeats on every MIG instance of a GPU: count each GPU once, or sums and
    # means would weigh a partitioned GPU once per instance
    per_gpu: bool = False
    # info metrics: the numeric label that carries the value
    label: str | None = None
    # a note shown when an older alias was used (e.g. a unit change)
    alias_note: str = ""
    # appended to the reason when no wire name is present (e.g. how to enable an off-by-default field)
    missing_note: str = ""
    # how a user checks this value by hand, when the probe's own command does not fit
    verify: str = ""
    # labels whose series are copies of one value (SGLang's tp_rank/pp_rank with metrics for all schedulers):
    # series that differ only in these labels are counted once
    fold_labels: list[str] = Field(default_factory=list)
    # gauges: each sample divided by this gauge's total in the same scrape (TGI's reserved tokens over its token
    # budget); a scrape without it (or with it at zero) has no value
    divide_by: str | None = None

    @model_validator(mode="after")
    def _units_in_names(self) -> SignalSpec:
        if self.kind == "counter" and not self.name.endswith("_per_second"):
            raise ValueError("counter signals become rates: their name must end in _per_second")
        if self.kind == "info" and not self.label:
            raise ValueError("info signals need 'label', the label that carries the number")
        if self.divide_by is not None and self.kind != "gauge":
            raise ValueError("divide_by applies to gauges only")
        return self


class ByDesignSpec(_Strict):
    """A signal this server cannot have, by its design: a fixed value (TGI never preempts: 0 preemptions/s) or,
    without ``value``, unavailable. Either way ``reason`` says why, in the coverage and the evidence's source."""

    name: str
    kind: Literal["gauge", "counter"]
    unit: str
    reason: str = Field(min_length=1)
    value: float | None = None

    @model_validator(mode="after")
    def _counter_rate(self) -> ByDesignSpec:
        if self.kind == "counter" and not self.name.endswith("_per_second"):
            raise ValueError("counter signals become rates: their name must end in _per_second")
        return self


class DetectJsonSpec(_Strict):
    """Detection by an endpoint of the server's own: GET ``path`` answers a JSON object with ``key`` (whose value
    contains ``contains``, when given)."""

    path: str = Field(pattern=r"^/")
    key: str
    contains: str = ""


class ProbeSpec(_Strict):
    name: str
    title: str
    server: str
    metrics_path: str = "/metrics"
    # a page is this server's when any sample name starts with one of these
    detect_prefixes: list[str]
    # exact names of an older release too generic to detect the server by, accepted once the probe is chosen
    legacy_names: list[str] = Field(default_factory=list)
    # a server whose metrics_path is not Prometheus (TensorRT-LLM's JSON): where its Prometheus page is
    prometheus_path: str = ""
    # the info metric whose labels describe the server's configuration
    config_metric: str | None = None
    # DCGM-style "blank" sentinel values (no data / not supported) are dropped as missing, never read as numbers
    blank_sentinels: bool = False
    # how a user checks this probe's values by hand; empty: curl the page and grep the metric (HTTP probes)
    verify: str = ""
    # "server": an inference server's own page, a candidate for auto-detection (llmdiag.collect.detect) and
    # `--server NAME`; "telemetry": GPU, host and other pages read beside it
    role: Literal["server", "telemetry"] = "telemetry"
    # server auto-detection (llmdiag.collect.detect) beyond the metric prefixes: a response header whose value
    # contains the text (lower case), /v1/models' owned_by values, and JSON endpoints of the server's own
    detect_headers: dict[str, str] = Field(default_factory=dict)
    detect_owned_by: list[str] = Field(default_factory=list)
    detect_json: list[DetectJsonSpec] = Field(default_factory=list)
    # caveats about this server's metrics, shown with the probe in the coverage
    notes: list[str] = Field(default_factory=list)
    by_design: list[ByDesignSpec] = Field(default_factory=list)
    signal: list[SignalSpec]

    @field_validator("signal")
    @classmethod
    def _unique(cls, signals: list[SignalSpec]) -> list[SignalSpec]:
        names = [s.name for s in signals]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"signal names repeat: {sorted(dupes)}")
        return signals

    @model_validator(mode="after")
    def _by_design_not_measured(self) -> ProbeSpec:
        both = {s.name for s in self.signal} & {b.name for b in self.by_design}
        if both:
            raise ValueError(f"signals both measured and fixed by design: {sorted(both)}")
        return self


# ---------------------------------------------------------------------------------------------
# rules

CODE_RE = re.compile(r"^(MEM|CMP|SCH|NET|SAN|REG)\d{3}$")
SLUG_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
CODE_PREFIX = {
    "MEM": "memory",
    "CMP": "compute",
    "SCH": "scheduling",
    "NET": "network",
    "SAN": "sanity",
    "REG": "regression",
}


class SignalRef(_Strict):
    signal: str
    stat: str = "value"


class Condition(SignalRef):
    op: Literal[">", ">=", "<", "<=", "==", "!="]
    value: float
    # a gate whose signal a server does not have: "skip" the rule (the default), or "pass" and judge it on the rest
    # (for a guard another gate or the server's design already covers; the evidence shows it unavailable)
    if_missing: Literal["skip", "pass"] = "skip"

    def holds(self, observed: float) -> bool:
        return {
            ">": observed > self.value,
            ">=": observed >= self.value,
            "<": observed < self.value,
            "<=": observed <= self.value,
            "==": observed == self.value,
            "!=": observed != self.value,
        }[self.op]


class Ladder(SignalRef):
    """Severity from one signal: ``warning`` and ``critical`` thresholds in ``direction``."""

    direction: Literal["above", "below"] = "above"
    warning: float
    critical: float | None = None  # none: the finding never goes past warning

    @model_validator(mode="after")
    def _ordered(self) -> Ladder:
        if self.critical is None:
            return self
        if self.direction == "above" and self.critical < self.warning:
            raise ValueError("with direction 'above', critical must be >= warning")
        if self.direction == "below" and self.critical > self.warning:
            raise ValueError("with direction 'below', critical must be <= warning")
        return self


ENGINES = ("vllm", "sglang", "trtllm", "tgi", "llamacpp")


class Fix(_Strict):
    """What to change: ``text`` for everyone, then each engine's own flags or options. An engine the rule cannot
    judge (its signals do not exist there) is left out of ``applies_to``; every engine in it needs its fixes."""

    text: str
    vllm: list[str] = Field(default_factory=list)
    sglang: list[str] = Field(default_factory=list)
    trtllm: list[str] = Field(default_factory=list)
    tgi: list[str] = Field(default_factory=list)
    llamacpp: list[str] = Field(default_factory=list)
    applies_to: list[Literal["vllm", "sglang", "trtllm", "tgi", "llamacpp"]] = Field(
        default_factory=lambda: list(ENGINES)
    )

    def for_engine(self, engine: str) -> list[str]:
        return list(getattr(self, engine, [])) if engine in ENGINES else []

    @model_validator(mode="after")
    def _fixes_where_it_applies(self) -> Fix:
        if not self.text.strip():
            raise ValueError("fix text is empty")
        if len(set(self.applies_to)) != len(self.applies_to):
            raise ValueError("applies_to repeats an engine")
        outside = [e for e in ENGINES if getattr(self, e) and e not in self.applies_to]
        if outside:
            raise ValueError(f"fixes for {', '.join(outside)}, which applies_to leaves out")
        empty = [e for e in ENGINES if any(not flag.strip() for flag in getattr(self, e))]
        if empty:
            raise ValueError(f"an empty fix for {', '.join(empty)}")
        return self


class RuleSpec(_Strict):
    code: str
    slug: str
    title: str
    category: Category
    status: Literal["preview", "stable", "deprecated"] = "stable"
    # a fault or a risk worth fixing that does not by itself limit the server (a degraded but idle link, an OOM
    # risk): shown with its evidence, never the verdict's class
    advisory: bool = False
    summary: str
    what: str
    why: str
    verify: str = ""
    severity: Ladder
    gate: list[Condition] = Field(default_factory=list)
    evidence: list[SignalRef] = Field(default_factory=list)
    fix: Fix
    # judged only where that rule is skipped for want of inputs (a stand-in for logs, which lack request counts)
    instead_of: str | None = None
    # what the rule judges: one server's window ("server"), or several replicas side by side ("fleet": judged on the
    # fleet's own signals by llmdiag.engine.fleet, never in a single server's verdict)
    scope: Literal["server", "fleet"] = "server"

    @field_validator("code")
    @classmethod
    def _code(cls, code: str) -> str:
        if not CODE_RE.match(code):
            raise ValueError("must be MEM, CMP, SCH, NET, SAN or REG followed by three digits")
        return code

    @field_validator("slug")
    @classmethod
    def _slug(cls, slug: str) -> str:
        if not SLUG_RE.match(slug):
            raise ValueError("must be lower-case words joined by '-'")
        return slug

    @model_validator(mode="after")
    def _category_matches_code(self) -> RuleSpec:
        if CODE_PREFIX[self.code[:3]] != self.category.value:
            raise ValueError(f"code {self.code} belongs to category '{CODE_PREFIX[self.code[:3]]}'")
        return self

    def inputs(self) -> list[SignalRef]:
        return [self.severity, *self.gate, *self.evidence]


# ---------------------------------------------------------------------------------------------
# collectives (probes/collectives.toml): which trace kernels and CPU ops are communication

COLLECTIVE_TYPES = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
    "send_recv",
    "gather",
    "scatter",
    "barrier",
)


class KernelPattern(_Strict):
    pattern: str
    family: Literal["nccl", "rccl", "symm_mem", "vllm_custom", "quick_ar", "trtllm_custom", "gloo"]
    # "": the name does not tell; the type comes from the kernel's args or its CPU op
    collective: str = ""

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        return pattern

    @field_validator("collective")
    @classmethod
    def _known(cls, collective: str) -> str:
        if collective and collective not in COLLECTIVE_TYPES:
            raise ValueError(f"unknown collective '{collective}'; one of {', '.join(COLLECTIVE_TYPES)}")
        return collective


class OpPattern(_Strict):
    pattern: str
    collective: str = ""

    _compiles = field_validator("pattern")(KernelPattern._compiles.__func__)  # type: ignore[attr-defined]


class DeviceLink(_Strict):
    pattern: str
    link: str

    _compiles = field_validator("pattern")(KernelPattern._compiles.__func__)  # type: ignore[attr-defined]


class CollectiveSpec(_Strict):
    kernel: list[KernelPattern] = Field(min_length=1)
    device_link: list[DeviceLink] = Field(default_factory=list)
    cpu_op: list[OpPattern] = Field(min_length=1)
    names: dict[str, str]
    bus_factor: dict[str, Literal["2(n-1)/n", "(n-1)/n", "1"]]
    dtype_bytes: dict[str, int]

    @model_validator(mode="after")
    def _names_are_types(self) -> CollectiveSpec:
        for name, collective in self.names.items():
            if collective not in COLLECTIVE_TYPES:
                raise ValueError(f"names.{name}: unknown collective '{collective}'")
        return self
