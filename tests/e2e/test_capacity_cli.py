"""`llmdiag capacity` end to end through the CLI: the issue's example, JSON, a config.json, and bad input
(one ERROR line, one HINT line, exit 2, never a traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmdiag.model.report import SCHEMA_VERSION
from tests.conftest import CliResult, run_cli

EXAMPLE = (
    "capacity",
    "--gpu",
    "H100",
    "--model",
    "llama-3-8b",
    "--tp",
    "1",
    "--users",
    "1000",
    "--prompt-tokens",
    "500",
    "--output-tokens",
    "200",
)
SMALL = ("--users", "10", "--prompt-tokens", "100", "--output-tokens", "50")


def assert_usage_error(result: CliResult, *needles: str) -> None:
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("ERROR: ") and lines[1].startswith("HINT: "), result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)


def test_the_issue_example_in_the_terminal():
    result = run_cli(*EXAMPLE)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "KV-CACHE MEMORY" in out
    assert "655 of 1,000 users fit at 700 tokens each; 345 wait" in out
    for section in (
        "Memory per GPU",
        "Decode throughput",
        "What runs out at 1,000 users",
        "Time to first token",
        "The seed arithmetic",
        "Notes",
    ):
        assert section in out, section
    assert "0.147 tokens/s each" in out  # the naive split
    assert result.stderr == ""


def test_the_issue_example_as_json():
    result = run_cli(*EXAMPLE, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["schema_version"] == SCHEMA_VERSION and report["kind"] == "capacity"
    assert report["limited_by"] == "kv_memory"
    assert {r["resource"] for r in report["resources"]} == {
        "kv_memory",
        "max_num_seqs",
        "max_num_batched_tokens",
        "compute",
        "hbm_bandwidth",
        "interconnect",
        "scheduler",
    }
    assert report["memory"]["kv_max_batch_sequences"] == report["served_sequences"] == 655
    assert report["waiting_users"] == 345
    seed = report["seed"]
    # 1000 users do not get 1 token/s each: batching gives each served user tens of tokens/s
    assert seed["batched_per_user_tokens_per_second"] > 10
    assert seed["batched_mean_per_user_tokens_per_second"] > 10
    assert seed["naive_per_user_tokens_per_second"] < 1
    assert report["ttft"]["waves"] == 2
    assert report["at_users"]["step"]["bound_by"] == "compute"


def test_a_local_config_json(tmp_path: Path):
    config = {
        "_name_or_path": "my-org/tiny-llama",
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_attention_heads": 32,
        "num_hidden_layers": 22,
        "num_key_value_heads": 4,
        "vocab_size": 32000,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 2048,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = run_cli("capacity", "--gpu", "L4", "--model-config", str(path), *SMALL, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["inputs"]["model"] == "my-org/tiny-llama"
    assert report["model"]["kv_bytes_per_token"] == 2 * 22 * 4 * 64 * 2


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("--gpu", "B900", "--model", "llama-3-8b"), ("unknown GPU 'B900'", "H100, H200, A100, L4")),
        (("--gpu", "H100", "--model", "gpt-5"), ("unknown model 'gpt-5'", "llama-3-8b, llama-3-70b", "mixtral-8x7b")),
        (("--model", "llama-3-8b"), ("no GPU given", "H100")),
        (("--gpu", "H100"), ("no model given", "--model-config")),
        (("--gpu", "H100", "--model", "llama-3-8b", "--tp", "3"), ("does not divide", "1, 2, 4, 8")),
        (("--gpu", "L4", "--model", "llama-3-8b", "--interconnect", "nvlink"), ("no NVLink", "pcie4")),
        (("--gpu", "H100", "--model", "llama-3-8b", "--interconnect", "ib"), ("unknown interconnect",)),
        (("--gpu", "H100", "--model", "llama-3-70b"), ("does not fit on one H100", "--tp 2")),
        (("--gpu", "H100", "--model", "llama-3-8b", "--gpu-memory-utilization", "1.5"), ("gpu-memory-utilization",)),
        (("--gpu", "H100", "--model", "llama-3-8b", "--model-config", "x.json"), ("both --model and --model-config",)),
        (("--gpu", "H100", "--model-config", "/nonexistent/config.json"), ("no such file", "config.json")),
    ],
)
def test_bad_input_is_one_error_and_one_hint(args: tuple[str, ...], needles: tuple[str, ...]):
    assert_usage_error(run_cli("capacity", *args, *SMALL), *needles)


def test_an_unsupported_config_is_refused(tmp_path: Path):
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "hidden_size": 7168,
                "num_attention_heads": 128,
                "num_hidden_layers": 61,
                "intermediate_size": 18432,
                "vocab_size": 129280,
                "kv_lora_rank": 512,
            }
        )
    )
    # an MLA config (kv_lora_rank) without its head widths: the missing field is named
    assert_usage_error(run_cli("capacity", "--gpu", "H100", "--model-config", str(path), *SMALL), "qk_nope_head_dim")
    path.write_text(json.dumps({**json.loads(path.read_text()), "kv_lora_rank": None, "mamba_d_state": 16}))
    assert_usage_error(run_cli("capacity", "--gpu", "H100", "--model-config", str(path), *SMALL), "mamba_d_state")
    path.write_text("{broken")
    assert_usage_error(run_cli("capacity", "--gpu", "H100", "--model-config", str(path), *SMALL), "not valid JSON")


def test_missing_and_invalid_numbers():
    zero_users = ("--users", "0", "--prompt-tokens", "1", "--output-tokens", "1")
    result = run_cli("capacity", "--gpu", "H100", "--model", "llama-3-8b", *zero_users)
    assert_usage_error(result, "--users must be at least 1")
    assert_usage_error(run_cli("capacity", "--gpu", "H100", "--model", "llama-3-8b"), "--users")


def test_simulate_measures_the_same_case_beside_the_estimate():
    result = run_cli(
        "capacity",
        "--gpu",
        "H100",
        "--model",
        "llama-3-8b",
        "--tp",
        "1",
        "--users",
        "64",
        "--prompt-tokens",
        "256",
        "--output-tokens",
        "64",
        "--simulate",
        "--simulate-seconds",
        "5",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    sim = report["simulated"]
    assert sim["users"] == 64 and sim["users_capped"] is False
    assert sim["requests_completed"] > 0 and sim["steps"] > 0
    assert 0 < sim["mean_batch_sequences"] <= 64
    assert sim["ttft_samples"] > 0 and 0 < sim["ttft_p50_seconds"] <= sim["ttft_p90_seconds"]
    assert sim["analytical_total_tokens_per_second"] == report["at_users"]["total_tokens_per_second"]
    # loose: the closed loop's client turnaround and the warm-up shave some off; never absolute times
    ratio = sim["total_tokens_per_second"] / report["at_users"]["total_tokens_per_second"]
    assert 0.3 <= ratio <= 1.5, ratio
    # 64 short sequences fit easily: no KV or batch-slot cap. A starved CPU can delay the simulator's steps so that a
    # few arrivals wait a step (read as the step budget), so that one is tolerated; seen on this 2-core box under load
    assert sim["preemptions"] == 0 and sim["limited_by"] in (None, "max_num_batched_tokens"), sim["limited_detail"]


def test_deepseek_v3_on_mi300x_prices_its_mla_latent_and_fp8_weights():
    result = run_cli("capacity", "--gpu", "MI300X", "--model", "deepseek-v3", "--tp", "8", *SMALL, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    # config.json: (kv_lora_rank 512 + qk_rope_head_dim 64) · 61 layers · 2 bytes
    assert report["model"]["kv_bytes_per_token"] == (512 + 64) * 61 * 2
    assert report["model"]["weight_bytes"] == report["model"]["total_params"]  # the FP8 checkpoint: 1 byte a weight
    assert report["hardware"]["memory_bytes"] == 205822885888  # rocm-smi's VRAM total of an MI300X
    text = run_cli("capacity", "--gpu", "MI300X", "--model", "deepseek-v3", "--tp", "8", *SMALL)
    assert text.returncode == 0 and "Infinity Fabric" in text.stdout and "70,272 bytes" in text.stdout
