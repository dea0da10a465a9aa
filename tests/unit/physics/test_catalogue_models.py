"""The wider model catalogue: MLA's KV (DeepSeek), fine-grained MoE with shared experts and leading dense layers,
sliding-window layers and MXFP4 experts (gpt-oss), and real config.json texts read as a --model-config reads them
(tests/fixtures/hf-config/PROVENANCE.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmdiag.errors import InputFileError
from llmdiag.physics.hardware import GPUS, MODELS, load_model_config
from llmdiag.physics.step import (
    Deployment,
    StepLoad,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    kv_capacity,
    sliding_window_kv_bytes_per_sequence,
    step_flops,
    weight_bytes,
    weight_bytes_read,
)
from tests.conftest import FIXTURES

HF_CONFIGS = FIXTURES / "hf-config"
DEEPSEEK_V3 = MODELS["deepseek-v3"]


def test_deepseek_v3_kv_per_token_is_its_latent_not_its_heads():
    # config.json: kv_lora_rank 512, qk_rope_head_dim 64, num_hidden_layers 61, torch_dtype bfloat16 (2 bytes).
    # MLA caches one 512-wide latent and one 64-wide rope key per token and layer:
    #   (512 + 64) · 61 · 2 = 576 · 122 = 70,272 bytes
    assert kv_bytes_per_token(DEEPSEEK_V3) == 70_272
    # not what 2 · L · n_kv · d · b gives for its 128 heads of 128 (qk_nope) — 2 · 61 · 128 · 128 · 2 = 3,997,696:
    # ordinary attention's formula would price it 57 times too high
    assert 2 * 61 * 128 * 128 * 2 == 3_997_696 != kv_bytes_per_token(DEEPSEEK_V3)
    assert kv_bytes_per_token(DEEPSEEK_V3, kv_dtype_bytes=1) == 576 * 61  # FP8 KV: 35,136


def test_mla_latent_is_whole_on_every_tensor_parallel_rank():
    for tp in (1, 8):
        dep = Deployment(gpu=GPUS["MI300X"], model=DEEPSEEK_V3, tp=tp)
        assert kv_bytes_per_token_per_gpu(dep) == 70_272  # vLLM replicates the MLA cache; heads do not split it


def test_deepseek_v3_weights_are_its_fp8_checkpoint():
    # quantization_config quant_method fp8: 1 byte a weight; 671.03 B parameters (the shape's own count)
    assert DEEPSEEK_V3.weight_bytes == DEEPSEEK_V3.total_params == weight_bytes(DEEPSEEK_V3)
    # by hand: MLA attention per layer 7168·1536 + 1536 + 1536·128·192 + 7168·576 + 512 + 512·128·256 + 128·128·7168
    # = 187,107,328; dense MLP 3·7168·18432; MoE MLP (256 + 1 shared)·3·7168·2048 + router 7168·256; norms 2·7168;
    # embedding and lm_head 2·129280·7168; final norm 7168
    attention, norms = 187_107_328, 2 * 7168
    dense = 3 * (attention + 3 * 7168 * 18432 + norms)
    moe = 58 * (attention + 257 * 3 * 7168 * 2048 + 7168 * 256 + norms)
    assert DEEPSEEK_V3.total_params == dense + moe + 2 * 129280 * 7168 + 7168 == 671_026_404_352
    # one decode token reads the shared part and 8 of 256 routed experts (+1 shared) per MoE layer
    routed = DEEPSEEK_V3.all_expert_params
    assert routed == 58 * 256 * 3 * 7168 * 2048
    one_token = weight_bytes_read(DEEPSEEK_V3, 1)
    assert one_token == pytest.approx((DEEPSEEK_V3.total_params - routed) + routed * 8 / 256)


def test_mla_attention_flops_use_its_query_key_and_value_widths():
    # 2 · L · n_h · (d_qk + d_v) per query·key pair: 2 · 61 · 128 · (192 + 128)
    load = StepLoad(new_tokens=0, attended_tokens=1)
    assert step_flops(DEEPSEEK_V3, load) == 2 * 61 * 128 * (128 + 64 + 128)
    # a dense model keeps 4 · L · n_h · d
    llama = MODELS["llama-3.1-8b"]
    assert step_flops(llama, load) == 4 * 32 * 32 * 128


def test_gpt_oss_keeps_full_kv_only_in_its_full_attention_layers():
    model = MODELS["gpt-oss-120b"]
    # layer_types: 18 sliding_attention + 18 full_attention; 8 KV heads of 64; bf16
    assert (model.sliding_layers, model.sliding_window_tokens) == (18, 128)
    assert kv_bytes_per_token(model) == 2 * 18 * 8 * 64 * 2  # 36,864
    assert sliding_window_kv_bytes_per_sequence(model) == 128 * 18 * 2 * 8 * 64 * 2


def test_gpt_oss_experts_are_mxfp4_and_the_rest_16_bit():
    model = MODELS["gpt-oss-120b"]
    experts = model.all_expert_params
    assert experts == 36 * 128 * 3 * 2880 * 2880
    assert model.weight_bytes == round((model.total_params - experts) * 2 + experts * 4.25 / 8)
    # ~65 GB: fits one 80 GB H100 with room for KV, as OpenAI says it does
    assert 60e9 < model.weight_bytes < 70e9
    assert kv_capacity(Deployment(gpu=GPUS["H100"], model=model)).tokens > 0


def test_qwen3_moe_experts_take_their_own_width():
    model = MODELS["qwen3-30b-a3b"]
    assert model.expert_params == 3 * 2048 * 768  # moe_intermediate_size, not intermediate_size 6144
    assert model.moe_layers == 48 and model.dense_layers == 0


def test_a_real_deepseek_r1_config_json_reads_as_the_table_entry():
    spec = load_model_config(HF_CONFIGS / "deepseek-r1.config.json")
    table = MODELS["deepseek-r1"]
    same = ("total_params", "active_params", "weight_bytes", "all_expert_params")
    assert all(getattr(spec, f) == getattr(table, f) for f in same)
    assert kv_bytes_per_token(spec) == 70_272 and spec.is_mla and spec.dense_layers == 3
    assert spec.max_context_tokens == 163_840


def test_a_real_llama_config_json_reads_as_llama_3_1_70b():
    spec = load_model_config(HF_CONFIGS / "llama-3.3-70b-instruct.config.json")
    assert spec.total_params == MODELS["llama-3.1-70b"].total_params
    assert kv_bytes_per_token(spec) == 2 * 80 * 8 * 128 * 2


def test_an_mla_config_without_its_head_widths_names_the_missing_field(tmp_path: Path):
    config = json.loads((HF_CONFIGS / "deepseek-r1.config.json").read_text())
    del config["v_head_dim"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(InputFileError, match="field 'v_head_dim' is missing"):
        load_model_config(path)


def test_a_real_gpt_oss_120b_config_json_reads_as_the_table_entry():
    spec = load_model_config(HF_CONFIGS / "gpt-oss-120b.config.json")
    table = MODELS["gpt-oss-120b"]
    same = ("total_params", "active_params", "weight_bytes", "sliding_layers", "sliding_window_tokens")
    assert all(getattr(spec, f) == getattr(table, f) for f in same)
    # 18 full-attention layers · 2 (K and V) · 8 KV heads · 64 · 2 bytes
    assert kv_bytes_per_token(spec) == 18 * 2 * 8 * 64 * 2


def test_a_real_qwen3_moe_config_json_reads_as_the_table_entry():
    spec = load_model_config(HF_CONFIGS / "qwen3-30b-a3b.config.json")
    table = MODELS["qwen3-30b-a3b"]
    assert (spec.total_params, spec.active_params) == (table.total_params, table.active_params)
    assert spec.expert_params == 3 * 2048 * 768 and spec.experts == 128 and spec.active_experts == 8
    # sliding_window null and use_sliding_window false: every layer keeps the whole context
    assert spec.sliding_layers == 0 and kv_bytes_per_token(spec) == 2 * 48 * 4 * 128 * 2
