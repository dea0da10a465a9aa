"""What the physics needs to know about a GPU, the link between GPUs, and a model: small typed specs.

The figures are data, each with its source: probes/tables/gpus.toml, interconnects.toml and models.toml (the file
format is ``llmdiag.schema.tables``). This module turns them into the specs the formulas read, once, on import.

GPUs: peaks are dense bf16 (without 2:4 sparsity, which LLM serving does not use); memory is what ``nvidia-smi``
reports, because vLLM sizes its KV cache from what the device reports; NVLink is per direction. An interconnect's
bandwidth is per GPU and per direction as a transfer achieves it, and its all-reduce latency the fixed cost of one.

Models: the published Hugging Face ``config.json`` shapes, read by the same ``model_from_config`` as a
``--model-config`` file. Parameter counts are derived from the shape (``ModelSpec.total_params``) and match the
model cards (models.toml gives each card's figure; a unit test compares them).

    per layer:  attention = H·(n_heads·d_head) + 2·H·(n_kv·d_head) + (n_heads·d_head)·H   [+ q,k,v biases]
                          MLA (DeepSeek): H·r_q + r_q + r_q·n_h·(d_nope + d_rope)      (q down, norm, up)
                                        + H·(r_kv + d_rope) + r_kv                      (the latent and its norm)
                                        + r_kv·n_h·(d_nope + d_v) + n_h·d_v·H           (K/V up; output)
                mlp       = 3·H·I (gated: gate, up, down); an MoE layer: E·3·H·I_e + S·3·H·I_s + H·E (router)
                norms     = 2·H
    total     = L_dense·(attention + mlp + norms) + L_moe·(attention + moe mlp + norms)
                + V·H (embedding) + V·H (lm_head, unless tied) + H
    active    = the same with k (experts per token) in place of E
    (L_dense: all layers of a dense model, the first_k_dense_replace of an MoE; S shared experts of width I_s.)
    Weight bytes: N·b, or a quantized checkpoint's widths (fp8: 1 byte; gpt-oss's MXFP4 experts: 4.25 bits).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from llmdiag.errors import InputFileError, RuleSpecError, UsageError, option
from llmdiag.schema.tables import (
    NVLINK,
    GpuEntry,
    InterconnectEntry,
    ModelEntry,
    load_gpu_table,
    load_interconnect_table,
    load_model_table,
)

MIB = 1024**2
GIB = 1024**3


# The precisions gpus.toml gives a dense peak for (the keys of GpuSpec.peak_flops_per_second_by_dtype).
PRECISIONS = ("bf16", "fp16", "fp8", "fp4", "int8", "int4")


@dataclass(frozen=True)
class GpuSpec:
    name: str
    part: str
    memory_bytes: int
    hbm_bandwidth_bytes_per_second: float
    peak_bf16_flops_per_second: float
    nvlink_bandwidth_bytes_per_second: float | None  # the GPU-to-GPU link (NVLink or Infinity Fabric), per direction
    pcie: str  # the interconnect its PCIe link is (interconnects.toml)
    # vLLM's defaults for its OpenAI server on this GPU (gpus.toml says where each comes from)
    vllm_max_num_seqs: int
    vllm_max_num_batched_tokens: int
    aliases: tuple[str, ...] = ()
    # Dense peak per precision (PRECISIONS), FLOP/s or, for int8/int4, integer op/s; a precision the part has no
    # Tensor/Matrix Core unit for is absent. bf16 is always there and equals peak_bf16_flops_per_second.
    peak_flops_per_second_by_dtype: Mapping[str, float] = field(default_factory=dict, hash=False)
    gpu_link: str = "NVLink"  # what the GPU-to-GPU link is called ("Infinity Fabric" on AMD parts)

    def peak_flops_per_second(self, dtype: str) -> float | None:
        """The dense peak for a precision ("bf16", "fp8", "int4", ...); None where the part has no unit for it."""
        if dtype not in PRECISIONS:
            raise ValueError(f"unknown precision {dtype!r}: one of {', '.join(PRECISIONS)}")
        return self.peak_flops_per_second_by_dtype.get(dtype)


@dataclass(frozen=True)
class InterconnectSpec:
    name: str
    description: str
    bandwidth_bytes_per_second: float  # per GPU, per direction, as a transfer achieves it
    # fixed cost of one all-reduce however small: decode messages are KBs, so this dominates there
    allreduce_latency_seconds: float


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str  # Hugging Face id or the config.json it was read from
    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int  # of a dense MLP (every layer of a dense model; an MoE's leading dense layers)
    vocab_size: int
    dtype_bytes: int = 2  # the checkpoint's 16-bit width: activations, and KV unless FP8 KV is set
    experts: int = 1  # routed experts per MoE layer; 1 = dense
    active_experts: int = 1  # routed experts each token goes to
    tied_embeddings: bool = False
    attention_bias: bool = False
    max_context_tokens: int = 0  # 0 = not stated
    aliases: tuple[str, ...] = ()
    # --- MoE layouts beyond Mixtral's (DeepSeek, Qwen3-MoE) ---
    moe_intermediate_size: int = 0  # one routed expert's MLP width; 0 = intermediate_size (Mixtral)
    shared_experts: int = 0  # experts every token passes through in each MoE layer (DeepSeek's n_shared_experts)
    shared_expert_intermediate_size: int = 0  # their MLP width; 0 = moe_intermediate_size
    dense_layers: int = 0  # leading layers with a dense MLP in an MoE (DeepSeek's first_k_dense_replace)
    # --- multi-head latent attention (DeepSeek-V2/V3): KV is one compressed latent per token and layer ---
    q_lora_rank: int = 0  # 0 = queries projected directly
    kv_lora_rank: int = 0  # 0 = ordinary attention (MLA off)
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # --- sliding-window layers (gpt-oss's layer_types): they keep at most the window's KV per sequence ---
    sliding_window_tokens: int = 0
    sliding_layers: int = 0
    # --- quantized checkpoints: bytes per weight (0 = dtype_bytes); the experts may differ (gpt-oss's MXFP4) ---
    weight_bytes_per_param: float = 0
    expert_weight_bytes_per_param: float = 0

    @property
    def is_moe(self) -> bool:
        return self.experts > 1

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def q_dim(self) -> int:
        return self.attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def qk_head_dim(self) -> int:
        """Width of one head's query·key product: head_dim, or MLA's nope + rope parts."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim if self.is_mla else self.head_dim

    @property
    def full_attention_layers(self) -> int:
        """Layers whose KV grows with the whole context (all but the sliding-window ones)."""
        return self.layers - self.sliding_layers

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert's gated MLP in one layer."""
        return 3 * self.hidden_size * (self.moe_intermediate_size or self.intermediate_size)

    def _attention_params(self) -> int:
        h, n = self.hidden_size, self.attention_heads
        if self.is_mla:
            q_out = n * self.qk_head_dim
            query = (
                h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * q_out if self.q_lora_rank else h * q_out
            )
            latent = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank  # kv_a_proj + its norm
            up = self.kv_lora_rank * n * (self.qk_nope_head_dim + self.v_head_dim)  # kv_b_proj: K (nope) and V
            return query + latent + up + n * self.v_head_dim * h
        attention = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        return attention + (self.q_dim + 2 * self.kv_dim if self.attention_bias else 0)

    def _params(self, experts: int) -> int:
        h = self.hidden_size
        per_layer = self._attention_params() + 2 * h  # + the two norms
        dense_mlp = 3 * h * self.intermediate_size
        if not self.is_moe:
            body = self.layers * (per_layer + dense_mlp)
        else:
            shared = self.shared_experts * 3 * h * (self.shared_expert_intermediate_size or self.moe_intermediate_size)
            moe_mlp = experts * self.expert_params + shared + h * self.experts  # + the router
            body = self.dense_layers * (per_layer + dense_mlp) + self.moe_layers * (per_layer + moe_mlp)
        embeddings = self.vocab_size * h * (1 if self.tied_embeddings else 2)
        return body + embeddings + h

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
        """The routed experts' parameters, which a step reads only where its tokens were routed."""
        return self.moe_layers * self.experts * self.expert_params

    @property
    def weight_bytes(self) -> int:
        """Bytes the weights take: N · b, with a quantized checkpoint's own widths (its experts apart)."""
        dense = self.weight_bytes_per_param or self.dtype_bytes
        expert = self.expert_weight_bytes_per_param or dense
        return round((self.total_params - self.all_expert_params) * dense + self.all_expert_params * expert)


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def find_gpu(name: str) -> GpuSpec:
    key = _key(name)
    for gpu in GPUS.values():
        if key in {_key(gpu.name), _key(gpu.part), *map(_key, gpu.aliases)}:
            return gpu
    raise UsageError(f"unknown GPU '{name}'", f"known GPUs: {', '.join(GPUS)}")


def _model_key(text: str) -> str:  # "meta-llama/Meta-Llama-3-8B-Instruct" → "metallama38b"
    return _key(re.sub(r"-(instruct|chat)\b", "", text.split("/")[-1], flags=re.IGNORECASE))


def find_model(name: str) -> ModelSpec:
    for model in MODELS.values():
        if _model_key(name) in {_model_key(model.name), _model_key(model.source), *map(_model_key, model.aliases)}:
            return model
    raise UsageError(
        f"unknown model '{name}'",
        f"known models: {', '.join(MODELS)}; or pass {option('model_config')} PATH to a Hugging Face config.json",
    )


def interconnect_for(gpu: GpuSpec, name: str | None = None) -> InterconnectSpec:
    """The link between this GPU's tensor-parallel ranks: NVLink where the part has it, else its PCIe."""
    wanted = (name or (NVLINK if gpu.nvlink_bandwidth_bytes_per_second else gpu.pcie)).lower()
    if wanted == NVLINK:
        if gpu.nvlink_bandwidth_bytes_per_second is None:
            raise UsageError(f"the {gpu.name} has no NVLink", f"use {option('interconnect')} {gpu.pcie}")
        return InterconnectSpec(
            NVLINK,
            f"{gpu.gpu_link} ({gpu.name})",  # NVLink, or AMD's Infinity Fabric: the table's 'nvlink' entry
            gpu.nvlink_bandwidth_bytes_per_second,
            NVLINK_ALLREDUCE_LATENCY_SECONDS,
        )
    if wanted in PCIE_LINKS:
        return PCIE_LINKS[wanted]
    raise UsageError(f"unknown interconnect '{name}'", f"known interconnects: {', '.join([NVLINK, *PCIE_LINKS])}")


# --- a model's shape from its config.json -----------------------------------------------------------------

# Fields of architectures whose memory or compute these formulas do not describe.
UNSUPPORTED_FIELDS = {
    "ssm_cfg": "state-space (Mamba) layers keep a state, not a KV cache",
    "mamba_d_state": "state-space (Mamba) layers keep a state, not a KV cache",
}
# Bytes per weight of the quantized checkpoints modelled, by quantization_config.quant_method. fp8 (DeepSeek-V3/R1's
# block FP8): every linear layer in 1 byte (the embeddings' 16 bits are counted as 1 too: < 0.3 % of the weights).
# mxfp4 (gpt-oss): the experts in 4-bit values with one 8-bit scale per 32 (4.25 bits), the rest in 16 bits.
QUANTIZED_WEIGHT_BYTES = {"fp8": (1.0, 1.0), "mxfp4": (None, 4.25 / 8)}
# vLLM's --dtype auto serves float32 checkpoints in 16 bits, so every one of these costs 2 bytes
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 2, "bf16": 2, "fp16": 2}


def config_hint() -> str:
    return f"pass the config.json of a Hugging Face model folder, or a built-in {option('model')}"


# a Hugging Face repository id as servers report the model they serve (vLLM's default served name)
HF_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def hf_hub_cache() -> Path:
    """Where the Hugging Face hub keeps its downloads: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub
    (the hub library's own order)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or str(Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    return Path(home).expanduser() / "hub"


def cached_model_config(repo_id: str, cache: Path | None = None) -> Path | None:
    """The config.json of a model the hub cache on this machine holds (the newest snapshot), or None."""
    if not HF_REPO_ID.match(repo_id):
        return None
    snapshots = (cache or hf_hub_cache()) / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    try:
        configs = [p for p in snapshots.glob("*/config.json") if p.is_file()]
    except OSError:
        return None
    return max(configs, key=lambda p: p.stat().st_mtime) if configs else None


def load_model_config(path: Path) -> ModelSpec:
    """A model's shape from a local Hugging Face ``config.json``: dense, or MoE in Mixtral's, Qwen-MoE's, DeepSeek's
    (MLA, shared experts, leading dense layers) or gpt-oss's (sliding-window layers, MXFP4 experts) layout."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file", config_hint()) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(f"{path}: cannot read it ({exc})", config_hint()) from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})", config_hint()) from None
    except RecursionError:
        raise InputFileError(f"{path}: JSON nested deeper than any model config", config_hint()) from None
    if not isinstance(config, dict):
        raise InputFileError(f"{path}: not a model config (a JSON object was expected)", config_hint())
    if "hidden_size" not in config and isinstance(config.get("text_config"), dict):
        config = {**config["text_config"], "_name_or_path": config.get("_name_or_path", "")}
    name = str(config.get("_name_or_path") or path.resolve().parent.name or path.stem)
    return model_from_config(config, name=name, source=str(path), where=str(path))


def _positive_int_reader(config: Mapping[str, Any], where: str) -> Callable[..., int]:
    def positive_int(field: str, default: int | None = None) -> int:
        value = config.get(field)
        if value is None:
            if default is None:
                raise InputFileError(f"{where}: field '{field}' is missing", config_hint())
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InputFileError(f"{where}: field '{field}' must be a positive integer, got {value!r}", config_hint())
        return value

    return positive_int


def _not_modelled(where: str, what: str) -> InputFileError:
    return InputFileError(
        f"{where}: {what} is not modelled",
        "llmdiag models dense and MoE transformers (Mixtral, Qwen-MoE, DeepSeek MLA, gpt-oss); pick a built-in "
        f"{option('model')} for a rough figure",
    )


def _moe_fields(config: Mapping[str, Any], where: str) -> dict[str, int]:
    """Experts (Mixtral's num_local_experts, Qwen's num_experts, DeepSeek's n_routed_experts), their widths, the
    shared experts and the leading dense layers."""
    positive_int = _positive_int_reader(config, where)
    experts = positive_int("n_routed_experts", positive_int("num_local_experts", positive_int("num_experts", 1)))
    if experts == 1:
        return {}
    # every layer an MoE layer after the leading dense ones: other layouts are refused, not mispriced
    if (
        config.get("moe_layer_freq", 1) != 1
        or config.get("decoder_sparse_step", 1) != 1
        or config.get("mlp_only_layers")
    ):
        raise _not_modelled(where, "an MoE with dense layers between its MoE layers")
    active = positive_int("num_experts_per_tok", positive_int("experts_per_token", 1))
    if active > experts:
        raise InputFileError(f"{where}: num_experts_per_tok {active} exceeds the {experts} experts", config_hint())

    def count(field: str) -> int:  # a field that may be 0 or absent (0 then)
        value = config.get(field) or 0
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputFileError(f"{where}: field '{field}' must be a whole number >= 0, got {value!r}", config_hint())
        return value

    shared_width = count("shared_expert_intermediate_size")
    return {
        "experts": experts,
        "active_experts": active,
        "moe_intermediate_size": count("moe_intermediate_size"),
        "shared_experts": count("n_shared_experts") or (1 if shared_width else 0),
        "shared_expert_intermediate_size": shared_width,
        "dense_layers": count("first_k_dense_replace"),
    }


def _mla_fields(config: Mapping[str, Any], where: str) -> dict[str, int]:
    """Multi-head latent attention (DeepSeek-V2/V3): its ranks and head widths."""
    if config.get("kv_lora_rank") is None:
        return {}
    positive_int = _positive_int_reader(config, where)
    return {
        "q_lora_rank": positive_int("q_lora_rank", 0) if config.get("q_lora_rank") is not None else 0,
        "kv_lora_rank": positive_int("kv_lora_rank"),
        "qk_nope_head_dim": positive_int("qk_nope_head_dim"),
        "qk_rope_head_dim": positive_int("qk_rope_head_dim"),
        "v_head_dim": positive_int("v_head_dim"),
    }


def _sliding_fields(config: Mapping[str, Any], where: str) -> dict[str, int]:
    """Sliding-window layers named in layer_types (gpt-oss). A bare sliding_window without layer_types (Mistral
    v0.1, Qwen's use_sliding_window) is not applied, as before: vLLM's handling of those varies by version."""
    types = config.get("layer_types")
    if not types:
        return {}
    if not isinstance(types, list) or any(t not in ("sliding_attention", "full_attention") for t in types):
        raise _not_modelled(where, "a layer_types entry other than sliding_attention and full_attention")
    if len(types) != config.get("num_hidden_layers"):
        raise InputFileError(f"{where}: layer_types names {len(types)} layers, not num_hidden_layers", config_hint())
    sliding = sum(t == "sliding_attention" for t in types)
    if not sliding:
        return {}
    return {"sliding_layers": sliding, "sliding_window_tokens": _positive_int_reader(config, where)("sliding_window")}


def _quantized_fields(config: Mapping[str, Any], where: str) -> dict[str, float]:
    quantization = config.get("quantization_config")
    if quantization is None:
        return {}
    method = quantization.get("quant_method") if isinstance(quantization, Mapping) else None
    if method not in QUANTIZED_WEIGHT_BYTES:
        raise _not_modelled(where, f"quantization_config quant_method {method!r} (modelled: fp8, mxfp4)")
    dense, expert = QUANTIZED_WEIGHT_BYTES[method]
    return {"weight_bytes_per_param": dense or 0.0, "expert_weight_bytes_per_param": expert}


def model_from_config(config: Mapping[str, Any], *, name: str, source: str, where: str) -> ModelSpec:
    """The shape a Hugging Face config.json describes; ``where`` names it in errors (``InputFileError``)."""
    for unsupported, reason in UNSUPPORTED_FIELDS.items():
        if config.get(unsupported) is not None:
            raise InputFileError(
                f"{where}: field '{unsupported}' is not supported: {reason}",
                "llmdiag models dense and MoE transformers (Mixtral, Qwen-MoE, DeepSeek MLA, gpt-oss); pick a "
                f"built-in {option('model')} for a rough figure",
            )
    positive_int = _positive_int_reader(config, where)
    hidden = positive_int("hidden_size")
    heads = positive_int("num_attention_heads")
    mla = _mla_fields(config, where)
    if hidden % heads and config.get("head_dim") is None and not mla:
        raise InputFileError(
            f"{where}: hidden_size {hidden} is not a multiple of {heads} heads and no head_dim", config_hint()
        )
    kv_heads = positive_int("num_key_value_heads", heads)
    if heads % kv_heads:
        raise InputFileError(
            f"{where}: {heads} attention heads are not a multiple of {kv_heads} KV heads", config_hint()
        )
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    if dtype not in DTYPE_BYTES:
        raise InputFileError(f"{where}: dtype '{dtype}' is not modelled", f"supported: {', '.join(DTYPE_BYTES)}")
    # the MoE, MLA, sliding-window and quantization fields, each where the config has them
    layout: dict[str, Any] = {
        **_moe_fields(config, where),
        **mla,
        **_sliding_fields(config, where),
        **_quantized_fields(config, where),
    }
    spec = ModelSpec(
        name=name,
        source=source,
        layers=positive_int("num_hidden_layers"),
        hidden_size=hidden,
        attention_heads=heads,
        kv_heads=kv_heads,
        # MLA's per-head query·key width (qk_nope + qk_rope) where the config gives no head_dim
        head_dim=positive_int(
            "head_dim", mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"] if mla else hidden // heads
        ),
        intermediate_size=positive_int("intermediate_size"),
        vocab_size=positive_int("vocab_size"),
        dtype_bytes=DTYPE_BYTES[dtype],
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        # Qwen2 configs do not say so, but its q, k and v projections carry biases
        attention_bias=bool(config.get("attention_bias", config.get("model_type") == "qwen2")),
        max_context_tokens=positive_int("max_position_embeddings", 0),
        **layout,
    )
    if spec.dense_layers >= spec.layers:
        raise InputFileError(
            f"{where}: first_k_dense_replace {spec.dense_layers} leaves no MoE layer of {spec.layers}", config_hint()
        )
    return spec


def min_tensor_parallel(model: ModelSpec, gpu: GpuSpec, usable_ratio: float, reserve_bytes: int) -> int | None:
    """The smallest TP size that divides the heads and leaves room for KV after the weights, if any ≤ 64."""
    weights = model.weight_bytes
    for tp in range(1, 65):
        if model.attention_heads % tp == 0 and gpu.memory_bytes * usable_ratio - reserve_bytes > weights / tp:
            return tp
    return None


# --- the tables (probes/tables/), read once on import -------------------------------------------------------

GPUS_TABLE = "probes/tables/gpus.toml"
MODELS_TABLE = "probes/tables/models.toml"


def _refuse_clashing_names(path: str, names: Mapping[str, list[str]], key: Callable[[str], str]) -> None:
    """Two entries answering to one name (as the lookup folds names) would leave the lookup to pick by order."""
    seen: dict[str, str] = {}
    for entry, entry_names in names.items():
        for name in entry_names:
            other = seen.setdefault(key(name), entry)
            if other != entry:
                raise RuleSpecError(path, f"{entry}.aliases", f"'{name}' also names {other}")


def _interconnects() -> tuple[InterconnectEntry, dict[str, InterconnectSpec]]:
    """NVLink (its bandwidth is each GPU's own) and the PCIe links, by name."""
    entries = load_interconnect_table().interconnect
    nvlink = next(e for e in entries if e.name == NVLINK)  # the schema requires it
    pcie = {
        e.name: InterconnectSpec(e.name, e.description, e.bandwidth_bytes_per_second, e.allreduce_latency_seconds)
        for e in entries
        if e.bandwidth_bytes_per_second is not None
    }
    return nvlink, pcie


def _gpu_spec(entry: GpuEntry) -> GpuSpec:
    if entry.pcie not in PCIE_LINKS:
        raise RuleSpecError(GPUS_TABLE, f"{entry.name}.pcie", f"'{entry.pcie}' is none of {', '.join(PCIE_LINKS)}")
    return GpuSpec(
        name=entry.name,
        part=entry.part,
        memory_bytes=entry.memory_mib * MIB,
        hbm_bandwidth_bytes_per_second=entry.hbm_bandwidth_bytes_per_second,
        peak_bf16_flops_per_second=entry.peak_bf16_dense_flops_per_second,
        nvlink_bandwidth_bytes_per_second=entry.nvlink_bytes_per_second,
        pcie=entry.pcie,
        vllm_max_num_seqs=entry.vllm_max_num_seqs,
        vllm_max_num_batched_tokens=entry.vllm_max_num_batched_tokens,
        aliases=tuple(entry.aliases),
        peak_flops_per_second_by_dtype=_peaks(entry),
        gpu_link=entry.gpu_link,
    )


def _peaks(entry: GpuEntry) -> dict[str, float]:
    """The entry's dense peaks by precision, those the part has."""
    peaks = {
        "bf16": entry.peak_bf16_dense_flops_per_second,
        "fp16": entry.peak_fp16_dense_flops_per_second,
        "fp8": entry.peak_fp8_dense_flops_per_second,
        "fp4": entry.peak_fp4_dense_flops_per_second,
        "int8": entry.peak_int8_dense_ops_per_second,
        "int4": entry.peak_int4_dense_ops_per_second,
    }
    return {dtype: peak for dtype, peak in peaks.items() if peak is not None}


def _gpus() -> dict[str, GpuSpec]:
    entries = load_gpu_table().gpu
    _refuse_clashing_names(GPUS_TABLE, {g.name: [g.name, g.part, *g.aliases] for g in entries}, _key)
    return {g.name: _gpu_spec(g) for g in entries}


def _model_spec(entry: ModelEntry) -> ModelSpec:
    config = entry.config.model_dump(exclude_none=True)
    try:
        spec = model_from_config(config, name=entry.name, source=entry.huggingface, where=f"{entry.name} config")
    except InputFileError as exc:
        raise RuleSpecError(MODELS_TABLE, f"{entry.name}.config", exc.message) from None
    return replace(spec, aliases=tuple(entry.aliases))


def _models() -> dict[str, ModelSpec]:
    entries = load_model_table().model
    names = {m.name: [m.name, m.huggingface, *m.aliases] for m in entries}
    _refuse_clashing_names(MODELS_TABLE, names, _model_key)
    return {m.name: _model_spec(m) for m in entries}


_NVLINK, PCIE_LINKS = _interconnects()
NVLINK_DESCRIPTION = _NVLINK.description
NVLINK_ALLREDUCE_LATENCY_SECONDS = _NVLINK.allreduce_latency_seconds
GPUS = _gpus()
MODELS = _models()
