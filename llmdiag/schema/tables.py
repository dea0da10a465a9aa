"""The physics' data tables (probes/tables/): GPUs, the links between them, and model shapes, each figure sourced.

    gpus.toml           one [[gpu]] per part: memory, HBM bandwidth, dense peaks per precision, GPU link, PCIe,
                        vLLM's batch caps
    interconnects.toml  one [[interconnect]] per tensor-parallel link: achieved bandwidth, all-reduce latency
    models.toml         one [[model]] per model: the fields of its Hugging Face config.json, verbatim

Every figure of a GPU or interconnect names its source in the entry's ``sources`` table (a figure without one is
refused); a model's figures are its config.json's, whose address the entry gives. What the figures mean (bytes,
the dense peak, per direction) is in ``llmdiag.physics.hardware``, which turns these entries into its specs.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any, TypeVar

from pydantic import BaseModel, Field, model_validator

from llmdiag.schema.base import _Strict
from llmdiag.schema.loader import _parse

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
NVLINK = "nvlink"  # the interconnect whose bandwidth is each GPU's own
Table = TypeVar("Table", bound=BaseModel)


class _Sourced(_Strict):
    """An entry whose figures each name where they come from: ``sources`` maps a figure's field to its source."""

    sources: dict[str, str]

    @model_validator(mode="after")
    def _every_figure_sourced(self) -> _Sourced:
        figures = set(type(self).model_fields) - {"name", "part", "description", "aliases", "sources", "gpu_link"}
        unknown = set(self.sources) - figures
        if unknown:
            raise ValueError(f"sources name no figure of this entry: {', '.join(sorted(unknown))}")
        unsourced = [f for f in sorted(figures) if getattr(self, f) is not None and not self.sources.get(f, "").strip()]
        if unsourced:
            raise ValueError(f"figures without a source: {', '.join(unsourced)}")
        return self


class GpuEntry(_Sourced):
    name: str = Field(pattern=NAME_PATTERN)
    part: str = Field(min_length=1)
    aliases: list[str] = Field(default_factory=list)
    memory_mib: int = Field(gt=0)  # as nvidia-smi reports it: what vLLM sizes its KV cache from
    hbm_bandwidth_bytes_per_second: float = Field(gt=0)
    # Dense Tensor Core / Matrix Core peaks, without 2:4 sparsity (which serving does not use); None: the part has
    # no such unit. int8 and int4 are integer operations per second (a multiply-add counts 2, as for FLOPs).
    peak_bf16_dense_flops_per_second: float = Field(gt=0)
    peak_fp16_dense_flops_per_second: float = Field(gt=0)
    peak_fp8_dense_flops_per_second: float | None = Field(default=None, gt=0)
    peak_fp4_dense_flops_per_second: float | None = Field(default=None, gt=0)
    peak_int8_dense_ops_per_second: float | None = Field(default=None, gt=0)
    peak_int4_dense_ops_per_second: float | None = Field(default=None, gt=0)
    # the GPU-to-GPU link (NVLink, AMD Infinity Fabric), per direction; None: the GPUs talk over PCIe
    nvlink_bytes_per_second: float | None = Field(default=None, gt=0)
    gpu_link: str = "NVLink"  # what the part's GPU-to-GPU link is called
    pcie: str  # the [[interconnect]] this part's PCIe link is
    vllm_max_num_seqs: int = Field(ge=1)  # vLLM's defaults for its OpenAI server on this part
    vllm_max_num_batched_tokens: int = Field(ge=1)


class GpuTable(_Strict):
    gpu: list[GpuEntry] = Field(min_length=1)


class InterconnectEntry(_Sourced):
    name: str = Field(pattern=NAME_PATTERN)
    description: str = Field(min_length=1)
    # per GPU, per direction, as a transfer achieves it; None: the GPU's own figure (NVLink, gpus.toml)
    bandwidth_bytes_per_second: float | None = Field(default=None, gt=0)
    allreduce_latency_seconds: float = Field(gt=0)  # the fixed cost of one all-reduce, however small


class InterconnectTable(_Strict):
    interconnect: list[InterconnectEntry] = Field(min_length=1)

    @model_validator(mode="after")
    def _nvlink_takes_the_gpus_bandwidth(self) -> InterconnectTable:
        if not any(e.name == NVLINK for e in self.interconnect):
            raise ValueError(f"no '{NVLINK}' entry (its bandwidth is each GPU's own)")
        for e in self.interconnect:
            if (e.bandwidth_bytes_per_second is None) != (e.name == NVLINK):
                raise ValueError(f"{e.name}: only '{NVLINK}' leaves bandwidth_bytes_per_second to the GPU")
        return self


class HfConfig(_Strict):
    """The config.json fields the physics reads (``llmdiag.physics.hardware.model_from_config``), as published."""

    model_type: str | None = None
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int | None = None
    num_local_experts: int | None = None  # Mixtral, gpt-oss
    num_experts: int | None = None  # Qwen-MoE
    n_routed_experts: int | None = None  # DeepSeek
    num_experts_per_tok: int | None = None
    experts_per_token: int | None = None  # gpt-oss's second spelling of num_experts_per_tok
    moe_intermediate_size: int | None = None
    n_shared_experts: int | None = None
    shared_expert_intermediate_size: int | None = None
    first_k_dense_replace: int | None = None
    moe_layer_freq: int | None = None
    decoder_sparse_step: int | None = None
    mlp_only_layers: list[int] | None = None
    # multi-head latent attention (DeepSeek-V2/V3)
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    # sliding-window layers (gpt-oss)
    sliding_window: int | None = None
    layer_types: list[str] | None = None
    tie_word_embeddings: bool | None = None
    attention_bias: bool | None = None
    torch_dtype: str | None = None
    quantization_config: dict[str, Any] | None = None  # fp8 (DeepSeek) and mxfp4 (gpt-oss) are modelled


class PublishedParameters(_Strict):
    """The parameter count the model's publisher gives: the shape's own count must match it."""

    total_billions: float = Field(gt=0)
    active_billions: float | None = Field(default=None, gt=0)  # an MoE's per-token share
    # Some publishers leave the input embedding out of the active count (a table lookup, not a matmul): gpt-oss,
    # DeepSeek. Others count it (Mistral's 12.9B for Mixtral 8x7B).
    active_excludes_input_embedding: bool = False
    # The unit of the last digit the publisher gives ("37B": 1, "3.3B": 0.1): the shape's count must fall within
    # one such unit (the figure may be rounded or cut), or within 0.5 %, whichever is wider.
    precision_billions: float | None = Field(default=None, gt=0)
    source: str = Field(min_length=1)


class ModelEntry(_Strict):
    name: str = Field(pattern=NAME_PATTERN)
    aliases: list[str] = Field(default_factory=list)
    huggingface: str = Field(pattern=r"^[\w.-]+/[\w.-]+$")  # the repository id
    source: str = Field(min_length=1)  # where config holds its figures from: the config.json's address
    published_parameters: PublishedParameters | None = None
    config: HfConfig


class ModelTable(_Strict):
    model: list[ModelEntry] = Field(min_length=1)


def _load(name: str, model: type[Table]) -> Table:
    entry = resources.files("llmdiag.probes").joinpath("tables").joinpath(f"{name}.toml")
    return _parse(model, f"probes/tables/{name}.toml", entry.read_text(encoding="utf-8"))


@cache
def load_gpu_table() -> GpuTable:
    return _load("gpus", GpuTable)


@cache
def load_interconnect_table() -> InterconnectTable:
    return _load("interconnects", InterconnectTable)


@cache
def load_model_table() -> ModelTable:
    return _load("models", ModelTable)
