"""The simulated engine's accounting of what limited each step (``Step.limit``, ``EngineStats.limit_seconds``): the
truth bench/calibration.py judges verdicts against. Driven by hand (tests/unit/sim/test_sim_engine.py's tiny engine:
8 usable KV blocks of 4 tokens, max_num_seqs 4, 64 batched tokens), each state built from its cause."""

from __future__ import annotations

import pytest

from llmdiag.physics.hardware import GPUS, MODELS, interconnect_for
from llmdiag.physics.step import Deployment
from llmdiag.sim.engine import Engine, EngineConfig, limit_shares
from tests.unit.sim.test_sim_engine import drain, request, run_step, tiny

L4, A100 = GPUS["L4"], GPUS["A100"]
LLAMA8, LLAMA70 = MODELS["llama-3-8b"], MODELS["llama-3-70b"]


def test_a_request_that_arrived_but_finds_no_kv_blocks_makes_the_step_kv_limited():
    engine = tiny()
    engine.add_request(request("a", 20, 4))  # ⌈20/4⌉ = 5 of the 8 blocks
    engine.add_request(request("b", 16, 4))  # would need 4: only 3 are left
    step, _ = run_step(engine, 0.0)
    assert [r.request_id for r, _ in step.scheduled] == ["a"] and engine.free_blocks == 3
    assert step.limit == "kv"


def test_a_preemption_makes_the_step_kv_limited():
    engine = tiny(num_gpu_blocks_override=5, max_model_len=16)  # 4 usable blocks = 16 tokens
    engine.add_request(request("a", 8, 8))
    engine.add_request(request("b", 8, 8))
    now = run_step(engine, 0.0)[0].end  # both prefilled: 2 + 2 blocks, the pool is full
    step, _ = run_step(engine, now)  # token 9 of a needs a third block: b is preempted
    assert engine.stats.preemptions == 1 and step.limit == "kv"


def test_a_request_waiting_for_a_batch_slot_makes_the_step_batch_capped():
    engine = tiny(max_num_seqs=1)
    engine.add_request(request("a", 6, 4))
    engine.add_request(request("b", 6, 4))
    step, _ = run_step(engine, 0.0)
    assert len(engine.waiting) == 1 and engine.free_blocks == 6  # KV has room: only the slot keeps b out
    assert step.limit == "batch_cap"


def test_a_request_that_has_not_arrived_yet_limits_nothing():
    engine = tiny(max_num_seqs=1)
    engine.add_request(request("a", 6, 4))
    engine.add_request(request("b", 6, 4, arrival=60.0))
    step, _ = run_step(engine, 0.0)
    assert step.limit == "none"


def test_a_short_step_with_nobody_waiting_limits_nothing():
    engine = tiny()  # Llama 3 8B on an H100: one decode streams 16 GB at 3.35 TB/s, ~5 ms plus 2 ms of host
    engine.add_request(request("a", 6, 4))
    steps = [run_step(engine, 0.0)[0]]
    while engine.has_work():
        steps.append(run_step(engine, steps[-1].end)[0])
    assert all(s.duration < 0.02 for s in steps)
    assert {s.limit for s in steps} == {"none"}


def _engine(dep: Deployment, **settings: object) -> Engine:
    base: dict[str, object] = dict(num_gpu_blocks_override=300, max_num_batched_tokens=2048, max_model_len=2048)
    base.update(settings)
    return Engine(EngineConfig(dep, **base))  # type: ignore[arg-type]


def test_a_slow_decode_on_slow_memory_is_bandwidth_limited():
    engine = _engine(Deployment(L4, LLAMA8))
    engine.add_request(request("a", 6, 2))
    run_step(engine, 0.0)
    step, _ = run_step(engine, 1.0)  # one decode: 16 GB of weights over the L4's 300 GB/s, ~53 ms
    assert step.timing.memory_seconds > 10 * step.timing.compute_seconds
    assert step.duration > 0.05
    assert step.limit == "bandwidth"


def test_a_long_prefill_is_compute_limited():
    engine = _engine(Deployment(L4, LLAMA8))
    engine.add_request(request("a", 2000, 2))  # 2 · 8 G · 2000 = 32 TFLOP at the L4's ~121 TFLOP/s: ~0.27 s
    step, _ = run_step(engine, 0.0)
    assert step.timing.compute_seconds > 2 * step.timing.memory_seconds
    assert step.limit == "compute"


def test_a_step_whose_all_reduces_outweigh_its_kernels_is_link_limited():
    dep = Deployment(A100, LLAMA70, tp=8, interconnect=interconnect_for(A100, "pcie4"))
    engine = _engine(dep)
    engine.add_request(request("alone", 6, 3))
    run_step(engine, 0.0)
    # one decode token: the weights' 17.6 GB per GPU outweigh 160 one-token all-reduces, and the step is short
    step, _ = run_step(engine, 1.0)
    assert step.timing.memory_seconds > step.timing.allreduce_seconds and step.limit == "none"
    drain(engine, 2.0)
    for index in range(64):
        engine.add_request(request(f"r{index}", 6, 3, arrival=3.0))
    run_step(engine, 3.0)  # the 64 prompts
    step, _ = run_step(engine, 4.0)  # 64 decode tokens: each all-reduce carries 64 hidden states over PCIe
    timing = step.timing
    assert timing.allreduce_seconds > max(timing.compute_seconds, timing.memory_seconds)
    assert step.duration < 0.05  # a short step all the same: the link, not its length, names it
    assert step.limit == "link"


def test_totals_add_each_step_to_its_limit_and_shares_leave_the_rest_idle():
    engine = tiny(max_num_seqs=1)
    before = engine.limit_totals()
    assert set(before.values()) == {0.0}
    engine.add_request(request("a", 6, 2))
    engine.add_request(request("b", 6, 2))
    steps = []
    now = 0.0
    while engine.has_work():
        step, _ = run_step(engine, now)
        steps.append(step)
        now = step.end
    # a's two steps keep b waiting for the one slot; b's two run alone
    assert [s.limit for s in steps] == ["batch_cap", "batch_cap", "none", "none"]
    after = engine.limit_totals()
    assert after["batch_cap"] == pytest.approx(steps[0].duration + steps[1].duration)
    assert after["none"] == pytest.approx(steps[2].duration + steps[3].duration)
    window = 2 * now  # the engine ran for the first half of the window
    shares = limit_shares(before, after, window)
    assert shares["batch_cap"] + shares["none"] == pytest.approx(0.5)
    assert shares["idle"] == pytest.approx(0.5)
    assert drain(engine, now) == now  # nothing left to run
    with pytest.raises(ValueError):
        limit_shares(before, after, 0.0)
