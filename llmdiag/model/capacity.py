"""`llmdiag capacity`: how many users one deployment serves, how fast each is, and what runs out first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from llmdiag.model.report import Versioned

StepBound = Literal["compute", "hbm_bandwidth", "interconnect", "scheduler"]  # what sets a step's time


@dataclass(frozen=True)
class StepTime:
    flops: float
    compute_seconds: float
    hbm_bytes_per_gpu: float
    memory_seconds: float
    allreduce_seconds: float
    scheduler_seconds: float
    step_seconds: float
    bound_by: StepBound  # the largest of the four terms


Resource = Literal[
    "kv_memory", "max_num_seqs", "max_num_batched_tokens", "compute", "hbm_bandwidth", "interconnect", "scheduler"
]
BATCH_CAPS: tuple[Resource, ...] = ("kv_memory", "max_num_seqs", "max_num_batched_tokens")


class CapacityInputs(BaseModel):
    gpu: str
    gpu_part: str
    model: str
    model_source: str
    tp: int
    interconnect: str
    users: int
    prompt_tokens: int
    output_tokens: int
    gpu_memory_utilization: float
    block_size_tokens: int
    activation_reserve_bytes: int
    scheduler_overhead_seconds: float
    max_num_seqs: int
    max_num_batched_tokens: int
    # where the two batch caps came from: "given", or vLLM's default for this GPU
    batch_caps_source: str


class HardwareFacts(BaseModel):
    memory_bytes: int
    hbm_bandwidth_bytes_per_second: float
    peak_bf16_flops_per_second: float
    interconnect_bandwidth_bytes_per_second: float
    allreduce_latency_seconds: float


class ModelFacts(BaseModel):
    total_params: int
    active_params: int
    weight_bytes: int
    kv_bytes_per_token: int
    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    experts: int
    active_experts: int
    max_context_tokens: int


class MemoryReport(BaseModel):
    """Per GPU: memory × utilization = weights + activation reserve + KV cache."""

    usable_bytes_per_gpu: float
    weight_bytes_per_gpu: float
    activation_reserve_bytes: int
    kv_cache_bytes_per_gpu: float
    kv_bytes_per_token_per_gpu: int
    kv_blocks: int
    kv_capacity_tokens: int
    context_tokens: int
    blocks_per_sequence: int
    kv_max_batch_sequences: int


class OperatingPoint(BaseModel):
    label: str
    batch_sequences: int
    decode_context_tokens: float
    prompt_tokens_per_step: float  # prefill riding along in each step (0 for decode only)
    step: StepTime  # a frozen dataclass: pydantic validates and serialises it as it is
    per_user_tokens_per_second: float  # what one served user reads
    total_tokens_per_second: float


class ResourceUse(BaseModel):
    resource: Resource
    used: float
    available: float
    unit: str
    ratio: float  # used / available; > 1 means it caps (batch caps) or its share of the step (step terms)
    detail: str


class TtftBurst(BaseModel):
    """Time to first token when every user sends a request at the same moment."""

    users: int
    waves: int
    wave_sequences: int
    wave_seconds: float
    prefill_tokens_per_second: float
    alone_seconds: float  # one request on an idle server
    p50_seconds: float
    p90_seconds: float
    max_seconds: float


class SeedArithmetic(BaseModel):
    users: int
    single_stream_tokens_per_second: float
    naive_per_user_tokens_per_second: float  # single stream ÷ users
    batched_per_user_tokens_per_second: float  # while served
    batched_mean_per_user_tokens_per_second: float  # total ÷ users: waiting time included
    batched_total_tokens_per_second: float
    batching_gain: float  # batched total ÷ single stream


class SimulatedCapacity(BaseModel):
    """What ``--simulate`` measured: the simulator (``llmdiag.sim``) under a closed-loop load of the same case.

    Rates and the batch are taken over the run after its warm-up (the arrival burst); TTFTs over every request.
    """

    users: int  # simulated users: the requested ones, capped at what one process drives
    users_capped: bool
    output_spread: float  # each request's output is drawn from O·(1 ± spread), mean O
    wall_seconds: float
    warmup_seconds: float
    measured_seconds: float  # simulated seconds in the measured window
    lag_seconds: float  # how long the simulated clock stood still for a late host over the run (0: kept up)
    requests_completed: int
    steps: int  # engine steps in the measured window
    mean_batch_sequences: float  # running sequences, time-averaged over the window
    max_batch_sequences: int
    mean_waiting: float
    total_tokens_per_second: float  # generated tokens / simulated seconds in the window
    per_user_tokens_per_second: float  # total ÷ mean batch: what a served user reads
    mean_per_user_tokens_per_second: float  # total ÷ users: waiting included
    gpu_busy_tokens_per_second: float  # generated tokens / summed step time: the rate without host lag
    ttft_p50_seconds: float | None
    ttft_p90_seconds: float | None
    ttft_samples: int
    kv_usage_mean: float
    kv_usage_max: float
    preemptions: int
    analytical_total_tokens_per_second: float  # plan_capacity's at-users total for the simulated users
    limited_by: Resource | None  # the cap seen, if one was: KV memory or a batch cap
    limited_detail: str


class CapacityReport(Versioned):
    kind: Literal["capacity"] = "capacity"
    summary: str
    inputs: CapacityInputs
    hardware: HardwareFacts
    model: ModelFacts
    memory: MemoryReport
    served_sequences: int
    waiting_users: int
    limited_by: Resource
    step_bound_by: StepBound
    single_stream: OperatingPoint
    kv_max_decode_only: OperatingPoint
    kv_max_sustained: OperatingPoint
    at_users: OperatingPoint
    resources: list[ResourceUse]
    ttft: TtftBurst
    seed: SeedArithmetic
    notes: list[str] = Field(default_factory=list)
    simulated: SimulatedCapacity | None = None  # only with --simulate
