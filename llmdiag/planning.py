"""``llmdiag capacity --simulate``: run the simulator for the same case as ``plan_capacity`` and measure it.

The simulator (``llmdiag.sim``) runs the same deployment and vLLM caps in real time behind its HTTP server, and a
closed-loop load of the same users, prompt and output (streaming clients, in this process) drives it for a bounded
time. Snapshots of the engine every ``SAMPLE_SECONDS`` give the batch, the queue and the KV use; the rates are
taken after a warm-up (the arrival burst), the TTFTs are what the clients saw on every request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from llmdiag.engine.capacity import CapacityQuestion, plan_capacity
from llmdiag.model.capacity import CapacityInputs, CapacityReport, Resource, SimulatedCapacity
from llmdiag.model.load import quantile
from llmdiag.physics.hardware import GpuSpec, ModelSpec

MAX_SIMULATED_USERS = 1000  # the streams one process (simulator and clients together) sustains
OUTPUT_SPREAD = 0.25  # vary output lengths a little so a closed loop's users do not stay in lockstep
WARMUP_SHARE = 0.4  # the share of the run left out of the rates: the arrival burst and its first wave
SAMPLE_SECONDS = 0.1
MIN_SECONDS = 2.0

Snapshot = dict[str, Any]  # the simulator's engine snapshot (SimServer.snapshot)


def question_of(report: CapacityReport, gpu: GpuSpec, model: ModelSpec, interconnect: str | None) -> CapacityQuestion:
    """The question ``report`` answers, its batch caps as resolved (vLLM's defaults written out)."""
    i = report.inputs
    return CapacityQuestion(
        gpu=gpu,
        model=model,
        tp=i.tp,
        users=i.users,
        prompt_tokens=i.prompt_tokens,
        output_tokens=i.output_tokens,
        interconnect=interconnect,
        gpu_memory_utilization=i.gpu_memory_utilization,
        max_num_seqs=i.max_num_seqs,
        max_num_batched_tokens=i.max_num_batched_tokens,
        activation_reserve_bytes=i.activation_reserve_bytes,
        scheduler_overhead_seconds=i.scheduler_overhead_seconds,
        block_size_tokens=i.block_size_tokens,
    )


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
    question = question_of(report, gpu, model, interconnect)
    users = min(question.users, MAX_SIMULATED_USERS)
    run = _run_simulator(question, users, max(MIN_SECONDS, seconds))
    window = _measured_window(run.samples)
    limited_by, detail = _cap_seen(window, report.inputs)
    # the estimate for the users simulated: the report's own unless they were capped
    analytical = report if users == question.users else plan_capacity(replace(question, users=users))
    ttfts = sorted(run.ttft_seconds)
    return SimulatedCapacity(
        users=users,
        users_capped=users < question.users,
        output_spread=OUTPUT_SPREAD,
        wall_seconds=run.wall_seconds,
        warmup_seconds=window.warmup_seconds,
        measured_seconds=window.seconds,
        lag_seconds=run.samples[-1]["lag_seconds"],
        requests_completed=run.requests_completed,
        steps=window.steps,
        mean_batch_sequences=window.mean_batch,
        max_batch_sequences=window.max_batch,
        mean_waiting=window.mean_waiting,
        total_tokens_per_second=window.total_tokens_per_second,
        per_user_tokens_per_second=window.total_tokens_per_second / window.mean_batch if window.mean_batch else 0.0,
        mean_per_user_tokens_per_second=window.total_tokens_per_second / users,
        gpu_busy_tokens_per_second=window.generated_tokens / window.busy_seconds if window.busy_seconds > 0 else 0.0,
        ttft_p50_seconds=quantile(ttfts, 0.5),
        ttft_p90_seconds=quantile(ttfts, 0.9),
        ttft_samples=len(ttfts),
        kv_usage_mean=window.kv_usage_mean,
        kv_usage_max=window.kv_usage_max,
        preemptions=window.preemptions,
        analytical_total_tokens_per_second=analytical.at_users.total_tokens_per_second,
        limited_by=limited_by,
        limited_detail=detail,
    )


@dataclass(frozen=True)
class SimulatorRun:
    samples: list[Snapshot]  # the engine every SAMPLE_SECONDS, the first before the load starts
    ttft_seconds: list[float]  # every request's, in simulated seconds
    requests_completed: int
    wall_seconds: float


def _run_simulator(question: CapacityQuestion, users: int, seconds: float) -> SimulatorRun:
    """The simulator behind its HTTP server, driven by a closed loop of ``users`` streaming clients until the
    deadline; leaving the block cancels what is in flight (no drain to skew the rates)."""
    from llmdiag.sim.engine import EngineConfig
    from llmdiag.sim.load import ClosedLoopLoad
    from llmdiag.sim.presets import LoadSpec
    from llmdiag.sim.server import SimServer

    config = EngineConfig(
        question.deployment(),
        max_num_seqs=question.max_num_seqs,
        max_num_batched_tokens=question.max_num_batched_tokens,
    )
    load = LoadSpec(users, question.prompt_tokens, question.output_tokens, output_spread=OUTPUT_SPREAD)
    samples: list[Snapshot] = []
    started = time.monotonic()
    with SimServer(config) as server:
        driver = ClosedLoopLoad(server.url, server.model, load, max_seconds=seconds + 60)
        with driver:
            samples.append(server.snapshot())
            while time.monotonic() - started < seconds:
                time.sleep(SAMPLE_SECONDS)
                samples.append(server.snapshot())
        wall = time.monotonic() - started
    stats = driver.tally
    ttfts = [t * server.config.time_scale for t in stats.ttft_seconds]
    return SimulatorRun(samples=samples, ttft_seconds=ttfts, requests_completed=stats.ok, wall_seconds=wall)


@dataclass(frozen=True)
class MeasuredWindow:
    """The run after its warm-up: rates from the counters' differences, the batch and queue time-averaged."""

    warmup_seconds: float
    seconds: float
    steps: int
    generated_tokens: float
    busy_seconds: float
    mean_batch: float
    max_batch: int
    mean_waiting: float
    kv_usage_mean: float
    kv_usage_max: float
    preemptions: int  # over the whole run

    @property
    def total_tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds


def _measured_window(samples: list[Snapshot]) -> MeasuredWindow:
    begin, end = samples[0]["clock_seconds"], samples[-1]["clock_seconds"]
    warm_until = begin + WARMUP_SHARE * (end - begin)
    window = [s for s in samples if s["clock_seconds"] >= warm_until] or samples[-2:]
    first, last = window[0], window[-1]

    def mean(key: str) -> float:
        total: float = sum(s[key] for s in window)
        return total / len(window)

    return MeasuredWindow(
        warmup_seconds=warm_until - begin,
        seconds=max(last["clock_seconds"] - first["clock_seconds"], 1e-9),
        steps=last["steps"] - first["steps"],
        generated_tokens=last["generation_tokens"] - first["generation_tokens"],
        busy_seconds=last["busy_seconds"] - first["busy_seconds"],
        mean_batch=mean("running"),
        max_batch=max(s["running"] for s in window),
        mean_waiting=mean("waiting"),
        kv_usage_mean=mean("kv_usage_ratio"),
        kv_usage_max=max(s["kv_usage_ratio"] for s in window),
        preemptions=samples[-1]["preemptions"],
    )


def _cap_seen(window: MeasuredWindow, inputs: CapacityInputs) -> tuple[Resource | None, str]:
    """The cap the run hit, if any: KV memory (preemptions, or a full cache with a queue), the batch slots, or
    else the step budget when users wait with both left."""
    waiting, kv_max, preemptions = window.mean_waiting, window.kv_usage_max, window.preemptions
    if preemptions or (kv_max >= 0.95 and waiting >= 1):
        return (
            "kv_memory",
            f"KV use up to {kv_max:.0%}, {preemptions:,} preemptions; {waiting:,.0f} users wait on average",
        )
    if window.max_batch >= inputs.max_num_seqs and waiting >= 1:
        return (
            "max_num_seqs",
            f"the batch reached max_num_seqs ({inputs.max_num_seqs}); {waiting:,.0f} users wait on average",
        )
    if waiting >= 1:
        return (
            "max_num_batched_tokens",
            f"{waiting:,.0f} users wait on average with KV and batch slots left: the step budget",
        )
    return None, f"no cap reached: every user is served (KV use up to {kv_max:.0%})"


# ---------------------------------------------------------------------------------------------------------------
# `llmdiag whatif` against the simulator: scan a preset, predict each fix, rerun with it, compare (accelerated time)

WHATIF_SCRAPE_SECONDS = 1.0  # simulated seconds between two pages, as a scan reads them
WHATIF_RAMP_SHARE = 0.5  # the scanned run adds its users over this share of the window: the batch varies, so the
# step's slope against it is measured (a scan under `llmdiag load` levels does the same)
WHATIF_WARMUP_SHARE = 0.4  # the rerun's pages before this share are left out: its arrival burst, not its state
WHATIF_SEED = 7
WHATIF_UNIX_ORIGIN = 1_767_225_600.0  # pages stamped from 2026-01-01 00:00 UTC: fixed, so a run is repeatable


def simulated_window(config: Any, load: Any, seconds: float, ramp: bool, seed: int = WHATIF_SEED) -> Any:
    """A closed loop of ``load`` on the simulator's engine, stepped in simulated time (no HTTP, no sleeping), read
    as a scan reads a vLLM page every WHATIF_SCRAPE_SECONDS, and judged: the Verdict. With ``ramp`` the users
    start one by one over the first WHATIF_RAMP_SHARE of the window; without, at once, and the warm-up is left
    out."""
    import random

    from llmdiag.collect.exposition import parse_exposition
    from llmdiag.collect.servers.pages import build_server_signals
    from llmdiag.engine.evaluate import build_verdict
    from llmdiag.schema.loader import load_probe
    from llmdiag.sim.engine import Engine, SimRequest
    from llmdiag.sim.metrics import render, vllm_registry

    engine = Engine(config)
    registry = vllm_registry(engine, WHATIF_UNIX_ORIGIN)
    rng = random.Random(seed)
    low, high = load.output_range()
    starts = _ramp(load.users, seconds * WHATIF_RAMP_SHARE) if ramp else [0.0] * load.users
    serial = 0

    def submit(at: float) -> None:
        nonlocal serial
        serial += 1
        engine.add_request(SimRequest(f"u{serial}", load.prompt_tokens, rng.randint(low, high), arrival=at))

    scrapes, now, next_page = [], 0.0, 0.0
    while now < seconds:
        while starts and starts[0] <= now:
            submit(starts.pop(0))
        while next_page <= now:
            text = render(registry).decode()
            scrapes.append(parse_exposition(text, WHATIF_UNIX_ORIGIN + now, origin="simulator"))
            next_page += WHATIF_SCRAPE_SECONDS
        step = engine.schedule(now)
        if step is None:
            now = min([next_page, *starts[:1]])
            continue
        for request in engine.complete(step):
            if request.finished:
                submit(step.end)
        now = step.end
    if not ramp:
        scrapes = scrapes[int(len(scrapes) * WHATIF_WARMUP_SHARE) :]
    signals = build_server_signals(load_probe("vllm"), scrapes, "simulator")
    return build_verdict(signals, target="simulator")


def _ramp(users: int, seconds: float) -> list[float]:
    """When each user starts: in levels of 1, 2, 4 … users, each held an equal share of ``seconds`` (as
    `llmdiag load` steps its levels), so the batch holds still at each for the step's fit."""
    levels = [1]
    while levels[-1] < users:
        levels.append(min(users, levels[-1] * 2))
    hold = seconds / len(levels)
    starts: list[float] = []
    for index, level in enumerate(levels):
        starts += [index * hold] * (level - len(starts))
    return starts


def config_with(config: Any, changes: dict[str, Any]) -> Any:
    """The simulator's engine with a what-if's changes applied (``replicas`` is the caller's: it splits users)."""
    deployment = config.deployment
    if "kv_cache_dtype" in changes:
        fp8 = str(changes["kv_cache_dtype"]).startswith("fp8")
        deployment = replace(deployment, kv_dtype_bytes=1 if fp8 else None)
    if "gpu_memory_utilization" in changes:
        deployment = replace(deployment, gpu_memory_utilization=float(changes["gpu_memory_utilization"]))
    if "tensor_parallel_size" in changes:
        deployment = replace(deployment, tp=int(changes["tensor_parallel_size"]))
    fields = {"deployment": deployment}
    for name, field in (
        ("max_num_seqs", "max_num_seqs"),
        ("max_num_batched_tokens", "max_num_batched_tokens"),
        ("num_gpu_blocks", "num_gpu_blocks_override"),
        ("max_model_len", "max_model_len"),
    ):
        if name in changes:
            fields[field] = int(changes[name])
    if (
        "num_gpu_blocks" not in changes
        and config.num_gpu_blocks_override is not None
        and deployment != config.deployment
    ):
        fields["num_gpu_blocks_override"] = None
    return replace(config, **fields)


@dataclass(frozen=True)
class WhatIfCheck:
    """One fix on one preset: what was predicted, and what the simulator then measured."""

    preset: str
    changes: dict[str, Any]
    prediction: Any  # llmdiag.model.WhatIf
    measured_class: str
    measured: Any  # llmdiag.model.Figures: the rerun's window, every replica together


def validate_whatif(preset_name: str, seconds: float = 40.0) -> list[WhatIfCheck]:
    """Scan the preset (a ramped closed loop), take each fix its verdict quantifies, rerun the simulator with it
    applied under the same users, and pair the prediction with the rerun's measured figures."""
    from llmdiag.engine.whatif import measured_figures, predict
    from llmdiag.sim.presets import LoadSpec, get_preset

    preset = get_preset(preset_name)
    verdict = simulated_window(preset.engine, preset.load, seconds, ramp=True)
    inputs = verdict.whatif_inputs
    seen: list[dict[str, Any]] = []
    checks = []
    for finding in verdict.findings:
        for effect in finding.predicted:
            if not effect.modelled or effect.changes in seen:
                continue
            seen.append(effect.changes)
            prediction = predict(inputs, effect.changes, verdict.bottleneck.value)
            replicas = int(effect.changes.get("replicas", 1))
            load = preset.load
            if replicas > 1:
                load = LoadSpec(
                    max(1, load.users // replicas), load.prompt_tokens, load.output_tokens, load.output_spread
                )
            after = simulated_window(config_with(preset.engine, effect.changes), load, seconds, ramp=False)
            measured = measured_figures(after.whatif_inputs)
            if replicas > 1:
                measured = _scaled(measured, replicas, preset.load.users)
            checks.append(WhatIfCheck(preset.name, effect.changes, prediction, after.bottleneck.value, measured))
    return checks


def _scaled(figures: Any, replicas: int, users: int) -> Any:
    """One replica's figures as the whole fleet's: counts and totals times the replicas."""
    update = {}
    for name in ("requests_running", "requests_waiting", "total_tokens_per_second", "preemptions_per_second"):
        value = getattr(figures, name)
        update[name] = None if value is None else value * replicas
    return figures.model_copy(update=update)
