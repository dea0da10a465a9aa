"""The simulated engine's scheduler and KV pool, driven by hand with a manual clock (no sockets, no real time).

Unless a test says otherwise: Llama 3 8B on one H100 with 4-token KV blocks and a 9-block pool (block 0 is vLLM's
null block, so 8 blocks = 32 tokens can be handed out), max_num_seqs 4, 64 batched tokens, max_model_len 32.
"""

from __future__ import annotations

import math

import pytest

from llmdiag.errors import UsageError
from llmdiag.physics.hardware import GPUS, MODELS, interconnect_for
from llmdiag.physics.step import Deployment, StepLoad, decode_load, prefill_load, step_time
from llmdiag.sim.engine import (
    ITL_BUCKETS,
    AdmissionRejected,
    Engine,
    EngineConfig,
    Histogram,
    SimRequest,
    Step,
    allreduce_bytes_per_gpu,
    request_tokens_buckets,
)
from llmdiag.sim.metrics import DcgmCollector, vllm_registry

H100, L4 = GPUS["H100"], GPUS["L4"]
LLAMA8, LLAMA70 = MODELS["llama-3-8b"], MODELS["llama-3-70b"]


def tiny(**engine: object) -> Engine:
    settings: dict[str, object] = dict(
        num_gpu_blocks_override=9, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=32
    )
    settings.update(engine)
    dep = Deployment(H100, LLAMA8, block_size_tokens=4)
    return Engine(EngineConfig(dep, **settings))  # type: ignore[arg-type]


def request(name: str, prompt: int, output: int, arrival: float = 0.0) -> SimRequest:
    return SimRequest(name, prompt, output, arrival)


def run_step(engine: Engine, now: float) -> tuple[Step, list[SimRequest]]:
    step = engine.schedule(now)
    assert step is not None
    changed = engine.complete(step)
    engine.check_blocks()
    return step, changed


def drain(engine: Engine, now: float = 0.0, limit: int = 1000) -> float:
    """Run steps back to back until nothing is left; returns the end of the last one."""
    for _ in range(limit):
        if not engine.has_work():
            return now
        step, _ = run_step(engine, now)
        now = step.end
    raise AssertionError("the engine did not drain")


# --- configuration -----------------------------------------------------------------------------------------


def test_defaults_come_from_vllm_and_the_kv_capacity():
    config = EngineConfig(Deployment(H100, LLAMA8))
    # vLLM 0.32 on a ≥ 70 GiB GPU that is not an A100: 1024 sequences, 8192 batched tokens
    assert (config.max_num_seqs, config.max_num_batched_tokens) == (1024, 8192)
    # 28,834 blocks of 16 tokens (test_physics works them out); Llama 3's 8,192-token context fits
    assert config.num_gpu_blocks == 28_834
    assert config.max_model_len == 8192
    assert config.served_model_name == "meta-llama/Meta-Llama-3-8B"
    # a small override caps max_model_len at what the pool holds: (9 − 1) blocks × 16 tokens
    assert EngineConfig(Deployment(H100, LLAMA8), num_gpu_blocks_override=9).max_model_len == 128


def test_weights_that_do_not_fit_are_refused_with_a_hint():
    with pytest.raises(UsageError) as info:
        EngineConfig(Deployment(L4, LLAMA70, tp=1))
    assert "does not fit" in info.value.message and "tensor-parallel" in info.value.hint


def test_max_model_len_beyond_the_pool_is_refused():
    with pytest.raises(UsageError, match="needs more KV"):
        EngineConfig(Deployment(H100, LLAMA8, block_size_tokens=4), num_gpu_blocks_override=9, max_model_len=33)


def test_request_token_buckets_are_vllms_1_2_5_series():
    assert request_tokens_buckets(2048) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
    assert request_tokens_buckets(1) == (1,)


def test_histogram_bucket_edges_follow_prometheus_le():
    hist = Histogram(ITL_BUCKETS)
    hist.observe(0.01)  # on the bound: the 0.01 bucket
    hist.observe(0.0100001, n=3)  # just above: the 0.025 bucket, three at once
    hist.observe(100.0)  # past the last bound: +Inf
    cumulative = dict(hist.cumulative())
    assert cumulative[0.01] == 1 and cumulative[0.025] == 4 and cumulative[80.0] == 4 and cumulative[math.inf] == 5
    assert hist.count == 5 and hist.total == pytest.approx(0.01 + 3 * 0.0100001 + 100)


# --- KV blocks ------------------------------------------------------------------------------------------------


def test_blocks_are_allocated_as_the_sequence_grows_and_freed_when_it_finishes():
    engine = tiny()
    a = request("a", prompt=6, output=4)
    engine.add_request(a)
    assert engine.kv_usage == 0.0

    # step 1: the 6-token prompt in one chunk → ⌈6/4⌉ = 2 blocks; 8 − 2 = 6 free; usage 1 − 6/8
    step, changed = run_step(engine, 0.0)
    assert step.scheduled == [(a, 6)] and changed == [a]
    assert (a.blocks, engine.free_blocks, engine.kv_usage) == (2, 6, 0.25)
    assert (a.computed, a.generated, a.first_token_ts) == (6, 1, step.end)
    # its price is the physics' for one 6-token prefill
    assert step.load == prefill_load(6)
    assert step.duration == pytest.approx(step_time(engine.dep, prefill_load(6)).step_seconds)

    # step 2: decode token 7 → still ⌈7/4⌉ = 2 blocks; it reads 7 tokens of KV
    step, _ = run_step(engine, step.end)
    assert step.scheduled == [(a, 1)] and step.load == StepLoad(1, 7, 7) == decode_load(1, 7)
    assert (a.blocks, engine.free_blocks) == (2, 6)

    # step 3: token 8 still fits; step 4: token 9 crosses into a third block
    step, _ = run_step(engine, step.end)
    assert (a.blocks, a.generated) == (2, 3)
    step, changed = run_step(engine, step.end)
    # a had its 4 tokens at the end of step 4: it leaves and gives back all three blocks
    assert a.finished and a.finish_reason == "length" and changed == [a]
    assert (a.blocks, engine.free_blocks, engine.running) == (0, 8, [])
    assert engine.stats.request_success["length"] == 1
    assert (engine.stats.prompt_tokens, engine.stats.generation_tokens) == (6, 4)


def test_preemption_by_recompute_when_the_pool_runs_out():
    engine = tiny(num_gpu_blocks_override=5, max_model_len=16)  # 4 usable blocks = 16 tokens
    a, b = request("a", 8, 8), request("b", 8, 8)
    engine.add_request(a)
    engine.add_request(b)

    # step 1: both prompts, 2 blocks each: the pool is full
    step, _ = run_step(engine, 0.0)
    assert step.scheduled == [(a, 8), (b, 8)] and engine.free_blocks == 0 and engine.kv_usage == 1.0

    # step 2: a's 9th token needs a third block; none is free, so the most recently admitted (b) is preempted:
    # its 2 blocks go back, a takes 1, b waits at the front of the queue and keeps its 1 sampled token
    step, _ = run_step(engine, step.end)
    assert step.scheduled == [(a, 1)]
    assert engine.stats.preemptions == 1 and b.preemptions == 1
    assert list(engine.waiting) == [b] and (b.state, b.computed, b.blocks, b.generated) == ("waiting", 0, 0, 1)
    assert (a.blocks, engine.free_blocks) == (3, 1)

    # b must recompute 9 tokens (8 prompt + 1 generated) = 3 blocks; only 1 is free until a finishes
    now = step.end
    while not a.finished:
        step, _ = run_step(engine, now)
        now = step.end
        assert all(r is a for r, _ in step.scheduled)
    assert a.generated == 8 and engine.free_blocks == 4  # a held ⌈15/4⌉ = 4 blocks and gave them all back

    # the next step readmits b with its whole context as one chunk; its second token's latency is the detour
    first_token = b.last_token_ts
    step, changed = run_step(engine, now)
    assert step.scheduled == [(b, 9)] and changed == [b] and b.generated == 2 and b.blocks == 3
    assert engine.stats.itl.total >= step.end - first_token
    drain(engine, step.end)
    assert b.finished and b.generated == 8
    # prompt tokens count once per request; the recompute does not add them again
    assert engine.stats.prompt_tokens == 16
    # request_num_preemptions: a had 0, b had 1; vLLM's first bucket (le=1) holds both
    assert dict(engine.stats.num_preemptions.cumulative())[1.0] == 2


def test_a_request_that_preempts_itself_stops_the_running_pass():
    engine = tiny(num_gpu_blocks_override=3, max_model_len=8)  # 2 usable blocks = 8 tokens
    a, b = request("a", 2, 3), request("b", 4, 2)
    engine.add_request(a)
    engine.add_request(b)
    step, _ = run_step(engine, 0.0)
    assert step.scheduled == [(a, 2), (b, 4)] and engine.free_blocks == 0
    # a's 3rd token still fits its block; b's 5th needs a second block, and b is itself the newest running
    # request: it preempts itself and the pass stops (nothing is admitted in a step that preempted)
    step, _ = run_step(engine, step.end)
    assert step.scheduled == [(a, 1)] and list(engine.waiting) == [b] and engine.stats.preemptions == 1
    assert (b.blocks, b.computed, engine.free_blocks) == (0, 0, 1)


def test_chunked_prefill_respects_max_num_batched_tokens():
    engine = tiny(max_num_batched_tokens=8)
    a = request("a", prompt=20, output=2)
    engine.add_request(a)
    step1, changed = run_step(engine, 0.0)
    assert step1.scheduled == [(a, 8)] and changed == [] and a.generated == 0  # no token mid-prompt
    step2, _ = run_step(engine, step1.end)
    # the second chunk attends to the 8 cached tokens plus itself, causally: 8·8 + 8·9/2 = 100
    assert step2.scheduled == [(a, 8)] and step2.load == StepLoad(8, 100, 16) == prefill_load(8, 1, cached_tokens=8)
    step3, changed = run_step(engine, step2.end)
    assert step3.scheduled == [(a, 4)] and changed == [a] and a.generated == 1
    # prefill time spans the three chunks; TTFT from arrival at 0
    assert a.first_token_ts == step3.end

    # a decoding request and a new prompt share the budget: 1 decode token + 7 prompt tokens
    b = request("b", prompt=10, output=1)
    engine.add_request(b)
    step4, _ = run_step(engine, step3.end)
    assert step4.scheduled == [(a, 1), (b, 7)] and step4.num_tokens == 8
    assert all(step.num_tokens <= 8 for step in (step1, step2, step3, step4))


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget():
    engine = tiny(max_num_batched_tokens=32, enable_chunked_prefill=False)
    a, b = request("a", 20, 4), request("b", 20, 4)
    engine.add_request(a)
    engine.add_request(b)
    step, _ = run_step(engine, 0.0)
    assert step.scheduled == [(a, 20)]  # b's 20 tokens do not fit the 12 left, and are not split


def test_max_num_seqs_caps_the_batch_and_finished_requests_make_room():
    engine = tiny(max_num_seqs=2)
    reqs = [request(name, 4, output) for name, output in (("a", 1), ("b", 3), ("c", 2))]
    for r in reqs:
        engine.add_request(r)
    step, _ = run_step(engine, 0.0)
    assert [r.request_id for r, _ in step.scheduled] == ["a", "b"] and list(engine.waiting) == [reqs[2]]
    # a finished with its first token and left; c joins next step beside b
    assert reqs[0].finished and [r.request_id for r in engine.running] == ["b"]
    step, _ = run_step(engine, step.end)
    assert [(r.request_id, n) for r, n in step.scheduled] == [("b", 1), ("c", 4)]
    end = drain(engine, step.end)
    assert all(r.finished for r in reqs) and engine.free_blocks == 8 and end > 0
    assert engine.stats.request_success["length"] == 3


def test_a_request_is_never_scheduled_before_it_arrives():
    # the runner starts a step up to 50 ms in the past when it catches up on timer jitter
    engine = tiny()
    late = request("late", 4, 2, arrival=5.0)
    engine.add_request(late)
    assert engine.schedule(4.99) is None
    step, _ = run_step(engine, 5.0)
    assert step.scheduled == [(late, 4)] and late.scheduled_ts == 5.0


def test_queue_cap_rejects_and_counts():
    engine = tiny(max_num_queued_reqs=2)
    engine.add_request(request("a", 4, 4))
    engine.add_request(request("b", 4, 4))
    with pytest.raises(AdmissionRejected) as info:
        engine.add_request(request("c", 4, 4))
    assert info.value.reason == "max_num_queued_reqs"
    assert engine.stats.admission_rejections == {"max_num_queued_reqs": 1, "max_num_queued_tokens": 0}
    run_step(engine, 0.0)  # running requests count against the cap too (vLLM 0.33)
    with pytest.raises(AdmissionRejected):
        engine.add_request(request("d", 4, 4))


def test_request_timings_are_vllms_intervals():
    engine = tiny()
    a = request("a", 4, 3, arrival=1.0)
    engine.add_request(a)
    s1, _ = run_step(engine, 2.5)  # it waited 1.5 s in the queue
    s2, _ = run_step(engine, s1.end)
    s3, _ = run_step(engine, s2.end)
    stats = engine.stats
    assert a.finished and stats.queue.total == pytest.approx(1.5)
    assert stats.ttft.total == pytest.approx(s1.end - 1.0)
    assert stats.prefill.total == pytest.approx(s1.end - 2.5)
    assert stats.decode.total == pytest.approx(s3.end - s1.end)
    assert stats.inference.total == pytest.approx(s3.end - 2.5)
    assert stats.e2e.total == pytest.approx(s3.end - 1.0)
    # two inter-token gaps, one per step after the first token; time per output token = decode / (3 − 1)
    assert stats.itl.count == 2 and stats.itl.total == pytest.approx(s3.end - s1.end)
    assert stats.time_per_output_token.total == pytest.approx((s3.end - s1.end) / 2)
    # iteration tokens: the prompt (credited with its first token) + 1 generated, then 1 and 1
    assert stats.iteration_tokens.count == 3 and stats.iteration_tokens.total == 5 + 1 + 1


def test_each_decoding_request_records_its_gap_since_its_last_token():
    engine = tiny()
    for name in "abcd":
        engine.add_request(request(name, 4, 3))
    s1, _ = run_step(engine, 0.0)
    s2, _ = run_step(engine, 12.0)  # the engine idled 12 s: every gap includes the pause
    gap = s2.end - s1.end
    assert 10.0 < gap < 20.0
    assert engine.stats.itl.count == 4 and engine.stats.itl.total == pytest.approx(4 * gap)
    assert dict(engine.stats.itl.cumulative())[10.0] == 0 and dict(engine.stats.itl.cumulative())[20.0] == 4


def test_abort_frees_blocks_wherever_the_request_is():
    engine = tiny()
    a, b, c = request("a", 8, 8), request("b", 8, 8), request("c", 8, 8)
    for r in (a, b, c):
        engine.add_request(r)
    run_step(engine, 0.0)
    engine.abort(b, 1.0)  # running, between steps
    assert b.finished and b.blocks == 0 and b not in engine.running
    step = engine.schedule(1.0)
    assert step is not None
    engine.abort(a, 1.001)  # on the GPU right now: dropped when the step completes
    changed = engine.complete(step)
    engine.check_blocks()
    assert a not in changed and a not in engine.running and a.blocks == 0
    d = request("d", 4, 4)
    engine.add_request(d)
    engine.abort(d, 2.0)  # still waiting
    assert d not in engine.waiting
    assert engine.stats.request_success["abort"] == 3
    assert engine.stats.e2e.count == 3  # aborted requests are recorded, as vLLM does
    assert [r.request_id for r in engine.running] == ["c"]


# --- what the pages see ------------------------------------------------------------------------------------


def test_activity_over_the_last_second_splits_steps_at_the_window_edge():
    dep = Deployment(H100, LLAMA70, tp=8, interconnect=interconnect_for(H100, "pcie5"))
    engine = Engine(EngineConfig(dep))
    for i in range(16):
        engine.add_request(request(f"r{i}", 64, 4))
    step, _ = run_step(engine, 0.0)
    timing = step.timing
    # 16 prompts of 64 tokens = 1,024 tokens through 160 all-reduces of 1,024 × 8,192 × 2 bytes, 7/4 of it per GPU
    assert step.link_bytes_per_gpu == allreduce_bytes_per_gpu(dep, 1024) == 160 * 7 / 4 * 1024 * 8192 * 2
    assert timing.bound_by == "interconnect"
    activity = engine.activity(now=step.end, window=step.duration / 2)  # half the step is inside the window
    assert activity.link_bytes_per_gpu == pytest.approx(step.link_bytes_per_gpu / 2)
    assert activity.allreduce_seconds == pytest.approx(timing.allreduce_seconds / 2)
    assert activity.kernel_seconds == pytest.approx(max(timing.compute_seconds, timing.memory_seconds) / 2)
    # an all-reduce-bound step: the link is busier than the SMs
    assert activity.ratio(activity.allreduce_seconds) > activity.ratio(activity.kernel_seconds)

    labels = DcgmCollector(engine, now=lambda: step.end).labels
    assert [x["gpu"] for x in labels] == [str(i) for i in range(8)] and len({x["UUID"] for x in labels}) == 8
    assert labels[0]["modelName"] == "NVIDIA H100 80GB HBM3" and labels[0]["Hostname"] == "llmdiag-sim"


def test_vllm_page_counts_match_the_engine():
    engine = tiny()
    engine.add_request(request("a", 6, 4))
    drain(engine)
    families = {m.name: m for m in vllm_registry(engine, wall_start=1_800_000_000.0).collect()}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for m in families.values() for s in m.samples}
    labels = (("engine", "0"), ("model_name", "meta-llama/Meta-Llama-3-8B"))
    assert samples[("vllm:generation_tokens_total", labels)] == 4
    assert samples[("vllm:prompt_tokens_total", labels)] == 6
    assert samples[("vllm:request_success_total", (*labels[:1], ("finished_reason", "length"), *labels[1:]))] == 1
    assert samples[("vllm:iteration_tokens_total_count", labels)] == 4  # one observation per step
    assert samples[("vllm:iteration_tokens_total_created", labels)] == 1_800_000_000.0
    assert samples[("vllm:kv_cache_usage_perc", labels)] == 0.0
