"""The physics of one serving step and of the KV cache: a roofline model, in pure functions.

The simulator prices each scheduler step with ``step_time``; the capacity model (``llmdiag.engine.capacity``)
uses the same functions in closed form. Symbols: L layers, H hidden size, n_h attention heads, n_kv KV heads,
d head dim, b weight bytes per value, b_kv KV bytes per value (the weights' width unless FP8 KV is set),
N_total / N_active parameters (``hardware.ModelSpec``), tp tensor-parallel size, F peak FLOP/s per GPU,
B_hbm HBM bytes/s per GPU, B_link interconnect bytes/s per direction, α latency of one all-reduce.

KV cache
    kv_bytes_per_token         = 2 · L · n_kv · d · b_kv                  (K and V, every layer)
                               = (kv_lora_rank + qk_rope_head_dim) · L · b_kv
                                                                          (MLA, DeepSeek-V2/V3: one compressed latent
                                                                          and one shared rope key per layer)
                                 L counts full-attention layers only: a sliding-window layer (gpt-oss) keeps at
                                 most W tokens per sequence (sliding_window_kv_bytes_per_sequence), not modelled
                                 in the capacity
    kv_bytes_per_token_per_gpu = 2 · L · ⌈n_kv / tp⌉ · d · b_kv           (heads split; replicated when tp > n_kv;
                                                                          MLA's latent: all of it on every rank)
    weight_bytes               = N_total · b                              (an MoE keeps every expert in memory;
                                                                          a quantized checkpoint at its own widths:
                                                                          fp8 1 byte, gpt-oss's MXFP4 experts 4.25 bits)
    kv_cache_bytes_per_gpu     = memory · gpu_memory_utilization − weight_bytes / tp − activation_reserve
    kv_blocks                  = ⌊kv_cache_bytes_per_gpu / (block_size · kv_bytes_per_token_per_gpu)⌋
    kv_capacity_tokens         = kv_blocks · block_size
    max_batch(context)         = ⌊kv_blocks / ⌈context / block_size⌉⌋    (vLLM pages KV in whole blocks)

    activation_reserve is what vLLM's profiling run keeps back per GPU for activations, CUDA graphs and
    non-torch allocations: ~1–3 GiB for a 7–8B model at 8192 batched tokens. Default 2 GiB; the server's
    "Available KV cache memory" log line gives the real figure.

A step (``StepLoad``: the new tokens it computes, the context each attends to, the KV it reads)
    flops          = 2 · N_active · new_tokens                       (one multiply-add per active weight per token;
                                                                      the embedding gather is counted too: ≤ 7 % high)
                   + 2 · L · n_h · (d_qk + d_v) · attended_tokens    (QKᵀ and A·V: 2 FLOPs per multiply-add,
                                                                      per query·key pair per layer; d_qk = d_v = d,
                                                                      or MLA's qk_nope + qk_rope and v_head)
      decode of B sequences at context c:   new = B,  attended = B · c,  kv read = B · c
      prefill of a P-token prompt:          new = P,  attended = P(P+1)/2 (causal),  kv read = P
    compute_seconds = flops / (F · tp · compute_efficiency)
    weight_bytes_read = N_total · b for a dense model; for an MoE with E experts, k per token, over n tokens:
                        (N_total − all_expert_params) · b + all_expert_params · b · (1 − (1 − k/E)^n)
                        (the expected share of experts that n uniformly routed tokens touch)
    hbm_bytes_per_gpu = weight_bytes_read / tp + kv_bytes_per_token_per_gpu · (kv_read + new_tokens)
                        (weights once per step, shared by the whole batch; the KV read plus the new KV written;
                        activations stay in cache and are ignored)
    memory_seconds  = hbm_bytes_per_gpu / (B_hbm · bandwidth_efficiency)
    allreduce_seconds = 0 at tp = 1, else 2 · L · (α + 2 · (tp − 1)/tp · new_tokens · H · b / B_link)
                        (Megatron TP all-reduces the hidden state twice per layer, after attention and after the
                        MLP; a ring all-reduce moves 2(tp−1)/tp of the message through each GPU's link)
    step_seconds    = max(compute_seconds, memory_seconds) + allreduce_seconds + scheduler_overhead
                        (compute and HBM traffic overlap; the all-reduce and the CPU's scheduling do not)

    scheduler_overhead (default 2 ms) is the CPU time per step to schedule, prepare inputs and sample, which
    the GPU waits for: vLLM's per-step host overhead with CUDA graphs is ~1–3 ms for a few hundred sequences.
    Efficiencies default to 1: the model is a ceiling (real kernels reach ~50–80 % of peak FLOP/s and ~70–90 %
    of HBM bandwidth); the simulator may lower them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmdiag.errors import UsageError, option
from llmdiag.model.capacity import StepBound, StepTime
from llmdiag.physics.hardware import GIB, GpuSpec, InterconnectSpec, ModelSpec, interconnect_for

# vLLM 0.32 defaults (vllm/config/cache.py: gpu_memory_utilization 0.92, DEFAULT_BLOCK_SIZE 16)
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
DEFAULT_BLOCK_SIZE_TOKENS = 16
DEFAULT_ACTIVATION_RESERVE_BYTES = 2 * GIB
DEFAULT_SCHEDULER_OVERHEAD_SECONDS = 0.002


@dataclass(frozen=True)
class Deployment:
    """One model served on tp GPUs of one kind, with the server settings that shape the physics."""

    gpu: GpuSpec
    model: ModelSpec
    tp: int = 1
    interconnect: InterconnectSpec | None = None  # None: NVLink where the GPU has it, else its PCIe
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    activation_reserve_bytes: int = DEFAULT_ACTIVATION_RESERVE_BYTES
    block_size_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS
    kv_dtype_bytes: int | None = None  # None = the weights' width; 1 for FP8 KV
    scheduler_overhead_seconds: float = DEFAULT_SCHEDULER_OVERHEAD_SECONDS
    compute_efficiency: float = 1.0
    bandwidth_efficiency: float = 1.0

    def __post_init__(self) -> None:
        if self.interconnect is None:
            object.__setattr__(self, "interconnect", interconnect_for(self.gpu))
        if self.tp < 1:
            raise UsageError(f"{option('tp')} must be at least 1, got {self.tp}")
        heads = self.model.attention_heads
        if heads % self.tp:
            divisors = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)
            raise UsageError(
                f"{option('tp')} {self.tp} does not divide {self.model.name}'s {heads} attention heads",
                f"use a tensor-parallel size that divides {heads}: {divisors}",
            )
        if not 0 < self.gpu_memory_utilization <= 1:
            raise UsageError(
                f"{option('gpu_memory_utilization')} must be in (0, 1], got {self.gpu_memory_utilization:g}"
            )
        if self.block_size_tokens < 1 or self.activation_reserve_bytes < 0 or self.scheduler_overhead_seconds < 0:
            raise UsageError("block size, activation reserve and scheduler overhead must not be negative")
        if not (0 < self.compute_efficiency <= 1 and 0 < self.bandwidth_efficiency <= 1):
            raise UsageError("efficiencies must be in (0, 1]")

    @property
    def link(self) -> InterconnectSpec:
        """The interconnect, always set after construction."""
        assert self.interconnect is not None
        return self.interconnect


# --- KV cache -------------------------------------------------------------------------------------------


def kv_bytes_per_token(model: ModelSpec, kv_dtype_bytes: int | None = None) -> int:
    """The KV one token leaves in the whole model: 2 · L · n_kv · d · b_kv (K and V, every layer), or for MLA
    (kv_lora_rank + qk_rope_head_dim) · L · b_kv (one compressed latent and the shared rope key per layer).
    Sliding-window layers are left out: they keep at most the window per sequence, not per token."""
    width = kv_dtype_bytes or model.dtype_bytes
    if model.is_mla:
        return (model.kv_lora_rank + model.qk_rope_head_dim) * model.full_attention_layers * width
    return 2 * model.full_attention_layers * model.kv_heads * model.head_dim * width


def kv_bytes_per_token_per_gpu(dep: Deployment) -> int:
    """2 · L · ⌈n_kv / tp⌉ · d · b_kv: each GPU holds its own KV heads (vLLM replicates them when tp > n_kv).
    MLA's latent is not split by heads: every rank holds all of it (vLLM replicates the MLA cache across TP)."""
    model = dep.model
    if model.is_mla:
        return kv_bytes_per_token(model, dep.kv_dtype_bytes)
    heads = math.ceil(model.kv_heads / dep.tp)
    return 2 * model.full_attention_layers * heads * model.head_dim * (dep.kv_dtype_bytes or model.dtype_bytes)


def sliding_window_kv_bytes_per_sequence(model: ModelSpec, kv_dtype_bytes: int | None = None) -> int:
    """What the sliding-window layers keep per sequence once it is longer than the window: W · 2 · n_kv · d · b_kv
    per such layer. Not in the capacity figures (a few MB per sequence for gpt-oss's 128-token window)."""
    width = kv_dtype_bytes or model.dtype_bytes
    return model.sliding_window_tokens * model.sliding_layers * 2 * model.kv_heads * model.head_dim * width


def weight_bytes(model: ModelSpec) -> int:
    """N_total · b: every parameter sits in memory, every expert of an MoE included (a quantized checkpoint at
    its own widths: ``ModelSpec.weight_bytes``)."""
    return model.weight_bytes


@dataclass(frozen=True)
class KvCapacity:
    usable_bytes_per_gpu: float  # memory · gpu_memory_utilization
    weight_bytes_per_gpu: float
    activation_reserve_bytes: int
    kv_cache_bytes_per_gpu: float  # what is left for KV; ≤ 0 when the weights do not fit
    kv_bytes_per_token_per_gpu: int
    blocks: int
    tokens: int


def kv_capacity(dep: Deployment) -> KvCapacity:
    """How many tokens of KV the deployment holds, in whole blocks (the formula in the module docstring)."""
    usable = dep.gpu.memory_bytes * dep.gpu_memory_utilization
    weights = weight_bytes(dep.model) / dep.tp
    kv_bytes = usable - weights - dep.activation_reserve_bytes
    per_token = kv_bytes_per_token_per_gpu(dep)
    blocks = max(0, math.floor(kv_bytes / (dep.block_size_tokens * per_token)))
    return KvCapacity(
        usable_bytes_per_gpu=usable,
        weight_bytes_per_gpu=weights,
        activation_reserve_bytes=dep.activation_reserve_bytes,
        kv_cache_bytes_per_gpu=kv_bytes,
        kv_bytes_per_token_per_gpu=per_token,
        blocks=blocks,
        tokens=blocks * dep.block_size_tokens,
    )


def blocks_per_sequence(dep: Deployment, context_tokens: int) -> int:
    """⌈context / block_size⌉: a sequence's last block is allocated whole."""
    return math.ceil(context_tokens / dep.block_size_tokens)


def max_batch_sequences(dep: Deployment, context_tokens: int) -> int:
    """⌊kv_blocks / ⌈context / block_size⌉⌋: sequences of this length the KV cache holds at once."""
    return kv_capacity(dep).blocks // blocks_per_sequence(dep, context_tokens)


# --- one step -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepLoad:
    """The work of one step. Token counts are floats so a steady state can carry averages (1.6 prompts/step)."""

    new_tokens: float = 0.0  # tokens whose forward pass runs this step (decode tokens + prompt tokens)
    attended_tokens: float = 0.0  # Σ over those tokens of the context each attends to (itself included)
    kv_read_tokens: float = 0.0  # KV entries read from HBM: Σ over sequences of their context

    def __add__(self, other: StepLoad) -> StepLoad:
        return StepLoad(
            self.new_tokens + other.new_tokens,
            self.attended_tokens + other.attended_tokens,
            self.kv_read_tokens + other.kv_read_tokens,
        )


def decode_load(sequences: float, context_tokens: float) -> StepLoad:
    """B sequences each decoding one token at context c: new B, attended B·c, KV read B·c."""
    return StepLoad(sequences, sequences * context_tokens, sequences * context_tokens)


def prefill_load(prompt_tokens: float, prompts: float = 1.0, cached_tokens: float = 0.0) -> StepLoad:
    """``prompts`` prompts of P tokens after ``cached_tokens`` already in KV (a later chunk, or a prefix hit).

    Token i of the prompt attends to cached + i tokens, so attended = P·cached + P(P+1)/2 per prompt.
    """
    p = prompt_tokens
    attended = p * cached_tokens + p * (p + 1) / 2
    return StepLoad(prompts * p, prompts * attended, prompts * (cached_tokens + p))


def step_flops(model: ModelSpec, load: StepLoad) -> float:
    """2 · N_active · new_tokens + 2 · L · n_h · (d_qk + d_v) · attended_tokens (= 4 · L · n_h · d when the query·key
    and value widths are both d; MLA's are qk_nope + qk_rope and v_head, its un-absorbed form)."""
    attention = 2 * model.layers * model.attention_heads * (model.qk_head_dim + model.value_head_dim)
    return 2 * model.active_params * load.new_tokens + attention * load.attended_tokens


def experts_touched_ratio(model: ModelSpec, tokens: float) -> float:
    """1 − (1 − k/E)^n: the expected share of an MoE layer's experts that n uniformly routed tokens use."""
    if not model.is_moe:
        return 1.0
    untouched: float = (1 - model.active_experts / model.experts) ** max(tokens, 0.0)
    return 1 - untouched


def weight_bytes_read(model: ModelSpec, tokens: float) -> float:
    """Weight bytes a step streams from HBM: all of a dense model; an MoE's shared part plus the experts used."""
    if not model.is_moe:
        return float(weight_bytes(model))
    shared = model.total_params - model.all_expert_params
    dense_bytes = model.weight_bytes_per_param or model.dtype_bytes
    expert_bytes = model.expert_weight_bytes_per_param or dense_bytes  # gpt-oss's MXFP4 experts are narrower
    touched = model.all_expert_params * experts_touched_ratio(model, tokens)
    if expert_bytes == dense_bytes:
        return (shared + touched) * dense_bytes
    return shared * dense_bytes + touched * expert_bytes


def hbm_bytes_per_gpu(dep: Deployment, load: StepLoad) -> float:
    """weight_bytes_read / tp + kv_bytes_per_token_per_gpu · (kv_read + new_tokens)."""
    kv = kv_bytes_per_token_per_gpu(dep) * (load.kv_read_tokens + load.new_tokens)
    return weight_bytes_read(dep.model, load.new_tokens) / dep.tp + kv


def allreduce_seconds(dep: Deployment, tokens: float) -> float:
    """2 · L · (α + 2(tp−1)/tp · tokens · H · b / B_link); zero on one GPU."""
    if dep.tp == 1 or tokens <= 0:
        return 0.0
    model, link = dep.model, dep.link
    message_bytes = tokens * model.hidden_size * model.dtype_bytes
    ring_bytes = 2 * (dep.tp - 1) / dep.tp * message_bytes
    per_allreduce = link.allreduce_latency_seconds + ring_bytes / link.bandwidth_bytes_per_second
    return 2 * model.layers * per_allreduce


def step_time(dep: Deployment, load: StepLoad) -> StepTime:
    """max(compute, memory) + all-reduce + scheduler overhead, each term kept for the report."""
    if load.new_tokens <= 0:
        overhead = dep.scheduler_overhead_seconds
        return StepTime(0.0, 0.0, 0.0, 0.0, 0.0, overhead, overhead, "scheduler")
    flops = step_flops(dep.model, load)
    compute = flops / (dep.gpu.peak_bf16_flops_per_second * dep.tp * dep.compute_efficiency)
    hbm = hbm_bytes_per_gpu(dep, load)
    memory = hbm / (dep.gpu.hbm_bandwidth_bytes_per_second * dep.bandwidth_efficiency)
    allreduce = allreduce_seconds(dep, load.new_tokens)
    overhead = dep.scheduler_overhead_seconds
    terms: dict[StepBound, float] = {
        "compute": compute,
        "hbm_bandwidth": memory,
        "interconnect": allreduce,
        "scheduler": overhead,
    }
    return StepTime(
        flops=flops,
        compute_seconds=compute,
        hbm_bytes_per_gpu=hbm,
        memory_seconds=memory,
        allreduce_seconds=allreduce,
        scheduler_seconds=overhead,
        step_seconds=max(compute, memory) + allreduce + overhead,
        bound_by=max(terms, key=lambda name: terms[name]),
    )
