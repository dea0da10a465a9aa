"""`llmdiag nccl-bench`: collective bandwidth measured under torchrun, as nccl-tests measures it.

The ranks fill everything but ``signals`` and ``findings`` (llmdiag.collect.nccl); the caller judges the run
(llmdiag.api.nccl) and adds them. Figures are in base units: seconds, bytes, bytes per second, ratios 0–1.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from llmdiag.errors import option
from llmdiag.model.report import SCHEMA_VERSION
from llmdiag.model.signals import Signal
from llmdiag.model.verdict import Finding

NCCL_BENCH_TOOL = "llmdiag nccl-bench"


def timing_note() -> str:
    """How each time was measured, naming the options that set it (as the caller names them)."""
    return f"mean per collective over {option('iters')} back to back, averaged over ranks; median of {option('trials')}"


class NcclBenchOptions(BaseModel):
    """What to measure: checked before torchrun starts, and handed to the ranks as JSON."""

    sizes: list[int]  # message sizes in bytes, ascending
    ops: list[str]  # all_reduce, all_gather, reduce_scatter, all_to_all
    iters: int = 20  # timed collectives per trial
    warmup: int = 5  # untimed collectives before each size
    trials: int = 3  # timed batches per size; the median is kept
    max_size_bytes: int | None = None  # a cap on the message size (else memory; 64 MiB with gloo)
    link: str | None = None  # the link class to compare with (probes/links.toml), else NVML names it
    check: bool = True  # check each op's result once before timing it


class CollectiveMeasurement(BaseModel):
    """One op at one message size: nccl-tests' algbw and busbw."""

    op: str
    size_bytes: int  # nccl-tests' size: all_reduce the buffer, all_gather the output, the others the input
    count: int  # float32 elements
    time_seconds: float  # mean per collective, averaged over ranks, median of the trials
    time_max_rank_seconds: float  # the slowest rank's mean (same trial)
    algbw_bytes_per_second: float
    busbw_bytes_per_second: float
    bus_factor: float
    trials_seconds: list[float] = Field(default_factory=list)


class BenchLink(BaseModel):
    """The link class the benchmark's traffic crosses and the busbw a healthy one reaches, or why it is unknown."""

    name: str | None
    expected_bus_bandwidth_bytes_per_second: float | None
    how: str  # how it was found (NVML, --link)
    unavailable: str | None = None
    title: str = ""


class MemoryCopyProbe(BaseModel):
    """One rank has no inter-GPU link: the device-memory copy bandwidth instead (host memory on a CPU)."""

    device: str
    size_bytes: int
    time_seconds: float
    copy_bandwidth_bytes_per_second: float  # bytes read + written per second
    peak_bytes_per_second: float | None
    peak_how: str
    copy_vs_peak_ratio: float | None
    check: str  # "ok" or "wrong result"


class NcclBenchReport(BaseModel):
    schema_version: str = SCHEMA_VERSION
    tool: str = NCCL_BENCH_TOOL
    tool_version: str = ""
    torch_version: str
    backend: str  # nccl, or gloo on CPU ranks
    world_size: int
    local_world_size: int
    nodes: int
    device: str
    dtype: str = "float32"
    iters: int
    warmup: int
    trials: int
    timing: str = Field(default_factory=timing_note)
    size_cap_bytes: int | None
    size_cap_reason: str
    link: BenchLink
    results: list[CollectiveMeasurement] = Field(default_factory=list)
    failed_ops: dict[str, str] = Field(default_factory=dict)  # op -> why (a wrong result)
    skipped_sizes_bytes: list[int] = Field(default_factory=list)  # above the size cap
    memory_probe: MemoryCopyProbe | None = None
    elapsed_seconds: float | None = None
    # the caller's judgement: the benchmark's own signals (not the engine's derived ones) and the rules that fired
    signals: dict[str, Signal] = Field(default_factory=dict)
    findings: list[Finding] = Field(default_factory=list)
