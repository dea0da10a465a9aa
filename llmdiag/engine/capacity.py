"""Capacity: how many users one deployment serves at once, how fast each is, and what runs out first.

Built on ``llmdiag.physics.step`` (the formulas are in its docstring). Every user sends a request of P prompt
tokens and reads O output tokens; ``users`` is how many are in flight at once (a closed loop: a user whose
answer finishes sends the next request).

    context           = P + O                   a sequence's final length; the batch is sized at it, so no
                                                sequence is ever preempted (vLLM admits by current use, may
                                                run more and preempts when the cache fills)
    kv_max_batch      = max_batch(context)      what the KV cache holds
    budget_batch      = ⌊max_num_batched_tokens · O / (P + O)⌋
                                                in steady state each step carries B decode tokens plus B·P/O
                                                prompt tokens (B/O requests finish per step, as many start)
    served            = min(users, kv_max_batch, max_num_seqs, budget_batch); the rest wait for a slot
    decode context    = P + O/2                 the mean context over a request's decode
    sustained step    = step(decode(B, P + O/2) + prefill(P, prompts = B/O))
    per-user tokens/s = 1 / step  (while served);   total = B / step;   averaged over all users = total / users

Time to first token when all users arrive at once (waves):
    prefill_rate      = C / step(prefill of C tokens)   with C = max_num_batched_tokens (chunked prefill)
    wave              = up to ``served_cap`` requests; wave w+1 starts when wave w finishes:
    wave_seconds      = n·P / prefill_rate + (O − 1) · step(decode(n, P + O/2))
    ttft(user i)      = w · wave_seconds + max(alone, (j + 1) · P / prefill_rate)    (w = i // cap, j = i % cap)
    Decodes of a wave's early requests are not interleaved with its later prefills; both effects are a few
    percent here and ``--simulate`` (with the simulator) measures the real interleaving.

The seed arithmetic: one stream decodes at 1 / step(decode(1)) tokens/s. Dividing that by the users assumes
the GPU serves one user at a time; but a decode step streams the weights once for the whole batch, so B users
share each step and the total grows almost B-fold until compute, KV memory or a batch cap stops it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from llmdiag.errors import UsageError, option
from llmdiag.model import Roofline, Signal, SignalSet
from llmdiag.model.capacity import (
    BATCH_CAPS,
    CapacityInputs,
    CapacityReport,
    HardwareFacts,
    MemoryReport,
    ModelFacts,
    OperatingPoint,
    Resource,
    ResourceUse,
    SeedArithmetic,
    StepTime,
    TtftBurst,
)
from llmdiag.physics.hardware import (
    GIB,
    GpuSpec,
    ModelSpec,
    find_gpu,
    find_model,
    interconnect_for,
    min_tensor_parallel,
)
from llmdiag.physics.step import (
    DEFAULT_ACTIVATION_RESERVE_BYTES,
    DEFAULT_BLOCK_SIZE_TOKENS,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_SCHEDULER_OVERHEAD_SECONDS,
    Deployment,
    StepLoad,
    blocks_per_sequence,
    decode_load,
    kv_bytes_per_token,
    kv_capacity,
    prefill_load,
    step_time,
    weight_bytes,
)


def roofline_decode_tokens_per_second(dep: Deployment, batch_sequences: float, context_tokens: float) -> float:
    """The ceiling on total decode tokens/s for this batch and mean context: peak FLOP/s and HBM bandwidth, no
    CPU overhead. A live scan divides the measured generation rate by it (running batch, mean context)."""
    if batch_sequences <= 0:
        return 0.0
    ceiling = replace(dep, scheduler_overhead_seconds=0.0)
    return batch_sequences / step_time(ceiling, decode_load(batch_sequences, context_tokens)).step_seconds


def sustained_load(batch_sequences: float, prompt_tokens: int, output_tokens: int) -> StepLoad:
    """B decodes at the mean context P + O/2, plus the B/O prompts that replace the requests finishing."""
    decode_context = prompt_tokens + output_tokens / 2
    return decode_load(batch_sequences, decode_context) + prefill_load(prompt_tokens, batch_sequences / output_tokens)


RESOURCE_WORDS: dict[Resource, str] = {
    "kv_memory": "KV-cache memory",
    "max_num_seqs": "the max_num_seqs batch cap",
    "max_num_batched_tokens": "the max_num_batched_tokens step budget",
    "compute": "compute",
    "hbm_bandwidth": "HBM bandwidth",
    "interconnect": "the interconnect (tensor-parallel all-reduce)",
    "scheduler": "the scheduler's per-step CPU time",
}


@dataclass(frozen=True)
class CapacityQuestion:
    """One capacity question: ``users`` concurrent users of ``model`` on ``tp`` × ``gpu``, each sending P prompt
    tokens and reading O output tokens, under these server settings. Checked on construction (``UsageError``).

    ``max_num_seqs`` / ``max_num_batched_tokens``: None takes vLLM's own defaults for that GPU.
    """

    gpu: GpuSpec
    model: ModelSpec
    tp: int = 1
    users: int = 1
    prompt_tokens: int = 500
    output_tokens: int = 200
    interconnect: str | None = None  # None: NVLink where the GPU has it, else its PCIe
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    activation_reserve_bytes: int = DEFAULT_ACTIVATION_RESERVE_BYTES
    scheduler_overhead_seconds: float = DEFAULT_SCHEDULER_OVERHEAD_SECONDS
    block_size_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS

    def __post_init__(self) -> None:
        for key, value in (
            ("users", self.users),
            ("prompt_tokens", self.prompt_tokens),
            ("output_tokens", self.output_tokens),
        ):
            if value < 1:
                raise UsageError(f"{option(key)} must be at least 1, got {value}")
        for key, cap in (
            ("max_num_seqs", self.max_num_seqs),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
        ):
            if cap is not None and cap < 1:
                raise UsageError(f"{option(key)} must be at least 1, got {cap}")

    @property
    def context_tokens(self) -> int:
        """P + O: a sequence's final length, which the batch is sized at."""
        return self.prompt_tokens + self.output_tokens

    @property
    def decode_context_tokens(self) -> float:
        """P + O/2: the mean context over a request's decode."""
        return self.prompt_tokens + self.output_tokens / 2

    def deployment(self) -> Deployment:
        """The deployment the question is about (raises ``UsageError`` for a TP size or link it cannot have)."""
        return Deployment(
            gpu=self.gpu,
            model=self.model,
            tp=self.tp,
            interconnect=interconnect_for(self.gpu, self.interconnect),
            gpu_memory_utilization=self.gpu_memory_utilization,
            activation_reserve_bytes=self.activation_reserve_bytes,
            block_size_tokens=self.block_size_tokens,
            scheduler_overhead_seconds=self.scheduler_overhead_seconds,
        )


def plan_capacity(question: CapacityQuestion) -> CapacityReport:
    """The capacity of the question's deployment for its users (formulas: module docstring).

    Raises ``UsageError`` for impossible sizes or a model that does not fit.
    """
    dep = question.deployment()
    memory = _memory(question, dep)
    caps = _batch_caps(question, memory)
    points = _operating_points(question, dep, memory, caps)
    at_users = points.at_users
    seed = _seed_arithmetic(question.users, points.single_stream, at_users)
    return CapacityReport(
        summary=_summary(question, caps, at_users),
        inputs=_inputs_echo(question, dep, caps),
        hardware=_hardware_facts(dep),
        model=_model_facts(question.model),
        memory=memory,
        served_sequences=caps.served,
        waiting_users=caps.waiting,
        limited_by=caps.binding if caps.waiting else at_users.step.bound_by,
        step_bound_by=at_users.step.bound_by,
        single_stream=points.single_stream,
        kv_max_decode_only=points.kv_max_decode_only,
        kv_max_sustained=points.kv_max_sustained,
        at_users=at_users,
        resources=_batch_cap_use(question, memory, caps) + _step_term_use(question, at_users.step),
        ttft=_ttft_burst(question, dep, caps),
        seed=seed,
        notes=_notes(question, caps, seed),
    )


def _where(question: CapacityQuestion) -> str:
    return f"{question.tp} × {question.gpu.name}" if question.tp > 1 else f"one {question.gpu.name}"


def _memory(question: CapacityQuestion, dep: Deployment) -> MemoryReport:
    """Per GPU: what the weights leave for KV, and how many whole sequences of the final length it holds."""
    cap = kv_capacity(dep)
    model, context = question.model, question.context_tokens
    if cap.kv_cache_bytes_per_gpu <= 0:
        need = min_tensor_parallel(
            model, question.gpu, question.gpu_memory_utilization, question.activation_reserve_bytes
        )
        raise UsageError(
            f"{model.name} does not fit on {_where(question)}: {cap.weight_bytes_per_gpu / GIB:.1f} GiB of weights "
            f"per GPU, {(cap.usable_bytes_per_gpu - cap.activation_reserve_bytes) / GIB:.1f} GiB usable",
            f"use {option('tp')} {need} or more" if need else "use a bigger GPU",
        )
    per_sequence = blocks_per_sequence(dep, context)
    kv_max = cap.blocks // per_sequence
    if kv_max == 0:
        raise UsageError(
            f"one sequence of {context:,} tokens needs {per_sequence:,} KV blocks; {_where(question)} holds "
            f"{cap.blocks:,}",
            f"shorten {option('prompt_tokens')} / {option('output_tokens')}, raise {option('tp')}, or pick a GPU with "
            "more memory",
        )
    return MemoryReport(
        usable_bytes_per_gpu=cap.usable_bytes_per_gpu,
        weight_bytes_per_gpu=cap.weight_bytes_per_gpu,
        activation_reserve_bytes=cap.activation_reserve_bytes,
        kv_cache_bytes_per_gpu=cap.kv_cache_bytes_per_gpu,
        kv_bytes_per_token_per_gpu=cap.kv_bytes_per_token_per_gpu,
        kv_blocks=cap.blocks,
        kv_capacity_tokens=cap.tokens,
        context_tokens=context,
        blocks_per_sequence=per_sequence,
        kv_max_batch_sequences=kv_max,
    )


@dataclass(frozen=True)
class BatchCaps:
    """The three caps on the batch and what they leave: the smallest (``binding``) decides who is served."""

    given: bool  # the vLLM caps came with the question, not from vLLM's defaults for the GPU
    max_num_seqs: int
    max_num_batched_tokens: int
    sequences_by_cap: dict[Resource, int]
    binding: Resource
    served: int
    waiting: int

    @property
    def served_cap(self) -> int:
        return self.sequences_by_cap[self.binding]


def _batch_caps(question: CapacityQuestion, memory: MemoryReport) -> BatchCaps:
    """KV memory, max_num_seqs, and the step budget ⌊max_num_batched_tokens · O / (P + O)⌋ (module docstring)."""
    gpu, o = question.gpu, question.output_tokens
    seq_cap = question.max_num_seqs or gpu.vllm_max_num_seqs
    budget = question.max_num_batched_tokens or gpu.vllm_max_num_batched_tokens
    caps: dict[Resource, int] = {
        "kv_memory": memory.kv_max_batch_sequences,
        "max_num_seqs": seq_cap,
        "max_num_batched_tokens": max(1, budget * o // question.context_tokens),
    }
    binding = min(BATCH_CAPS, key=lambda name: caps[name])  # ties go to KV memory: listed first
    served = min(question.users, caps[binding])
    return BatchCaps(
        given=question.max_num_seqs is not None or question.max_num_batched_tokens is not None,
        max_num_seqs=seq_cap,
        max_num_batched_tokens=budget,
        sequences_by_cap=caps,
        binding=binding,
        served=served,
        waiting=question.users - served,
    )


@dataclass(frozen=True)
class OperatingPoints:
    single_stream: OperatingPoint
    kv_max_decode_only: OperatingPoint
    kv_max_sustained: OperatingPoint
    at_users: OperatingPoint


def _operating_points(
    question: CapacityQuestion, dep: Deployment, memory: MemoryReport, caps: BatchCaps
) -> OperatingPoints:
    """One stream; the KV-max batch decoding alone and with prompts arriving; the served users' sustained step."""
    p, o, context = question.prompt_tokens, question.output_tokens, question.decode_context_tokens
    kv_max, served = memory.kv_max_batch_sequences, caps.served
    return OperatingPoints(
        single_stream=_point("single stream", dep, 1, decode_load(1, context), context),
        kv_max_decode_only=_point("KV-max batch, decode only", dep, kv_max, decode_load(kv_max, context), context),
        kv_max_sustained=_point("KV-max batch, prompts arriving", dep, kv_max, sustained_load(kv_max, p, o), context),
        at_users=_point(f"{question.users} users", dep, served, sustained_load(served, p, o), context),
    )


def _point(label: str, dep: Deployment, batch: int, load: StepLoad, context: float) -> OperatingPoint:
    step = step_time(dep, load)
    return OperatingPoint(
        label=label,
        batch_sequences=batch,
        decode_context_tokens=context,
        prompt_tokens_per_step=load.new_tokens - batch,
        step=step,
        per_user_tokens_per_second=1 / step.step_seconds,
        total_tokens_per_second=batch / step.step_seconds,
    )


def _batch_cap_use(question: CapacityQuestion, memory: MemoryReport, caps: BatchCaps) -> list[ResourceUse]:
    """What all the users would take of each batch cap, served or not."""
    users, per_sequence = question.users, memory.blocks_per_sequence
    per_step = users * (1 + question.prompt_tokens / question.output_tokens)
    return [
        ResourceUse(
            resource="kv_memory",
            used=users * per_sequence * question.block_size_tokens,
            available=memory.kv_capacity_tokens,
            unit="tokens",
            ratio=users * per_sequence / memory.kv_blocks,
            detail=f"{users:,} × {per_sequence} blocks",
        ),
        ResourceUse(
            resource="max_num_seqs",
            used=users,
            available=caps.max_num_seqs,
            unit="sequences",
            ratio=users / caps.max_num_seqs,
            detail="batch slots",
        ),
        ResourceUse(
            resource="max_num_batched_tokens",
            used=per_step,
            available=caps.max_num_batched_tokens,
            unit="tokens/step",
            ratio=per_step / caps.max_num_batched_tokens,
            detail="decode + prompt tokens",
        ),
    ]


def _step_term_use(question: CapacityQuestion, step: StepTime) -> list[ResourceUse]:
    """Each term's share of the served users' step."""
    allreduces = f"{2 * question.model.layers} all-reduces" if question.tp > 1 else "TP 1: none"
    terms: tuple[tuple[Resource, float, str], ...] = (
        ("compute", step.compute_seconds, f"{step.flops / 1e12:.1f} TFLOP"),
        ("hbm_bandwidth", step.memory_seconds, f"{step.hbm_bytes_per_gpu / 1e9:.1f} GB per GPU"),
        ("interconnect", step.allreduce_seconds, allreduces),
        ("scheduler", step.scheduler_seconds, "fixed per step"),
    )
    return [
        ResourceUse(
            resource=resource,
            used=seconds,
            available=step.step_seconds,
            unit="seconds per step",
            ratio=seconds / step.step_seconds,
            detail=what,
        )
        for resource, seconds, what in terms
    ]


def prefill_alone_seconds(dep: Deployment, prompt_tokens: int, chunk_tokens: int) -> float:
    """One prompt on an idle server: its chunks one step each, each attending to the chunks before it."""
    total, done = 0.0, 0
    while done < prompt_tokens:
        size = min(chunk_tokens, prompt_tokens - done)
        total += step_time(dep, prefill_load(size, 1, cached_tokens=done)).step_seconds
        done += size
    return total


def _ttft_burst(question: CapacityQuestion, dep: Deployment, caps: BatchCaps) -> TtftBurst:
    """Every user's request at once: waves of up to the served cap, prefilled at the step budget's rate."""
    users, p, o = question.users, question.prompt_tokens, question.output_tokens
    chunk_tokens, wave_cap = caps.max_num_batched_tokens, caps.served_cap
    chunk_step = step_time(dep, prefill_load(p, chunk_tokens / p))
    rate = chunk_tokens / chunk_step.step_seconds
    alone = prefill_alone_seconds(dep, p, chunk_tokens)
    wave = min(users, wave_cap)
    decode_step = step_time(dep, decode_load(wave, p + o / 2)).step_seconds
    wave_seconds = wave * p / rate + (o - 1) * decode_step

    def ttft(i: int) -> float:
        return (i // wave) * wave_seconds + max(alone, (i % wave + 1) * p / rate)

    def nearest_rank(q: float) -> float:
        return ttft(max(0, math.ceil(q * users) - 1))

    return TtftBurst(
        users=users,
        waves=math.ceil(users / wave),
        wave_sequences=wave,
        wave_seconds=wave_seconds,
        prefill_tokens_per_second=rate,
        alone_seconds=alone,
        p50_seconds=nearest_rank(0.5),
        p90_seconds=nearest_rank(0.9),
        max_seconds=ttft(users - 1),
    )


def _seed_arithmetic(users: int, single: OperatingPoint, at_users: OperatingPoint) -> SeedArithmetic:
    """The single stream divided among the users, against what batching gives (module docstring)."""
    return SeedArithmetic(
        users=users,
        single_stream_tokens_per_second=single.total_tokens_per_second,
        naive_per_user_tokens_per_second=single.total_tokens_per_second / users,
        batched_per_user_tokens_per_second=at_users.per_user_tokens_per_second,
        batched_mean_per_user_tokens_per_second=at_users.total_tokens_per_second / users,
        batched_total_tokens_per_second=at_users.total_tokens_per_second,
        batching_gain=at_users.total_tokens_per_second / single.total_tokens_per_second,
    )


def _summary(question: CapacityQuestion, caps: BatchCaps, at_users: OperatingPoint) -> str:
    users, bound_words = question.users, RESOURCE_WORDS[at_users.step.bound_by]
    per_user, total = at_users.per_user_tokens_per_second, at_users.total_tokens_per_second
    if caps.waiting:
        return (
            f"{RESOURCE_WORDS[caps.binding]} caps first: {caps.served:,} of {users:,} users fit at "
            f"{question.context_tokens:,} tokens each; {caps.waiting:,} wait for a slot. Each served user reads "
            f"{per_user:.1f} tokens/s, {total:,.0f} tokens/s in total; the steps are limited by {bound_words}."
        )
    return (
        f"All {users:,} users fit ({RESOURCE_WORDS[caps.binding]} allows {caps.served_cap:,}); {bound_words} limits "
        f"each step. Each user reads {per_user:.1f} tokens/s, {total:,.0f} tokens/s in total."
    )


def _notes(question: CapacityQuestion, caps: BatchCaps, seed: SeedArithmetic) -> list[str]:
    context, model = question.context_tokens, question.model
    notes = [
        "A roofline: peak FLOP/s and HBM bandwidth. Real kernels reach ~50-80% of them, so read tokens/s as a "
        "ceiling and times as a floor.",
        f"The batch is sized at each sequence's final length ({context} tokens), so nothing is preempted; vLLM "
        "admits by current use and may run more, preempting (recomputing) when the cache fills.",
    ]
    if not caps.given:
        notes.append(
            f"Batch caps are vLLM's defaults on {question.gpu.name}: {option('max_num_seqs')} {caps.max_num_seqs}, "
            f"{option('max_num_batched_tokens')} {caps.max_num_batched_tokens}; pass yours with the same flags."
        )
    if caps.waiting:
        notes.append(
            f"Waiting users read nothing until a slot frees: averaged over time each of the {question.users:,} users "
            f"gets {seed.batched_mean_per_user_tokens_per_second:.1f} tokens/s."
        )
    if model.max_context_tokens and context > model.max_context_tokens:
        notes.append(f"{context} tokens exceed {model.name}'s {model.max_context_tokens}-token context window.")
    return notes


def _inputs_echo(question: CapacityQuestion, dep: Deployment, caps: BatchCaps) -> CapacityInputs:
    """The question as answered: names, and the batch caps as resolved."""
    return CapacityInputs(
        gpu=question.gpu.name,
        gpu_part=question.gpu.part,
        model=question.model.name,
        model_source=question.model.source,
        tp=question.tp,
        interconnect=dep.link.description,
        users=question.users,
        prompt_tokens=question.prompt_tokens,
        output_tokens=question.output_tokens,
        gpu_memory_utilization=question.gpu_memory_utilization,
        block_size_tokens=question.block_size_tokens,
        activation_reserve_bytes=question.activation_reserve_bytes,
        scheduler_overhead_seconds=question.scheduler_overhead_seconds,
        max_num_seqs=caps.max_num_seqs,
        max_num_batched_tokens=caps.max_num_batched_tokens,
        batch_caps_source="given" if caps.given else f"vLLM default for {question.gpu.name}",
    )


def _hardware_facts(dep: Deployment) -> HardwareFacts:
    return HardwareFacts(
        memory_bytes=dep.gpu.memory_bytes,
        hbm_bandwidth_bytes_per_second=dep.gpu.hbm_bandwidth_bytes_per_second,
        peak_bf16_flops_per_second=dep.gpu.peak_bf16_flops_per_second,
        interconnect_bandwidth_bytes_per_second=dep.link.bandwidth_bytes_per_second,
        allreduce_latency_seconds=dep.link.allreduce_latency_seconds,
    )


def _model_facts(model: ModelSpec) -> ModelFacts:
    return ModelFacts(
        total_params=model.total_params,
        active_params=model.active_params,
        weight_bytes=weight_bytes(model),
        kv_bytes_per_token=kv_bytes_per_token(model),
        layers=model.layers,
        hidden_size=model.hidden_size,
        attention_heads=model.attention_heads,
        kv_heads=model.kv_heads,
        head_dim=model.head_dim,
        experts=model.experts,
        active_experts=model.active_experts,
        max_context_tokens=model.max_context_tokens,
    )


def roofline_for_window(dep: Deployment, signals: SignalSet) -> Roofline | None:
    """Where the measured decode rate sits under the ceiling: mean batch (Little's law) at the mean context of
    a sequence halfway through its output. None when the window has no decoding to compare."""

    def value(name: str, stat: str) -> float | None:
        signal = signals.get(name)
        return None if signal is None else signal.stat(stat)

    batch = value("requests_running_avg", "value")
    measured = value("generation_tokens_per_second", "rate")
    itl = value("itl_seconds", "mean")
    if measured is None and batch and itl:
        # no output-token counter (TGI, Triton): each decode step makes one token per running request
        measured = batch / itl
    prompt = value("prompt_length_tokens", "mean")
    output = value("output_length_tokens", "mean")
    if not batch or not measured or prompt is None or output is None:
        return None
    context = prompt + output / 2
    ceiling_dep = replace(dep, scheduler_overhead_seconds=0.0)
    step = step_time(ceiling_dep, decode_load(batch, context))
    ceiling = batch / step.step_seconds
    return Roofline(
        gpu=dep.gpu.name,
        model=dep.model.name,
        tp=dep.tp,
        batch_sequences=batch,
        context_tokens=context,
        ceiling_tokens_per_second=ceiling,
        measured_tokens_per_second=measured,
        fraction_of_ceiling_ratio=measured / ceiling,
        bound_by=step.bound_by,
    )


def roofline_signal(roofline: Roofline, where: str = "") -> Signal:
    """The fraction of the ceiling as a signal, so rules can cite it beside the GPU's own activity counters.
    ``where``: where the deployment came from (default: the options that name it)."""
    return Signal(
        name="roofline_fraction_ratio",
        kind="derived",
        unit="ratio",
        stats={"value": roofline.fraction_of_ceiling_ratio},
        source=f"decode tokens/s over the {roofline.bound_by} ceiling of {roofline.model} on {roofline.tp} × "
        f"{roofline.gpu} ({where or option('gpu') + '/' + option('model_shape')})",
    )


GPU_COUNT_RE = re.compile(r"(\d+) × ")


def deployment_seen(
    signals: SignalSet, local_model: Callable[[str], tuple[ModelSpec, str] | None] | None = None
) -> tuple[Deployment | None, str]:
    """The deployment the window shows without flags, and where each fact came from (or why there is none): the
    GPU from a telemetry source's product name (NVML, dcgm-exporter's modelName, nvidia-smi) in the GPU table, the
    model from the served model's name in the model table, and TP 1 only where one GPU is seen: on several GPUs
    the tensor-parallel size is on no page, and a wrong one would misplace the ceiling by that factor."""
    seen = [s for s in signals.sources if s.ok and s.config.get("gpus")]
    if not seen:
        return None, "no GPU seen (no NVML on this host, no DCGM exporter)"
    source = seen[0]
    gpu_name = source.config.get("gpu")
    if not gpu_name:
        return None, f"the GPUs {source.config['gpus']} ({source.probe}) are not in the GPU table"
    count = sum(int(n) for n in GPU_COUNT_RE.findall(source.config["gpus"]))
    if count != 1:
        return None, f"{source.config['gpus']} seen ({source.probe}): the tensor-parallel size is not on the page"
    names = [m for s in signals.sources for m in s.models]
    for name in names:
        try:
            model, whence = find_model(name), "model table"
        except UsageError:
            found = local_model(name) if local_model is not None else None
            if found is None:
                continue
            model, whence = found
        where = (
            f"GPU {gpu_name} from {source.probe} ({source.config['gpus']}), model {model.name} from the served "
            f"model '{name}' ({whence}), TP 1 (one GPU seen)"
        )
        return Deployment(find_gpu(gpu_name), model, tp=1), where
    searched = "the model table" + (" or a local config.json" if local_model is not None else "")
    return None, f"the served model ({', '.join(names) or 'not named'}) is not in {searched}"
