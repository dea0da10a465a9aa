"""The simulator engine's other modes, driven by hand: static batching (a batch waits for its longest request),
vLLM's priority scheduling policy, and a request that arrives with its KV already computed (a disaggregated decode
instance). Llama 3 8B on one H100 with 4-token blocks, as in test_sim_engine."""

from __future__ import annotations

from llmdiag.physics.hardware import GPUS, MODELS
from llmdiag.physics.step import Deployment, StepLoad
from llmdiag.sim.engine import Engine, EngineConfig, SimRequest
from tests.unit.sim.test_sim_engine import run_step

H100, LLAMA8 = GPUS["H100"], MODELS["llama-3-8b"]


def engine(**flags: object) -> Engine:
    settings: dict[str, object] = dict(
        num_gpu_blocks_override=33, max_num_seqs=4, max_num_batched_tokens=8, max_model_len=64
    )
    settings.update(flags)
    return Engine(EngineConfig(Deployment(H100, LLAMA8, block_size_tokens=4), **settings))  # type: ignore[arg-type]


def test_static_batching_admits_no_one_until_the_whole_batch_has_ended():
    e = engine(batching="static")
    short, long_ = SimRequest("short", 4, 1, 0.0), SimRequest("long", 4, 3, 0.0)
    e.add_request(short)
    e.add_request(long_)
    # the batch is prefilled whole in one step, past the 8-token budget's chunking (two prompts of 4 fit anyway)
    step, _ = run_step(e, 0.0)
    assert [r.request_id for r, _ in step.scheduled] == ["short", "long"]
    assert short.finished  # its one token came with the prefill
    late = SimRequest("late", 4, 1, step.end)
    e.add_request(late)
    # a slot is free, but the batch still runs: the late request waits until the long one ends
    step, _ = run_step(e, step.end)
    assert [r.request_id for r, _ in step.scheduled] == ["long"]
    step, _ = run_step(e, step.end)
    assert long_.finished and late.state == "waiting"
    step, _ = run_step(e, step.end)
    assert [r.request_id for r, _ in step.scheduled] == ["late"]


def test_static_batching_prefills_the_batch_in_one_step_past_the_token_budget():
    e = engine(batching="static")
    for name in "abc":
        e.add_request(SimRequest(name, 6, 2, 0.0))
    step, _ = run_step(e, 0.0)
    assert step.num_tokens == 18  # 3 × 6 > the 8-token budget: a static server runs the padded batch at once
    continuous = engine()
    for name in "abc":
        continuous.add_request(SimRequest(name, 6, 2, 0.0))
    step, _ = run_step(continuous, 0.0)
    assert step.num_tokens == 8  # vLLM's chunked prefill stops at the budget


def test_continuous_batching_lets_a_request_join_at_the_next_step():
    e = engine()
    first = SimRequest("first", 4, 3, 0.0)
    e.add_request(first)
    step, _ = run_step(e, 0.0)
    e.add_request(SimRequest("joins", 4, 1, step.end))
    step, _ = run_step(e, step.end)
    assert [r.request_id for r, _ in step.scheduled] == ["first", "joins"]


def test_the_priority_policy_serves_the_lower_value_first_and_fcfs_does_not():
    for policy, expected in (("priority", ["paid", "free-1"]), ("fcfs", ["free-1", "free-2"])):
        e = engine(scheduling_policy=policy, max_num_seqs=2)
        e.add_request(SimRequest("free-1", 4, 1, 0.0, priority=1))
        e.add_request(SimRequest("free-2", 4, 1, 0.1, priority=1))
        e.add_request(SimRequest("paid", 4, 1, 0.2, priority=0))
        step, _ = run_step(e, 0.3)
        assert [r.request_id for r, _ in step.scheduled] == expected, policy


def test_the_priority_policy_preempts_the_lowest_priority_running_request():
    # 4 usable blocks of 4 tokens; both requests grow past their first block. Free runs first, paid joins a step
    # later: FCFS evicts the last admitted (paid), the priority policy the lowest priority (free)
    for policy, victim in (("fcfs", "paid"), ("priority", "free")):
        e = engine(scheduling_policy=policy, num_gpu_blocks_override=5, max_model_len=16)
        free, paid = SimRequest("free", 4, 6, 0.0, priority=1), SimRequest("paid", 4, 6, 0.0, priority=0)
        requests = {"free": free, "paid": paid}
        e.add_request(free)
        step, _ = run_step(e, 0.0)
        paid.arrival = step.end
        e.add_request(paid)
        now = step.end
        while e.stats.preemptions == 0:
            step, _ = run_step(e, now)
            now = step.end
        assert {name: r.preemptions for name, r in requests.items()} == {
            name: int(name == victim) for name in requests
        }, policy


def test_a_request_whose_kv_came_over_the_link_computes_only_its_next_token():
    e = engine()
    decode = SimRequest("d", 20, 3, 0.0)
    decode.computed, decode.generated = 20, 1  # the prefill instance computed the prompt and sampled token 1
    decode.first_token_ts = decode.last_token_ts = 0.0
    e.add_request(decode)
    step, _ = run_step(e, 0.0)
    # one new token attending to the 20 in KV plus itself; the blocks for all 21 tokens
    assert step.scheduled == [(decode, 1)] and step.load == StepLoad(1, 21, 21)
    assert decode.blocks == 6 and decode.generated == 2
