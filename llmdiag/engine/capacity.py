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
from dataclasses import replace

from llmdiag.errors import UsageError
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


def _alone_ttft_seconds(dep: Deployment, prompt_tokens: int, chunk_tokens: int) -> float:
    """One prompt on an idle server: its chunks one step each, each attending to the chunks before it."""
    total, done = 0.0, 0
    while done < prompt_tokens:
        size = min(chunk_tokens, prompt_tokens - done)
        total += step_time(dep, prefill_load(size, 1, cached_tokens=done)).step_seconds
        done += size
    return total


def _ttft_burst(
    dep: Deployment, users: int, wave_cap: int, prompt_tokens: int, output_tokens: int, chunk_tokens: int
) -> TtftBurst:
    p, o = prompt_tokens, output_tokens
    chunk_step = step_time(dep, prefill_load(p, chunk_tokens / p))
    rate = chunk_tokens / chunk_step.step_seconds
    alone = _alone_ttft_seconds(dep, p, chunk_tokens)
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


RESOURCE_WORDS: dict[Resource, str] = {
    "kv_memory": "KV-cache memory",
    "max_num_seqs": "the max_num_seqs batch cap",
    "max_num_batched_tokens": "the max_num_batched_tokens step budget",
    "compute": "compute",
    "hbm_bandwidth": "HBM bandwidth",
    "interconnect": "the interconnect (tensor-parallel all-reduce)",
    "scheduler": "the scheduler's per-step CPU time",
}


def plan_capacity(
    gpu: GpuSpec | str,
    model: ModelSpec | str,
    tp: int = 1,
    users: int = 1,
    prompt_tokens: int = 500,
    output_tokens: int = 200,
    *,
    interconnect: str | None = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    activation_reserve_bytes: int = DEFAULT_ACTIVATION_RESERVE_BYTES,
    scheduler_overhead_seconds: float = DEFAULT_SCHEDULER_OVERHEAD_SECONDS,
    block_size_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS,
) -> CapacityReport:
    """The capacity of ``model`` on ``tp`` × ``gpu`` for ``users`` concurrent users (formulas: module docstring).

    ``max_num_seqs`` / ``max_num_batched_tokens`` default to vLLM's own defaults for that GPU.
    Raises ``UsageError`` for unknown names, impossible sizes, or a model that does not fit.
    """
    gpu_spec = find_gpu(gpu) if isinstance(gpu, str) else gpu
    model_spec = find_model(model) if isinstance(model, str) else model
    for flag, value in (("--users", users), ("--prompt-tokens", prompt_tokens), ("--output-tokens", output_tokens)):
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    for flag, cap in (("--max-num-seqs", max_num_seqs), ("--max-num-batched-tokens", max_num_batched_tokens)):
        if cap is not None and cap < 1:
            raise UsageError(f"{flag} must be at least 1, got {cap}")
    dep = Deployment(
        gpu=gpu_spec,
        model=model_spec,
        tp=tp,
        interconnect=interconnect_for(gpu_spec, interconnect),
        gpu_memory_utilization=gpu_memory_utilization,
        activation_reserve_bytes=activation_reserve_bytes,
        block_size_tokens=block_size_tokens,
        scheduler_overhead_seconds=scheduler_overhead_seconds,
    )
    p, o = prompt_tokens, output_tokens
    context = p + o
    cap = kv_capacity(dep)
    where = f"{tp} × {gpu_spec.name}" if tp > 1 else f"one {gpu_spec.name}"
    if cap.kv_cache_bytes_per_gpu <= 0:
        need = min_tensor_parallel(model_spec, gpu_spec, gpu_memory_utilization, activation_reserve_bytes)
        raise UsageError(
            f"{model_spec.name} does not fit on {where}: {cap.weight_bytes_per_gpu / GIB:.1f} GiB of weights per GPU, "
            f"{(cap.usable_bytes_per_gpu - cap.activation_reserve_bytes) / GIB:.1f} GiB usable",
            f"use --tp {need} or more" if need else "use a bigger GPU",
        )
    per_sequence = blocks_per_sequence(dep, context)
    kv_max = cap.blocks // per_sequence
    if kv_max == 0:
        raise UsageError(
            f"one sequence of {context:,} tokens needs {per_sequence:,} KV blocks; {where} holds {cap.blocks:,}",
            "shorten --prompt-tokens / --output-tokens, raise --tp, or pick a GPU with more memory",
        )

    given = max_num_seqs is not None or max_num_batched_tokens is not None
    seq_cap = max_num_seqs or gpu_spec.vllm_max_num_seqs
    budget = max_num_batched_tokens or gpu_spec.vllm_max_num_batched_tokens
    budget_batch = max(1, budget * o // (p + o))
    caps: dict[Resource, int] = {"kv_memory": kv_max, "max_num_seqs": seq_cap, "max_num_batched_tokens": budget_batch}
    batch_cap_name = min(BATCH_CAPS, key=lambda name: caps[name])  # ties go to KV memory: listed first
    served_cap = caps[batch_cap_name]
    served = min(users, served_cap)
    waiting = users - served

    decode_context = p + o / 2
    single = _point("single stream", dep, 1, decode_load(1, decode_context), decode_context)
    kv_decode = _point("KV-max batch, decode only", dep, kv_max, decode_load(kv_max, decode_context), decode_context)
    kv_sustained = _point("KV-max batch, prompts arriving", dep, kv_max, sustained_load(kv_max, p, o), decode_context)
    at_users = _point(f"{users} users", dep, served, sustained_load(served, p, o), decode_context)
    step = at_users.step
    limited_by: Resource = batch_cap_name if waiting else step.bound_by

    per_step = users * (1 + p / o)
    resources = [
        ResourceUse(
            resource="kv_memory",
            used=users * per_sequence * block_size_tokens,
            available=cap.tokens,
            unit="tokens",
            ratio=users * per_sequence / cap.blocks,
            detail=f"{users:,} × {per_sequence} blocks",
        ),
        ResourceUse(
            resource="max_num_seqs",
            used=users,
            available=seq_cap,
            unit="sequences",
            ratio=users / seq_cap,
            detail="batch slots",
        ),
        ResourceUse(
            resource="max_num_batched_tokens",
            used=per_step,
            available=budget,
            unit="tokens/step",
            ratio=per_step / budget,
            detail="decode + prompt tokens",
        ),
    ]
    for resource, seconds, what in (
        ("compute", step.compute_seconds, f"{step.flops / 1e12:.1f} TFLOP"),
        ("hbm_bandwidth", step.memory_seconds, f"{step.hbm_bytes_per_gpu / 1e9:.1f} GB per GPU"),
        ("interconnect", step.allreduce_seconds, f"{2 * model_spec.layers} all-reduces" if tp > 1 else "TP 1: none"),
        ("scheduler", step.scheduler_seconds, "fixed per step"),
    ):
        share = seconds / step.step_seconds
        resources.append(
            ResourceUse(
                resource=resource,
                used=seconds,
                available=step.step_seconds,
                unit="seconds per step",
                ratio=share,
                detail=what,
            )
        )

    ttft = _ttft_burst(dep, users, served_cap, p, o, budget)
    seed = SeedArithmetic(
        users=users,
        single_stream_tokens_per_second=single.total_tokens_per_second,
        naive_per_user_tokens_per_second=single.total_tokens_per_second / users,
        batched_per_user_tokens_per_second=at_users.per_user_tokens_per_second,
        batched_mean_per_user_tokens_per_second=at_users.total_tokens_per_second / users,
        batched_total_tokens_per_second=at_users.total_tokens_per_second,
        batching_gain=at_users.total_tokens_per_second / single.total_tokens_per_second,
    )

    bound_words = RESOURCE_WORDS[step.bound_by]
    if waiting:
        summary = (
            f"{RESOURCE_WORDS[batch_cap_name]} caps first: {served:,} of {users:,} users fit at {context:,} tokens "
            "each; "
            f"{waiting:,} wait for a slot. Each served user reads {at_users.per_user_tokens_per_second:.1f} tokens/s, "
            f"{at_users.total_tokens_per_second:,.0f} tokens/s in total; the steps are limited by {bound_words}."
        )
    else:
        summary = (
            f"All {users:,} users fit ({RESOURCE_WORDS[batch_cap_name]} allows {served_cap:,}); {bound_words} limits "
            f"each step. Each user reads {at_users.per_user_tokens_per_second:.1f} tokens/s, "
            f"{at_users.total_tokens_per_second:,.0f} tokens/s in total."
        )

    notes = [
        "A roofline: peak FLOP/s and HBM bandwidth. Real kernels reach ~50-80% of them, so read tokens/s as a "
        "ceiling and times as a floor.",
        f"The batch is sized at each sequence's final length ({context} tokens), so nothing is preempted; vLLM "
        "admits by current use and may run more, preempting (recomputing) when the cache fills.",
    ]
    if not given:
        notes.append(
            f"Batch caps are vLLM's defaults on {gpu_spec.name}: --max-num-seqs {seq_cap}, "
            f"--max-num-batched-tokens {budget}; pass yours with the same flags."
        )
    if waiting:
        notes.append(
            f"Waiting users read nothing until a slot frees: averaged over time each of the {users:,} users gets "
            f"{seed.batched_mean_per_user_tokens_per_second:.1f} tokens/s."
        )
    if model_spec.max_context_tokens and context > model_spec.max_context_tokens:
        notes.append(
            f"{context} tokens exceed {model_spec.name}'s {model_spec.max_context_tokens}-token context window."
        )
    return CapacityReport(
        summary=summary,
        inputs=CapacityInputs(
            gpu=gpu_spec.name,
            gpu_part=gpu_spec.part,
            model=model_spec.name,
            model_source=model_spec.source,
            tp=tp,
            interconnect=dep.link.description,
            users=users,
            prompt_tokens=p,
            output_tokens=o,
            gpu_memory_utilization=gpu_memory_utilization,
            block_size_tokens=block_size_tokens,
            activation_reserve_bytes=activation_reserve_bytes,
            scheduler_overhead_seconds=scheduler_overhead_seconds,
            max_num_seqs=seq_cap,
            max_num_batched_tokens=budget,
            batch_caps_source="given" if given else f"vLLM default for {gpu_spec.name}",
        ),
        hardware=HardwareFacts(
            memory_bytes=gpu_spec.memory_bytes,
            hbm_bandwidth_bytes_per_second=gpu_spec.hbm_bandwidth_bytes_per_second,
            peak_bf16_flops_per_second=gpu_spec.peak_bf16_flops_per_second,
            interconnect_bandwidth_bytes_per_second=dep.link.bandwidth_bytes_per_second,
            allreduce_latency_seconds=dep.link.allreduce_latency_seconds,
        ),
        model=ModelFacts(
            total_params=model_spec.total_params,
            active_params=model_spec.active_params,
            weight_bytes=weight_bytes(model_spec),
            kv_bytes_per_token=kv_bytes_per_token(model_spec),
            layers=model_spec.layers,
            hidden_size=model_spec.hidden_size,
            attention_heads=model_spec.attention_heads,
            kv_heads=model_spec.kv_heads,
            head_dim=model_spec.head_dim,
            experts=model_spec.experts,
            active_experts=model_spec.active_experts,
            max_context_tokens=model_spec.max_context_tokens,
        ),
        memory=MemoryReport(
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
        ),
        served_sequences=served,
        waiting_users=waiting,
        limited_by=limited_by,
        step_bound_by=step.bound_by,
        single_stream=single,
        kv_max_decode_only=kv_decode,
        kv_max_sustained=kv_sustained,
        at_users=at_users,
        resources=resources,
        ttft=ttft,
        seed=seed,
        notes=notes,
    )


def roofline_for_window(dep: Deployment, signals: SignalSet) -> Roofline | None:
    """Where the measured decode rate sits under the ceiling: mean batch (Little's law) at the mean context of
    a sequence halfway through its output. None when the window has no decoding to compare."""

    def value(name: str, stat: str) -> float | None:
        signal = signals.get(name)
        return None if signal is None else signal.stat(stat)

    batch = value("requests_running_avg", "value")
    measured = value("generation_tokens_per_second", "rate")
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


def roofline_signal(roofline: Roofline) -> Signal:
    """The fraction of the ceiling as a signal, so rules can cite it beside the GPU's own activity counters."""
    return Signal(
        name="roofline_fraction_ratio",
        kind="derived",
        unit="ratio",
        stats={"value": roofline.fraction_of_ceiling_ratio},
        source=f"decode tokens/s over the {roofline.bound_by} ceiling of {roofline.model} on {roofline.tp} × "
        f"{roofline.gpu} (--gpu/--model-shape)",
    )
