"""`capacity --compare` in-process: the option's parsing, the per-precision peak, and the physics' direction in each
comparison (never an absolute figure), and the accelerated simulator run it stands beside (planning.run_virtual)."""

from __future__ import annotations

import pytest

from llmdiag.api.capacity import capacity_question
from llmdiag.api.compare import (
    Case,
    CompareSettings,
    parse_compare,
    physics_continuous,
    physics_static,
    precision_peak,
    reserved_length,
    simulated,
)
from llmdiag.engine.capacity import plan_capacity
from llmdiag.errors import UsageError
from llmdiag.model.compare import COMPARISONS
from llmdiag.physics.hardware import GPUS
from llmdiag.planning import VirtualWorkload, run_virtual


def case(users: int = 64, max_num_seqs: int | None = 32) -> Case:
    question = capacity_question(
        "H100", "llama-3-8b", users=users, prompt_tokens=500, output_tokens=200, max_num_seqs=max_num_seqs
    )
    return Case(question, plan_capacity(question), question.deployment(), users, users, CompareSettings())


def test_compare_takes_all_or_a_list_in_the_canonical_order():
    assert parse_compare("all") == list(COMPARISONS)
    assert parse_compare("users, batching") == ["batching", "users"]
    for bad in ("", "batching,nope"):
        with pytest.raises(UsageError) as info:
            parse_compare(bad)
        assert "compare" in info.value.message and "batching" in info.value.hint


def test_the_peak_per_precision_is_the_catalogues():
    """H100's FP8 is its datasheet's dense 1,979 TFLOPS (gpus.toml); the A100 has no FP8 units: BF16 math, said so."""
    h100, a100 = GPUS["H100"], GPUS["A100"]
    peak, source = precision_peak(h100, "fp8")
    assert peak == h100.peak_flops_per_second("fp8") and 1.9e15 < peak < 2.0e15 and "dense FP8" in source
    peak, source = precision_peak(a100, "fp8")
    assert peak == a100.peak_bf16_flops_per_second and "no FP8 units" in source


def test_static_batching_loses_throughput_as_output_lengths_spread_and_continuous_does_not():
    c = case()
    continuous = physics_continuous(c)["total_tokens_per_second"]
    static = [physics_static(c, spread)["total_tokens_per_second"] for spread in (0.0, 0.5, 0.9)]
    assert continuous is not None and all(s is not None for s in static)
    assert static[0] > static[1] > static[2]  # type: ignore[operator]
    assert continuous > static[2]  # type: ignore[operator]
    assert physics_static(c, 0.0)["idle_slot_ratio"] == 0.0 < physics_static(c, 0.9)["idle_slot_ratio"]  # type: ignore[operator]


def test_a_reserving_server_sets_aside_the_models_context():
    c = case()
    assert reserved_length(c) == 8192  # llama-3-8b's max_position_embeddings (models.toml)


def run(c: Case, **flags: object):
    workload = VirtualWorkload(
        users=c.sim_users,
        prompt_tokens=500,
        output_tokens=200,
        horizon_seconds=20.0,
        warmup_seconds=5.0,
        output_spread=0.9,
    )
    return run_virtual(c.engine_config(**flags), workload)


def test_a_virtual_run_is_deterministic_and_continuous_beats_static_when_lengths_spread():
    c = case()
    first, again = run(c), run(c)
    assert [(r.request_id, r.finished_ts) for r in first.requests] == [
        (r.request_id, r.finished_ts) for r in again.requests
    ]
    static = run(c, batching="static")
    cont_figures, static_figures = simulated(first, 32.0), simulated(static, 32.0)
    assert cont_figures["total_tokens_per_second"] > static_figures["total_tokens_per_second"]  # type: ignore[operator]
    assert static_figures["idle_slot_ratio"] > cont_figures["idle_slot_ratio"]  # type: ignore[operator]
    # nothing is measured before the warm-up: every request counted arrived after it
    assert all(r.arrival >= 5.0 for r in first.measured_requests()) and first.measured_requests()


def test_a_disaggregated_pair_gives_the_first_token_on_the_prefill_side_and_decodes_on_the_other():
    c = case(users=8, max_num_seqs=8)
    workload = VirtualWorkload(users=8, prompt_tokens=500, output_tokens=50, horizon_seconds=5.0)
    pair = run_virtual(c.engine_config(), workload, decode_config=c.engine_config(), kv_transfer_seconds_per_token=1e-6)
    assert pair.requests and all(r.generated == r.output_tokens == 50 for r in pair.requests)
    # the decode side's steps carry decodes only: one token per sequence
    assert pair.steps and all(s.generated == s.sequences for s in pair.steps)
