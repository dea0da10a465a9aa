"""`llmdiag capacity --compare`: the classic comparisons, each alternative priced by the physics and run in the
simulator on the same workload, side by side.

    report = run_compare(question, parse_compare("batching,kv"))

Every alternative gets one set of figures (``FIGURES``) from each method:

    physics     a closed loop in steady state. B sequences are served (plan_capacity's batch caps), each request
                takes T = prefill alone + (O − 1) · step(sustained load of B), so X = B / T requests/s finish and,
                by Little's law, N users wait W = T · (N / B − 1) for a slot when N > B. TTFT = W + prefill alone;
                per-user tokens/s = 1 / step while decoding, O / (W + T) with the queue; total = B / step.
    simulator   the simulator's engine (llmdiag.sim.engine, vLLM V1's scheduler) stepped in virtual time by
                ``planning.run_virtual``: the users each send ``requests_per_user`` requests back to back, starting
                together; the figures are the finished requests' (TTFT, decode rate, e2e) and the steps' (ITL).

The comparison's module docstrings in ``_batching`` … ``_users`` say what each alternative changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from llmdiag.engine.capacity import CapacityQuestion, plan_capacity, prefill_alone_seconds, sustained_load
from llmdiag.errors import UsageError, option
from llmdiag.model.capacity import CapacityReport
from llmdiag.model.compare import (
    COMPARISONS,
    CompareColumn,
    CompareInputs,
    CompareReport,
    CompareRow,
    Comparison,
    Method,
)
from llmdiag.model.load import quantile
from llmdiag.physics.hardware import GpuSpec
from llmdiag.physics.step import (
    Deployment,
    blocks_per_sequence,
    decode_load,
    kv_bytes_per_token_per_gpu,
    kv_capacity,
    prefill_load,
    step_time,
    weight_bytes,
)
from llmdiag.planning import MAX_SIMULATED_USERS, VirtualRun, VirtualWorkload, run_virtual

Figures = dict[str, float | None]
FIGURE_COLUMNS = {
    "total_tokens_per_second": ("total tok/s", "tokens/s"),
    "per_user_tokens_per_second": ("per user tok/s", "tokens/s"),
    "per_user_incl_queue_tokens_per_second": ("per user tok/s with queue", "tokens/s"),
    "ttft_p50_seconds": ("TTFT p50", "seconds"),
    "ttft_p90_seconds": ("TTFT p90", "seconds"),
    "itl_p50_seconds": ("ITL p50", "seconds"),
    "itl_p90_seconds": ("ITL p90", "seconds"),
    "idle_slot_ratio": ("idle slots", "ratio"),
    "batch_sequences": ("batch", "count"),
    "sequences_fit": ("seqs fit", "count"),
    "kv_waste_ratio": ("KV wasted", "ratio"),
    "weight_bytes_per_gpu": ("weights/GPU", "bytes"),
    "kv_bytes_per_token_per_gpu": ("KV/token", "bytes"),
    "compute_seconds": ("step: math", "seconds"),
    "memory_seconds": ("step: HBM", "seconds"),
    "step_seconds": ("step", "seconds"),
    "gpus": ("GPUs", "count"),
}
SIMULATOR_ONLY = "the simulator measures it; the steady-state physics has one value for every request"
PHYSICS_ONLY = "a property of the deployment: the physics gives it, the simulator runs with it"


@dataclass(frozen=True)
class CompareSettings:
    """The workload's shape beyond the capacity question, and how long the simulator runs."""

    output_spreads: tuple[float, ...] = (0.0, 0.5, 0.9)  # output lengths uniform in O·(1 ± spread)
    paid_share: float = 0.2  # the priority comparison's paid users (priority 0), the rest free (priority 1)
    # the simulator's run, in closed-loop cycles (a user's wait + request time, by the physics): the warm-up that
    # is not measured (the arrival burst), then the cycles that are
    warmup_cycles: float = 1.5
    measured_cycles: float = 4.0
    seed: int = 18


def parse_compare(text: str) -> list[str]:
    """``all`` or a comma-separated list of COMPARISONS, in their canonical order; ``UsageError`` otherwise."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError(f"{option('compare')} needs a comparison", f"one or more of {', '.join(COMPARISONS)}, or all")
    if "all" in names:
        return list(COMPARISONS)
    unknown = [n for n in names if n not in COMPARISONS]
    if unknown:
        raise UsageError(
            f"unknown comparison '{unknown[0]}' in {option('compare')}",
            f"one or more of {', '.join(COMPARISONS)} (comma-separated), or all",
        )
    return [n for n in COMPARISONS if n in names]


# --- the two methods ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One alternative's deployment and server settings, shared by its physics and its simulator run."""

    question: CapacityQuestion
    plan: CapacityReport
    dep: Deployment
    users: int
    sim_users: int
    settings: CompareSettings
    # every row's whole figures, in the order made: (alternative, method, figures)
    ledger: list[tuple[str, Method, Figures]] = field(default_factory=list)

    @property
    def max_num_seqs(self) -> int:
        return self.plan.inputs.max_num_seqs

    @property
    def chunk_tokens(self) -> int:
        return self.plan.inputs.max_num_batched_tokens

    def engine_config(self, dep: Deployment | None = None, **flags: Any) -> Any:
        from llmdiag.sim.engine import EngineConfig

        kwargs: dict[str, Any] = {"max_num_seqs": self.max_num_seqs, "max_num_batched_tokens": self.chunk_tokens}
        kwargs.update(flags)
        return EngineConfig(dep or self.dep, **kwargs)

    @property
    def cycle_seconds(self) -> float:
        """A user's closed-loop cycle by the physics (wait + request): the simulator runs a few of them."""
        base = physics_continuous(self)
        return self.question.output_tokens / (base["per_user_incl_queue_tokens_per_second"] or 1.0)

    def workload(self, spread: float = 0.0, priority_users: int = 0, users: int | None = None) -> VirtualWorkload:
        q, settings = self.question, self.settings
        warmup = settings.warmup_cycles * self.cycle_seconds
        return VirtualWorkload(
            users=users or self.sim_users,
            prompt_tokens=q.prompt_tokens,
            output_tokens=q.output_tokens,
            horizon_seconds=warmup + settings.measured_cycles * self.cycle_seconds,
            warmup_seconds=warmup,
            output_spread=spread,
            priority_users=priority_users,
            seed=settings.seed,
        )


def closed_loop(users: float, batch: float, step_seconds: float, alone_seconds: float, output_tokens: int) -> Figures:
    """The physics' steady state (module docstring): users wait for one of ``batch`` slots by Little's law."""
    request = alone_seconds + (output_tokens - 1) * step_seconds
    wait = request * max(0.0, users / batch - 1) if batch > 0 else math.inf
    ttft = wait + alone_seconds
    return {
        "total_tokens_per_second": batch / step_seconds,
        "per_user_tokens_per_second": 1 / step_seconds,
        "per_user_incl_queue_tokens_per_second": output_tokens / (wait + request),
        "ttft_p50_seconds": ttft,
        "ttft_p90_seconds": ttft,
        "itl_p50_seconds": step_seconds,
        "itl_p90_seconds": step_seconds,
        "batch_sequences": batch,
        "idle_slot_ratio": 0.0,
    }


def physics_continuous(case: Case, dep: Deployment | None = None, batch: float | None = None) -> Figures:
    """Continuous batching at the served batch (or ``batch``): the sustained step of plan_capacity."""
    dep = dep or case.dep
    q = case.question
    served = batch if batch is not None else float(case.plan.served_sequences)
    step = step_time(dep, sustained_load(served, q.prompt_tokens, q.output_tokens)).step_seconds
    alone = prefill_alone_seconds(dep, q.prompt_tokens, case.chunk_tokens)
    return closed_loop(case.users, served, step, alone, q.output_tokens)


def _weighted_quantile(samples: list[tuple[float, int]], q: float) -> float | None:
    """The q-quantile of values each observed ``count`` times (the ITL of every decode in a step)."""
    total = sum(count for _, count in samples)
    if total == 0:
        return None
    rank, seen = q * (total - 1), 0
    for value, count in sorted(samples):
        seen += count
        if seen > rank:
            return value
    return sorted(samples)[-1][0]


def simulated(run: VirtualRun, batch_cap: float, users_share: float = 1.0, klass: int | None = None) -> Figures:
    """The figures of an accelerated run after its warm-up: the requests' TTFT and decode rates (those of priority
    ``klass`` only, if given), the steps' ITL, batch and tokens (total ÷ ``users_share``: a replica's share)."""
    requests = [r for r in run.measured_requests() if klass is None or r.priority == klass]
    steps = run.measured_steps()
    w = run.workload
    window = w.horizon_seconds - w.warmup_seconds
    ttfts = sorted(r.first_token_ts - r.arrival for r in requests)
    decode = sorted((r.generated - 1) / (r.last_token_ts - r.first_token_ts) for r in requests if r.generated > 1)
    with_queue = [r.generated / (r.finished_ts - r.arrival) for r in requests]
    busy = sum(s.duration for s in steps)
    mean_batch = sum(s.duration * s.sequences for s in steps) / busy if busy > 0 else 0.0
    itl = [(s.duration, s.decodes) for s in steps if s.decodes]
    return {
        "total_tokens_per_second": sum(s.generated for s in steps) / window / users_share if window > 0 else None,
        "per_user_tokens_per_second": quantile(decode, 0.5),
        "per_user_incl_queue_tokens_per_second": sum(with_queue) / len(with_queue) if with_queue else None,
        "ttft_p50_seconds": quantile(ttfts, 0.5),
        "ttft_p90_seconds": quantile(ttfts, 0.9),
        "itl_p50_seconds": _weighted_quantile(itl, 0.5),
        "itl_p90_seconds": _weighted_quantile(itl, 0.9),
        "batch_sequences": mean_batch,
        "idle_slot_ratio": max(0.0, 1 - mean_batch / batch_cap) if batch_cap > 0 and steps else None,
        "sequences_fit": float(max((s.sequences for s in steps), default=0)),
    }


def _columns(keys: list[str]) -> list[CompareColumn]:
    return [CompareColumn(key=k, label=FIGURE_COLUMNS[k][0], unit=FIGURE_COLUMNS[k][1]) for k in keys]


def _row(case: Case, alternative: str, method: Method, figures: Figures, keys: list[str], why: str = "") -> CompareRow:
    """A table row: the figures the comparison shows; one the method cannot give is None, with ``why``. Every
    figure goes in the case's ledger, where the users comparison finds them."""
    case.ledger.append((alternative, method, figures))
    values = {k: figures.get(k) for k in keys}
    reasons = {
        k: why or (SIMULATOR_ONLY if method == "physics" else PHYSICS_ONLY) for k, v in values.items() if v is None
    }
    return CompareRow(alternative=alternative, method=method, values=values, unavailable=reasons)


def _pair(case: Case, alternative: str, physics: Figures, sim: Figures, keys: list[str]) -> list[CompareRow]:
    return [_row(case, alternative, "physics", physics, keys), _row(case, alternative, "simulator", sim, keys)]


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}×" if a is not None and b else "unavailable"


def _seconds(value: float | None) -> str:
    if value is None:
        return "unavailable"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def _find(rows: list[CompareRow], alternative: str, method: Method, key: str) -> float | None:
    for row in rows:
        if row.alternative == alternative and row.method == method:
            return row.values.get(key)
    return None


# --- static vs continuous batching ------------------------------------------------------------------------------


def physics_static(case: Case, spread: float) -> Figures:
    """A static batch of B requests, prefilled in one step, decoded until its longest ends. Output lengths are the
    expected order statistics of B uniform draws in O·(1 ± spread); the GPU steps the shrinking batch token by
    token. In a closed loop of N users a request waits ⌈N / B⌉ − 1 whole batches and the rest of its own."""
    q, dep = case.question, case.dep
    low, high = q.output_tokens * (1 - spread), q.output_tokens * (1 + spread)
    longest = round(high)
    fit = kv_capacity(dep).blocks // blocks_per_sequence(dep, q.prompt_tokens + longest)
    batch = max(1, min(case.users, case.max_num_seqs, fit))
    lengths = sorted(low + (high - low) * k / (batch + 1) for k in range(1, batch + 1))
    prefill = step_time(dep, prefill_load(q.prompt_tokens, batch)).step_seconds
    clock, active_time, slot_time = prefill, 0.0, 0.0
    done: list[float] = []
    index = 0
    for t in range(1, longest + 1):
        while index < len(lengths) and lengths[index] < t:
            done.append(clock)
            index += 1
        active = batch - index
        if active == 0:
            break
        step = step_time(dep, decode_load(active, q.prompt_tokens + t)).step_seconds
        clock += step
        active_time += active * step
        slot_time += batch * step
    done += [clock] * (batch - len(done))
    tokens = sum(lengths)
    rounds = max(0.0, case.users / batch - 1)
    ttft = rounds * clock + sum(clock - d for d in done) / batch + prefill
    decode_rates = [n / (d - prefill) for n, d in zip(lengths, done, strict=True) if d > prefill]
    return {
        "total_tokens_per_second": tokens / clock,
        "per_user_tokens_per_second": sum(decode_rates) / len(decode_rates) if decode_rates else None,
        "per_user_incl_queue_tokens_per_second": tokens / batch / (rounds * clock + clock),
        "ttft_p50_seconds": ttft,
        "ttft_p90_seconds": ttft,
        "idle_slot_ratio": 1 - active_time / slot_time if slot_time > 0 else 0.0,
        "batch_sequences": float(batch),
    }


def _batching(case: Case) -> Comparison:
    keys = ["total_tokens_per_second", "per_user_tokens_per_second", "ttft_p50_seconds", "idle_slot_ratio"]
    rows: list[CompareRow] = []
    spreads = case.settings.output_spreads
    for spread in spreads:
        label = f"±{spread:.0%}"
        cont = simulated(run_virtual(case.engine_config(), case.workload(spread)), _batch_cap(case))
        static = simulated(run_virtual(case.engine_config(batching="static"), case.workload(spread)), _batch_cap(case))
        rows += _pair(case, f"continuous {label}", physics_continuous(case), cont, keys)
        rows += _pair(case, f"static {label}", physics_static(case, spread), static, keys)
    widest = f"±{spreads[-1]:.0%}"
    gain = _ratio(
        _find(rows, f"continuous {widest}", "simulator", keys[0]),
        _find(rows, f"static {widest}", "simulator", keys[0]),
    )
    return Comparison(
        name="batching",
        title="Static vs continuous batching",
        question="What does letting a request join or leave the batch at every step buy, as output lengths spread?",
        columns=_columns(keys),
        rows=rows,
        chart_columns=["total_tokens_per_second", "idle_slot_ratio"],
        finding=f"at output lengths {widest}, continuous batching's throughput is {gain} static's in the simulator: "
        "a static batch holds its slots empty until its longest request ends",
        basis=[
            "static: a batch forms only when the last one has ended, is prefilled in one step and decodes until its "
            "longest request ends (before Orca, OSDI '22); continuous: vLLM V1's scheduler, chunked prefill on",
            "idle slots: the share of the batch's slots that hold no sequence while it steps (the GPU's batch "
            "capacity left unused); the continuous physics is a steady state with every slot full",
            f"±spread: output lengths uniform in {case.question.output_tokens} · (1 ± spread), the same draws for both "
            "modes",
            "per user tok/s: while decoding (the median request's); TTFT includes the wait for a slot",
        ],
    )


def _batch_cap(case: Case) -> float:
    """The most sequences the deployment runs at once for these users: the simulator's idle slots count from it."""
    return float(min(case.sim_users, case.plan.served_sequences))


# --- reserved vs paged KV -----------------------------------------------------------------------------------------


def reserved_length(case: Case) -> int:
    """What a reserving server sets aside per sequence: the model's context (its max_model_len), at most the cache."""
    q = case.question
    stated = q.model.max_context_tokens or 8192
    return max(q.prompt_tokens + q.output_tokens, min(stated, kv_capacity(case.dep).tokens))


def _kv(case: Case) -> Comparison:
    """Reserved: each sequence holds max_model_len tokens of KV from admission (what servers did before
    PagedAttention, SOSP '23). Paged: vLLM's blocks of 16 tokens, allocated as tokens land. The simulator runs
    reservation as one block of max_model_len tokens per sequence."""
    q, dep = case.question, case.dep
    keys = ["sequences_fit", "kv_waste_ratio", "batch_sequences", "total_tokens_per_second", "ttft_p50_seconds"]
    capacity = kv_capacity(dep)
    length = reserved_length(case)
    mean_context = q.prompt_tokens + q.output_tokens / 2
    reserved_fit = capacity.tokens // length
    paged_fit = capacity.blocks // blocks_per_sequence(dep, q.prompt_tokens + q.output_tokens)
    block = dep.block_size_tokens
    paged_held = math.ceil(mean_context / block) * block
    rows: list[CompareRow] = []
    for label, fit, waste in (
        (f"reserved {length:,}/seq", reserved_fit, 1 - mean_context / length),
        (f"paged, {block}-token blocks", paged_fit, 1 - mean_context / paged_held),
    ):
        batch = min(case.users, fit, case.max_num_seqs)
        physics: Figures = {"sequences_fit": float(fit), "kv_waste_ratio": waste}
        sim: Figures = {}
        if batch >= 1:
            physics |= physics_continuous(case, batch=float(batch))
            if label.startswith("reserved"):
                reserve_dep = replace(dep, block_size_tokens=length)
                config = case.engine_config(reserve_dep, num_gpu_blocks_override=fit + 1, max_model_len=length)
            else:
                config = case.engine_config()
            sim = simulated(run_virtual(config, case.workload()), float(batch))
        physics["batch_sequences"] = float(batch)
        why = "" if batch else "not one sequence fits"
        rows.append(_row(case, label, "physics", physics, keys, why))
        rows.append(_row(case, label, "simulator", sim, keys, why))
    return Comparison(
        name="kv",
        title="KV reserved for the maximum length vs paged KV",
        question="How many sequences fit, and how much KV is wasted, when each reserves its maximum length?",
        columns=_columns(keys),
        rows=rows,
        chart_columns=["sequences_fit", "total_tokens_per_second"],
        finding=f"paged KV fits {paged_fit:,} sequences of {q.prompt_tokens + q.output_tokens} tokens where reserving "
        f"{length:,} tokens each fits {reserved_fit:,}",
        basis=[
            f"KV cache: {capacity.tokens:,} tokens per GPU ({capacity.blocks:,} blocks of {block})",
            f"waste: the share of held KV no token fills at the mean context P + O/2 = {mean_context:g} tokens "
            "(reservation: the unused maximum; paged: the last block's empty tail)",
            "sequences that fit (simulator): the largest batch one step carried; the simulator admits by the KV in "
            "use, as vLLM does, so it can run more than fit at their full length (and preempts when the cache fills)",
        ],
    )


# --- precision ---------------------------------------------------------------------------------------------------

# (label, weight bytes per parameter, KV bytes per value, the math's precision, what it is)
PRECISIONS: tuple[tuple[str, float, int, str, str], ...] = (
    ("BF16", 2.0, 2, "bf16", "weights, activations and KV in BF16"),
    ("FP8", 1.0, 1, "fp8", "FP8 weights and activations (W8A8), FP8 KV cache"),
    ("INT8", 1.0, 2, "int8", "INT8 weights and activations (W8A8, SmoothQuant-style), BF16 KV"),
    ("INT4 weight-only", 0.5, 2, "bf16", "INT4 weights (W4A16: AWQ/GPTQ), dequantised to BF16 math, BF16 KV"),
)


def precision_peak(gpu: GpuSpec, math_precision: str) -> tuple[float, str]:
    """The GPU's dense peak for ``math_precision`` (bf16, fp8, int8) and where the figure comes from: the catalogue's
    own per-precision peak (gpus.toml, sourced per part). A part with no units for it runs the weights narrow and the
    math in BF16 (FP8 weights on an A100 run as weight-only FP8, as vLLM's Marlin kernels do)."""
    bf16 = gpu.peak_bf16_flops_per_second
    if math_precision == "bf16":
        return bf16, "gpus.toml: the datasheet's dense BF16"
    peak = gpu.peak_flops_per_second(math_precision)
    if peak is not None:
        return peak, f"gpus.toml: the datasheet's dense {math_precision.upper()}"
    return bf16, f"the {gpu.name} has no {math_precision.upper()} units (gpus.toml): weight-only at BF16 math"


def precision_deployment(dep: Deployment, weight_width: float, kv_width: int, peak: float) -> Deployment:
    """The deployment with weights ``weight_width`` bytes wide (every weight, a quantized checkpoint's experts too),
    KV ``kv_width`` bytes wide, and the precision's peak."""
    model = replace(dep.model, weight_bytes_per_param=weight_width, expert_weight_bytes_per_param=weight_width)
    return replace(dep, model=model, gpu=replace(dep.gpu, peak_bf16_flops_per_second=peak), kv_dtype_bytes=kv_width)


def _precision(case: Case) -> Comparison:
    q = case.question
    keys = [
        "weight_bytes_per_gpu",
        "kv_bytes_per_token_per_gpu",
        "sequences_fit",
        "compute_seconds",
        "memory_seconds",
        "step_seconds",
        "per_user_tokens_per_second",
        "total_tokens_per_second",
    ]
    rows: list[CompareRow] = []
    basis: list[str] = []
    context = q.prompt_tokens + q.output_tokens
    for label, width, kv_width, math_precision, what in PRECISIONS:
        peak, source = precision_peak(q.gpu, math_precision)
        dep = precision_deployment(case.dep, width, kv_width, peak)
        capacity = kv_capacity(dep)
        fit = capacity.blocks // blocks_per_sequence(dep, context)
        batch = min(case.users, fit, case.max_num_seqs)
        basis.append(f"{label}: {what}; peak {peak / 1e12:,.0f} T/s ({source})")
        physics: Figures = {
            "weight_bytes_per_gpu": weight_bytes(dep.model) / dep.tp,
            "kv_bytes_per_token_per_gpu": float(kv_bytes_per_token_per_gpu(dep)),
            "sequences_fit": float(fit),
        }
        sim: Figures = {}
        if batch >= 1:
            step = step_time(dep, sustained_load(batch, q.prompt_tokens, q.output_tokens))
            physics |= physics_continuous(case, dep, float(batch))
            physics |= {
                "compute_seconds": step.compute_seconds,
                "memory_seconds": step.memory_seconds,
                "step_seconds": step.step_seconds,
            }
            sim = simulated(run_virtual(case.engine_config(dep), case.workload()), float(batch))
        why = "" if batch else "the weights leave no room for one sequence's KV"
        rows.append(_row(case, label, "physics", physics, keys, why))
        rows.append(_row(case, label, "simulator", sim, keys, why))
    total = _ratio(_find(rows, "FP8", "physics", keys[-1]), _find(rows, "BF16", "physics", keys[-1]))
    basis.append(
        "accuracy: narrower weights and KV may change the model's answers; whether the quality is acceptable is "
        "your judgement, measured on your own evaluation, not llmdiag's"
    )
    return Comparison(
        name="precision",
        title="Weights and KV precision: BF16 vs FP8 vs INT8 vs INT4 (weight-only)",
        question="What do narrower weights and KV buy in memory, batch and speed (accuracy is yours to judge)?",
        columns=_columns(keys),
        rows=rows,
        chart_columns=["total_tokens_per_second", "per_user_tokens_per_second"],
        finding=f"FP8 gives {total} BF16's total tokens/s in the physics; the accuracy cost is the user's judgement, "
        "not the tool's",
        basis=basis,
    )


# --- priority scheduling ------------------------------------------------------------------------------------------


POLICY_WORDS = {"fcfs": "FCFS", "priority": "priority"}


def physics_priority(case: Case, paid: int) -> tuple[Figures, Figures]:
    """Paid users first (strict priority, no preemption for priority in the physics): paid users take slots as they
    come, so they wait only when they outnumber the slots; free users share what paid users leave, by Little's law
    on the slots left (a paid user holds a slot for T of every W_paid + T)."""
    q = case.question
    base = physics_continuous(case)
    batch = base["batch_sequences"] or 1.0
    step = 1 / (base["per_user_tokens_per_second"] or 1.0)
    alone = prefill_alone_seconds(case.dep, q.prompt_tokens, case.chunk_tokens)
    paid_figures = closed_loop(paid, min(batch, max(paid, 1)), step, alone, q.output_tokens)
    request = alone + (q.output_tokens - 1) * step
    paid_wait = (paid_figures["ttft_p50_seconds"] or 0.0) - alone
    paid_slots = paid * request / (paid_wait + request) if paid else 0.0
    free_slots = batch - paid_slots
    free = case.users - paid
    free_figures = closed_loop(free, free_slots, step, alone, q.output_tokens) if free_slots > 0 else {}
    return paid_figures, free_figures


def _priority(case: Case) -> Comparison:
    keys = [
        "ttft_p50_seconds",
        "ttft_p90_seconds",
        "per_user_tokens_per_second",
        "per_user_incl_queue_tokens_per_second",
    ]
    share = case.settings.paid_share
    paid = round(case.users * share)
    sim_paid = round(case.sim_users * share)
    cap = _batch_cap(case)
    runs = {
        policy: run_virtual(case.engine_config(scheduling_policy=policy), case.workload(priority_users=sim_paid))
        for policy in ("fcfs", "priority")
    }
    fcfs = physics_continuous(case)
    paid_physics, free_physics = physics_priority(case, paid)
    rows: list[CompareRow] = []
    for policy, run in runs.items():
        for label, klass, physics in (
            ("paid", 0, fcfs if policy == "fcfs" else paid_physics),
            ("free", 1, fcfs if policy == "fcfs" else free_physics),
        ):
            # a class's rows carry no total: the GPU's tokens are everyone's (the fcfs and batching rows have it)
            sim = simulated(run, cap, klass=klass) | {"total_tokens_per_second": None}
            physics = physics | {"total_tokens_per_second": None}
            rows += _pair(case, f"{POLICY_WORDS[policy]}, {label} users", physics, sim, keys)
    ttft = {
        (policy, klass): _find(rows, f"{POLICY_WORDS[policy]}, {klass} users", "simulator", "ttft_p50_seconds")
        for policy in ("fcfs", "priority")
        for klass in ("paid", "free")
    }
    finding = (
        f"TTFT p50 in the simulator: paid users {_seconds(ttft['fcfs', 'paid'])} under first come first served, "
        f"{_seconds(ttft['priority', 'paid'])} with priority; free users {_seconds(ttft['fcfs', 'free'])} → "
        f"{_seconds(ttft['priority', 'free'])}"
    )
    if case.users <= case.plan.served_sequences:
        finding += f": every user has a slot at {case.users:,} users, so the order of the queue changes little"
    return Comparison(
        name="priority",
        title="Priority scheduling: paid users first",
        question=f"With {share:.0%} of {case.users:,} users paid, what do paid and free users each get?",
        columns=_columns(keys),
        rows=rows,
        chart_columns=["ttft_p50_seconds", "per_user_incl_queue_tokens_per_second"],
        finding=finding,
        basis=[
            "vLLM --scheduling-policy priority: the waiting queue is ordered by (priority, arrival), lower first; a "
            "preemption evicts the lowest-priority running request",
            f"{paid:,} paid users (priority 0) and {case.users - paid:,} free users (priority 1), a closed loop; "
            "per user tok/s while decoding is the same for both classes: they share every step",
        ],
    )


# --- prefill/decode interference, chunked prefill, disaggregation ---------------------------------------------------


def physics_interference(case: Case, chunked: bool) -> Figures:
    """A colocated GPU: B/O prompts arrive per step; a step that carries prompt tokens is slower for every decode in
    it. Chunked prefill cuts a prompt into steps of at most the budget (more steps carry a chunk, each a smaller
    one); without it a whole prompt rides in one step. The ITL p50/p90 is the plain or the loaded step, by the
    share of steps that carry prompt tokens."""
    q, dep = case.question, case.dep
    figures = physics_continuous(case)
    batch = figures["batch_sequences"] or 1.0
    context = q.prompt_tokens + q.output_tokens / 2
    arrivals = batch / q.output_tokens  # prompts per step
    if chunked:
        chunk = max(1.0, min(float(q.prompt_tokens), case.chunk_tokens - batch))
        share = min(1.0, arrivals * math.ceil(q.prompt_tokens / chunk))
    else:
        chunk, share = q.prompt_tokens * max(1.0, arrivals), min(1.0, arrivals)
    plain = step_time(dep, decode_load(batch, context)).step_seconds
    loaded = step_time(dep, decode_load(batch, context) + prefill_load(chunk, 1)).step_seconds
    figures["itl_p50_seconds"] = loaded if share >= 0.5 else plain
    figures["itl_p90_seconds"] = loaded if share >= 0.1 else plain
    figures["gpus"] = float(dep.tp)
    return figures


def physics_disaggregated(case: Case, transfer_seconds: float) -> Figures:
    """A prefill instance and a decode instance in a closed loop of N users. The prefill instance finishes
    R_p = prefill rate / P requests/s; the decode instance holds at most B sequences, each for D = O · step(b).
    The loop's rate X = min(R_p, B / D, N / (prefill alone + transfer + D)) with b = X · D in decode (Little's law,
    solved by iteration). When the prefill side is the slower, users queue before their first token; else after it,
    for a decode slot (the per-user rate with the queue carries that wait)."""
    q, dep = case.question, case.dep
    cap = float(case.plan.served_sequences)
    context = q.prompt_tokens + q.output_tokens / 2
    alone = prefill_alone_seconds(dep, q.prompt_tokens, case.chunk_tokens)
    chunk = case.chunk_tokens
    prefill_requests = chunk / step_time(dep, prefill_load(chunk, 1)).step_seconds / q.prompt_tokens
    batch = cap
    for _ in range(20):
        step = step_time(dep, decode_load(batch, context)).step_seconds
        decode = q.output_tokens * step
        rate = min(prefill_requests, cap / decode, case.users / (alone + transfer_seconds + decode))
        batch = max(1.0, min(cap, rate * decode))
    cycle = case.users / rate
    ttft = (
        max(alone + transfer_seconds, cycle - decode) if rate >= prefill_requests * 0.999 else alone + transfer_seconds
    )
    return {
        "total_tokens_per_second": rate * q.output_tokens,
        "per_user_tokens_per_second": 1 / step,
        "per_user_incl_queue_tokens_per_second": q.output_tokens / cycle,
        "ttft_p50_seconds": ttft,
        "ttft_p90_seconds": ttft,
        "itl_p50_seconds": step,
        "itl_p90_seconds": step,
        "batch_sequences": batch,
        "gpus": 2.0 * dep.tp,
    }


def _disagg(case: Case) -> Comparison:
    q, dep = case.question, case.dep
    keys = ["ttft_p50_seconds", "ttft_p90_seconds", "itl_p50_seconds", "itl_p90_seconds", "total_tokens_per_second"]
    keys.append("gpus")
    cap = _batch_cap(case)
    per_token = kv_bytes_per_token_per_gpu(dep) / dep.link.bandwidth_bytes_per_second
    transfer = per_token * q.prompt_tokens
    whole = q.prompt_tokens + round(q.output_tokens * 1.0) + 1
    unchunked = case.engine_config(
        enable_chunked_prefill=False, max_model_len=whole, max_num_batched_tokens=max(case.chunk_tokens, whole)
    )
    half = max(1, case.sim_users // 2)
    two = simulated(run_virtual(case.engine_config(), case.workload(users=half)), min(cap, half), 0.5)
    two_physics = physics_continuous(replace(case, users=max(1, case.users // 2)))
    two_physics["total_tokens_per_second"] = 2 * (two_physics["total_tokens_per_second"] or 0.0)
    gpus: Figures = {"gpus": float(dep.tp)}
    rows = _pair(
        case,
        "colocated, chunked prefill",
        physics_interference(case, True),
        simulated(run_virtual(case.engine_config(), case.workload()), cap) | gpus,
        keys,
    )
    rows += _pair(
        case,
        "colocated, whole prompts",
        physics_interference(case, False),
        simulated(run_virtual(unchunked, case.workload()), cap) | gpus,
        keys,
    )
    rows += _pair(
        case, "two colocated replicas", two_physics | {"gpus": 2.0 * dep.tp}, two | {"gpus": 2.0 * dep.tp}, keys
    )
    pair = run_virtual(
        case.engine_config(),
        case.workload(),
        decode_config=case.engine_config(),
        kv_transfer_seconds_per_token=per_token,
    )
    rows += _pair(
        case,
        "disaggregated: 1 prefill + 1 decode",
        physics_disaggregated(case, transfer),
        simulated(pair, cap) | {"gpus": 2.0 * dep.tp},
        keys,
    )
    names = ("colocated, chunked prefill", "colocated, whole prompts", "disaggregated: 1 prefill + 1 decode")

    def seen(key: str) -> str:
        return " / ".join(_seconds(_find(rows, name, "simulator", key)) for name in names)

    finding = (
        f"in the simulator, colocated chunked / whole prompts / disaggregated: ITL p90 {seen('itl_p90_seconds')}, "
        f"TTFT p50 {seen('ttft_p50_seconds')}; disaggregation uses twice the GPUs (two colocated replicas too)"
    )
    return Comparison(
        name="disagg",
        title="Prefill/decode interference, chunked prefill, and disaggregation",
        question="What do prompts sharing the GPU with decodes cost in inter-token latency, and what does splitting "
        "them buy in TTFT against ITL?",
        columns=_columns(keys),
        rows=rows,
        chart_columns=["itl_p90_seconds", "ttft_p50_seconds"],
        finding=finding,
        basis=[
            f"whole prompts: chunked prefill off (max_num_batched_tokens ≥ max_model_len = {whole}); chunked: "
            f"max_num_batched_tokens {case.chunk_tokens:,}",
            f"KV transfer: {kv_bytes_per_token_per_gpu(dep):,} B/token over {dep.link.name} "
            f"({dep.link.bandwidth_bytes_per_second / 1e9:,.0f} GB/s): {transfer * 1e3:.2f} ms per prompt",
            "ITL: every decode's wait for its next token, from the steps it rode (simulator); the physics picks the "
            "decode-only step or the step carrying a prompt by the share of steps that carry one",
            "disaggregated: where the decode side is the slower, users queue after their first token (TTFT falls, "
            "the per-user rate while decoding carries the wait); where the one prefill GPU is, before it",
        ],
    )


# --- 1000 tokens/s and 1000 users -------------------------------------------------------------------------------


def _users(case: Case, others: list[tuple[str, list[tuple[str, Method, Figures]]]]) -> Comparison:
    """The naive division (one stream's tokens/s ÷ users) beside what each user gets under every alternative."""
    keys = ["per_user_tokens_per_second", "per_user_incl_queue_tokens_per_second", "total_tokens_per_second"]
    seed = case.plan.seed
    naive: Figures = {
        "per_user_tokens_per_second": seed.naive_per_user_tokens_per_second,
        "per_user_incl_queue_tokens_per_second": seed.naive_per_user_tokens_per_second,
        "total_tokens_per_second": seed.single_stream_tokens_per_second,
    }
    rows = [_row(case, f"naive: one stream ÷ {case.users:,} users", "naive", naive, keys)]
    for name, entries in others:
        for alternative, method, figures in entries:
            rows.append(_row(case, f"{name}: {alternative}", method, figures, keys, "this comparison does not give it"))
    return Comparison(
        name="users",
        title=f"{seed.single_stream_tokens_per_second:,.0f} tokens/s and {case.users:,} users",
        question="Does each of the users get one stream's tokens/s divided by the users?",
        columns=_columns(keys),
        rows=rows,
        chart_columns=["per_user_incl_queue_tokens_per_second"],
        finding=f"the naive division gives each user {seed.naive_per_user_tokens_per_second:.3g} tok/s; batching "
        f"gives each served user {seed.batched_per_user_tokens_per_second:,.1f} tok/s while decoding "
        f"({seed.batching_gain:,.0f}× the single stream in total)",
        basis=[
            "naive: one stream decodes at 1 / step(batch 1); dividing it among the users assumes the GPU serves one "
            "user at a time, but a step streams the weights once for the whole batch",
        ],
    )


# --- the entry point ---------------------------------------------------------------------------------------------

RUNNERS: dict[str, Callable[[Case], Comparison]] = {
    "batching": _batching,
    "kv": _kv,
    "precision": _precision,
    "priority": _priority,
    "disagg": _disagg,
}


def run_compare(
    question: CapacityQuestion,
    names: list[str],
    settings: CompareSettings | None = None,
    on_comparison: Callable[[str], None] | None = None,
) -> CompareReport:
    """Run the named comparisons (COMPARISONS) for the question's deployment and users. ``users`` needs the
    others' rows: asked alone, it runs them all and shows only itself. Blocking; prints nothing."""
    settings = settings or CompareSettings()
    plan = plan_capacity(question)
    case = Case(
        question, plan, question.deployment(), question.users, min(question.users, MAX_SIMULATED_USERS), settings
    )
    wanted = [n for n in names if n != "users"]
    needed = list(RUNNERS) if "users" in names else wanted
    done: dict[str, Comparison] = {}
    entries: list[tuple[str, list[tuple[str, Method, Figures]]]] = []
    for name in needed:
        if on_comparison is not None:
            on_comparison(name)
        start = len(case.ledger)
        done[name] = RUNNERS[name](case)
        entries.append((name, case.ledger[start:]))
    shown = [done[n] for n in wanted]
    if "users" in names:
        shown.append(_users(case, entries))
    return CompareReport(
        inputs=CompareInputs(
            gpu=plan.inputs.gpu,
            model=plan.inputs.model,
            tp=question.tp,
            users=question.users,
            prompt_tokens=question.prompt_tokens,
            output_tokens=question.output_tokens,
            max_num_seqs=case.max_num_seqs,
            max_num_batched_tokens=case.chunk_tokens,
            simulated_users=case.sim_users,
            measured_seconds=case.settings.measured_cycles * case.cycle_seconds,
            seed=settings.seed,
        ),
        comparisons=shown,
    )
