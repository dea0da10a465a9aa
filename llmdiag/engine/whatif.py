"""What a change would buy: a closed-loop model of the measured window, run before and after a set of changes.

A pure function of the window's ``WhatIfInputs`` (llmdiag.engine.whatif_inputs) and the changes; no I/O. The
model, per replica (N users split evenly over k replicas):

    ctx        = ⌈(P + O/2) / block⌉ · block        KV tokens a running sequence holds on average (P prompt, O output)
    kv_fit     = kv_tokens / ctx                    sequences the KV pool holds (kv_tokens = blocks · block size)
    running  R = min(N, max_num_seqs, kv_fit, max_num_batched_tokens)
    waiting    = N − R
    step(R)    = a + s · R                          the decode step, least squares on the window's (batch, step)
    t_serve    = prefill + O · step(R)               a request's time in the batch (prefill: the measured mean)
    X          = R / t_serve                        requests per second (= the arrival rate of a closed loop)
    wait       = (N − R) / X                        Little's law on the queue
    TTFT p50   = wait + prefill;  p90 = p50 · (measured p90 / p50)
    per-user tokens/s = 1 / step(R) while decoding; X · O / N with the queue
    total tokens/s    = k · X · O
    KV peak    = R · ctx / kv_tokens · (measured peak / mean use), at most 1
    preemptions/s = X · (measured preemptions per finished request) while KV binds, else 0

The model refuses (``modelled = False`` with the reason) where the window cannot carry it: too few readings, no
users seen, no lengths, a change that moves the batch with no step slope measured, a KV change without the KV
geometry, or a change it does not model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from llmdiag.errors import UsageError, option
from llmdiag.model.whatif import CHANGE_NAMES, ChangeValue, Figures, FixEffect, WhatIf, WhatIfInputs

MIN_SCRAPES = 4  # a step fit needs STEP_FIT_MIN_INTERVALS intervals; fewer readings carry no rate worth modelling
MIN_BAND_RATIO = 0.10
MAX_BAND_RATIO = 1.0
WAITING_MATTERS = 1.0  # fewer requests than this waiting on average: nobody queues
KV_FULL_RATIO = 0.95
SIXTEEN_BIT_KV = ("auto", "bfloat16", "float16", "half", "bf16", "fp16")
NOT_MODELLED = {
    "enable_prefix_caching": "the hit rate a prefix cache would get depends on prompt prefixes the window does not"
    " show",
    "enforce_eager": "CUDA graphs change the host's time per step, which the window does not separate from the GPU's",
}


@dataclass(frozen=True)
class Params:
    """One state of the closed loop, per replica."""

    users: float
    replicas: int
    max_num_seqs: float | None  # None: no cap seen (the batch never filled it)
    kv_tokens: float | None  # None: KV geometry unknown, no KV cap modelled
    block_tokens: float
    prompt_tokens: float
    output_tokens: float
    step_intercept_seconds: float
    step_slope_seconds_per_request: float
    prefill_seconds: float
    batch_token_budget: float | None = None


@dataclass(frozen=True)
class Point:
    running: float
    waiting: float
    binding: str  # users | max_num_seqs | kv | max_num_batched_tokens
    kv_fit: float | None
    step_seconds: float
    requests_per_second: float
    wait_seconds: float


def context_tokens(p: Params) -> float:
    return math.ceil((p.prompt_tokens + p.output_tokens / 2) / p.block_tokens) * p.block_tokens


def operate(p: Params) -> Point:
    """The closed loop's operating point: who runs, who waits, and how fast."""
    users = p.users / p.replicas
    kv_fit = p.kv_tokens / context_tokens(p) if p.kv_tokens is not None else None
    caps = {"users": users}
    if p.max_num_seqs is not None:
        caps["max_num_seqs"] = p.max_num_seqs
    if kv_fit is not None:
        caps["kv"] = max(kv_fit, 1.0)
    if p.batch_token_budget is not None:
        caps["max_num_batched_tokens"] = p.batch_token_budget  # one decode token per running sequence per step
    binding = min(caps, key=lambda k: (caps[k], k != "users"))
    running = caps[binding]
    step = max(p.step_intercept_seconds + p.step_slope_seconds_per_request * running, 1e-6)
    serve = p.prefill_seconds + p.output_tokens * step
    rate = running / serve
    return Point(running, users - running, binding, kv_fit, step, rate, (users - running) / rate)


@dataclass(frozen=True)
class Calibration:
    """What the window measured beyond the parameters: the TTFT spread, KV's peak over its mean use, preemptions
    per finished request."""

    ttft_p90_over_p50: float | None
    kv_peak_over_mean: float
    preemptions_per_request: float | None


def figures(p: Params, at: Point, cal: Calibration) -> Figures:
    k = p.replicas
    ttft = at.wait_seconds + p.prefill_seconds
    kv_peak = None
    if p.kv_tokens:
        kv_peak = min(1.0, at.running * context_tokens(p) / p.kv_tokens * cal.kv_peak_over_mean)
    if at.binding != "kv":
        preempt: float | None = 0.0
    elif cal.preemptions_per_request is not None:
        preempt = k * at.requests_per_second * cal.preemptions_per_request
    else:
        preempt = None
    return Figures(
        requests_running=k * at.running,
        requests_waiting=k * at.waiting,
        per_user_tokens_per_second=1.0 / at.step_seconds,
        per_user_tokens_per_second_incl_waiting=at.requests_per_second * p.output_tokens / (p.users / k),
        ttft_p50_seconds=ttft,
        ttft_p90_seconds=ttft * cal.ttft_p90_over_p50 if cal.ttft_p90_over_p50 is not None else None,
        total_tokens_per_second=k * at.requests_per_second * p.output_tokens,
        kv_peak_ratio=kv_peak,
        preemptions_per_second=preempt,
    )


class Refused(Exception):
    """The window cannot support the prediction; the message says why."""


# ---------------------------------------------------------------------------------------------------------------
# the changes


def parse_changes(pairs: dict[str, str]) -> dict[str, ChangeValue]:
    """NAME=VALUE strings as typed values; an unknown name or a bad value is a UsageError."""
    out: dict[str, ChangeValue] = {}
    for name, raw in pairs.items():
        if name not in CHANGE_NAMES:
            raise UsageError(
                f"unknown what-if parameter {name!r}",
                f"give {option('set')} NAME=VALUE with NAME one of: {', '.join(CHANGE_NAMES)}",
            )
        out[name] = _typed(name, raw.strip())
    return out


def _typed(name: str, raw: str) -> ChangeValue:
    bad = UsageError(f"bad value {raw!r} for {name}", _value_hint(name))
    if name == "kv_cache_dtype":
        if not raw or not raw.replace("_", "").isalnum():
            raise bad
        return raw.lower()
    if name in ("enable_prefix_caching", "enforce_eager"):
        if raw.lower() in ("true", "1", "yes", "on"):
            return True
        if raw.lower() in ("false", "0", "no", "off"):
            return False
        raise bad
    try:
        value = float(raw)
    except ValueError:
        raise bad from None
    if not math.isfinite(value):
        raise bad
    if name == "gpu_memory_utilization":
        if not 0 < value <= 1:
            raise bad
        return value
    if value < 1 or value != int(value):
        raise bad
    return int(value)


def _value_hint(name: str) -> str:
    if name == "kv_cache_dtype":
        return "give a vLLM KV dtype, e.g. kv_cache_dtype=fp8 or kv_cache_dtype=auto"
    if name in ("enable_prefix_caching", "enforce_eager"):
        return f"give {name}=true or {name}=false"
    if name == "gpu_memory_utilization":
        return "give a share of GPU memory above 0 and at most 1, e.g. gpu_memory_utilization=0.9"
    return f"give a whole number of at least 1, e.g. {name}=8"


# ---------------------------------------------------------------------------------------------------------------
# the prediction


def _base(inputs: WhatIfInputs) -> tuple[Params, Calibration, list[str]]:
    """The window as the model's parameters, or Refused."""
    why = inputs.unavailable
    if inputs.scrapes < MIN_SCRAPES:
        raise Refused(f"{inputs.scrapes} readings: a prediction needs a window of at least {MIN_SCRAPES}")
    if not inputs.users_seen:
        raise Refused("no requests running or waiting in the window: " + why.get("users_seen", "no load to model"))
    for name in ("prompt_tokens_mean", "output_tokens_mean"):
        if getattr(inputs, name) is None:
            raise Refused(f"no measured {name.split('_')[0]} lengths: {why.get(name, 'not in the window')}")
    if inputs.step_seconds_at_mean_batch is None or inputs.requests_running_mean is None:
        raise Refused("no decode step measured: " + why.get("step_seconds_at_mean_batch", "no output tokens"))
    basis = [f"arrivals stay as measured: a closed loop of {inputs.users_seen:.0f} users (the most running + waiting)"]
    slope = inputs.step_slope_seconds_per_request
    if slope is not None and slope < 0:
        # a step that shortens as the batch grows is noise (a host busier at the smaller batch), not physics
        basis.append("the fitted step slope came out negative (noise): the step taken as flat in the batch")
        a, s = inputs.step_seconds_at_mean_batch, 0.0
    elif slope is not None and inputs.step_intercept_seconds is not None:
        a, s = inputs.step_intercept_seconds, slope
        basis.append(
            f"step(b) = {a * 1e3:.3g} ms + {s * 1e3:.3g} ms × b, fitted on"
            f" {inputs.step_fit_source or f'{len(inputs.step_samples)} intervals'} (R² {inputs.step_fit_r2 or 0:.2f})"
        )
    else:
        a, s = inputs.step_seconds_at_mean_batch, math.nan  # a flat step: valid only where the batch stays
    kv_tokens, block = _kv_geometry(inputs, basis)
    output = inputs.output_tokens_mean or 1.0
    prefill = inputs.prefill_seconds_mean  # exact (sum over count); vLLM's buckets start at 0.3 s, too coarse for p50
    if prefill is not None and (inputs.preemptions_per_second or 0.0) > 0:
        # a preempted request's recompute counts as prefill again: one step carries a chunked prefill instead
        prefill = inputs.step_seconds_at_mean_batch
        basis.append("prefill taken as one step: preemptions in the window inflate the prefill-time histogram")
    if prefill is None:
        prefill = a + (0.0 if math.isnan(s) else s * inputs.requests_running_mean)
        basis.append("prefill taken as one step: the window has no prefill-time histogram")
    cap = None
    waiting = inputs.requests_waiting_mean or 0.0
    kv_full = (inputs.kv_usage_peak_ratio or 0.0) >= KV_FULL_RATIO
    most = inputs.requests_running_max
    # a cap: requests waited with KV to spare, and the batch never held every user
    if waiting >= WAITING_MATTERS and not kv_full and most is not None and most < inputs.users_seen:
        cap = most
        basis.append(f"the batch cap taken as the most running seen with a queue: {cap:g}")
    params = Params(
        users=inputs.users_seen,
        replicas=1,
        max_num_seqs=cap,
        kv_tokens=kv_tokens,
        block_tokens=block,
        prompt_tokens=inputs.prompt_tokens_mean or 1.0,
        output_tokens=output,
        step_intercept_seconds=a,
        step_slope_seconds_per_request=s,
        prefill_seconds=prefill,
    )
    ttft50, ttft90 = inputs.ttft_p50_seconds, inputs.ttft_p90_seconds
    peak, mean = inputs.kv_usage_peak_ratio, inputs.kv_usage_mean_ratio
    preempt, finished = inputs.preemptions_per_second, inputs.arrival_rate_per_second
    cal = Calibration(
        ttft_p90_over_p50=ttft90 / ttft50 if ttft50 and ttft90 else None,
        # a full pool's peak over its mean says nothing of a pool with room: taken as 1 there
        kv_peak_over_mean=peak / mean if peak and mean and not kv_full else 1.0,
        preemptions_per_request=preempt / finished if preempt is not None and finished else None,
    )
    return params, cal, basis


def _kv_geometry(inputs: WhatIfInputs, basis: list[str]) -> tuple[float | None, float]:
    block = inputs.kv_block_size_tokens or 16.0
    if inputs.kv_gpu_blocks is not None and inputs.kv_block_size_tokens is not None:
        return inputs.kv_gpu_blocks * inputs.kv_block_size_tokens, block
    usage, running = inputs.kv_usage_mean_ratio, inputs.requests_running_mean
    prompt, output = inputs.prompt_tokens_mean, inputs.output_tokens_mean
    if usage and usage > 0.01 and running and prompt is not None and output is not None:
        held = running * (prompt + output / 2)
        basis.append(f"KV pool inferred from its use: {held:.0f} tokens held at {usage:.0%} (no block count)")
        return held / usage, block
    basis.append("no KV geometry: the KV cap is not modelled")
    return None, block


def _apply(
    inputs: WhatIfInputs, base: Params, changes: dict[str, ChangeValue], basis: list[str]
) -> tuple[Params, bool]:
    """The parameters after the changes, and whether the changes move the step's physics (KV dtype, TP)."""
    p = base
    for name in changes:
        if name in NOT_MODELLED:
            raise Refused(f"{name} is not modelled: {NOT_MODELLED[name]}")
    if "max_num_seqs" in changes:
        p = replace(p, max_num_seqs=float(changes["max_num_seqs"]))
    if "num_gpu_blocks" in changes:
        if inputs.kv_block_size_tokens is None:
            raise Refused(
                "num_gpu_blocks needs the KV block size: " + inputs.unavailable.get("kv_block_size_tokens", "")
            )
        p = replace(p, kv_tokens=float(changes["num_gpu_blocks"]) * inputs.kv_block_size_tokens)
    if "kv_cache_dtype" in changes:
        p = _kv_dtype(inputs, p, str(changes["kv_cache_dtype"]), basis)
    if "gpu_memory_utilization" in changes:
        raise Refused(
            "gpu_memory_utilization needs the GPU's memory and the weights' size: the window placed no known GPU"
            " serving a known model (num_gpu_blocks sets the pool directly)"
        )
    if "tensor_parallel_size" in changes:
        raise Refused(
            "tensor_parallel_size needs the step's physics at the new size: the window placed no known GPU serving"
            " a known model"
        )
    if "max_model_len" in changes:
        longest = (inputs.prompt_tokens_mean or 0) + 1.5 * (inputs.output_tokens_mean or 0)
        if float(changes["max_model_len"]) < longest:
            raise Refused(
                f"max_model_len {changes['max_model_len']} is below the window's longer requests (~{longest:.0f}"
                " tokens): the server would refuse them, so the load itself would change"
            )
        basis.append("max_model_len only bounds a request's length: every request seen still fits")
    if "max_num_batched_tokens" in changes:
        p = _budget(inputs, p, int(changes["max_num_batched_tokens"]), basis)
    if "replicas" in changes:
        p = replace(p, replicas=int(changes["replicas"]))
        basis.append(f"the {p.users:.0f} users split evenly over {p.replicas} replicas, each like the one measured")
    return p, False


def _kv_dtype(inputs: WhatIfInputs, p: Params, dtype: str, basis: list[str]) -> Params:
    if p.kv_tokens is None:
        raise Refused("kv_cache_dtype needs the KV geometry: " + inputs.unavailable.get("kv_gpu_blocks", ""))
    now = (inputs.kv_cache_dtype or "auto").lower()
    if inputs.kv_cache_dtype is None:
        basis.append("the KV dtype was not reported: taken as 16-bit (vLLM's auto on a BF16/FP16 model)")
    eight = dtype.startswith("fp8") or dtype == "int8"
    if eight and now in SIXTEEN_BIT_KV:
        basis.append("fp8 KV halves the bytes per token: twice the tokens in the same pool; the step kept")
        return replace(p, kv_tokens=p.kv_tokens * 2)
    if not eight and dtype in SIXTEEN_BIT_KV and now not in SIXTEEN_BIT_KV:
        basis.append("16-bit KV doubles the bytes per token: half the tokens in the same pool")
        return replace(p, kv_tokens=p.kv_tokens / 2)
    basis.append(f"kv_cache_dtype {dtype} keeps the bytes per token of {now}")
    return p


def _budget(inputs: WhatIfInputs, p: Params, budget: int, basis: list[str]) -> Params:
    """The step's token budget: prompts longer than it prefill over ⌈P / budget⌉ steps, and it caps the batch."""
    prompt = p.prompt_tokens
    before = inputs.step_tokens_max
    chunks_after = math.ceil(prompt / budget)
    if before is None:
        if chunks_after > 1:
            raise Refused(
                "max_num_batched_tokens below the prompt needs the budget in use: "
                + inputs.unavailable.get("step_tokens_max", "")
            )
        basis.append("every prompt fits the new budget in one step; the budget in use is unknown")
        return replace(p, batch_token_budget=float(budget))
    chunks_before = max(1, math.ceil(prompt / before))
    basis.append(
        f"prefill over ⌈{prompt:.0f} / budget⌉ steps: {chunks_before} now (budget ≤ {before:g} tokens seen),"
        f" {chunks_after} after"
    )
    return replace(
        p, prefill_seconds=p.prefill_seconds * chunks_after / chunks_before, batch_token_budget=float(budget)
    )


def measured_figures(inputs: WhatIfInputs) -> Figures:
    users = inputs.users_seen
    rate = inputs.generation_tokens_per_second
    step = inputs.step_seconds_at_mean_batch
    return Figures(
        requests_running=inputs.requests_running_mean,
        requests_waiting=inputs.requests_waiting_mean,
        per_user_tokens_per_second=1.0 / step if step else None,
        per_user_tokens_per_second_incl_waiting=rate / users if rate is not None and users else None,
        ttft_p50_seconds=inputs.ttft_p50_seconds,
        ttft_p90_seconds=inputs.ttft_p90_seconds,
        total_tokens_per_second=rate,
        kv_peak_ratio=inputs.kv_usage_peak_ratio,
        preemptions_per_second=inputs.preemptions_per_second,
    )


def _band(before: Figures, measured: Figures, r2: float | None) -> float:
    """How far the model's `before` misses the window, on the figures that have both (at least ±10 %), widened by
    a loose step fit."""
    misses: list[float] = []
    names = ("per_user_tokens_per_second", "per_user_tokens_per_second_incl_waiting", "total_tokens_per_second")
    for name in (*names, "ttft_p50_seconds"):
        model: float | None = getattr(before, name)
        seen: float | None = getattr(measured, name)
        if model is not None and seen:
            misses.append(abs(model / seen - 1))
    band = max([MIN_BAND_RATIO, *misses])
    if r2 is not None and r2 < 0.8:
        band += 0.8 - r2
    return round(min(band, MAX_BAND_RATIO), 2)


def _class_after(class_before: str, point: Point, after: Figures, before: Figures) -> str:
    if (after.requests_waiting or 0.0) >= WAITING_MATTERS:
        return "memory" if point.binding == "kv" else "scheduling"
    if (after.preemptions_per_second or 0.0) > 0:
        return "memory"
    if class_before in ("compute", "network"):
        faster = (after.per_user_tokens_per_second or 0.0) >= 1.25 * (before.per_user_tokens_per_second or math.inf)
        return "healthy" if faster else class_before
    return "healthy"


def _next_limit(p: Params, at: Point) -> str:
    users = p.users / p.replicas
    each = " per replica" if p.replicas > 1 else ""
    if at.binding == "max_num_seqs":
        return (
            f"the batch cap again: {at.waiting:.0f} of {users:.0f} users{each} still wait"
            f" (max_num_seqs {p.max_num_seqs:g})"
        )
    if at.binding == "kv":
        return f"KV caps at {at.kv_fit:.0f} sequences{each}: {at.waiting:.0f} of {users:.0f} users wait"
    if at.binding == "max_num_batched_tokens":
        return f"the step's token budget caps the batch at {at.running:.0f}: {at.waiting:.0f} users wait"
    caps = []
    if at.kv_fit is not None:
        caps.append(f"KV would cap at {at.kv_fit:.0f} sequences")
    if p.max_num_seqs is not None:
        caps.append(f"the batch cap at {p.max_num_seqs:g}")
    rest = f"; next, {' and '.join(caps)}" if caps else ""
    return (
        f"no cap: all {users:.0f} users{each} run at once; the step ({at.step_seconds * 1e3:.3g} ms at"
        f" {at.running:.0f} sequences) sets the pace{rest}"
    )


def predict(inputs: WhatIfInputs, changes: dict[str, ChangeValue], class_before: str = "") -> WhatIf:
    """The figures before and after ``changes`` on the measured window; ``modelled=False`` with the reason where
    the window cannot support it."""
    measured = measured_figures(inputs)
    out = WhatIf(changes=dict(changes), modelled=False, class_before=class_before, measured=measured)
    if class_before == "stalled":
        out.not_modelled_reason = "the engine stalled: no capacity model applies to a hang"
        return out
    try:
        base, cal, basis = _base(inputs)
        after_params, _ = _apply(inputs, base, changes, basis)
        before_point, after_point = operate(base), operate(after_params)
        if math.isnan(base.step_slope_seconds_per_request):
            moved = abs(after_point.running - before_point.running) > 0.5
            if moved:
                raise Refused(
                    "the change moves the batch, and the window has no step slope to price it: "
                    + inputs.unavailable.get("step_slope_seconds_per_request", "no batch variation")
                    + " (scan under a load whose batch varies, e.g. `llmdiag load` levels)"
                )
            flat = replace(base, step_slope_seconds_per_request=0.0)
            after_params = replace(after_params, step_slope_seconds_per_request=0.0)
            base = flat
            before_point, after_point = operate(base), operate(after_params)
            basis.append("the batch stays where it was, so the step measured at it holds (no slope needed)")
    except Refused as exc:
        out.not_modelled_reason = str(exc)
        return out
    before, after = figures(base, before_point, cal), figures(after_params, after_point, cal)
    if cal.ttft_p90_over_p50 is not None:
        basis.append(f"TTFT p90 keeps the window's p90/p50 ratio ({cal.ttft_p90_over_p50:.2f})")
    out.modelled = True
    out.basis = basis
    out.before, out.after = before, after
    out.band_ratio = _band(before, measured, inputs.step_fit_r2)
    out.class_after = _class_after(class_before, after_point, after, before)
    out.next_limit = _next_limit(after_params, after_point)
    return out


# ---------------------------------------------------------------------------------------------------------------
# a finding's fixes, quantified (the rule's [[fix.whatif]] entries)

NO_PARAMETER = "this fix changes no parameter the what-if model takes (vLLM's flags: see llmdiag whatif)"


def _current(inputs: WhatIfInputs, name: str) -> float | None:
    """The value in use, as the window shows it."""
    if name == "max_num_seqs":
        return inputs.requests_running_max
    if name == "num_gpu_blocks":
        return inputs.kv_gpu_blocks
    if name == "max_num_batched_tokens":
        return inputs.step_tokens_max
    if name == "gpu_memory_utilization":
        return inputs.gpu_memory_utilization
    return None


def resolve_fix(inputs: WhatIfInputs, wanted: dict[str, ChangeValue]) -> dict[str, ChangeValue]:
    """A rule's what-if values on this window: ``"x2"`` twice the value in use, ``"users"`` the users seen; or
    Refused when the window does not show the value to start from."""
    out: dict[str, ChangeValue] = {}
    for name, value in wanted.items():
        if isinstance(value, str) and value.startswith("x") and name != "kv_cache_dtype":
            now = _current(inputs, name)
            if now is None:
                raise Refused(f"{name} in use is not in the window, so '{value}' of it cannot be priced")
            scaled = now * float(value[1:])
            out[name] = max(1, round(scaled)) if name != "gpu_memory_utilization" else min(scaled, 1.0)
        elif value == "users":
            if not inputs.users_seen:
                raise Refused("no users seen to size it to")
            out[name] = max(1, math.ceil(inputs.users_seen))
        else:
            out[name] = value
    return out


def fix_effects(
    entries: list[tuple[dict[str, ChangeValue], str]], inputs: WhatIfInputs | None, class_before: str
) -> list[FixEffect]:
    """Each (set, not_modelled) entry of a rule's fix as a predicted effect on the window."""
    if not entries:
        return [FixEffect(modelled=False, not_modelled_reason=NO_PARAMETER)]
    effects = []
    for wanted, reason in entries:
        if reason:
            effects.append(FixEffect(modelled=False, not_modelled_reason=reason))
            continue
        if inputs is None:
            effects.append(FixEffect(changes=wanted, modelled=False, not_modelled_reason="no window to predict on"))
            continue
        try:
            changes = resolve_fix(inputs, wanted)
        except Refused as exc:
            effects.append(FixEffect(changes=wanted, modelled=False, not_modelled_reason=str(exc)))
            continue
        got = predict(inputs, changes, class_before)
        effects.append(
            FixEffect(
                changes=changes,
                modelled=got.modelled,
                not_modelled_reason=got.not_modelled_reason,
                class_after=got.class_after,
                next_limit=got.next_limit,
                before=got.before if got.modelled else None,
                after=got.after if got.modelled else None,
                band_ratio=got.band_ratio,
            )
        )
    return effects
