"""What the physics needs to know about a GPU, the link between GPUs, and a model: small typed tables.

GPUs (one chip; peaks are dense, i.e. without 2:4 sparsity, which LLM serving does not use):

    name  part                memory (as nvidia-smi reports it)   HBM bandwidth   peak bf16 dense   NVLink/direction
    H100  H100 SXM5 80GB HBM3  81559 MiB                           3.35 TB/s       989.4 TFLOP/s     450 GB/s
    H200  H200 SXM 141GB HBM3e 143771 MiB                          4.8 TB/s        989.4 TFLOP/s     450 GB/s
    A100  A100 SXM4 80GB       81920 MiB                           2.039 TB/s      312 TFLOP/s       300 GB/s
    L4    L4 24GB GDDR6        23034 MiB                           300 GB/s        121 TFLOP/s       none (PCIe 4)

Sources: NVIDIA's H100, H200, A100 and L4 datasheets (bandwidth; bf16 Tensor Core peak, halving the "with
sparsity" figure: H100 1979 → 989.4 per the Hopper whitepaper, L4 242 → 121). Memory totals are the ones
``nvidia-smi`` prints (collected in modal-labs/modal-client PR #2797 for H100, A100 80GB and L4; the H200
figure from published ``nvidia-smi`` output), because vLLM sizes its KV cache from what the device reports,
not the marketing "80 GB". NVLink is the per-direction half of the datasheet's bidirectional total
(H100/H200 900 GB/s, A100 600 GB/s). PCIe x16 is Gen4 ~32 / Gen5 ~64 GB/s raw per direction; ~25 / ~50 GB/s
is what a transfer achieves after protocol overhead.

Models: the published Hugging Face ``config.json`` shapes. Parameter counts are derived from the shape
(``ModelSpec.total_params``) and match the model cards: Llama 3 8B 8.03 B, 70B 70.6 B, Qwen2.5 7B 7.62 B,
72B 72.7 B, Mistral 7B v0.3 7.25 B, Mixtral 8x7B 46.7 B total / 12.9 B active.

    per layer:  attention = H·(n_heads·d_head) + 2·H·(n_kv·d_head) + (n_heads·d_head)·H   [+ q,k,v biases]
                mlp       = 3·H·I per expert (gated: gate, up, down)
                router    = H·E (MoE only);  norms = 2·H
    total     = L·(attention + E·mlp + router + norms) + V·H (embedding) + V·H (lm_head, unless tied) + H
    active    = the same with k (experts per token) in place of E
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from llmdiag.errors import InputFileError, UsageError

MIB = 1024**2
GIB = 1024**3

InterconnectName = Literal["nvlink", "pcie4", "pcie5"]


@dataclass(frozen=True)
class GpuSpec:
    name: str
    part: str
    memory_bytes: int
    hbm_bandwidth_bytes_per_second: float
    peak_bf16_flops_per_second: float
    nvlink_bandwidth_bytes_per_second: float | None
    pcie: InterconnectName
    # vLLM 0.32's defaults for the OpenAI server on this GPU (vllm/engine/arg_utils.py: ≥ 70 GiB and not
    # A100 gets 1024 seqs / 8192 batched tokens; everything else 256 / 2048)
    vllm_max_num_seqs: int
    vllm_max_num_batched_tokens: int
    aliases: tuple[str, ...] = ()


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec(
            "H100",
            "H100 SXM5 80GB HBM3",
            81559 * MIB,
            3.35e12,
            989.4e12,
            450e9,
            "pcie5",
            1024,
            8192,
            ("h100-sxm", "h100-sxm5", "h100-80gb"),
        ),
        GpuSpec(
            "H200",
            "H200 SXM 141GB HBM3e",
            143771 * MIB,
            4.8e12,
            989.4e12,
            450e9,
            "pcie5",
            1024,
            8192,
            ("h200-sxm", "h200-141gb"),
        ),
        GpuSpec(
            "A100",
            "A100 SXM4 80GB HBM2e",
            81920 * MIB,
            2.039e12,
            312e12,
            300e9,
            "pcie4",
            256,
            2048,
            ("a100-sxm", "a100-sxm4", "a100-80gb", "a100-sxm4-80gb"),
        ),
        GpuSpec("L4", "L4 24GB GDDR6", 23034 * MIB, 300e9, 121e12, None, "pcie4", 256, 2048, ("l4-24gb",)),
    )
}


@dataclass(frozen=True)
class InterconnectSpec:
    name: InterconnectName
    description: str
    bandwidth_bytes_per_second: float  # per GPU, per direction, as a transfer achieves it
    # fixed cost of one all-reduce however small: decode messages are KBs, so this dominates there.
    # Order of magnitude of small-message all_reduce times in nccl-tests / vLLM's custom all-reduce.
    allreduce_latency_seconds: float


PCIE_LINKS: dict[str, InterconnectSpec] = {
    "pcie4": InterconnectSpec("pcie4", "PCIe Gen4 x16", 25e9, 30e-6),
    "pcie5": InterconnectSpec("pcie5", "PCIe Gen5 x16", 50e9, 25e-6),
}
NVLINK_ALLREDUCE_LATENCY_SECONDS = 10e-6


def interconnect_for(gpu: GpuSpec, name: str | None = None) -> InterconnectSpec:
    """The link between this GPU's tensor-parallel ranks: NVLink where the part has it, else its PCIe."""
    wanted = (name or ("nvlink" if gpu.nvlink_bandwidth_bytes_per_second else gpu.pcie)).lower()
    if wanted == "nvlink":
        if gpu.nvlink_bandwidth_bytes_per_second is None:
            raise UsageError(f"the {gpu.name} has no NVLink", f"use --interconnect {gpu.pcie}")
        return InterconnectSpec(
            "nvlink",
            f"NVLink ({gpu.name})",
            gpu.nvlink_bandwidth_bytes_per_second,
            NVLINK_ALLREDUCE_LATENCY_SECONDS,
        )
    if wanted in PCIE_LINKS:
        return PCIE_LINKS[wanted]
    raise UsageError(f"unknown interconnect '{name}'", "known interconnects: nvlink, pcie4, pcie5")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str  # Hugging Face id or the config.json it was read from
    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int  # per expert for MoE
    vocab_size: int
    dtype_bytes: int = 2
    experts: int = 1  # 1 = dense
    active_experts: int = 1  # experts each token is routed to
    tied_embeddings: bool = False
    attention_bias: bool = False
    max_context_tokens: int = 0  # 0 = not stated

    @property
    def is_moe(self) -> bool:
        return self.experts > 1

    @property
    def q_dim(self) -> int:
        return self.attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def expert_params(self) -> int:
        """Parameters of one expert's gated MLP in one layer."""
        return 3 * self.hidden_size * self.intermediate_size

    def _params(self, experts: int) -> int:
        h = self.hidden_size
        attention = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        if self.attention_bias:
            attention += self.q_dim + 2 * self.kv_dim
        router = h * self.experts if self.is_moe else 0
        per_layer = attention + experts * self.expert_params + router + 2 * h
        embeddings = self.vocab_size * h * (1 if self.tied_embeddings else 2)
        return self.layers * per_layer + embeddings + h

    @property
    def total_params(self) -> int:
        """Every parameter: what sits in GPU memory."""
        return self._params(self.experts)

    @property
    def active_params(self) -> int:
        """Parameters one token passes through: what its matmuls cost (equals total for a dense model)."""
        return self._params(self.active_experts)

    @property
    def all_expert_params(self) -> int:
        return self.layers * self.experts * self.expert_params if self.is_moe else 0


def _llama(name: str, source: str, **shape: Any) -> ModelSpec:
    return ModelSpec(name=name, source=source, head_dim=128, dtype_bytes=2, **shape)


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _llama(
            "llama-3-8b",
            "meta-llama/Meta-Llama-3-8B",
            layers=32,
            hidden_size=4096,
            attention_heads=32,
            kv_heads=8,
            intermediate_size=14336,
            vocab_size=128256,
            max_context_tokens=8192,
        ),
        _llama(
            "llama-3-70b",
            "meta-llama/Meta-Llama-3-70B",
            layers=80,
            hidden_size=8192,
            attention_heads=64,
            kv_heads=8,
            intermediate_size=28672,
            vocab_size=128256,
            max_context_tokens=8192,
        ),
        _llama(
            "qwen2.5-7b",
            "Qwen/Qwen2.5-7B-Instruct",
            layers=28,
            hidden_size=3584,
            attention_heads=28,
            kv_heads=4,
            intermediate_size=18944,
            vocab_size=152064,
            attention_bias=True,
            max_context_tokens=32768,
        ),
        _llama(
            "qwen2.5-72b",
            "Qwen/Qwen2.5-72B-Instruct",
            layers=80,
            hidden_size=8192,
            attention_heads=64,
            kv_heads=8,
            intermediate_size=29568,
            vocab_size=152064,
            attention_bias=True,
            max_context_tokens=32768,
        ),
        _llama(
            "mistral-7b",
            "mistralai/Mistral-7B-Instruct-v0.3",
            layers=32,
            hidden_size=4096,
            attention_heads=32,
            kv_heads=8,
            intermediate_size=14336,
            vocab_size=32768,
            max_context_tokens=32768,
        ),
        _llama(
            "mixtral-8x7b",
            "mistralai/Mixtral-8x7B-Instruct-v0.1",
            layers=32,
            hidden_size=4096,
            attention_heads=32,
            kv_heads=8,
            intermediate_size=14336,
            vocab_size=32000,
            experts=8,
            active_experts=2,
            max_context_tokens=32768,
        ),
    )
}


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def find_gpu(name: str) -> GpuSpec:
    key = _key(name)
    for gpu in GPUS.values():
        if key in {_key(gpu.name), _key(gpu.part), *map(_key, gpu.aliases)}:
            return gpu
    raise UsageError(f"unknown GPU '{name}'", f"known GPUs: {', '.join(GPUS)} (SXM parts)")


def find_model(name: str) -> ModelSpec:
    def key(text: str) -> str:  # "meta-llama/Meta-Llama-3-8B-Instruct" → "metallama38b"
        return _key(re.sub(r"-(instruct|chat)\b", "", text.split("/")[-1], flags=re.IGNORECASE))

    for model in MODELS.values():
        if key(name) in (key(model.name), key(model.source)):
            return model
    raise UsageError(
        f"unknown model '{name}'",
        f"known models: {', '.join(MODELS)}; or pass --model-config PATH to a Hugging Face config.json",
    )


# Fields of architectures whose memory or compute these formulas do not describe.
UNSUPPORTED_FIELDS = {
    "kv_lora_rank": "multi-head latent attention (DeepSeek-style) caches a compressed KV",
    "q_lora_rank": "multi-head latent attention (DeepSeek-style) caches a compressed KV",
    "moe_intermediate_size": "fine-grained / shared-expert MoE layers have their own sizes",
    "shared_expert_intermediate_size": "shared-expert MoE layers have their own sizes",
    "n_shared_experts": "shared-expert MoE layers have their own sizes",
    "quantization_config": "quantized weights are not 16-bit; the weight bytes would be wrong",
    "ssm_cfg": "state-space (Mamba) layers keep a state, not a KV cache",
    "mamba_d_state": "state-space (Mamba) layers keep a state, not a KV cache",
}
# vLLM's --dtype auto serves float32 checkpoints in 16 bits, so every one of these costs 2 bytes
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 2, "bf16": 2, "fp16": 2}
CONFIG_HINT = "pass the config.json of a Hugging Face model folder, or a built-in --model"


def load_model_config(path: Path) -> ModelSpec:
    """A model's shape from a local Hugging Face ``config.json`` (dense or Mixtral-style MoE, gated MLP)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file", CONFIG_HINT) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(f"{path}: cannot read it ({exc})", CONFIG_HINT) from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})", CONFIG_HINT) from None
    if not isinstance(config, dict):
        raise InputFileError(f"{path}: not a model config (a JSON object was expected)", CONFIG_HINT)
    if "hidden_size" not in config and isinstance(config.get("text_config"), dict):
        config = {**config["text_config"], "_name_or_path": config.get("_name_or_path", "")}
    for field, reason in UNSUPPORTED_FIELDS.items():
        if config.get(field) is not None:
            raise InputFileError(
                f"{path}: field '{field}' is not supported: {reason}",
                "llmdiag models dense and Mixtral-style MoE transformers; pick a built-in --model for a rough figure",
            )

    def positive_int(field: str, default: int | None = None) -> int:
        value = config.get(field)
        if value is None:
            if default is None:
                raise InputFileError(f"{path}: field '{field}' is missing", CONFIG_HINT)
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InputFileError(f"{path}: field '{field}' must be a positive integer, got {value!r}", CONFIG_HINT)
        return value

    hidden = positive_int("hidden_size")
    heads = positive_int("num_attention_heads")
    if hidden % heads and config.get("head_dim") is None:
        raise InputFileError(
            f"{path}: hidden_size {hidden} is not a multiple of {heads} heads and no head_dim", CONFIG_HINT
        )
    kv_heads = positive_int("num_key_value_heads", heads)
    if heads % kv_heads:
        raise InputFileError(f"{path}: {heads} attention heads are not a multiple of {kv_heads} KV heads", CONFIG_HINT)
    experts = positive_int("num_local_experts", positive_int("num_experts", 1))
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    if dtype not in DTYPE_BYTES:
        raise InputFileError(f"{path}: dtype '{dtype}' is not modelled", f"supported: {', '.join(DTYPE_BYTES)}")
    name = str(config.get("_name_or_path") or path.resolve().parent.name or path.stem)
    spec = ModelSpec(
        name=name,
        source=str(path),
        layers=positive_int("num_hidden_layers"),
        hidden_size=hidden,
        attention_heads=heads,
        kv_heads=kv_heads,
        head_dim=positive_int("head_dim", hidden // heads),
        intermediate_size=positive_int("intermediate_size"),
        vocab_size=positive_int("vocab_size"),
        dtype_bytes=DTYPE_BYTES[dtype],
        experts=experts,
        active_experts=positive_int("num_experts_per_tok", 1) if experts > 1 else 1,
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        # Qwen2 configs do not say so, but its q, k and v projections carry biases
        attention_bias=bool(config.get("attention_bias", config.get("model_type") == "qwen2")),
        max_context_tokens=positive_int("max_position_embeddings", 0),
    )
    if spec.active_experts > spec.experts:
        raise InputFileError(
            f"{path}: num_experts_per_tok {spec.active_experts} exceeds the {spec.experts} experts", CONFIG_HINT
        )
    return spec


def min_tensor_parallel(model: ModelSpec, gpu: GpuSpec, usable_ratio: float, reserve_bytes: int) -> int | None:
    """The smallest TP size that divides the heads and leaves room for KV after the weights, if any ≤ 64."""
    weights = model.total_params * model.dtype_bytes
    for tp in range(1, 65):
        if model.attention_heads % tp == 0 and gpu.memory_bytes * usable_ratio - reserve_bytes > weights / tp:
            return tp
    return None
