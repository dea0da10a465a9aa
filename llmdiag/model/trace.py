"""`llmdiag trace`: PyTorch profiler (Kineto) traces, one file per rank."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from llmdiag.model.report import Report
from llmdiag.model.verdict import Verdict

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


class TraceReport(Report):
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
