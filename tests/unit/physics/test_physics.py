"""The physics formulas and hardware tables against numbers worked out by hand (the arithmetic is in comments).

Reference deployment unless a test says otherwise: Llama 3 8B (bf16) on one H100 SXM, vLLM defaults
(gpu_memory_utilization 0.92, 16-token blocks), 2 GiB activation reserve, 2 ms scheduler overhead.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmdiag.errors import InputFileError, UsageError
from llmdiag.physics.hardware import GPUS, MODELS, find_gpu, find_model, interconnect_for, load_model_config
from llmdiag.physics.step import (
    Deployment,
    StepLoad,
    allreduce_seconds,
    decode_load,
    experts_touched_ratio,
    hbm_bytes_per_gpu,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    kv_capacity,
    max_batch_sequences,
    prefill_load,
    step_flops,
    step_time,
    weight_bytes,
    weight_bytes_read,
)

LLAMA8 = MODELS["llama-3-8b"]
LLAMA70 = MODELS["llama-3-70b"]
MIXTRAL = MODELS["mixtral-8x7b"]
H100 = GPUS["H100"]


def h100_llama8() -> Deployment:
    return Deployment(gpu=H100, model=LLAMA8)


# --- hardware tables --------------------------------------------------------------------------------------


def test_llama_3_8b_parameter_count_by_hand():
    # embedding 128256·4096 = 525,336,576, and an untied lm_head of the same size: 1,050,673,152
    # per layer: q and o 2·4096·4096 = 33,554,432; k and v 2·4096·(8·128) = 8,388,608;
    #            MLP 3·4096·14336 = 176,160,768; two norms 2·4096 = 8,192   → 218,112,000
    # 32 layers: 6,979,584,000; + final norm 4,096 → 6,979,584,000 + 1,050,673,152 + 4,096
    assert LLAMA8.total_params == 8_030_261_248
    assert LLAMA8.active_params == LLAMA8.total_params
    # weights in bf16: 8,030,261,248 · 2
    assert weight_bytes(LLAMA8) == 16_060_522_496


def test_mixtral_total_and_active_parameters_by_hand():
    # per layer: attention 33,554,432 + 8,388,608 = 41,943,040; one expert 3·4096·14336 = 176,160,768;
    #            router 4096·8 = 32,768; norms 8,192
    # all 8 experts: 41,943,040 + 8·176,160,768 + 32,768 + 8,192 = 1,451,270,144 per layer
    #   · 32 = 46,440,644,608; + embeddings 2·32000·4096 = 262,144,000; + final norm 4,096
    assert MIXTRAL.total_params == 46_702_792_704
    # 2 experts: 41,943,040 + 2·176,160,768 + 32,768 + 8,192 = 394,305,536 per layer
    #   · 32 = 12,617,777,152; + 262,144,000 + 4,096
    assert MIXTRAL.active_params == 12_879_925_248


# the model cards' parameter counts: test_tables.py (models.toml carries them)


def test_gpu_table_matches_the_datasheets():
    # nvidia-smi's 81559 MiB = 81559·1,048,576 bytes
    assert H100.memory_bytes == 85_520_809_984
    assert H100.hbm_bandwidth_bytes_per_second == 3.35e12
    assert H100.peak_bf16_flops_per_second == 989.4e12  # 1979 "with sparsity" / 2
    assert GPUS["H200"].hbm_bandwidth_bytes_per_second == 4.8e12
    assert GPUS["A100"].peak_bf16_flops_per_second == 312e12
    assert GPUS["L4"].nvlink_bandwidth_bytes_per_second is None


def test_names_resolve_case_and_punctuation_blind():
    assert find_gpu("h100").name == "H100"
    assert find_gpu("H100-SXM").name == "H100"
    assert find_model("Llama-3-8B").name == "llama-3-8b"
    assert find_model("meta-llama/Meta-Llama-3-8B-Instruct").name == "llama-3-8b"
    assert find_model("Qwen/Qwen2.5-72B-Instruct").name == "qwen2.5-72b"


def test_unknown_names_list_the_known_ones():
    with pytest.raises(UsageError) as gpu:
        find_gpu("B900")
    assert "H100, H200, A100, L4" in gpu.value.hint and "MI300X" in gpu.value.hint
    with pytest.raises(UsageError) as model:
        find_model("gpt-5")
    assert "llama-3-8b" in model.value.hint and "model_config" in model.value.hint


def test_interconnect_defaults_and_refusals():
    assert interconnect_for(H100).name == "nvlink"
    assert interconnect_for(H100).bandwidth_bytes_per_second == 450e9
    assert interconnect_for(GPUS["A100"]).bandwidth_bytes_per_second == 300e9
    assert interconnect_for(GPUS["L4"]).name == "pcie4"
    assert interconnect_for(H100, "pcie5").bandwidth_bytes_per_second == 50e9
    with pytest.raises(UsageError, match="no NVLink"):
        interconnect_for(GPUS["L4"], "nvlink")
    with pytest.raises(UsageError, match="unknown interconnect"):
        interconnect_for(H100, "infiniband")


# --- HF config.json loader -------------------------------------------------------------------------------

LLAMA_3_8B_CONFIG = {  # meta-llama/Meta-Llama-3-8B config.json (the fields that matter)
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}


def write(tmp_path: Path, config: object) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_loader_reads_a_llama_config_like_the_table(tmp_path: Path):
    spec = load_model_config(write(tmp_path, LLAMA_3_8B_CONFIG))
    assert spec.total_params == LLAMA8.total_params
    assert kv_bytes_per_token(spec) == 131_072
    assert spec.head_dim == 128  # 4096 / 32, derived
    assert spec.max_context_tokens == 8192


def test_loader_reads_mixtral_experts_and_qwen_biases(tmp_path: Path):
    mixtral = {**LLAMA_3_8B_CONFIG, "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2}
    spec = load_model_config(write(tmp_path, mixtral))
    assert (spec.experts, spec.active_experts) == (8, 2)
    assert spec.total_params == MIXTRAL.total_params
    qwen = {
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
    }
    assert load_model_config(write(tmp_path, qwen)).total_params == MODELS["qwen2.5-7b"].total_params


def test_loader_descends_into_text_config(tmp_path: Path):
    spec = load_model_config(write(tmp_path, {"model_type": "llava", "text_config": LLAMA_3_8B_CONFIG}))
    assert spec.total_params == LLAMA8.total_params


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object was expected"),
        (json.dumps({k: v for k, v in LLAMA_3_8B_CONFIG.items() if k != "hidden_size"}), "'hidden_size' is missing"),
        (json.dumps({**LLAMA_3_8B_CONFIG, "num_hidden_layers": -1}), "'num_hidden_layers' must be a positive"),
        (json.dumps({**LLAMA_3_8B_CONFIG, "num_key_value_heads": 5}), "not a multiple of 5 KV heads"),
        (json.dumps({**LLAMA_3_8B_CONFIG, "kv_lora_rank": 512}), "field 'qk_nope_head_dim' is missing"),
        (json.dumps({**LLAMA_3_8B_CONFIG, "quantization_config": {"bits": 4}}), "quant_method None"),
        (json.dumps({**LLAMA_3_8B_CONFIG, "quantization_config": {"quant_method": "awq"}}), "'awq'"),
        (json.dumps({**LLAMA_3_8B_CONFIG, "mamba_d_state": 16}), "'mamba_d_state' is not supported"),
        (json.dumps({**LLAMA_3_8B_CONFIG, "num_experts": 8, "mlp_only_layers": [0]}), "dense layers between"),
        (json.dumps({**LLAMA_3_8B_CONFIG, "layer_types": ["linear_attention"] * 32}), "layer_types entry"),
        (json.dumps({**LLAMA_3_8B_CONFIG, "layer_types": ["full_attention"] * 31}), "names 31 layers"),
        (json.dumps({**LLAMA_3_8B_CONFIG, "num_experts": 8, "n_shared_experts": -1}), "'n_shared_experts' must be"),
        (json.dumps({**LLAMA_3_8B_CONFIG, "torch_dtype": "int8"}), "dtype 'int8'"),
    ],
)
def test_loader_rejects_bad_configs_with_a_reason(tmp_path: Path, content: str, message: str):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(InputFileError, match=message) as error:
        load_model_config(path)
    assert error.value.hint


def test_loader_missing_file(tmp_path: Path):
    with pytest.raises(InputFileError, match="no such file"):
        load_model_config(tmp_path / "absent.json")


# --- KV cache -----------------------------------------------------------------------------------------------


def test_kv_bytes_per_token_by_hand():
    assert kv_bytes_per_token(LLAMA8) == 131_072  # 2·32·8·128·2
    assert kv_bytes_per_token(LLAMA70) == 327_680  # 2·80·8·128·2
    assert kv_bytes_per_token(MODELS["qwen2.5-7b"]) == 57_344  # 2·28·4·128·2
    assert kv_bytes_per_token(MIXTRAL) == 131_072  # 2·32·8·128·2: experts do not change attention
    assert kv_bytes_per_token(LLAMA8, kv_dtype_bytes=1) == 65_536  # FP8 KV: 2·32·8·128·1


def test_kv_bytes_per_gpu_split_and_replicated():
    # TP 4: 8 KV heads → 2 per GPU: 2·80·2·128·2
    assert kv_bytes_per_token_per_gpu(Deployment(gpu=H100, model=LLAMA70, tp=4)) == 81_920
    # TP 16 > 8 KV heads: vLLM replicates, one head per GPU: 2·80·1·128·2
    assert kv_bytes_per_token_per_gpu(Deployment(gpu=H100, model=LLAMA70, tp=16)) == 40_960


def test_kv_capacity_by_hand():
    cap = kv_capacity(h100_llama8())
    # usable: 85,520,809,984 · 0.92 = 78,679,145,185.28
    assert cap.usable_bytes_per_gpu == pytest.approx(78_679_145_185.28)
    # minus weights 16,060,522,496 and reserve 2 GiB = 2,147,483,648 → 60,471,139,041.28
    assert cap.kv_cache_bytes_per_gpu == pytest.approx(60_471_139_041.28)
    # a block: 16 tokens · 131,072 = 2,097,152 bytes; 60,471,139,041.28 / 2,097,152 = 28,834.9 → 28,834
    assert cap.blocks == 28_834
    assert cap.tokens == 461_344  # 28,834 · 16


def test_largest_batch_by_hand():
    # 500 + 200 = 700 tokens → ⌈700/16⌉ = 44 blocks; 28,834 // 44 = 655 (655·44 = 28,820 ≤ 28,834 < 656·44)
    assert max_batch_sequences(h100_llama8(), 700) == 655
    # exactly 1 block per 16 tokens: 28,834 sequences of 16
    assert max_batch_sequences(h100_llama8(), 16) == 28_834


# --- step physics ---------------------------------------------------------------------------------------------


def test_loads_by_hand():
    assert decode_load(8, 600) == StepLoad(new_tokens=8, attended_tokens=4800, kv_read_tokens=4800)
    # a 500-token prompt from scratch: token i attends to i tokens, Σ = 500·501/2 = 125,250
    assert prefill_load(500) == StepLoad(new_tokens=500, attended_tokens=125_250, kv_read_tokens=500)
    # a 50-token chunk after 100 cached: 50·100 + 50·51/2 = 5,000 + 1,275; reads 150 tokens of KV
    assert prefill_load(50, cached_tokens=100) == StepLoad(50, 6_275, 150)
    assert decode_load(1, 10) + prefill_load(4) == StepLoad(5, 20, 14)  # 10 + 4·5/2 = 20; 10 + 4 = 14


def test_flops_by_hand():
    # decode of 1 token at context 600: 2·8,030,261,248 + 4·32·(32·128)·600 = 16,060,522,496 + 314,572,800
    assert step_flops(LLAMA8, decode_load(1, 600)) == 16_375_095_296
    # Mixtral computes with its active parameters only: 2·12,879,925,248 + 4·32·4096·1
    assert step_flops(MIXTRAL, decode_load(1, 1)) == 25_759_850_496 + 524_288


def test_moe_weight_bytes_read_by_hand():
    # one token uses 2 of 8 experts: 1 − (1 − 2/8)^1 = 0.25; two tokens: 1 − 0.75² = 0.4375
    assert experts_touched_ratio(MIXTRAL, 1) == 0.25
    assert experts_touched_ratio(MIXTRAL, 2) == 0.4375
    # shared part 46,702,792,704 − 45,097,156,608 (32·8·176,160,768) = 1,605,636,096;
    # + 45,097,156,608·0.25 = 11,274,289,152 → 12,879,925,248 parameters: exactly the active ones, · 2 bytes
    assert weight_bytes_read(MIXTRAL, 1) == 25_759_850_496
    # a big batch touches every expert: all 46.7 B parameters stream
    assert weight_bytes_read(MIXTRAL, 10_000) == pytest.approx(weight_bytes(MIXTRAL))
    assert weight_bytes_read(LLAMA8, 1) == weight_bytes(LLAMA8)


def test_single_stream_decode_step_by_hand():
    step = step_time(h100_llama8(), decode_load(1, 600))
    # compute: 16,375,095,296 / 989.4e12 = 16.55 µs
    assert step.compute_seconds == pytest.approx(16_375_095_296 / 989.4e12)
    assert step.compute_seconds == pytest.approx(16.5505e-6, rel=1e-4)
    # HBM: weights 16,060,522,496 + KV 131,072·(600 read + 1 written) = 16,060,522,496 + 78,774,272
    assert hbm_bytes_per_gpu(h100_llama8(), decode_load(1, 600)) == 16_139_296_768
    # 16,139,296,768 / 3.35e12 = 4.8177 ms; + 2 ms scheduler = 6.8177 ms → 146.7 tokens/s
    assert step.memory_seconds == pytest.approx(4.81770e-3, rel=1e-5)
    assert step.step_seconds == pytest.approx(6.81770e-3, rel=1e-5)
    assert step.bound_by == "hbm_bandwidth"
    assert step.allreduce_seconds == 0.0


def test_prefill_chunk_is_compute_bound_by_hand():
    # 8192 tokens of 500-token prompts (16.384 prompts): 2·8,030,261,248·8192 = 131,567,800,287,232
    #   + 524,288 · 16.384·125,250 (= 2,052,096) = 1,075,889,455,104 → 132,643,689,742,336 FLOPs
    step = step_time(h100_llama8(), prefill_load(500, 8192 / 500))
    assert step.flops == pytest.approx(132_643_689_742_336)
    # / 989.4e12 = 134.06 ms ≫ memory (16,060,522,496 + 131,072·16,384) / 3.35e12 = 5.44 ms
    assert step.compute_seconds == pytest.approx(0.1340648, rel=1e-6)
    assert step.memory_seconds == pytest.approx(18_208_006_144 / 3.35e12)
    assert step.bound_by == "compute"
    assert step.step_seconds == pytest.approx(0.1340648 + 0.002, rel=1e-6)


def test_allreduce_by_hand():
    # Llama 3 70B, TP 4 on NVLink, 64 tokens: message 64·8192·2 = 1,048,576 bytes; ring 2·3/4 of it = 1,572,864
    # per all-reduce 10 µs + 1,572,864 / 450e9 = 10 µs + 3.49525 µs; 2·80 = 160 of them = 2.15924 ms
    dep = Deployment(gpu=H100, model=LLAMA70, tp=4)
    assert allreduce_seconds(dep, 64) == pytest.approx(160 * (10e-6 + 1_572_864 / 450e9))
    assert allreduce_seconds(dep, 64) == pytest.approx(2.15924e-3, rel=1e-5)
    # Llama 3 8B, TP 8 over PCIe Gen4, 256 tokens: 256·4096·2 = 2,097,152; ring 2·7/8 → 3,670,016 bytes
    # per all-reduce 30 µs + 3,670,016 / 25e9 = 30 + 146.80 µs; 64 of them = 11.315 ms
    pcie = Deployment(gpu=H100, model=LLAMA8, tp=8, interconnect=interconnect_for(H100, "pcie4"))
    assert allreduce_seconds(pcie, 256) == pytest.approx(11.31524e-3, rel=1e-5)
    step = step_time(pcie, decode_load(256, 600))
    assert step.bound_by == "interconnect"
    assert allreduce_seconds(h100_llama8(), 256) == 0.0  # TP 1


def test_tensor_parallel_splits_weights_and_compute():
    one, four = Deployment(gpu=H100, model=LLAMA70, tp=2), Deployment(gpu=H100, model=LLAMA70, tp=4)
    load = decode_load(1, 100)
    assert step_time(four, load).compute_seconds == pytest.approx(step_time(one, load).compute_seconds / 2)
    # weights 141,107,412,992 bytes / 4 per GPU + KV 81,920·101
    assert hbm_bytes_per_gpu(four, load) == pytest.approx(141_107_412_992 / 4 + 81_920 * 101)


def test_an_empty_step_costs_only_the_scheduler():
    step = step_time(h100_llama8(), StepLoad())
    assert step.step_seconds == 0.002 and step.bound_by == "scheduler"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp": 3}, "does not divide llama-3-8b's 32 attention heads"),
        ({"tp": 0}, "at least 1"),
        ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"compute_efficiency": 0.0}, "efficiencies"),
    ],
)
def test_deployment_refuses_impossible_settings(kwargs: dict[str, float], message: str):
    with pytest.raises(UsageError, match=message):
        Deployment(gpu=H100, model=LLAMA8, **kwargs)  # type: ignore[arg-type]
