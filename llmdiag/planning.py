"""``llmdiag capacity --simulate``: run the simulator for the same case as ``plan_capacity`` and measure it.

The simulator (``llmdiag.sim``) runs the same deployment and vLLM caps in real time behind its HTTP server, and a
closed-loop load of the same users, prompt and output (streaming clients, in this process) drives it for a bounded
time. Snapshots of the engine every ``SAMPLE_SECONDS`` give the batch, the queue and the KV use; the rates are
taken after a warm-up (the arrival burst), the TTFTs are what the clients saw on every request.
"""

from __future__ import annotations

import time
from typing import Any

from llmdiag.engine.capacity import plan_capacity
from llmdiag.model.capacity import CapacityReport, Resource, SimulatedCapacity
from llmdiag.model.load import quantile
from llmdiag.physics.hardware import GpuSpec, ModelSpec, interconnect_for
from llmdiag.physics.step import Deployment

MAX_SIMULATED_USERS = 1000  # the streams one process (simulator and clients together) sustains
OUTPUT_SPREAD = 0.25  # vary output lengths a little so a closed loop's users do not stay in lockstep
WARMUP_SHARE = 0.4  # the share of the run left out of the rates: the arrival burst and its first wave
SAMPLE_SECONDS = 0.1
MIN_SECONDS = 2.0


def simulate_capacity(
    report: CapacityReport,
    gpu: GpuSpec,
    model: ModelSpec,
    *,
    interconnect: str | None = None,
    seconds: float = 15.0,
) -> SimulatedCapacity:
    """Run the simulator for ``report``'s case (same GPU, model, TP, memory settings and vLLM caps) for about
    ``seconds`` of wall time and return what it measured. Blocking; prints nothing."""
    from llmdiag.sim.engine import EngineConfig
    from llmdiag.sim.load import ClosedLoopLoad
    from llmdiag.sim.presets import LoadSpec
    from llmdiag.sim.server import SimServer

    i = report.inputs
    seconds = max(MIN_SECONDS, seconds)
    users = min(i.users, MAX_SIMULATED_USERS)
    dep = Deployment(
        gpu=gpu,
        model=model,
        tp=i.tp,
        interconnect=interconnect_for(gpu, interconnect),
        gpu_memory_utilization=i.gpu_memory_utilization,
        activation_reserve_bytes=i.activation_reserve_bytes,
        block_size_tokens=i.block_size_tokens,
        scheduler_overhead_seconds=i.scheduler_overhead_seconds,
    )
    config = EngineConfig(dep, max_num_seqs=i.max_num_seqs, max_num_batched_tokens=i.max_num_batched_tokens)
    load = LoadSpec(users, i.prompt_tokens, i.output_tokens, output_spread=OUTPUT_SPREAD)

    samples: list[dict[str, Any]] = []
    started = time.monotonic()
    with SimServer(config) as server:
        # the run ends at the deadline: leaving the block cancels what is in flight (no drain to skew the rates)
        driver = ClosedLoopLoad(server.url, server.model, load, max_seconds=seconds + 60)
        with driver:
            samples.append(server.snapshot())
            while time.monotonic() - started < seconds:
                time.sleep(SAMPLE_SECONDS)
                samples.append(server.snapshot())
        wall = time.monotonic() - started
    stats = driver.tally

    begin, end = samples[0]["clock_seconds"], samples[-1]["clock_seconds"]
    warm_until = begin + WARMUP_SHARE * (end - begin)
    window = [s for s in samples if s["clock_seconds"] >= warm_until] or samples[-2:]
    first, last = window[0], window[-1]
    measured = max(last["clock_seconds"] - first["clock_seconds"], 1e-9)
    generated = last["generation_tokens"] - first["generation_tokens"]
    busy = last["busy_seconds"] - first["busy_seconds"]
    total = generated / measured
    mean_batch = sum(s["running"] for s in window) / len(window)
    mean_waiting = sum(s["waiting"] for s in window) / len(window)
    kv_mean = sum(s["kv_usage_ratio"] for s in window) / len(window)
    kv_max = max(s["kv_usage_ratio"] for s in window)
    max_batch = max(s["running"] for s in window)
    preemptions = samples[-1]["preemptions"]

    limited_by: Resource | None
    if preemptions or (kv_max >= 0.95 and mean_waiting >= 1):
        limited_by = "kv_memory"
        detail = f"KV use up to {kv_max:.0%}, {preemptions:,} preemptions; {mean_waiting:,.0f} users wait on average"
    elif max_batch >= i.max_num_seqs and mean_waiting >= 1:
        limited_by = "max_num_seqs"
        detail = f"the batch reached max_num_seqs ({i.max_num_seqs}); {mean_waiting:,.0f} users wait on average"
    elif mean_waiting >= 1:
        limited_by = "max_num_batched_tokens"
        detail = f"{mean_waiting:,.0f} users wait on average with KV and batch slots left: the step budget"
    else:
        limited_by = None
        detail = f"no cap reached: every user is served (KV use up to {kv_max:.0%})"

    analytical = (
        report
        if users == i.users
        else plan_capacity(
            gpu,
            model,
            i.tp,
            users,
            i.prompt_tokens,
            i.output_tokens,
            interconnect=interconnect,
            gpu_memory_utilization=i.gpu_memory_utilization,
            max_num_seqs=i.max_num_seqs,
            max_num_batched_tokens=i.max_num_batched_tokens,
            activation_reserve_bytes=i.activation_reserve_bytes,
            scheduler_overhead_seconds=i.scheduler_overhead_seconds,
            block_size_tokens=i.block_size_tokens,
        )
    )
    ttfts = [t * server.config.time_scale for t in stats.ttft_seconds]
    return SimulatedCapacity(
        users=users,
        users_capped=users < i.users,
        output_spread=OUTPUT_SPREAD,
        wall_seconds=wall,
        warmup_seconds=warm_until - begin,
        measured_seconds=measured,
        lag_seconds=samples[-1]["lag_seconds"],
        requests_completed=stats.ok,
        steps=last["steps"] - first["steps"],
        mean_batch_sequences=mean_batch,
        max_batch_sequences=max_batch,
        mean_waiting=mean_waiting,
        total_tokens_per_second=total,
        per_user_tokens_per_second=total / mean_batch if mean_batch else 0.0,
        mean_per_user_tokens_per_second=total / users,
        gpu_busy_tokens_per_second=generated / busy if busy > 0 else 0.0,
        ttft_p50_seconds=quantile(sorted(ttfts), 0.5),
        ttft_p90_seconds=quantile(sorted(ttfts), 0.9),
        ttft_samples=len(ttfts),
        kv_usage_mean=kv_mean,
        kv_usage_max=kv_max,
        preemptions=preemptions,
        analytical_total_tokens_per_second=analytical.at_users.total_tokens_per_second,
        limited_by=limited_by,
        limited_detail=detail,
    )
