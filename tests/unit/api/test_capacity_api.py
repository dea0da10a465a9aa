"""`llmdiag capacity` as a library call (llmdiag.api.capacity): names resolved as the command resolves them, the
same report as the engine's plan, and the simulation on request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import llmdiag.api
from llmdiag.api.capacity import capacity_question, run_capacity
from llmdiag.engine.capacity import CapacityQuestion, plan_capacity
from llmdiag.errors import InputFileError, UsageError
from llmdiag.physics.hardware import GPUS, MODELS
from llmdiag.physics.step import DEFAULT_GPU_MEMORY_UTILIZATION

SMALL = {"users": 10, "prompt_tokens": 100, "output_tokens": 20}


def test_the_api_face_lazily_offers_the_capacity_entry_points():
    assert llmdiag.api.run_capacity is run_capacity and llmdiag.api.capacity_question is capacity_question
    assert {"run_capacity", "capacity_question"} <= set(llmdiag.api.__all__)


def test_names_resolve_case_blind_and_defaults_are_vllms():
    question = capacity_question("h100-sxm", "Meta-Llama-3-8B-Instruct", **SMALL)
    assert question == CapacityQuestion(GPUS["H100"], MODELS["llama-3-8b"], **SMALL)
    assert question.gpu_memory_utilization == DEFAULT_GPU_MEMORY_UTILIZATION
    assert question.max_num_seqs is None and question.max_num_batched_tokens is None
    # 0 is "not given", as the command has always read --gpu-memory-utilization
    assert capacity_question("H100", "llama-3-8b", gpu_memory_utilization=0, **SMALL) == question


def test_the_report_is_the_engines_plan():
    question = capacity_question("A100", "mixtral-8x7b", tp=4, max_num_seqs=64, **SMALL)
    assert run_capacity(question) == plan_capacity(question)
    assert run_capacity(question).simulated is None


@pytest.mark.parametrize(
    ("gpu", "model", "config", "message", "hint"),
    [
        (None, "llama-3-8b", False, "no GPU given", "known GPUs: H100, H200, A100, L4"),
        ("H100", None, False, "no model given", "model_config PATH/config.json"),
        ("H100", "llama-3-8b", True, "both model and model_config given", "pass one of them"),
        ("B900", "llama-3-8b", False, "unknown GPU 'B900'", "known GPUs"),
        ("H100", "gpt-5", False, "unknown model 'gpt-5'", "known models: llama-3-8b"),
    ],
)
def test_what_cannot_be_asked_is_a_usage_error(
    gpu: str | None, model: str | None, config: bool, message: str, hint: str, tmp_path: Path
):
    with pytest.raises(UsageError, match=message) as error:
        capacity_question(gpu, model, tmp_path / "config.json" if config else None, **SMALL)
    assert hint in error.value.hint


def test_a_config_json_stands_in_for_a_name(tmp_path: Path):
    path = tmp_path / "config.json"
    config = {"hidden_size": 2048, "num_attention_heads": 16, "num_hidden_layers": 16}
    path.write_text(json.dumps(config | {"intermediate_size": 8192, "vocab_size": 32000}))
    question = capacity_question("L4", None, path, **SMALL)
    assert (question.model.source, question.model.hidden_size, question.model.kv_heads) == (str(path), 2048, 16)
    path.write_text("{}")
    with pytest.raises(InputFileError, match="field 'hidden_size' is missing"):
        capacity_question("L4", None, path, **SMALL)


def test_settings_are_checked_after_the_names():
    with pytest.raises(UsageError, match="^users must be at least 1"):
        capacity_question("H100", "llama-3-8b", users=0, prompt_tokens=1, output_tokens=1)
    with pytest.raises(UsageError, match="unknown GPU"):
        capacity_question("B900", "llama-3-8b", users=0, prompt_tokens=1, output_tokens=1)


def test_simulate_runs_the_same_case_and_says_so_first():
    question = capacity_question("H100", "llama-3-8b", users=8, prompt_tokens=64, output_tokens=16)
    started: list[float] = []
    report = run_capacity(question, simulate_seconds=2.0, on_simulate=started.append)
    assert started == [2.0]
    assert report.simulated is not None and report.simulated.users == 8
    assert report.simulated.analytical_total_tokens_per_second == report.at_users.total_tokens_per_second
