"""Named derived signals: logic too rich for a rule's ladder and gate, in small typed functions.

Each function reads a SignalSet and returns a value, or raises ``Missing`` with the reason.
Rules then refer to the result by name like any measured signal (stat ``value``). Each signal's unit and meaning
are declared in probes/signals.toml (llmdiag.schema.registry); its formula is said here, beside its code.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from llmdiag.engine.series import TREND_MIN_READINGS, Missing, fit, trend, value_at
from llmdiag.engine.stepwall import STEP_FIT_MIN_BATCH_SPREAD, StepFit, step_fit
from llmdiag.errors import LlmdiagError, option
from llmdiag.model import Signal, SignalSet
from llmdiag.physics.hardware import GPUS, find_model
from llmdiag.schema.loader import find_rule, load_code_signals


@dataclass(frozen=True)
class Derived:
    name: str
    unit: str
    help: str
    formula: str | Callable[[], str]  # a callable when it names an option (llmdiag.errors.option): built when used
    compute: Callable[[SignalSet], float]


REGISTRY: list[Derived] = []


def derived(
    name: str, formula: str | Callable[[], str]
) -> Callable[[Callable[[SignalSet], float]], Callable[[SignalSet], float]]:
    """Register a derived signal. Its unit and meaning are declared in probes/signals.toml (producer "derived"); a
    name declared nowhere fails at import, so the code and the catalogue cannot drift apart."""
    declared = load_code_signals().declared("derived", name)

    def register(fn: Callable[[SignalSet], float]) -> Callable[[SignalSet], float]:
        REGISTRY.append(Derived(name, declared.unit, declared.help, formula, fn))
        return fn

    return register


def need(signals: SignalSet, name: str, stat: str) -> float:
    signal = signals.get(name)
    if signal is None:
        raise Missing(f"{name} was not collected")
    if signal.unavailable is not None:
        raise Missing(f"{name}: {signal.unavailable}")
    value = signal.stats.get(stat)
    if value is None:
        raise Missing(f"{name} has no {stat}")
    return value


# a part of TTFT can't exceed TTFT; past this, the two histograms saw different requests
SHARE_CONSISTENCY_LIMIT = 1.05


def _share(signals: SignalSet, part: str, whole: str) -> float:
    whole_mean = need(signals, whole, "mean")
    if whole_mean <= 0:
        raise Missing(f"{whole} mean is zero")
    share = need(signals, part, "mean") / whole_mean
    if share > SHARE_CONSISTENCY_LIMIT:
        # vLLM records TTFT at the first token but queue and prefill times when a request finishes:
        # a window shorter than the requests compares different requests (seen when load just started)
        raise Missing(f"mean {part} is {share:.2f}x mean {whole}: the window saw different requests; scan longer")
    return share


@derived("queue_share_of_ttft_ratio", formula="mean(queue_time) / mean(ttft)")
def queue_share_of_ttft(signals: SignalSet) -> float:
    return _share(signals, "queue_time_seconds", "ttft_seconds")


@derived("prefill_share_of_ttft_ratio", formula="mean(prefill_time) / mean(ttft)")
def prefill_share_of_ttft(signals: SignalSet) -> float:
    return _share(signals, "prefill_time_seconds", "ttft_seconds")


@derived("frontend_overhead_seconds", formula="mean(ttft) - mean(queue_time) - mean(prefill_time)")
def frontend_overhead(signals: SignalSet) -> float:
    return (
        need(signals, "ttft_seconds", "mean")
        - need(signals, "queue_time_seconds", "mean")
        - need(signals, "prefill_time_seconds", "mean")
    )


def _client_ttft_gap(signals: SignalSet) -> tuple[float, float]:
    client = need(signals, "client_ttft_seconds", "p50")
    server = need(signals, "ttft_seconds", "p50")
    return client - server, client


@derived("client_ttft_gap_seconds", formula="p50(client ttft) - p50(server ttft)")
def client_ttft_gap(signals: SignalSet) -> float:
    return _client_ttft_gap(signals)[0]


@derived("client_ttft_gap_ratio", formula="(p50(client ttft) - p50(server ttft)) / p50(client ttft)")
def client_ttft_gap_share(signals: SignalSet) -> float:
    gap, client = _client_ttft_gap(signals)
    if client <= 0:
        raise Missing("client TTFT median is zero")
    return gap / client


@derived("prefix_cache_hit_ratio", formula="rate(prefix_cache_hits) / rate(prefix_cache_queries)")
def prefix_cache_hit(signals: SignalSet) -> float:
    queries = need(signals, "prefix_cache_queries_per_second", "rate")
    if queries <= 0:
        raise Missing("no prefix-cache lookups in the window")
    return need(signals, "prefix_cache_hits_per_second", "rate") / queries


def window_seconds(signals: SignalSet) -> float:
    duration = signals.window.duration_seconds
    if not duration or duration <= 0:
        raise Missing("the window has no duration")
    return duration


def _seconds_in_window(signals: SignalSet, histogram: str) -> float:
    """The seconds of a stage's durations that can lie inside the window: the histogram's sum, clipped by the
    collector to what each scrape interval could hold (``sum_in_window_max``: a duration counted at t_k ended by
    t_k, so at most t_k - start of it is inside). Without scrape times (a log, hand-made numbers) the plain sum,
    which counts time spent before the window by requests that left the stage inside it."""
    total = need(signals, histogram, "sum")
    clipped = signals.signals[histogram].stats.get("sum_in_window_max")
    return total if clipped is None else min(total, clipped)


def _gauges_starve(signals: SignalSet) -> bool | None:
    """SAN004's question: does the running gauge read 0 under load (a starved API server answers /metrics only at
    idle moments)? False when fewer than one request ran on average (a starved server is a loaded one); None when
    it cannot be told (no running gauge readings or no request timings)."""
    running = signals.get("requests_running")
    rule = find_rule("SAN004")
    if running is None or running.unavailable or not running.samples or rule is None:
        return None
    try:
        if _under_one_running(signals):
            return False
        return running_gauge_zero_under_load(signals) >= rule.severity.warning
    except Missing:
        return None


def _under_one_running(signals: SignalSet) -> bool:
    """Fewer than one request ran on average (Little's law over the window): running gauges at 0 are expected."""
    return _seconds_in_window(signals, "inference_time_seconds") / window_seconds(signals) < 1.0


def _unseen_seconds(signal: Signal, longest_gap: float, head: float) -> float:
    """The most of the window's observed durations that a gauge reading 0 at every scrape could have missed.

    A stay longer than every gap between readings would have spanned a reading, so it lies wholly outside the
    readings' span: only its part in ``head`` (the window's start to the first reading, 0 when the first scrape
    was read) can be inside. A shorter one is at most its bucket's upper bound and the longest gap. Per bucket
    (lower, upper]: ``head`` when lower >= the longest gap, else max(min(upper, longest gap), head).
    """
    unseen, lower, below = 0.0, 0.0, 0.0
    for upper, cumulative in [*signal.buckets, (math.inf, signal.stats.get("count", 0.0))]:
        most = head if lower >= longest_gap else max(min(upper, longest_gap), head)
        unseen += max(cumulative - below, 0.0) * most
        lower, below = upper, max(below, cumulative)
    return unseen


def _zero_gauge_bound(signals: SignalSet, histogram: str, gauge: str) -> float | None:
    """When a trusted gauge read 0 at every scrape, no request was in the stage at a scrape: each stay inside the
    window lies between two readings (``_unseen_seconds``). None when the gauge is not known to be trusted (SAN004
    says it starves, or cannot say) or its readings have no times in the window. Neglected: a gauge is as old as
    the engine's last step (milliseconds to a few tenths of a second), so a stay that long beyond a gap can hide."""
    reading = signals.get(gauge)
    window = signals.window
    if reading is None or reading.unavailable or not reading.samples or reading.stats.get("max") != 0:
        return None
    if window.start_unix is None or window.end_unix is None or _gauges_starve(signals) is not False:
        return None
    times = sorted(t for t, _ in reading.samples)
    if times[0] < window.start_unix or times[-1] > window.end_unix:
        return None  # readings placed by their index (an untimed log), not by time
    edges = [*times, window.end_unix]
    longest_gap = max((b - a for a, b in zip(edges, edges[1:], strict=False)), default=0.0)
    return _unseen_seconds(signals.signals[histogram], longest_gap, head=times[0] - window.start_unix)


def _time_average(signals: SignalSet, histogram: str, gauge: str) -> float:
    """The larger of two estimates of how many requests sat in a stage on average.

    Little's law: the seconds requests spent in the stage (recorded per request when it leaves), summed over
    the window, divided by the window. It misses requests still in the stage at the window's end, so it reads
    low when requests last longer than the window. It would read high by the time spent before the window by
    requests that leave inside it (a queue that drained before the window): the sum is clipped to what the
    window could hold (``_seconds_in_window``), and, when a gauge SAN004 does not doubt read 0 throughout, to the
    longest gap between scrapes per request (``_zero_gauge_bound``). What clipping cannot remove stays: a
    request counted at t_k is taken to have been in the stage until t_k (vLLM counts queue time when a request
    finishes, so up to its run time too), and without scrape times the whole sum counts.
    The gauge's mean over the scrapes reads low when /metrics is answered only at idle moments (a starved API
    server: every sample 0). Each estimate is low or clipped to a bound, so take the max.
    """
    estimates: list[float] = []
    reasons: list[str] = []

    def littles_law() -> float:
        seconds = _seconds_in_window(signals, histogram)
        bound = _zero_gauge_bound(signals, histogram, gauge)
        if bound is not None:
            seconds = min(seconds, bound)
        return seconds / window_seconds(signals)

    def gauge_mean() -> float:
        return need(signals, gauge, "mean")

    for estimate in (littles_law, gauge_mean):
        try:
            estimates.append(estimate())
        except Missing as why:
            reasons.append(str(why))
    if not estimates:
        raise Missing("; ".join(reasons))
    return max(estimates)


# the bias that stays is said where the value is shown (the signal's source)
_LITTLE = (
    "max(sum({h}) clipped to the window / window, mean {g} gauge); clipped per request to its scrape - window "
    "start, and to the scrape gap while a {g} gauge SAN004 does not doubt read 0; still counts time before the "
    "window up to that bound, and all of it without scrape times (logs)"
)


@derived("requests_waiting_avg", formula=_LITTLE.format(h="queue_time", g="waiting"))
def requests_waiting_avg(signals: SignalSet) -> float:
    return _time_average(signals, "queue_time_seconds", "requests_waiting")


@derived("requests_running_avg", formula=_LITTLE.format(h="inference_time", g="running"))
def requests_running_avg(signals: SignalSet) -> float:
    return _time_average(signals, "inference_time_seconds", "requests_running")


@derived("requests_in_system", formula="requests_running_avg + requests_waiting_avg")
def requests_in_system(signals: SignalSet) -> float:
    return requests_running_avg(signals) + requests_waiting_avg(signals)


@derived("running_at_peak_ratio", formula="share of scrapes with running gauge = its max")
def running_at_peak(signals: SignalSet) -> float:
    running = signals.get("requests_running")
    peak = need(signals, "requests_running", "max")
    if running is None or peak <= 0 or not running.samples:
        raise Missing("the running gauge read 0 in every scrape")
    return sum(1 for _, v in running.samples if v >= peak) / len(running.samples)


@derived("batch_slots_in_use_ratio", formula="max(requests_running) / max_active_requests")
def batch_slots_in_use(signals: SignalSet) -> float:
    cap = need(signals, "max_active_requests", "last")
    if cap <= 0:
        raise Missing("max_active_requests is zero")
    return need(signals, "requests_running", "max") / cap


@derived("running_gauge_zero_under_load_ratio", formula="share of scrapes with running gauge = 0")
def running_gauge_zero_under_load(signals: SignalSet) -> float:
    running = signals.get("requests_running")
    if running is None or running.unavailable or not running.samples:
        raise Missing("no running gauge")
    if _under_one_running(signals):
        raise Missing("fewer than one request running on average: zero readings are expected")
    return sum(1 for _, v in running.samples if v == 0) / len(running.samples)


@derived("per_user_tokens_per_second", formula="rate(generation_tokens) / requests_running_avg")
def per_user_tokens(signals: SignalSet) -> float:
    return _generation_per_head(signals, requests_running_avg(signals), "no running requests in the window")


@derived(
    "per_user_tokens_per_second_incl_waiting",
    formula="rate(generation_tokens) / (requests_running_avg + requests_waiting_avg)",
)
def per_user_tokens_incl_waiting(signals: SignalSet) -> float:
    return _generation_per_head(signals, requests_in_system(signals), "no requests in the window")


def _generation_per_head(signals: SignalSet, heads: float, none_reason: str) -> float:
    if heads <= 0:
        raise Missing(none_reason)
    return need(signals, "generation_tokens_per_second", "rate") / heads


@derived("preemptions_per_finished_request", formula="increase(preemptions) / increase(request_success)")
def preemptions_per_finished_request(signals: SignalSet) -> float:
    preemptions = need(signals, "preemptions_per_second", "increase")
    finished = need(signals, "requests_finished_per_second", "increase")
    return preemptions / max(finished, 1.0)


@derived("engine_load_imbalance_ratio", formula="max / mean of per-engine running + waiting")
def engine_imbalance(signals: SignalSet) -> float:
    load: dict[str, float] = {}
    for name in ("requests_running", "requests_waiting"):
        signal = signals.get(name)
        if signal is None or signal.unavailable:
            raise Missing(f"{name} unavailable")
        for series, value in signal.by_series.items():
            labels = dict(p.split("=", 1) for p in series.split(",") if "=" in p)
            engine = labels.get("engine", labels.get("dp_rank", series))  # vLLM's engine, SGLang's dp_rank
            load[engine] = load.get(engine, 0.0) + value
    if len(load) < 2:
        raise Missing("a single engine: nothing to balance")
    mean = sum(load.values()) / len(load)
    if mean <= 0:
        raise Missing("no load on any engine")
    return max(load.values()) / mean


@derived(
    "histogram_count_excess_ratio",
    formula="max(count(e2e_latency), count(ttft) - max(running)) / increase(request_success)",
)
def histogram_excess(signals: SignalSet) -> float:
    finished = need(signals, "requests_finished_per_second", "increase")
    if finished < 5:
        raise Missing("fewer than 5 requests finished in the window")
    counts: list[float] = []
    reasons: list[str] = []
    try:
        counts.append(need(signals, "e2e_latency_seconds", "count"))
    except Missing as why:
        reasons.append(str(why))
    try:
        # a request counts in TTFT at its first token, in request_success at its end: those still running may be
        # counted in the first and not yet in the second
        running = need(signals, "requests_running", "max") if signals.get("requests_running") else 0.0
        counts.append(need(signals, "ttft_seconds", "count") - running)
    except Missing as why:
        reasons.append(str(why))
    if not counts:
        raise Missing("; ".join(reasons))
    return max(counts) / finished


# --- stalls, trends, sanity -------------------------------------------------------------------------------------

# progress: any of these moved (tokens out, prompt tokens in, a request finished, or an engine step: llama.cpp and
# Triton count tokens only when a request ends)
PROGRESS_SIGNALS = (
    "generation_tokens_per_second",
    "prompt_tokens_per_second",
    "engine_steps_per_second",
    "requests_finished_per_second",
)
# readings in a row with no progress before it is a stall, not one quiet interval that a request arrived at the end of
STALL_READINGS = 2


def _usable(signals: SignalSet, name: str, stat: str) -> Signal | None:
    signal = signals.get(name)
    if signal is None or signal.unavailable is not None or signal.stats.get(stat) is None:
        return None
    return signal


@derived(
    "no_progress_seconds",
    formula="seconds at the window's end in which no token was made and no engine step ran while requests ran or "
    "waited (2+ readings in a row)",
)
def no_progress(signals: SignalSet) -> float:
    if signals.window.kind == "snapshot":
        raise Missing("one moment: progress shows only between two readings")
    need(signals, "generation_tokens_per_second", "rate")
    need(signals, "requests_running", "max")
    progress = [s for name in PROGRESS_SIGNALS if (s := _usable(signals, name, "rate")) is not None]
    running = signals.signals["requests_running"]
    waiting = _usable(signals, "requests_waiting", "max")
    times = sorted({when for when, _ in signals.signals["generation_tokens_per_second"].samples})
    if len(times) < STALL_READINGS or not running.samples:
        # one rate over the whole window: stalled throughout, or not at all
        held = need(signals, "requests_running", "min") + (waiting.stats.get("min", 0.0) if waiting else 0.0)
        moved = any(s.stats["rate"] > 0 for s in progress)
        return 0.0 if moved or held < 1 else window_seconds(signals)
    rates = [dict(s.samples) for s in progress]
    since: float | None = None
    readings = 0
    for index in range(len(times) - 1, -1, -1):
        at = times[index]
        moved = any(r.get(at, 0.0) > 0 for r in rates)
        held = (value_at(running.samples, at) or 0.0) + (value_at(waiting.samples, at) or 0.0 if waiting else 0.0)
        if moved or held < 1:
            break
        readings += 1
        # a rate reading covers the interval that ends at it: the stall began at the reading before
        start = signals.window.start_unix if signals.window.start_unix is not None else at
        since = times[index - 1] if index > 0 else min(start, at)
    if since is None or readings < STALL_READINGS:
        return 0.0
    return times[-1] - since


@derived(
    "tokens_processed_per_second",
    formula="output tokens/s + prompt tokens/s over the window (one stat line: over the interval it reports)",
)
def tokens_processed(signals: SignalSet) -> float:
    # a capacity verdict needs a server that works: one producing no token while requests run is stuck (or its
    # numbers are wrong), whatever its gauges say; a /metrics dump has no rate at all and is not judged by this
    rates = [s.stats["rate"] for name in PROGRESS_SIGNALS[:2] if (s := _usable(signals, name, "rate")) is not None]
    if not rates:
        raise Missing("no token rate: one /metrics dump, or a log without throughput")
    return sum(rates)


@derived("kv_cache_full_in_seconds", formula="(1 - fitted KV usage now) / its fitted growth per second")
def kv_cache_full_in(signals: SignalSet) -> float:
    slope, _, last, _ = trend(signals, "kv_cache_usage_ratio")
    if slope <= 0:
        raise Missing("KV usage does not grow")
    return max(0.0, 1.0 - last) / slope


@derived(
    "generation_throughput_trend_ratio",
    formula="fitted output tokens/s at the window's end / at its start, while the running requests held",
)
def generation_throughputtrend(signals: SignalSet) -> float:
    _, first, last, _ = trend(signals, "generation_tokens_per_second")
    if first <= 0:
        raise Missing("no output at the window's start")
    running = signals.get("requests_running")
    if running is not None and running.unavailable is None and len(running.samples) >= TREND_MIN_READINGS:
        points = sorted(running.samples)
        slope, r_last, _ = fit(points)
        r_first = r_last - slope * (points[-1][0] - points[0][0])
        if r_first > 0 and r_last / r_first <= last / first + 0.1:
            raise Missing("fewer requests ran at the end: the throughput followed the load")
    return last / first


@derived("queue_over_running_ratio", formula="requests_waiting_avg / max(requests_running_avg, 1)")
def queue_over_running(signals: SignalSet) -> float:
    return requests_waiting_avg(signals) / max(requests_running_avg(signals), 1.0)


@derived(
    "queue_clears_in_window_ratio",
    formula="(last queue / its fall per second since its peak) / the seconds the readings span",
)
def queue_clears_in_window(signals: SignalSet) -> float:
    """How long the queue left at the end takes to clear at the pace it fell since its peak, in windows: below 1 a
    burst is being admitted and drains within another window like this one; a standing queue never falls."""
    if signals.window.kind == "snapshot":
        raise Missing("one moment: a queue's fall shows only between two readings")
    waiting = signals.get("requests_waiting")
    if waiting is None or waiting.unavailable is not None or len(waiting.samples) < STALL_READINGS:
        raise Missing("fewer than two readings of the queue")
    points = sorted(waiting.samples)
    peak_at, peak = max(points, key=lambda p: (p[1], -p[0]))  # the first reading at the peak
    end_at, last = points[-1]
    span = end_at - points[0][0]
    if last >= peak or end_at <= peak_at or span <= 0:
        raise Missing("the queue did not fall from its peak")
    pace = (peak - last) / (end_at - peak_at)
    return (last / pace) / span


# the fastest HBM in the GPU table, and the fewest bytes a weight can take (4-bit): no deployment decodes one request
# faster than reading its active weights once per token at that speed (speculative decoding aside)
FASTEST_HBM_BYTES_PER_SECOND = max(g.hbm_bandwidth_bytes_per_second for g in GPUS.values())
MIN_WEIGHT_BYTES = 0.5
# a mixture of experts names the parameters a token reads after an "A": Qwen3-30B-A3B (3e9). A bare size
# ("gpt-oss-120b", "Llama-3.1-8B") may be a mixture's total, which would set the ceiling far too low: not used
ACTIVE_IN_NAME = re.compile(r"(?<![A-Za-z0-9])A(\d+(?:\.\d+)?)[bB](?![a-zA-Z0-9])")


def model_active_params(signals: SignalSet) -> tuple[float, str]:
    """The served model's parameters read per token, and where that came from: the model table (its shape), or the
    active size a mixture's name states ("Qwen3-30B-A3B": 3e9)."""
    names = [m for source in signals.sources for m in source.models]
    if not names:
        raise Missing("the served model's name is unknown")
    for name in names:
        try:
            return float(find_model(name).active_params), f"{name} (model table)"
        except LlmdiagError:
            pass
        found = ACTIVE_IN_NAME.search(name.split("/")[-1])
        if found:
            return float(found.group(1)) * 1e9, f"{name} (active size in its name)"
    raise Missing(
        f"{', '.join(names)} is not in the model table (probes/tables/models.toml): a size in a name may be a "
        "mixture's total, not what a token reads"
    )


@derived(
    "per_user_decode_over_ceiling_ratio",
    formula="per_user_tokens_per_second / (fastest HBM in the GPU table / (active parameters x 0.5 bytes))",
)
def per_user_decode_over_ceiling(signals: SignalSet) -> float:
    params, _ = model_active_params(signals)
    ceiling = FASTEST_HBM_BYTES_PER_SECOND / (params * MIN_WEIGHT_BYTES)
    return per_user_tokens(signals) / ceiling


@derived(
    "ttft_mean_over_floor_ratio",
    formula="mean(ttft) / (active parameters x 0.5 bytes / fastest HBM in the GPU table)",
)
def ttft_mean_over_floor(signals: SignalSet) -> float:
    # a first token needs one forward pass, which reads every active weight at least once
    params, _ = model_active_params(signals)
    return need(signals, "ttft_seconds", "mean") / (params * MIN_WEIGHT_BYTES / FASTEST_HBM_BYTES_PER_SECOND)


@derived(
    "engine_model_unseen_requests_ratio",
    formula="1 - increase(tensorrt_llm success) / increase(ensemble success)",
)
def engine_model_unseen_requests(signals: SignalSet) -> float:
    ensemble = need(signals, "ensemble_requests_finished_per_second", "increase")
    if ensemble < 5:
        raise Missing("fewer than 5 requests finished at the ensemble in the window")
    return max(0.0, 1.0 - need(signals, "requests_finished_per_second", "increase") / ensemble)


@derived(
    "kv_usage_frozen_while_decoding_seconds",
    formula="the window's seconds when the KV usage gauge read one value throughout while tokens were generated",
)
def kv_usage_frozen(signals: SignalSet) -> float:
    if any(source.probe.endswith("-log") for source in signals.sources):
        raise Missing("a log prints the usage rounded: a steady printed value may be the rounding")
    kv = signals.get("kv_cache_usage_ratio")
    if kv is None or kv.unavailable is not None or len(kv.samples) < TREND_MIN_READINGS:
        raise Missing("too few KV usage readings to tell a frozen gauge")
    generated = signals.get("generation_tokens_per_second")
    if generated is None or generated.unavailable is not None or not generated.samples:
        raise Missing("no output-token readings")
    if need(signals, "requests_running", "min") < 1 or any(v <= 0 for _, v in generated.samples):
        return 0.0  # an idle moment in the window: an unchanged gauge is expected
    values = {v for _, v in kv.samples}
    return window_seconds(signals) if len(values) == 1 else 0.0


# below this mean GPU utilisation the GPUs are mostly idle: a share of "busy" time means nothing
GPU_BUSY_FLOOR = 0.05
LINKS = {"NVLink": "nvlink", "PCIe": "pcie"}


@derived("sm_idle_while_gpu_busy_ratio", formula="1 - mean(sm_active) / mean(gpu_utilization), clamped to [0, 1]")
def sm_idle_while_gpu_busy(signals: SignalSet) -> float:
    busy = need(signals, "gpu_utilization_ratio", "mean")
    if busy < GPU_BUSY_FLOOR:
        raise Missing(f"GPUs busy only {busy:.0%} of the time: nothing to split")
    return min(1.0, max(0.0, 1.0 - need(signals, "sm_active_ratio", "mean") / busy))


@derived("interconnect_bytes_per_second", formula="max over GPUs and over {NVLink, PCIe} of (tx + rx) bytes/s")
def interconnect_bytes(signals: SignalSet) -> float:
    best: float | None = None
    why: list[str] = []
    for label, prefix in LINKS.items():
        try:
            rows = _per_gpu(signals, *((f"{prefix}_{way}_bytes_per_second", "mean") for way in ("tx", "rx")))
        except Missing as exc:
            why.append(f"{label}: {exc}")
            continue
        value = max(tx + rx for tx, rx in rows)
        best = value if best is None else max(best, value)
    if best is None:
        raise Missing("; ".join(why))
    return best


def _by_series(signals: SignalSet, name: str) -> dict[str, float]:
    signal = signals.get(name)
    return dict(signal.by_series) if signal is not None else {}


def _per_gpu(signals: SignalSet, *refs: tuple[str, str]) -> list[tuple[float, ...]]:
    """The signals' values side by side per GPU (or MIG instance), from the probes' per-series means.

    Each ref is (signal, stat). When the signals share no series (one probe kept no per-GPU values, or two probes
    name GPUs differently) the window's aggregate stats stand in as a single row. Missing when any is unavailable.
    """
    aggregates = tuple(need(signals, name, stat) for name, stat in refs)
    per_series = [_by_series(signals, name) for name, _ in refs]
    shared = sorted(set(per_series[0]).intersection(*per_series[1:]))
    return [tuple(values[key] for values in per_series) for key in shared] or [aggregates]


# --- GPU telemetry (probes/dcgm.toml, probes/nvml.toml) ------------------------------------------------------


@derived(
    "gpu_memory_used_ratio", formula="max over GPUs of used / (used + free), or used / total where free is not reported"
)
def gpu_memory_used(signals: SignalSet) -> float:
    # used + free leaves out memory the driver reserves (DCGM's FB_RESERVED): it is what allocations can still get
    try:
        rows = _per_gpu(signals, ("gpu_memory_used_bytes", "max"), ("gpu_memory_free_bytes", "min"))
        ratios = [used / (used + free) for used, free in rows if used + free > 0]
    except Missing as no_free:
        try:
            rows = _per_gpu(signals, ("gpu_memory_used_bytes", "max"), ("gpu_memory_total_bytes", "max"))
        except Missing as no_total:
            raise Missing(f"{no_free}; {no_total}") from None
        ratios = [used / total for used, total in rows if total > 0]
    if not ratios:
        raise Missing("every GPU reports a zero-size framebuffer")
    return max(ratios)


@derived("gpu_power_ratio", formula="max over GPUs of mean(power) / mean(power limit)")
def gpu_power(signals: SignalSet) -> float:
    rows = _per_gpu(signals, ("gpu_power_watts", "mean"), ("gpu_power_limit_watts", "mean"))
    ratios = [power / limit for power, limit in rows if limit > 0]
    if not ratios:
        raise Missing("the power limit reads 0 W")
    return max(ratios)


@derived("sm_clock_ratio", formula="min over GPUs of mean(SM clock) / max SM clock")
def sm_clock(signals: SignalSet) -> float:
    rows = _per_gpu(signals, ("sm_clock_hertz", "mean"), ("sm_clock_max_hertz", "mean"))
    ratios = [clock / highest for clock, highest in rows if highest > 0]
    if not ratios:
        raise Missing("the maximum SM clock reads 0")
    return min(ratios)


# PCIe bandwidth per lane and direction after line encoding (8b/10b for Gen1-2, 128b/130b for Gen3-5, FLIT for
# Gen6), in bytes/s: a Gen4 x16 link carries 31.5 GB/s each way before packet overhead
PCIE_LANE_BYTES_PER_SECOND = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}


def pcie_link_bytes_per_second(generation: float, lanes: float) -> float:
    """Per-direction bandwidth of a link trained at this generation and width (a window mean rounds to a gen)."""
    gen = round(generation)
    if gen not in PCIE_LANE_BYTES_PER_SECOND:
        raise Missing(f"unknown PCIe generation {generation:g}")
    return PCIE_LANE_BYTES_PER_SECOND[gen] * lanes


@derived("pcie_link_speed_ratio", formula="min over GPUs of lane rate(gen) x width / (lane rate(max gen) x max width)")
def pcie_link_speed(signals: SignalSet) -> float:
    rows = _per_gpu(
        signals,
        ("pcie_link_generation", "min"),
        ("pcie_link_width_lanes", "min"),
        ("pcie_link_max_generation", "min"),
        ("pcie_link_max_width_lanes", "min"),
    )
    return min(
        pcie_link_bytes_per_second(gen, width) / pcie_link_bytes_per_second(max_gen, max_width)
        for gen, width, max_gen, max_width in rows
    )


@derived("pcie_link_capacity_bytes_per_second", formula="min over GPUs of lane rate(gen) x width")
def pcie_link_capacity(signals: SignalSet) -> float:
    rows = _per_gpu(signals, ("pcie_link_generation", "min"), ("pcie_link_width_lanes", "min"))
    return min(pcie_link_bytes_per_second(gen, width) for gen, width in rows)


@derived("link_utilization_ratio", formula="max over GPUs and links of max(tx, rx) / per-direction capacity")
def link_utilization(signals: SignalSet) -> float:
    shares: list[float] = []
    why: list[str] = []
    try:
        rows = _per_gpu(
            signals,
            ("pcie_tx_bytes_per_second", "mean"),
            ("pcie_rx_bytes_per_second", "mean"),
            ("pcie_link_generation", "min"),
            ("pcie_link_width_lanes", "min"),
        )
        shares += [max(tx, rx) / pcie_link_bytes_per_second(gen, width) for tx, rx, gen, width in rows]
    except Missing as exc:
        why.append(f"PCIe: {exc}")
    try:
        rows = _per_gpu(
            signals,
            ("nvlink_tx_bytes_per_second", "mean"),
            ("nvlink_rx_bytes_per_second", "mean"),
            ("nvlink_capacity_bytes_per_second", "min"),
        )
        shares += [max(tx, rx) / capacity for tx, rx, capacity in rows if capacity > 0]
    except Missing as exc:
        why.append(f"NVLink: {exc}")
    if not shares:
        raise Missing("; ".join(why) or "no link has a capacity above zero")
    return max(shares)


LINK_ERROR_SIGNALS = (
    "pcie_replay_errors_per_second",
    "nvlink_crc_errors_per_second",
    "nvlink_replay_errors_per_second",
    "nvlink_recovery_errors_per_second",
)


@derived(
    "link_errors_per_second",
    formula="sum of rate(PCIe replays, NVLink CRC, NVLink replays, NVLink recoveries) that are available",
)
def link_errors(signals: SignalSet) -> float:
    rates: list[float] = []
    why: list[str] = []
    for name in LINK_ERROR_SIGNALS:
        try:
            rates.append(need(signals, name, "rate"))
        except Missing as exc:
            why.append(str(exc))
    if not rates:
        raise Missing("; ".join(why))
    return sum(rates)


@derived(
    "roofline_fraction_ratio",
    formula=lambda: (
        "measured decode tokens/s / roofline ceiling (set by the scan from "
        f"{option('gpu')} and {option('model_shape')})"
    ),
)
def roofline_fraction(signals: SignalSet) -> float:
    # the scan adds the real value before judging (llmdiag.api); this entry names the signal and says why it is absent
    raise Missing(
        f"the deployment is unknown: pass {option('gpu')} and {option('model_shape')} to place the decode rate under "
        "its ceiling"
    )


# ---------------------------------------------------------------------------------------------
# slow steps against the SLO, and the proof that the step is the wall (CMP001, CMP008, SCH013)


@derived("itl_mean_over_slo_tpot_ratio", formula="itl_seconds.mean / slo_tpot_seconds (the user's TPOT SLO)")
def itl_mean_over_slo_tpot(signals: SignalSet) -> float:
    return need(signals, "itl_seconds", "mean") / need(signals, "slo_tpot_seconds", "value")


@derived(
    "itl_seconds_per_running_request",
    formula="least-squares slope of the step time (running requests / output tokens/s, interval by interval; "
    f"intervals whose end readings differ over {STEP_FIT_MIN_BATCH_SPREAD}x left out) against the running requests",
)
def itl_per_running_request(signals: SignalSet) -> float:
    return step_fit(signals).slope_seconds_per_request


@derived("itl_seconds_per_running_request_r2", formula="R² of that fit (1: the batch explains all of its spread)")
def itl_per_running_request_r2(signals: SignalSet) -> float:
    return step_fit(signals).r2


@derived(
    "step_batch_share_ratio",
    formula="that fit's slope x the mean running requests / the mean step (0: the step holds still as the batch "
    "varies)",
)
def step_batch_share(signals: SignalSet) -> float:
    return step_fit(signals).batch_share_ratio


# the proofs that the step itself is the wall: decode at half the physics ceiling or more (real kernels reach 70-90 %
# of peak bandwidth, host gaps included in the window), or a step that grows with the batch: a line explains 60 %
# of its spread and the batch's share (slope x mean batch) is a quarter of the mean step or more
ROOFLINE_SATURATED_RATIO = 0.5
STEP_FIT_MIN_R2 = 0.6
STEP_BATCH_SHARE_RATIO = 0.25


@derived(
    "step_wall_proofs_count",
    formula=f"how many hold: roofline_fraction_ratio >= {ROOFLINE_SATURATED_RATIO}; the step grows with the batch "
    f"(slope > 0, R² >= {STEP_FIT_MIN_R2}, slope x mean batch >= {STEP_BATCH_SHARE_RATIO} of the mean step)",
)
def step_wall_proofs(signals: SignalSet) -> float:
    return _proofs(
        signals,
        lambda roofline: roofline >= ROOFLINE_SATURATED_RATIO,
        lambda shape: shape.r2 >= STEP_FIT_MIN_R2 and shape.batch_share_ratio >= STEP_BATCH_SHARE_RATIO,
    )


def _proofs(signals: SignalSet, by_roofline: Callable[[float], bool], by_step: Callable[[StepFit], bool]) -> float:
    """How many of the two witnesses hold (the roofline fraction, the step's fit against the batch); unavailable
    only when neither could be read."""
    proofs, why = 0, []
    try:
        proofs += by_roofline(need(signals, "roofline_fraction_ratio", "value"))
    except Missing as exc:
        why.append(str(exc))
    try:
        proofs += by_step(step_fit(signals))
    except Missing as exc:
        why.append(str(exc))
    if len(why) == 2:
        raise Missing("; ".join(why))
    return float(proofs)


# the proofs that it is not: decode far under the ceiling (the host's gaps take most of each step), or a step that
# holds still while the batch varies (the batch sets none of its pace)
ROOFLINE_FAR_UNDER_RATIO = 0.25


@derived(
    "step_not_the_wall_proofs_count",
    formula=f"how many hold: roofline_fraction_ratio < {ROOFLINE_FAR_UNDER_RATIO}; step_batch_share_ratio < "
    f"{STEP_BATCH_SHARE_RATIO} (a fit over a batch that varied)",
)
def step_not_the_wall_proofs(signals: SignalSet) -> float:
    return _proofs(
        signals,
        lambda roofline: roofline < ROOFLINE_FAR_UNDER_RATIO,
        lambda shape: shape.batch_share_ratio < STEP_BATCH_SHARE_RATIO,
    )


# ---------------------------------------------------------------------------------------------
# against the target's own past: `llmdiag check` supplies the baseline_* signals (medians of its history,
# llmdiag.engine.baseline); a scan has none, so the regression rules are skipped with this reason

NO_BASELINE = "no baseline: only `llmdiag check` compares a window with the median of the target's past checks"


def _vs_baseline(signals: SignalSet, current: str, stat: str, baseline: str) -> float:
    if signals.get(baseline) is None:
        raise Missing(NO_BASELINE)
    base = need(signals, baseline, "value")
    if base <= 0:
        raise Missing(f"{baseline} is zero: nothing to compare against")
    return need(signals, current, stat) / base


@derived("ttft_p95_vs_baseline_ratio", formula="ttft_seconds.p95 / baseline_ttft_p95_seconds")
def ttft_p95_vs_baseline(signals: SignalSet) -> float:
    return _vs_baseline(signals, "ttft_seconds", "p95", "baseline_ttft_p95_seconds")


@derived("tpot_p95_vs_baseline_ratio", formula="tpot_seconds.p95 / baseline_tpot_p95_seconds")
def tpot_p95_vs_baseline(signals: SignalSet) -> float:
    return _vs_baseline(signals, "tpot_seconds", "p95", "baseline_tpot_p95_seconds")


@derived(
    "generation_throughput_vs_baseline_ratio", formula="rate(generation_tokens) / baseline_generation_tokens_per_second"
)
def generation_throughput_vs_baseline(signals: SignalSet) -> float:
    return _vs_baseline(signals, "generation_tokens_per_second", "rate", "baseline_generation_tokens_per_second")


@derived("requests_running_vs_baseline_ratio", formula="requests_running_avg / baseline_requests_running_avg")
def requests_running_vs_baseline(signals: SignalSet) -> float:
    return _vs_baseline(signals, "requests_running_avg", "value", "baseline_requests_running_avg")


def add_derived(signals: SignalSet) -> None:
    """Compute every registered derived signal into the set, unavailable ones with their reason.

    A signal the scan supplied under a registered name (the roofline, from the known deployment) is kept as it is.
    """
    for item in REGISTRY:
        supplied = signals.get(item.name)
        if supplied is not None and supplied.unavailable is None and not supplied.source.startswith("derived:"):
            continue
        try:
            value = item.compute(signals)
            signal = Signal(name=item.name, kind="derived", unit=item.unit, stats={"value": value})
        except Missing as why:
            signal = Signal.missing(item.name, "derived", item.unit, str(why))
        signal.source = f"derived: {item.formula() if callable(item.formula) else item.formula}"
        signal.window_seconds = signals.window.duration_seconds
        signals.add(signal)
