"""Probe specs (probes/*.toml): what a source exposes, metric names and aliases across versions -> signals."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from llmdiag.schema.base import _Strict

STAT_NAMES = {
    "gauge": {"last", "mean", "min", "max", "p90"},
    "counter": {"rate", "increase"},
    "histogram": {"p50", "p90", "p95", "p99", "mean", "count", "sum", "sum_in_window_max"},
    "info": {"value"},
    "derived": {"value"},
}


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
    # gauges that only count up (Triton's iteration number): PromQL forms (llmdiag.schema.promql) may read their
    # rate and increase over the window, as of a counter; the scan reads them as a gauge
    monotonic: bool = False

    @model_validator(mode="after")
    def _units_in_names(self) -> SignalSpec:
        if self.kind == "counter" and not self.name.endswith("_per_second"):
            raise ValueError("counter signals become rates: their name must end in _per_second")
        if self.kind == "info" and not self.label:
            raise ValueError("info signals need 'label', the label that carries the number")
        if self.divide_by is not None and self.kind != "gauge":
            raise ValueError("divide_by applies to gauges only")
        if self.monotonic and self.kind != "gauge":
            raise ValueError("monotonic applies to gauges only (a counter counts up by its kind)")
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


class EstimateSpec(_Strict):
    """A signal this page gives only indirectly, estimated from the probe's own signals as the scan estimates it
    (e.g. llmdiag.collect.servers.trtllm.finish_prometheus_signals): its PromQL per stat, over ``{signal.stat}`` and
    ``{window_seconds}`` (llmdiag.schema.promql), for the rule export. ``help`` says the estimate and its bias."""

    name: str
    promql: dict[str, str] = Field(min_length=1)
    help: str = Field(min_length=1)


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
    estimate: list[EstimateSpec] = Field(default_factory=list)
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
        estimated = {e.name for e in self.estimate} & ({s.name for s in self.signal} | {b.name for b in self.by_design})
        if estimated:
            raise ValueError(f"signals both measured (or fixed) and estimated: {sorted(estimated)}")
        return self
