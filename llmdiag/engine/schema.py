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

    @model_validator(mode="after")
    def _units_in_names(self) -> SignalSpec:
        if self.kind == "counter" and not self.name.endswith("_per_second"):
            raise ValueError("counter signals become rates: their name must end in _per_second")
        if self.kind == "info" and not self.label:
            raise ValueError("info signals need 'label', the label that carries the number")
        return self


class ProbeSpec(_Strict):
    name: str
    title: str
    server: str
    metrics_path: str = "/metrics"
    # a page is this server's when any sample name starts with one of these
    detect_prefixes: list[str]
    # the info metric whose labels describe the server's configuration
    config_metric: str | None = None
    # DCGM-style "blank" sentinel values (no data / not supported) are dropped as missing, never read as numbers
    blank_sentinels: bool = False
    # how a user checks this probe's values by hand; empty: curl the page and grep the metric (HTTP probes)
    verify: str = ""
    signal: list[SignalSpec]

    @field_validator("signal")
    @classmethod
    def _unique(cls, signals: list[SignalSpec]) -> list[SignalSpec]:
        names = [s.name for s in signals]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"signal names repeat: {sorted(dupes)}")
        return signals


# ---------------------------------------------------------------------------------------------
# rules

CODE_RE = re.compile(r"^(MEM|CMP|SCH|NET|SAN|REG)\d{3}$")
SLUG_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
CODE_PREFIX = {
    "MEM": "memory", "CMP": "compute", "SCH": "scheduling", "NET": "network", "SAN": "sanity", "REG": "regression",
}  # fmt: skip


class SignalRef(_Strict):
    signal: str
    stat: str = "value"


class Condition(SignalRef):
    op: Literal[">", ">=", "<", "<=", "==", "!="]
    value: float

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


class Fix(_Strict):
    text: str
    vllm: list[str] = Field(default_factory=list)
    sglang: list[str] = Field(default_factory=list)
    trtllm: list[str] = Field(default_factory=list)


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
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "send_recv", "gather",
    "scatter", "barrier",
)  # fmt: skip


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
