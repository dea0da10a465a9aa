"""The physics' data tables (probes/tables/): every figure sourced, strict on keys, consistent across files, and the
model shapes giving the parameter counts their publishers state. The values themselves are pinned by
test_physics.py (by hand) and the golden capacity grid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmdiag.errors import RuleSpecError
from llmdiag.physics.hardware import (
    GIB,
    GPUS,
    MIB,
    MODELS,
    _gpu_spec,
    _model_key,
    _model_spec,
    _refuse_clashing_names,
    find_gpu,
    interconnect_for,
    load_model_config,
)
from llmdiag.schema.loader import _parse
from llmdiag.schema.tables import (
    GpuEntry,
    GpuTable,
    InterconnectTable,
    ModelEntry,
    load_gpu_table,
    load_interconnect_table,
    load_model_table,
)

H100_ENTRY = """
[[gpu]]
name = "X1"
part = "X1 SXM 80GB"
memory_mib = 81559
hbm_bandwidth_bytes_per_second = 3.35e12
peak_bf16_dense_flops_per_second = 989.4e12
peak_fp16_dense_flops_per_second = 989.4e12
peak_fp8_dense_flops_per_second = 1978.9e12
pcie = "pcie5"
vllm_max_num_seqs = 1024
vllm_max_num_batched_tokens = 8192

[gpu.sources]
memory_mib = "nvidia-smi"
hbm_bandwidth_bytes_per_second = "datasheet"
peak_bf16_dense_flops_per_second = "datasheet"
peak_fp16_dense_flops_per_second = "datasheet"
peak_fp8_dense_flops_per_second = "datasheet"
pcie = "datasheet"
vllm_max_num_seqs = "arg_utils.py"
vllm_max_num_batched_tokens = "arg_utils.py"
"""


def gpu_table(text: str) -> GpuTable:
    return _parse(GpuTable, "probes/tables/gpus.toml", text)


def test_a_gpu_entry_with_every_figure_sourced_loads():
    [entry] = gpu_table(H100_ENTRY).gpu
    assert entry.memory_mib == 81559 and entry.nvlink_bytes_per_second is None


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (('memory_mib = "nvidia-smi"\n', ""), "figures without a source: memory_mib"),
        (('pcie = "datasheet"\n', 'pcie = " "\n'), "figures without a source: pcie"),
        (('peak_fp8_dense_flops_per_second = "datasheet"\n', ""), "without a source: peak_fp8_dense_flops"),
        (("[gpu.sources]\n", "[gpu.sources]\nmemory_gib = 'a typo'\n"), "sources name no figure of this entry"),
        (("memory_mib = 81559\n", "memory_mib = 81559\nmemory_gib = 80\n"), "Extra inputs are not permitted"),
        (("memory_mib = 81559\n", "memory_mib = 0\n"), "greater than 0"),
    ],
)
def test_a_gpu_entry_is_refused_with_the_field(edit: tuple[str, str], reason: str):
    old, new = edit
    assert old in H100_ENTRY
    with pytest.raises(RuleSpecError, match=reason) as info:
        gpu_table(H100_ENTRY.replace(old, new, 1))
    assert info.value.path == "probes/tables/gpus.toml" and info.value.field.startswith("gpu.0")


def interconnect(name: str, bandwidth: float | None) -> str:
    text = f'[[interconnect]]\nname = "{name}"\ndescription = "{name}"\nallreduce_latency_seconds = 1e-5\n'
    text += f"bandwidth_bytes_per_second = {bandwidth}\n" if bandwidth else ""
    text += '[interconnect.sources]\nallreduce_latency_seconds = "nccl-tests"\n'
    return text + ('bandwidth_bytes_per_second = "a guess"\n' if bandwidth else "")


def test_only_nvlink_takes_its_bandwidth_from_the_gpu():
    def table(text: str) -> InterconnectTable:
        return _parse(InterconnectTable, "probes/tables/interconnects.toml", text)

    assert len(table(interconnect("nvlink", None) + interconnect("pcie9", 1e9)).interconnect) == 2
    with pytest.raises(RuleSpecError, match="only 'nvlink' leaves bandwidth_bytes_per_second"):
        table(interconnect("nvlink", None) + interconnect("pcie9", None))
    with pytest.raises(RuleSpecError, match="no 'nvlink' entry"):
        table(interconnect("pcie9", 1e9))


def test_a_gpu_names_a_pcie_link_the_interconnects_table_has():
    [entry] = gpu_table(H100_ENTRY.replace('pcie = "pcie5"', 'pcie = "pcie9"')).gpu
    with pytest.raises(RuleSpecError, match="'pcie9' is none of pcie4, pcie5"):
        _gpu_spec(entry)


def test_two_entries_answering_to_one_name_are_refused():
    with pytest.raises(RuleSpecError, match="'H100-SXM' also names H100") as info:
        _refuse_clashing_names("probes/tables/gpus.toml", {"H100": ["H100", "h100-sxm"], "X": ["H100-SXM"]}, str.lower)
    assert info.value.field == "X.aliases"
    names = {"llama-3-8b": ["meta-llama/Meta-Llama-3-8B"], "other": ["Meta-Llama-3-8B-Instruct"]}
    with pytest.raises(RuleSpecError, match="also names llama-3-8b"):
        _refuse_clashing_names("probes/tables/models.toml", names, _model_key)


def test_the_shipped_tables_give_every_figure_a_source():
    for gpu in load_gpu_table().gpu:
        assert all(source.strip() for source in gpu.sources.values())
    for link in load_interconnect_table().interconnect:
        assert link.sources["allreduce_latency_seconds"].strip()
    for model in load_model_table().model:
        assert model.source.startswith(f"https://huggingface.co/{model.huggingface}/") and "config.json" in model.source


def test_vllm_batch_caps_follow_vllm_rule_for_every_gpu():
    # vllm/engine/arg_utils.py (0.32): >= 70 GiB and not an A100 -> 1024 sequences, 8192 tokens; else 256, 2048
    for gpu in GPUS.values():
        big = gpu.memory_bytes >= 70 * GIB and "a100" not in gpu.part.lower()
        expected = (1024, 8192) if big else (256, 2048)
        assert (gpu.vllm_max_num_seqs, gpu.vllm_max_num_batched_tokens) == expected, gpu.name


def test_gpu_memory_is_whole_mib_as_nvidia_smi_prints_it():
    assert all(gpu.memory_bytes % MIB == 0 for gpu in GPUS.values())


def published_tolerance_billions(figure: float, precision_billions: float | None) -> float:
    """0.5 %, or one unit of the last digit the publisher gives ("37B": ±1), whichever is wider."""
    return max(0.005 * figure, precision_billions or 0.0)


@pytest.mark.parametrize("entry", load_model_table().model, ids=lambda m: m.name)
def test_model_shapes_give_the_published_parameter_counts(entry: ModelEntry):
    published = entry.published_parameters
    assert published is not None, f"{entry.name}: give the model card's parameter count"
    model = MODELS[entry.name]
    tolerance = published_tolerance_billions(published.total_billions, published.precision_billions)
    assert model.total_params / 1e9 == pytest.approx(published.total_billions, abs=tolerance)
    if model.is_moe:
        assert published.active_billions is not None
        active = model.active_params
        if published.active_excludes_input_embedding:
            active -= model.vocab_size * model.hidden_size
        tolerance = published_tolerance_billions(published.active_billions, published.precision_billions)
        assert active / 1e9 == pytest.approx(published.active_billions, abs=tolerance)


@pytest.mark.parametrize("entry", load_model_table().model, ids=lambda m: m.name)
def test_a_table_entry_is_its_config_json(entry: ModelEntry, tmp_path: Path):
    """The table holds config.json fields verbatim: the same fields as a --model-config file give the same shape."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**entry.config.model_dump(exclude_none=True), "_name_or_path": entry.huggingface}))
    from_file = load_model_config(path)
    table = MODELS[entry.name]
    assert (from_file.name, from_file.source) == (entry.huggingface, str(path))
    assert from_file.__dict__ | {"name": table.name, "source": table.source, "aliases": table.aliases} == table.__dict__


def test_a_model_entry_with_an_impossible_shape_names_it():
    [entry] = load_model_table().model[:1]
    broken = entry.model_copy(update={"config": entry.config.model_copy(update={"num_key_value_heads": 5})})
    with pytest.raises(RuleSpecError, match="32 attention heads are not a multiple of 5 KV heads") as info:
        _model_spec(broken)
    assert info.value.path == "probes/tables/models.toml" and info.value.field == "llama-3-8b.config"


def test_a_model_config_field_the_reader_does_not_know_is_refused():
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        ModelEntry.model_validate(
            {
                "name": "x",
                "huggingface": "a/b",
                "source": "https://huggingface.co/a/b/blob/main/config.json",
                "config": {"hidden_size": 1, "num_hidden_layers": 1, "num_attention_heads": 1}
                | {"intermediate_size": 1, "vocab_size": 1, "rope_theta": 1e6},
            }
        )


def test_gpu_entries_keep_their_aliases():
    entry = GpuEntry.model_validate(gpu_table(H100_ENTRY).gpu[0].model_dump() | {"aliases": ["x1-80gb"]})
    assert _gpu_spec(entry).aliases == ("x1-80gb",)


def test_a_gpu_gives_its_dense_peak_per_precision_and_none_where_it_has_no_unit():
    [entry] = gpu_table(H100_ENTRY).gpu
    spec = _gpu_spec(entry)
    assert spec.peak_flops_per_second("fp8") == 1978.9e12 and spec.peak_flops_per_second("bf16") == 989.4e12
    assert spec.peak_flops_per_second("int4") is None  # not in the entry: the part has no such unit
    assert set(spec.peak_flops_per_second_by_dtype) == {"bf16", "fp16", "fp8"}
    with pytest.raises(ValueError, match="unknown precision 'fp64'"):
        spec.peak_flops_per_second("fp64")


CATALOGUE_MODELS = [
    *("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen2.5-7b", "qwen2.5-72b", "qwen3-8b", "qwen3-32b"),
    *("qwen3-30b-a3b", "qwen3-235b-a22b", "mistral-7b", "mixtral-8x7b", "mixtral-8x22b", "deepseek-v3"),
    *("deepseek-r1", "gpt-oss-20b", "gpt-oss-120b"),
]


def test_the_catalogue_has_the_models_served_most():
    assert set(CATALOGUE_MODELS) <= set(MODELS)
    assert all(MODELS[name].is_moe for name in ("qwen3-30b-a3b", "deepseek-v3", "gpt-oss-20b", "mixtral-8x22b"))


CATALOGUE_GPUS = ["H100", "H100-PCIe", "H200", "B200", "GB200", "A100", "A100-40GB", "L40S", "L4", "A10G", "RTX4090"]


def test_the_catalogue_has_the_parts_serving_runs_on():
    assert set(CATALOGUE_GPUS + ["MI300X", "MI325X"]) <= set(GPUS)


@pytest.mark.parametrize("entry", load_gpu_table().gpu, ids=lambda g: g.name)
def test_every_gpu_memory_figure_says_whether_the_device_reported_it(entry: GpuEntry):
    source = entry.sources["memory_mib"]
    assert "nvidia-smi" in source or "rocm-smi" in source or source.startswith("datasheet figure")


@pytest.mark.parametrize("entry", load_gpu_table().gpu, ids=lambda g: g.name)
def test_every_peak_is_a_dense_rate_ordered_as_the_units_are(entry: GpuEntry):
    peaks = _gpu_spec(entry).peak_flops_per_second_by_dtype
    # a narrower format never runs slower on the same Tensor/Matrix Cores
    for wide, narrow in [("bf16", "fp8"), ("fp8", "fp4"), ("int8", "int4"), ("bf16", "int8")]:
        if wide in peaks and narrow in peaks:
            assert peaks[narrow] >= peaks[wide], (entry.name, wide, narrow)
    # no "with sparsity" figure slipped in: each source tells the dense figure from the sparse (or the
    # accumulate mode taken), or says there is no datasheet
    for dtype, field in [("fp8", "peak_fp8_dense_flops_per_second"), ("bf16", "peak_bf16_dense_flops_per_second")]:
        if dtype in peaks:
            assert any(word in entry.sources[field] for word in ("sparsity", "accumulate", "no NVIDIA datasheet"))


def test_the_new_parts_read_as_their_datasheets_say():
    # by hand from the datasheets: NVIDIA's "with sparsity" figure halved; AMD's dense figure as printed
    assert GPUS["H100-PCIe"].peak_flops_per_second("bf16") == 1513e12 / 2
    assert GPUS["B200"].peak_flops_per_second("fp4") == 144e15 / 8 / 2  # HGX B200: 8 GPUs
    assert GPUS["GB200"].peak_flops_per_second("fp8") == 20e15 / 2 / 2  # per superchip: 2 GPUs
    assert GPUS["MI300X"].memory_bytes == 205822885888  # rocm-smi's VRAM Total Memory, bytes
    assert GPUS["MI300X"].nvlink_bandwidth_bytes_per_second == 7 * 128e9 / 2
    assert GPUS["A100-40GB"].peak_flops_per_second("fp8") is None  # Ampere has no FP8 unit
    assert GPUS["H100-PCIe"].nvlink_bandwidth_bytes_per_second is None  # a two-card bridge only


def test_aliases_keep_their_old_meaning():
    assert find_gpu("H100").part == "H100 SXM5 80GB HBM3"
    assert find_gpu("A100").part == "A100 SXM4 80GB HBM2e"
    assert find_gpu("H100 PCIe").name == "H100-PCIe" and find_gpu("a100-40gb").name == "A100-40GB"
    assert interconnect_for(GPUS["MI300X"]).description == "Infinity Fabric (MI300X)"
