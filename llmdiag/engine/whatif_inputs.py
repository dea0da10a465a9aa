"""What a what-if prediction needs, read off a judged window (``WhatIfInputs`` on the verdict): the step against the
batch, the KV geometry, the lengths, the arrival rate and the closed-loop users seen. Missing is ``None`` with the
reason, never 0."""

from __future__ import annotations

from llmdiag.engine.series import Missing, fit, value_at
from llmdiag.engine.stepwall import itl_by_batch
from llmdiag.model import SignalSet
from llmdiag.model.whatif import WhatIfInputs


def _stat(signals: SignalSet, name: str, stat: str, why: dict[str, str], field: str) -> float | None:
    signal = signals.get(name)
    if signal is None:
        why[field] = f"no {name} signal in the window"
        return None
    if signal.unavailable is not None:
        why[field] = f"{name}: {signal.unavailable}"
        return None
    value = signal.stats.get(stat)
    if value is None:
        why[field] = f"{name} has no {stat}"
    return value


def _users_seen(signals: SignalSet) -> float | None:
    """The most requests in the server (running + waiting) at one reading: a closed loop's users, less those
    between two requests."""
    running, waiting = signals.get("requests_running"), signals.get("requests_waiting")
    if running is None or waiting is None or running.unavailable or waiting.unavailable:
        return None
    if not running.samples:
        last_r, last_w = running.stats.get("max"), waiting.stats.get("max")
        return None if last_r is None or last_w is None else last_r + last_w
    queue = sorted(waiting.samples)
    totals = [r + (value_at(queue, at) or 0.0) for at, r in sorted(running.samples)]
    return max(totals) if totals else None


def _config_float(signals: SignalSet, key: str) -> float | None:
    for source in signals.sources:
        raw = source.config.get(key)
        if raw is not None:
            try:
                return float(raw)
            except ValueError:
                return None
    return None


def whatif_inputs(signals: SignalSet) -> WhatIfInputs:
    why: dict[str, str] = {}
    out = WhatIfInputs(
        server=signals.sources[0].probe.removesuffix("-log") if signals.sources else "",
        window_seconds=signals.window.duration_seconds,
        scrapes=signals.window.scrapes,
    )
    try:
        points = itl_by_batch(signals)
        slope, at_last, r2 = fit(points)
        out.step_samples = [(round(b, 4), s) for b, s in points]
        out.step_slope_seconds_per_request = slope
        out.step_intercept_seconds = at_last - slope * points[-1][0]
        out.step_fit_r2 = r2
        out.step_fit_source = f"{len(points)} intervals of the window with a steady batch"
    except Missing as exc:
        for name in ("step_intercept_seconds", "step_slope_seconds_per_request", "step_fit_r2"):
            why[name] = str(exc)
    running_mean = _stat(signals, "requests_running", "mean", why, "requests_running_mean")
    rate = _stat(signals, "generation_tokens_per_second", "rate", why, "step_seconds_at_mean_batch")
    if running_mean is not None and rate is not None and rate > 0 and running_mean > 0:
        out.step_seconds_at_mean_batch = running_mean / rate
    elif "step_seconds_at_mean_batch" not in why:
        why["step_seconds_at_mean_batch"] = "no output tokens or no running requests in the window"
    out.requests_running_mean = running_mean
    out.requests_running_max = _stat(signals, "requests_running", "max", why, "requests_running_max")
    out.requests_waiting_mean = _stat(signals, "requests_waiting", "mean", why, "requests_waiting_mean")
    out.generation_tokens_per_second = rate
    out.users_seen = _users_seen(signals)
    if out.users_seen is None:
        why["users_seen"] = "no running and waiting readings to count the users by"
    out.kv_block_size_tokens = _stat(signals, "kv_cache_block_size_tokens", "value", why, "kv_block_size_tokens")
    out.kv_gpu_blocks = _stat(signals, "kv_cache_blocks", "value", why, "kv_gpu_blocks")
    out.kv_usage_mean_ratio = _stat(signals, "kv_cache_usage_ratio", "mean", why, "kv_usage_mean_ratio")
    out.kv_usage_peak_ratio = _stat(signals, "kv_cache_usage_ratio", "max", why, "kv_usage_peak_ratio")
    out.prompt_tokens_mean = _stat(signals, "prompt_length_tokens", "mean", why, "prompt_tokens_mean")
    out.output_tokens_mean = _stat(signals, "output_length_tokens", "mean", why, "output_tokens_mean")
    out.arrival_rate_per_second = _stat(signals, "requests_finished_per_second", "rate", why, "arrival_rate_per_second")
    out.ttft_p50_seconds = _stat(signals, "ttft_seconds", "p50", why, "ttft_p50_seconds")
    out.ttft_p90_seconds = _stat(signals, "ttft_seconds", "p90", why, "ttft_p90_seconds")
    out.prefill_seconds_mean = _stat(signals, "prefill_time_seconds", "mean", why, "prefill_seconds_mean")
    out.prefill_seconds_p50 = _stat(signals, "prefill_time_seconds", "p50", why, "prefill_seconds_p50")
    out.queue_seconds_mean = _stat(signals, "queue_time_seconds", "mean", why, "queue_seconds_mean")
    out.preemptions_per_second = _stat(signals, "preemptions_per_second", "rate", why, "preemptions_per_second")
    out.prefix_cache_hit_ratio = _stat(signals, "prefix_cache_hit_ratio", "value", why, "prefix_cache_hit_ratio")
    tokens = signals.get("iteration_tokens")
    if tokens is not None and tokens.unavailable is None and tokens.buckets:
        # the smallest bound that holds every step seen: the budget in use is at most this, at least the one below
        count = tokens.stats.get("count", 0.0)
        out.step_tokens_max = next((bound for bound, cum in tokens.buckets if cum >= count), None)
    if out.step_tokens_max is None:
        why["step_tokens_max"] = "no per-step token histogram (vLLM's iteration_tokens_total) in the window"
    dtype = next((s.config["cache_dtype"] for s in signals.sources if "cache_dtype" in s.config), None)
    out.kv_cache_dtype = dtype
    if dtype is None:
        why["kv_cache_dtype"] = "the server reports no cache_dtype (vLLM's cache_config_info)"
    out.gpu_memory_utilization = _config_float(signals, "gpu_memory_utilization")
    if out.gpu_memory_utilization is None:
        why["gpu_memory_utilization"] = "the server reports no gpu_memory_utilization (vLLM's cache_config_info)"
    for name in ("gpu", "model", "tensor_parallel_size"):
        why[name] = "set from the verdict's roofline when one known GPU serves a known model"
    out.unavailable = why
    return out
