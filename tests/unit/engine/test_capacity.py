"""The capacity model against hand-worked numbers (arithmetic in comments), its caps, errors and renderers.

The reference case is the issue's: Llama 3 8B on one H100, 1000 users, 500 prompt + 200 output tokens.
Step-level numbers it builds on are worked out in test_physics.py.
"""

from __future__ import annotations

import pytest
from rich.console import Console

from llmdiag.engine.capacity import CapacityQuestion, plan_capacity, roofline_decode_tokens_per_second, sustained_load
from llmdiag.errors import UsageError
from llmdiag.model.capacity import CapacityReport
from llmdiag.model.report import SCHEMA_VERSION
from llmdiag.physics.hardware import GPUS, MODELS, find_gpu, find_model
from llmdiag.physics.step import Deployment, StepLoad
from llmdiag.render.capacity import render_capacity, render_capacity_json


def plan(gpu: str, model: str, **settings: object) -> CapacityReport:
    return plan_capacity(CapacityQuestion(find_gpu(gpu), find_model(model), **settings))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def example() -> CapacityReport:
    return plan("H100", "llama-3-8b", tp=1, users=1000, prompt_tokens=500, output_tokens=200)


def test_largest_batch_and_who_waits(example: CapacityReport):
    # 28,834 KV blocks (test_physics) // 44 blocks per 700-token sequence = 655
    assert example.memory.kv_max_batch_sequences == 655
    assert example.served_sequences == 655
    assert example.waiting_users == 345
    assert example.limited_by == "kv_memory"
    kv = next(r for r in example.resources if r.resource == "kv_memory")
    # 1000 · 44 blocks · 16 = 704,000 tokens wanted vs 461,344 held: 1000·44 / 28,834 = 1.526
    assert kv.used == 704_000 and kv.available == 461_344
    assert kv.ratio == pytest.approx(1.52597, rel=1e-5)


def test_sustained_load_by_hand():
    # 655 decodes at 500 + 200/2 = 600, plus 655/200 = 3.275 prompts of 500 tokens:
    # new = 655 + 1,637.5 = 2,292.5; attended = 655·600 + 3.275·125,250 = 393,000 + 410,193.75;
    # KV read = 393,000 + 3.275·500 = 394,637.5
    assert sustained_load(655, 500, 200) == StepLoad(2_292.5, 803_193.75, 394_637.5)


def test_sustained_step_and_throughput_by_hand(example: CapacityReport):
    step = example.at_users.step
    # FLOPs: 2·8,030,261,248·2,292.5 = 36,818,747,822,080 + 4·32·4096·803,193.75 = 421,104,844,800
    assert step.flops == pytest.approx(37_239_852_666_880)
    # HBM: 16,060,522,496 + 131,072·(394,637.5 + 2,292.5 = 396,930) = 16,060,522,496 + 52,026,408,960
    assert step.hbm_bytes_per_gpu == pytest.approx(68_086_931_456)
    # compute 37,239,852,666,880 / 989.4e12 = 37.639 ms > HBM 68,086,931,456 / 3.35e12 = 20.324 ms
    assert step.compute_seconds == pytest.approx(0.0376388, rel=1e-5)
    assert step.memory_seconds == pytest.approx(0.0203245, rel=1e-5)
    assert step.bound_by == "compute" and example.step_bound_by == "compute"
    # step 37.639 + 2 ms = 39.639 ms → 25.23 tokens/s each, 655 / 0.039639 = 16,524 in total
    assert step.step_seconds == pytest.approx(0.0396388, rel=1e-5)
    assert example.at_users.per_user_tokens_per_second == pytest.approx(25.2278, rel=1e-4)
    assert example.at_users.total_tokens_per_second == pytest.approx(16_524.2, rel=1e-4)


def test_decode_only_at_the_kv_max_batch_by_hand(example: CapacityReport):
    point = example.kv_max_decode_only
    # HBM: 16,060,522,496 + 131,072·655·601 = 16,060,522,496 + 51,597,148,160 = 67,657,670,656 bytes
    assert point.step.hbm_bytes_per_gpu == pytest.approx(67_657_670_656)
    # / 3.35e12 = 20.196 ms (> compute 655·16,375,095,296 / 989.4e12 = 10.841 ms); + 2 ms = 22.196 ms
    assert point.step.step_seconds == pytest.approx(0.0221963, rel=1e-5)
    assert point.step.bound_by == "hbm_bandwidth"
    assert point.total_tokens_per_second == pytest.approx(655 / 0.0221963, rel=1e-5)


def test_seed_arithmetic(example: CapacityReport):
    seed = example.seed
    # one stream: 1 / 6.8177 ms = 146.68 tokens/s (test_physics); ÷ 1000 users = 0.147 each
    assert seed.single_stream_tokens_per_second == pytest.approx(146.677, rel=1e-5)
    assert seed.naive_per_user_tokens_per_second == pytest.approx(0.146677, rel=1e-5)
    # batching: 25.2 tokens/s to each served user, 16,524 / 1000 = 16.5 averaged over everyone
    assert seed.batched_per_user_tokens_per_second == pytest.approx(25.2278, rel=1e-4)
    assert seed.batched_mean_per_user_tokens_per_second == pytest.approx(16.5242, rel=1e-4)
    assert seed.batching_gain == pytest.approx(16_524.2 / 146.677, rel=1e-4)
    # the point of it all: a 1000-user cluster does not give each user single-stream ÷ 1000
    assert seed.batched_mean_per_user_tokens_per_second > 100 * seed.naive_per_user_tokens_per_second


def test_ttft_burst_by_hand(example: CapacityReport):
    t = example.ttft
    # prefill rate: 8192 tokens per 134.065 + 2 ms step (test_physics) = 60,206.6 tokens/s
    assert t.prefill_tokens_per_second == pytest.approx(8192 / 0.1360648, rel=1e-6)
    # alone: 2·8,030,261,248·500 + 524,288·125,250 = 8,095,928,320,000 FLOPs / 989.4e12 = 8.1826 ms
    #   (> HBM (16,060,522,496 + 131,072·1000) / 3.35e12 = 4.833 ms); + 2 ms
    assert t.alone_seconds == pytest.approx(0.0101826, rel=1e-4)
    # a wave: 655·500 / 60,206.6 = 5.4396 s of prefill + 199 decode steps of 22.196 ms = 4.4171 s
    assert t.wave_seconds == pytest.approx(5.4396 + 4.4171, rel=1e-4)
    assert (t.waves, t.wave_sequences) == (2, 655)
    # median user is #500 (index 499) in the first wave: 500·500 / 60,206.6 = 4.1524 s
    assert t.p50_seconds == pytest.approx(4.1524, rel=1e-4)
    # the last is #345 of the second wave: 9.8567 + 345·500 / 60,206.6 = 9.8567 + 2.8651
    assert t.max_seconds == pytest.approx(12.7218, rel=1e-4)
    assert t.alone_seconds < t.p50_seconds < t.p90_seconds < t.max_seconds


def test_roofline_has_no_cpu_overhead():
    dep = Deployment(gpu=GPUS["H100"], model=MODELS["llama-3-8b"])
    # batch 1 at 600: memory 4.8177 ms only → 207.57 tokens/s
    assert roofline_decode_tokens_per_second(dep, 1, 600) == pytest.approx(1 / 4.81770e-3, rel=1e-5)
    # batch 655 at 600: 655 / 20.196 ms
    assert roofline_decode_tokens_per_second(dep, 655, 600) == pytest.approx(655 / 0.0201963, rel=1e-5)
    assert roofline_decode_tokens_per_second(dep, 0, 600) == 0.0


def test_few_users_all_fit_and_the_step_limits():
    report = plan("H100", "llama-3-8b", users=100, prompt_tokens=500, output_tokens=200)
    assert report.waiting_users == 0 and report.served_sequences == 100
    assert report.limited_by == report.step_bound_by == report.at_users.step.bound_by
    assert report.ttft.waves == 1


def test_vllm_default_max_num_seqs_caps_an_a100():
    # A100: 29,000 KV blocks // 44 = 659 sequences, but vLLM's default there is 256 (and 2048·200/700 = 585)
    report = plan("A100", "llama-3-8b", users=1000, prompt_tokens=500, output_tokens=200)
    assert report.memory.kv_max_batch_sequences == 659
    assert report.inputs.max_num_seqs == 256 and report.inputs.batch_caps_source == "vLLM default for A100"
    assert (report.limited_by, report.served_sequences) == ("max_num_seqs", 256)


def test_step_token_budget_can_cap_the_batch():
    # 512 tokens per step carry at most 512·200/700 = 146 sequences (each needs 1 + 500/200 tokens a step)
    report = plan("H100", "llama-3-8b", users=1000, prompt_tokens=500, output_tokens=200, max_num_batched_tokens=512)
    assert (report.limited_by, report.served_sequences) == ("max_num_batched_tokens", 146)
    assert report.inputs.batch_caps_source == "given"


def test_tensor_parallel_over_pcie_is_interconnect_bound():
    report = plan("H100", "llama-3-8b", tp=8, users=200, prompt_tokens=500, output_tokens=200, interconnect="pcie4")
    assert report.step_bound_by == "interconnect"
    assert report.inputs.interconnect == "PCIe Gen4 x16"


def test_moe_runs_and_reports_active_parameters():
    report = plan("H100", "mixtral-8x7b", tp=2, users=64, prompt_tokens=500, output_tokens=200)
    assert report.model.active_params == 12_879_925_248
    # one stream reads only the experts it uses: (1,605,636,096 + 0.25·45,097,156,608)·2 / 2 GPUs + KV
    assert report.single_stream.step.hbm_bytes_per_gpu == pytest.approx(12_879_925_248 + 65_536 * 601)


def test_a_model_that_does_not_fit_says_which_tp_would():
    with pytest.raises(UsageError, match="does not fit on one H100") as error:
        plan("H100", "llama-3-70b", users=1, prompt_tokens=500, output_tokens=200)
    assert "tp 2" in error.value.hint


def test_a_sequence_longer_than_the_cache_is_refused():
    with pytest.raises(UsageError, match="one sequence of 100,200 tokens"):
        plan("L4", "llama-3-8b", users=1, prompt_tokens=100_000, output_tokens=200)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"users": 0}, "users must be at least 1"),
        ({"prompt_tokens": 0}, "prompt_tokens"),
        ({"output_tokens": -5}, "output_tokens"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"gpu": "B900"}, "unknown GPU"),
        ({"model": "gpt-5"}, "unknown model"),
    ],
)
def test_bad_inputs_raise_usage_errors(kwargs: dict[str, object], message: str):
    args: dict[str, object] = {
        "gpu": "H100",
        "model": "llama-3-8b",
        "users": 10,
        "prompt_tokens": 10,
        "output_tokens": 10,
        **kwargs,
    }
    with pytest.raises(UsageError, match=message):
        plan(**args)  # type: ignore[arg-type]


def test_context_beyond_the_model_window_is_noted():
    report = plan("H100", "llama-3-8b", users=1, prompt_tokens=8000, output_tokens=500)
    assert any("8192-token context window" in note for note in report.notes)


def test_json_round_trips(example: CapacityReport):
    text = render_capacity_json(example)
    assert CapacityReport.model_validate_json(text) == example
    assert f'"schema_version": "{SCHEMA_VERSION}"' in text and '"kind": "capacity"' in text


def test_terminal_rendering_shows_every_section(example: CapacityReport):
    console = Console(width=120, record=True, color_system=None)
    console.print(render_capacity(example))
    text = console.export_text()
    for expected in (
        "KV-CACHE MEMORY",
        "655 of 1,000 users fit",
        "Memory per GPU",
        "Decode throughput",
        "What runs out at 1,000 users",
        "← caps",
        "Time to first token",
        "The seed arithmetic",
        "0.147 tokens/s each",
        "25.2 tokens/s each while served",
    ):
        assert expected in text, expected
