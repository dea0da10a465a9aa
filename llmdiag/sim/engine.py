"""A discrete-event model of a vLLM-style continuous-batching engine, priced step by step by ``physics.step_time``.

The engine knows no clock and no sockets: the caller hands it a time, ``schedule(now)`` builds one step and says
when it ends, and ``complete(step)`` applies the step's results at that end. ``llmdiag.sim.realtime`` drives it in
(scaled) real time; the unit tests drive it by hand. The scheduler follows vLLM V1's (``vllm/v1/core/sched``):

    KV cache     ``num_gpu_blocks`` blocks of ``block_size`` tokens; block 0 is vLLM's null block, so
                 ``num_gpu_blocks − 1`` can be handed out. A sequence holds ⌈tokens in KV / block_size⌉ blocks,
                 allocated as its prefill chunks and decoded tokens land. KV usage = 1 − free / (total − 1).
    a step       token budget = ``max_num_batched_tokens``.
                 1. Running requests, in admission order, each get min(tokens not yet in KV, budget): 1 for a
                    decode, the rest of the prompt for a prefill (chunked prefill). When a request's blocks do not
                    fit, the most recently admitted running request is preempted by recompute: its blocks are freed,
                    it forgets its KV and goes back to the front of the queue (``num_preemptions`` + 1). If it was
                    the request being scheduled, the running pass stops.
                 2. Only when nothing was preempted: waiting requests, first come first served, are admitted while
                    fewer than ``max_num_seqs`` run, budget is left and the blocks of their first chunk are free.
                    A request that does not fit blocks the queue behind it (FCFS: no overtaking).
    its time     ``physics.step_time`` of the batch actually scheduled (each request's chunk attends to its KV plus
                 itself, causally) + ``extra_step_overhead_seconds`` (a slow scheduler, a grammar, a busy host).
    at its end   every request whose tokens are all in KV samples one token; one that has its output leaves the
                 batch and frees its blocks; new requests join at the next step.

Two modes beyond vLLM's default (``capacity --compare`` runs them): ``batching="static"`` admits only when the last
batch has ended, prefills the whole batch in one step (past the token budget) and lets no one join until its
longest request ends; ``scheduling_policy="priority"`` orders the queue by (priority, arrival) and evicts the
lowest-priority running request, as vLLM's ``--scheduling-policy priority``. A request added with KV already in
place (``computed`` > 0: a disaggregated decode instance's, its KV sent by the prefill instance) computes only the
tokens that are not.

A preempted request recomputes its prompt and the tokens it had generated, then continues (its next inter-token
latency carries the whole detour, as in vLLM). Requests carry counters, not per-token objects: one step touches
each running request once, and the per-token histograms take one observation per distinct value per step.

What limited each step (``Step.limit``, summed as seconds per limit in ``EngineStats.limit_seconds``; the truth a
calibration bench judges llmdiag's verdicts against, never shown on a page):

    kv          a running request was preempted, or the first waiting request could not get its blocks
    batch_cap   a request that had arrived waited while ``max_num_seqs`` ran or the token budget was spent
    link        nobody waited for KV or a slot, and the all-reduces were the largest term of the step
    compute     nobody waited, the step's math was its largest term and the step was slow (``SLOW_STEP_SECONDS``)
    bandwidth   the same with HBM traffic the largest term
    host        the same with the host's per-step overhead the largest term
    none        nobody waited and the step was short
    (no step)   the GPU was idle: the window's time not covered by ``limit_seconds``

Recorded the way vLLM's V1 stats do (``vllm/v1/metrics/stats.py``): TTFT and e2e from arrival; queue = arrival →
first scheduling (preemptions do not move it); prefill = first scheduling → first token; decode = first → last
token; inference = first scheduling → last token; one inter-token latency per request per step after the first
token; prompt tokens counted once, when the first token comes; ``iteration_tokens`` = prompt tokens of requests
whose first token came this step + tokens generated this step.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from llmdiag.errors import UsageError
from llmdiag.model.capacity import StepTime
from llmdiag.physics.step import Deployment, StepLoad, kv_bytes_per_token_per_gpu, kv_capacity, step_time

FinishReason = Literal["stop", "length", "abort", "error", "repetition"]
FINISH_REASONS: tuple[FinishReason, ...] = ("stop", "length", "abort", "error", "repetition")
REJECT_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
DEFAULT_MAX_MODEL_LEN = 8192  # for a model whose context length is not stated
# token ids in and sampled token ids out over PCIe each step: a few bytes per token
HOST_BYTES_PER_TOKEN = 16
# a step at least this long paces each stream at ≤ 20 tokens/s, slower than people read: its largest term limits
# the server; a shorter step with nobody waiting limits nothing (the step limits above)
SLOW_STEP_SECONDS = 0.05
StepLimit = Literal["kv", "batch_cap", "compute", "bandwidth", "link", "host", "none"]
STEP_LIMITS: tuple[StepLimit, ...] = ("kv", "batch_cap", "compute", "bandwidth", "link", "host", "none")

# vLLM V1's default histogram buckets (vllm/v1/metrics/buckets.py; metrics catalog §1.2)
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)


def request_tokens_buckets(max_model_len: int) -> tuple[int, ...]:
    """vLLM's 1-2-5 series (1, 2, 5, 10, 20, 50, …) up to max_model_len."""
    out: list[int] = []
    magnitude = 1
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * magnitude
            if value > max_model_len:
                return tuple(out)
            out.append(value)
        magnitude *= 10


class AdmissionRejected(Exception):
    """The queue cap is reached; the server answers HTTP 503. ``reason`` is the admission_rejections label."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Histogram:
    """Bucket counts (not cumulative) and a sum; ``observe(value, n)`` records n equal observations at once."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last slot is +Inf
        self.total = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        # bisect_left: a value equal to a bound belongs to that bound's bucket (Prometheus 'le')
        self.counts[bisect_left(self.bounds, value)] += n
        self.total += value * n

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, cumulative count) pairs, +Inf last: what an exposition writes."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


@dataclass(frozen=True)
class EngineConfig:
    """The server flags that shape scheduling, with vLLM's defaults where a field is left None."""

    deployment: Deployment
    served_model_name: str = ""  # "" = the model's Hugging Face id
    max_num_seqs: int | None = None  # None = vLLM's default for the GPU
    max_num_batched_tokens: int | None = None  # None = vLLM's default for the GPU
    max_model_len: int | None = None  # None = the model's context, capped at what the KV cache holds
    num_gpu_blocks_override: int | None = None  # None = what the memory left after the weights holds
    max_num_queued_reqs: int | None = None  # None = no cap (vLLM's default)
    enable_chunked_prefill: bool = True  # vLLM V1 always chunks; False admits only whole prompts
    # static: a batch is admitted only when the last one has ended, prefilled whole in one step, and runs until its
    # longest request ends (before Orca, OSDI '22); continuous: vLLM's, anyone joins at any step
    batching: Literal["continuous", "static"] = "continuous"
    # vLLM's --scheduling-policy: fcfs, or priority (lower SimRequest.priority first, then arrival; a preemption
    # evicts the lowest-priority running request, as vllm/v1/core/sched/scheduler.py does)
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    extra_step_overhead_seconds: float = 0.0  # host time per step beyond the physics' scheduler overhead
    # the KV cache's blocks, worked out by __post_init__ (not an argument, and not part of equality or repr)
    _num_gpu_blocks: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        dep = self.deployment
        if not self.served_model_name:
            object.__setattr__(self, "served_model_name", dep.model.source)
        if self.max_num_seqs is None:
            object.__setattr__(self, "max_num_seqs", dep.gpu.vllm_max_num_seqs)
        if self.max_num_batched_tokens is None:
            object.__setattr__(self, "max_num_batched_tokens", dep.gpu.vllm_max_num_batched_tokens)
        blocks = self.num_gpu_blocks_override
        if blocks is None:
            blocks = kv_capacity(dep).blocks
            if blocks < 2:
                raise UsageError(
                    f"{dep.model.name} does not fit on {dep.tp} × {dep.gpu.name}: no memory is left for the KV cache",
                    "raise the tensor-parallel size or gpu_memory_utilization, or give num_gpu_blocks_override",
                )
        elif blocks < 2:
            raise UsageError(f"num_gpu_blocks_override must be at least 2, got {blocks}")
        kv_tokens = (blocks - 1) * dep.block_size_tokens
        if self.max_model_len is None:
            object.__setattr__(
                self, "max_model_len", min(dep.model.max_context_tokens or DEFAULT_MAX_MODEL_LEN, kv_tokens)
            )
        assert self.max_num_seqs is not None and self.max_num_batched_tokens is not None
        assert self.max_model_len is not None
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.max_model_len < 1:
            raise UsageError("max_num_seqs, max_num_batched_tokens and max_model_len must be at least 1")
        if self.max_model_len > kv_tokens:
            raise UsageError(
                f"max_model_len {self.max_model_len} needs more KV than the cache holds ({kv_tokens} tokens)",
                "lower max_model_len or give the KV cache more blocks",
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise UsageError(
                f"without chunked prefill max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                f"max_model_len ({self.max_model_len})",
                "enable chunked prefill or raise max_num_batched_tokens",
            )
        if self.max_num_queued_reqs is not None and self.max_num_queued_reqs < 1:
            raise UsageError(f"max_num_queued_reqs must be at least 1, got {self.max_num_queued_reqs}")
        if self.extra_step_overhead_seconds < 0:
            raise UsageError("extra_step_overhead_seconds must not be negative")
        object.__setattr__(self, "_num_gpu_blocks", blocks)

    @property
    def num_gpu_blocks(self) -> int:
        return self._num_gpu_blocks

    @property
    def block_size(self) -> int:
        return self.deployment.block_size_tokens

    @property
    def seqs(self) -> int:
        assert self.max_num_seqs is not None
        return self.max_num_seqs

    @property
    def batched_tokens(self) -> int:
        assert self.max_num_batched_tokens is not None
        return self.max_num_batched_tokens

    @property
    def model_len(self) -> int:
        assert self.max_model_len is not None
        return self.max_model_len


RequestState = Literal["waiting", "running", "finished"]


class SimRequest:
    """One request: its sizes, where it stands, and the timestamps vLLM's stats need. Counters, not token lists.

    ``output_tokens`` is how many tokens it will generate before it finishes with ``finish_reason`` (the server
    decides both from max_tokens, min_tokens and ignore_eos). ``listener`` is called when it gets new tokens or
    finishes; the server wakes the HTTP handler with it.
    """

    __slots__ = (
        "request_id",
        "prompt_tokens",
        "output_tokens",
        "finish_reason",
        "max_tokens",
        "arrival",
        "state",
        "computed",
        "generated",
        "blocks",
        "preemptions",
        "scheduled_ts",
        "first_token_ts",
        "last_token_ts",
        "finished_ts",
        "last_step",
        "listener",
        "priority",
    )

    def __init__(
        self,
        request_id: str,
        prompt_tokens: int,
        output_tokens: int,
        arrival: float,
        finish_reason: FinishReason = "length",
        max_tokens: int | None = None,
        priority: int = 0,
    ) -> None:
        if prompt_tokens < 1 or output_tokens < 1:
            raise ValueError("a request needs at least one prompt token and one output token")
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.finish_reason: FinishReason = finish_reason
        self.max_tokens = max_tokens if max_tokens is not None else output_tokens
        self.arrival = arrival
        self.state: RequestState = "waiting"
        self.computed = 0  # tokens whose KV is in the cache
        self.generated = 0  # output tokens sampled so far
        self.blocks = 0  # KV blocks held
        self.preemptions = 0
        self.scheduled_ts: float | None = None
        self.first_token_ts: float | None = None
        self.last_token_ts: float | None = None
        self.finished_ts: float | None = None
        self.last_step = -1  # index of the last step it was scheduled in
        self.listener: Callable[[], None] | None = None
        self.priority = priority  # vLLM's request priority: lower is served first under the priority policy

    @property
    def num_tokens(self) -> int:
        """Prompt plus every token sampled: what must be in KV before the next token can be sampled."""
        return self.prompt_tokens + self.generated

    @property
    def finished(self) -> bool:
        return self.state == "finished"

    def __repr__(self) -> str:
        return (
            f"SimRequest({self.request_id}, {self.state}, prompt={self.prompt_tokens}, generated="
            f"{self.generated}/{self.output_tokens}, computed={self.computed}, blocks={self.blocks})"
        )


@dataclass
class Step:
    """One scheduled step: who runs how many tokens, from when to when, and what the physics charged."""

    index: int
    start: float
    end: float
    scheduled: list[tuple[SimRequest, int]]
    load: StepLoad
    timing: StepTime
    link_bytes_per_gpu: float  # all-reduce bytes each GPU sends (and receives) in this step
    overhead_seconds: float  # host time: the physics' scheduler overhead + extra_step_overhead_seconds
    limit: StepLimit = "none"  # what limited this step (the module docstring)

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


def allreduce_bytes_per_gpu(dep: Deployment, tokens: float) -> float:
    """2 · L · 2(tp−1)/tp · tokens · H · b: what each rank's link carries per direction in one step's all-reduces
    (the byte term of ``physics.allreduce_seconds``); zero on one GPU."""
    if dep.tp == 1 or tokens <= 0:
        return 0.0
    model = dep.model
    return 2 * model.layers * 2 * (dep.tp - 1) / dep.tp * tokens * model.hidden_size * model.dtype_bytes


@dataclass
class EngineStats:
    """Everything the vLLM and DCGM pages report, as plain counters and histograms."""

    max_model_len: int
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    prefix_cache_queries: int = 0
    steps: int = 0
    request_success: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    admission_rejections: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REJECT_REASONS, 0))
    # what vLLM's --enable-mfu-metrics estimates, per GPU
    flops_per_gpu: float = 0.0
    read_bytes_per_gpu: float = 0.0
    write_bytes_per_gpu: float = 0.0
    # GPU time, summed over steps (for the DCGM page and the bench)
    step_seconds: float = 0.0
    compute_seconds: float = 0.0
    memory_seconds: float = 0.0
    allreduce_seconds: float = 0.0
    link_bytes_per_gpu: float = 0.0
    # step seconds by what limited the step (``Step.limit``): the simulator's truth, not a vLLM metric
    limit_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STEP_LIMITS, 0.0))
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    time_per_output_token: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))
    prefill: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))
    decode: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))
    inference: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))
    iteration_tokens: Histogram = field(default_factory=lambda: Histogram(ITERATION_TOKENS_BUCKETS))
    params_n: Histogram = field(default_factory=lambda: Histogram(PARAMS_N_BUCKETS))
    num_preemptions: Histogram = field(default_factory=lambda: Histogram(NUM_PREEMPTIONS_BUCKETS))
    request_prompt_tokens: Histogram = field(init=False)
    request_generation_tokens: Histogram = field(init=False)
    request_max_num_generation_tokens: Histogram = field(init=False)
    request_params_max_tokens: Histogram = field(init=False)
    request_prefill_kv_computed_tokens: Histogram = field(init=False)

    def __post_init__(self) -> None:
        bounds = request_tokens_buckets(self.max_model_len)
        self.request_prompt_tokens = Histogram(bounds)
        self.request_generation_tokens = Histogram(bounds)
        self.request_max_num_generation_tokens = Histogram(bounds)
        self.request_params_max_tokens = Histogram(bounds)
        self.request_prefill_kv_computed_tokens = Histogram(bounds)


class Engine:
    """The scheduler, the KV block pool and the stats. Not thread-safe: one event loop (or one test) drives it."""

    # completed steps kept for "activity over the last second" (the DCGM page)
    RECENT_SECONDS = 2.0

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.dep = config.deployment
        self.block_size = config.block_size
        self.num_gpu_blocks = config.num_gpu_blocks
        self.free_blocks = self.num_gpu_blocks - 1  # block 0 is the null block
        self.waiting: deque[SimRequest] = deque()
        # the queue the last scheduling decision left, as vLLM's num_requests_waiting reports it (the engine's
        # stats after each step): a request that arrived during a step is admitted by the next one, never counted
        self.waiting_after_last_schedule = 0
        self.running: list[SimRequest] = []
        self.in_flight: Step | None = None
        self.recent: deque[Step] = deque()
        # called with each completed step (after its results are applied): per-iteration stats of other dialects
        self.step_listeners: list[Callable[[Step], None]] = []
        self.stats = EngineStats(max_model_len=config.model_len)
        self._kv_bytes_per_token_per_gpu = kv_bytes_per_token_per_gpu(self.dep)
        self._overhead = self.dep.scheduler_overhead_seconds + config.extra_step_overhead_seconds

    # --- state ---------------------------------------------------------------------------------------------

    @property
    def kv_usage(self) -> float:
        """1 − free / (total − 1), as vLLM's kv_cache_usage_perc (a ratio despite the name)."""
        return 1.0 - self.free_blocks / (self.num_gpu_blocks - 1)

    @property
    def num_unfinished(self) -> int:
        return len(self.running) + len(self.waiting)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def check_blocks(self) -> None:
        """The pool's books balance: free + held by running requests = usable blocks (a test hook)."""
        held = sum(r.blocks for r in self.running)
        assert held + self.free_blocks == self.num_gpu_blocks - 1, (held, self.free_blocks)
        assert all(r.blocks == 0 for r in self.waiting), "a waiting request holds blocks"

    # --- arrivals and aborts ------------------------------------------------------------------------------

    def add_request(self, request: SimRequest) -> None:
        """Queue a request at the back, or raise AdmissionRejected when the queue cap is reached.

        vLLM 0.33's --max-num-queued-reqs counts every unfinished request in the engine: with --max-num-seqs 2
        and a cap of 8, a real server held 2 running + 6 waiting (tests/fixtures/vllm-0.32.0, 'admission').
        """
        cap = self.config.max_num_queued_reqs
        if cap is not None and self.num_unfinished >= cap:
            self.stats.admission_rejections["max_num_queued_reqs"] += 1
            raise AdmissionRejected("max_num_queued_reqs")
        if request.prompt_tokens + request.output_tokens > self.config.model_len:
            raise ValueError(f"{request.request_id} needs more than max_model_len {self.config.model_len} tokens")
        request.state = "waiting"
        self._enqueue(request)

    def _enqueue(self, request: SimRequest, front: bool = False) -> None:
        """FCFS: the back (a preempted request: the front). Priority: before the first request it outranks."""
        if self.config.scheduling_policy == "fcfs":
            if front:
                self.waiting.appendleft(request)
            else:
                self.waiting.append(request)
            return
        key = (request.priority, request.arrival)
        for index, other in enumerate(self.waiting):
            if key < (other.priority, other.arrival):
                self.waiting.insert(index, request)
                return
        self.waiting.append(request)

    def abort(self, request: SimRequest, now: float) -> None:
        """The client went away: drop the request wherever it is (finished_reason 'abort')."""
        if request.finished:
            return
        if request.state == "waiting":
            self.waiting.remove(request)
            self.waiting_after_last_schedule = min(self.waiting_after_last_schedule, len(self.waiting))
        elif self.in_flight is None or request.last_step != self.in_flight.index:
            self.running.remove(request)
            self._release(request)
        # else: it is in the step on the GPU; complete() drops it from the batch and frees its blocks
        request.finish_reason = "abort"
        self._finish(request, now)

    def abort_all(self, now: float) -> list[SimRequest]:
        """Shutdown: abort every unfinished request; returns them so their listeners can be told."""
        victims = [*self.running, *self.waiting]
        for request in victims:
            self.abort(request, now)
        return victims

    # --- one step ---------------------------------------------------------------------------------------

    def _release(self, request: SimRequest) -> None:
        self.free_blocks += request.blocks
        request.blocks = 0

    def _preempt(self, victim: SimRequest) -> None:
        """Recompute-style preemption: free the KV, forget it was computed, back to the front of the queue."""
        self._release(victim)
        victim.computed = 0
        victim.state = "waiting"
        victim.preemptions += 1
        self.stats.preemptions += 1
        self._enqueue(victim, front=True)

    def schedule(self, now: float) -> Step | None:
        """Build the next step starting at ``now`` (see the module docstring); None when there is nothing to run."""
        if self.in_flight is not None:
            raise RuntimeError("a step is already in flight; complete() it first")
        budget = self.config.batched_tokens
        block_size = self.block_size
        index_of_step = self.stats.steps
        scheduled: list[tuple[SimRequest, int]] = []
        new_tokens = 0
        attended = 0.0
        kv_read = 0
        preempted = False
        running = self.running
        if self.config.scheduling_policy == "priority":  # the last is the one a preemption evicts
            running.sort(key=lambda r: (r.priority, r.arrival))

        index = 0
        while index < len(running) and budget > 0:
            request = running[index]
            computed = request.computed
            n = min(request.num_tokens - computed, budget)
            needed = -(-(computed + n) // block_size) - request.blocks  # ceil division
            while needed > self.free_blocks:
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is request:
                    break
            if request.state == "waiting":  # it preempted itself: nothing after it runs either
                break
            if needed > 0:
                self.free_blocks -= needed
                request.blocks += needed
            scheduled.append((request, n))
            request.last_step = index_of_step
            budget -= n
            new_tokens += n
            attended += n * computed + n * (n + 1) / 2
            kv_read += computed + n
            index += 1

        kv_blocked = preempted
        if not preempted and self._admitting():
            max_seqs = self.config.seqs
            chunked = self.config.enable_chunked_prefill
            waiting = self.waiting
            if (
                self.config.batching == "static"
            ):  # the whole batch is prefilled in one padded step, as static servers ran it
                budget = max(budget, sum(r.num_tokens for r in waiting))
            while waiting and len(running) < max_seqs and budget > 0:
                request = waiting[0]
                if request.arrival > now:  # the runner may start a step a moment in the past to catch up on timer
                    break  # jitter; a request that arrived after that moment waits for the next step
                # a preempted request recomputes its output too; one whose KV came over the link (a
                # disaggregated decode instance) computes only what is not in KV yet
                computed = request.computed
                total = request.num_tokens - computed
                if not chunked and total > budget:
                    break
                n = min(total, budget)
                needed = -(-(computed + n) // block_size)
                if needed > self.free_blocks:
                    kv_blocked = True
                    break
                waiting.popleft()
                self.free_blocks -= needed
                request.blocks = needed
                request.state = "running"
                if request.scheduled_ts is None:
                    request.scheduled_ts = now
                self.stats.prefix_cache_queries += total
                running.append(request)
                scheduled.append((request, n))
                request.last_step = index_of_step
                budget -= n
                new_tokens += n
                attended += n * computed + n * (n + 1) / 2
                kv_read += computed + n

        self.waiting_after_last_schedule = len(self.waiting)
        if not scheduled:
            return None
        load = StepLoad(float(new_tokens), attended, float(kv_read))
        timing = step_time(self.dep, load)
        duration = timing.step_seconds + self.config.extra_step_overhead_seconds
        step = Step(
            index=index_of_step,
            start=now,
            end=now + duration,
            scheduled=scheduled,
            load=load,
            timing=timing,
            link_bytes_per_gpu=allreduce_bytes_per_gpu(self.dep, new_tokens),
            overhead_seconds=self._overhead,
            limit=self._limit(kv_blocked, now, timing, duration),
        )
        self.in_flight = step
        return step

    def _admitting(self) -> bool:
        """Continuous batching admits at every step; static only when the last batch has ended."""
        return self.config.batching == "continuous" or not self.running

    def _limit(self, kv_blocked: bool, now: float, timing: StepTime, duration: float) -> StepLimit:
        """What limited a step just scheduled (the module docstring): a request that waits for KV, then one that
        waits for a slot or the token budget, then the step's largest term when the step is slow."""
        if kv_blocked:
            return "kv"
        if self.waiting and self.waiting[0].arrival <= now:
            return "batch_cap"  # it arrived in time and neither KV nor a preemption kept it out
        terms: dict[StepLimit, float] = {
            "compute": timing.compute_seconds,
            "bandwidth": timing.memory_seconds,
            "link": timing.allreduce_seconds,
            "host": self._overhead,
        }
        largest = max(terms, key=lambda name: terms[name])
        if largest == "link":  # the collectives outweigh the kernels: a faster link shortens every step
            return "link"
        return largest if duration >= SLOW_STEP_SECONDS else "none"

    def limit_totals(self) -> dict[str, float]:
        """Step seconds so far by what limited each step (a copy): two readings, subtracted, give a window's."""
        return dict(self.stats.limit_seconds)

    def complete(self, step: Step) -> list[SimRequest]:
        """Apply a step's results at its end: sampled tokens, first tokens, finished requests. Returns the requests
        whose listeners should hear about it (new tokens or finished)."""
        if step is not self.in_flight:
            raise RuntimeError("complete() takes the step that schedule() returned")
        self.in_flight = None
        end = step.end
        stats = self.stats
        changed: list[SimRequest] = []
        itl_values: dict[float, int] = {}
        generated = 0
        prompt_done = 0
        any_finished = False
        for request, n in step.scheduled:
            if request.finished:  # aborted while its step ran
                self._release(request)
                any_finished = True
                continue
            request.computed += n
            if request.computed < request.num_tokens:
                continue  # a prefill chunk that is not the last one: nothing sampled
            request.generated += 1
            generated += 1
            last = request.last_token_ts
            if last is None:
                request.first_token_ts = end
                stats.ttft.observe(end - request.arrival)
                stats.prompt_tokens += request.prompt_tokens
                prompt_done += request.prompt_tokens
            else:
                itl = end - last
                itl_values[itl] = itl_values.get(itl, 0) + 1
            request.last_token_ts = end
            if request.generated >= request.output_tokens:
                self._release(request)
                self._finish(request, end)
                any_finished = True
            changed.append(request)

        if any_finished:
            self.running = [r for r in self.running if not r.finished]
        for value, count in itl_values.items():
            stats.itl.observe(value, count)
        stats.generation_tokens += generated
        stats.steps += 1
        stats.iteration_tokens.observe(prompt_done + generated)
        self._account(step)
        for listener in self.step_listeners:
            listener(step)
        return changed

    def _account(self, step: Step) -> None:
        stats, timing = self.stats, step.timing
        stats.step_seconds += step.duration
        stats.compute_seconds += timing.compute_seconds
        stats.memory_seconds += timing.memory_seconds
        stats.allreduce_seconds += timing.allreduce_seconds
        stats.link_bytes_per_gpu += step.link_bytes_per_gpu
        stats.limit_seconds[step.limit] += step.duration
        stats.flops_per_gpu += timing.flops / self.dep.tp
        written = self._kv_bytes_per_token_per_gpu * step.load.new_tokens
        stats.write_bytes_per_gpu += written
        stats.read_bytes_per_gpu += max(0.0, timing.hbm_bytes_per_gpu - written)
        recent = self.recent
        recent.append(step)
        horizon = step.end - self.RECENT_SECONDS
        while recent and recent[0].end < horizon:
            recent.popleft()

    def _finish(self, request: SimRequest, now: float) -> None:
        """Leave the engine and record the per-request histograms (vLLM records aborted requests too)."""
        request.state = "finished"
        request.finished_ts = now
        stats = self.stats
        stats.request_success[request.finish_reason] += 1
        scheduled = request.scheduled_ts if request.scheduled_ts is not None else now
        first = request.first_token_ts if request.first_token_ts is not None else now
        last = request.last_token_ts if request.last_token_ts is not None else now
        decode = last - first
        stats.e2e.observe(now - request.arrival)
        stats.queue.observe(scheduled - request.arrival)
        stats.prefill.observe(first - scheduled)
        stats.decode.observe(decode)
        stats.inference.observe(last - scheduled)
        stats.time_per_output_token.observe(decode / (request.generated - 1) if request.generated > 1 else 0.0)
        stats.request_prompt_tokens.observe(request.prompt_tokens)
        stats.request_generation_tokens.observe(request.generated)
        stats.request_max_num_generation_tokens.observe(request.max_tokens)
        stats.request_params_max_tokens.observe(request.max_tokens)
        stats.request_prefill_kv_computed_tokens.observe(request.prompt_tokens)  # no prefix-cache hits simulated
        stats.params_n.observe(1)
        stats.num_preemptions.observe(request.preemptions)

    # --- what the GPU did recently --------------------------------------------------------------------

    def activity(self, now: float, window: float = 1.0) -> Activity:
        """GPU time per kind over [now − window, now], steps cut at the window's edges (the one on the GPU too)."""
        lo = now - window
        totals = Activity(window_seconds=window)
        steps: list[Step] = [s for s in self.recent if s.end > lo]
        if self.in_flight is not None:
            steps.append(self.in_flight)
        for step in steps:
            overlap = min(step.end, now) - max(step.start, lo)
            if overlap <= 0 or step.duration <= 0:
                continue
            share = overlap / step.duration
            timing = step.timing
            totals.busy_seconds += share * (step.duration - step.overhead_seconds)
            totals.math_seconds += share * timing.flops / (self.dep.tp * self.dep.gpu.peak_bf16_flops_per_second)
            totals.hbm_seconds += share * timing.hbm_bytes_per_gpu / self.dep.gpu.hbm_bandwidth_bytes_per_second
            totals.kernel_seconds += share * max(timing.compute_seconds, timing.memory_seconds)
            totals.allreduce_seconds += share * timing.allreduce_seconds
            totals.link_bytes_per_gpu += share * step.link_bytes_per_gpu
            totals.host_bytes_per_gpu += share * step.load.new_tokens * HOST_BYTES_PER_TOKEN
        return totals


def limit_shares(before: dict[str, float], after: dict[str, float], window_seconds: float) -> dict[str, float]:
    """Each limit's share of a window from two ``Engine.limit_totals()`` readings at its ends, and ``idle``: the
    share no step covered. Steps are counted when they complete, so a step across an edge counts in the later
    window; shares are clamped to [0, 1]."""
    if window_seconds <= 0:
        raise ValueError("a window must be longer than zero")
    shares: dict[str, float] = {
        name: max(0.0, after.get(name, 0.0) - before.get(name, 0.0)) / window_seconds for name in STEP_LIMITS
    }
    shares = {name: min(1.0, share) for name, share in shares.items()}
    shares["idle"] = max(0.0, 1.0 - sum(shares.values()))
    return shares


@dataclass
class Activity:
    """What each GPU (every TP rank does the same work) spent its time on over a window, in seconds."""

    window_seconds: float
    busy_seconds: float = 0.0  # any kernel running: the step minus host overhead
    kernel_seconds: float = 0.0  # model kernels: max(compute, memory) per step
    math_seconds: float = 0.0  # FLOPs at the peak rate: the tensor pipes' busy time
    hbm_seconds: float = 0.0  # HBM bytes at the peak bandwidth
    allreduce_seconds: float = 0.0
    link_bytes_per_gpu: float = 0.0
    host_bytes_per_gpu: float = 0.0

    def ratio(self, seconds: float) -> float:
        return min(1.0, max(0.0, seconds / self.window_seconds)) if self.window_seconds > 0 else 0.0
