"""Server logs as a time series: the stat-logger lines of vLLM (V0 and V1), SGLang's batch lines, TensorRT-LLM's
iteration-stats JSON records and the KV-transfer lines of disaggregated serving (vLLM's NIXL/Mooncake connectors,
the Mooncake transfer engine), turned into the same SignalSet a scan builds.

The line formats are data (``probes/logs.toml``), read by ``llmdiag.collect.log_lines``. Each series (a DP engine,
a process) keeps its last value between its own lines, and at every moment with a stat line a synthetic "scrape"
holds all of them, so the server total is the sum over engines at each moment and ``by_series`` keeps each engine
for the imbalance rule. Per-second averages printed by the stat logger become counters (rate x the time since the
series' previous line, capped at the log's own median interval so a quiet gap is not read as busy), so rates,
charts and rules work as they do on /metrics. Every interval comes from the lines' own timestamps, never from an
assumed logging interval.

Lines without any time are ordered as given: gauges are judged over them, the printed per-second averages are read
as printed, and what needs time (counts per second) is unavailable with the reason. One moment (one stat line, or
every DP rank in the same second) is a snapshot.

llama.cpp's print_timings rows and TGI's router spans time each finished request: their latencies (TTFT, inter-token
latency, queue time) are samples of their own moment, never held as levels, and they carry no levels (running,
waiting, KV). What a log does not carry (latency histograms; finished requests in vLLM's and SGLang's stat lines) is
unavailable with the reason, never zero. The
inter-token latency is estimated per line as running requests / generation throughput (each running request gets
one token per step), and says so in its source: never from a series' first line (its interval began before the
log), nor from a line whose throughput gave fewer tokens than running requests over its interval (the batch was not
decoding throughout), nor from one line alone; intervals that also ran prefill are counted and named.

Times: vLLM prints ``MM-DD hh:mm:ss`` without a year; the year is the file's (its mtime), one less for a line that
would lie in the future of the file. All naive times, and --since/--until, are read as UTC.
"""

from __future__ import annotations

import gc
import math
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from llmdiag.collect.exposition import Scrape
from llmdiag.collect.log_lines import (
    LineReader,
    LogScan,
    Record,
    holds_record,
    iter_records,
    scan_logs,
    trtllm_record,
    utc,
)
from llmdiag.collect.signals import build_signal_set
from llmdiag.errors import InputFileError, UsageError, option
from llmdiag.model import Signal, SignalSet
from llmdiag.schema.loader import load_probe
from llmdiag.schema.logs import LogField, LogSpec, load_log_spec
from llmdiag.schema.probes import ProbeSpec, SignalSpec

__all__ = ["collect_logs", "looks_like_log", "parse_when", "starts_like_a_dump", "trtllm_record", "window_bounds"]

LOG_HINT = (
    "give the server's own log: vLLM stat-logger lines ('Avg prompt throughput: …'), SGLang 'Decode batch' / "
    "'Prefill batch' lines, TensorRT-LLM iteration-stats JSON records, llama.cpp's 'prompt eval time' / 'eval time' "
    "rows, or TGI's request spans (queue_time=…)"
)
SERVER_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM", "llamacpp": "llama.cpp", "tgi": "TGI"}
# the probe whose signal vocabulary a log's missing signals are listed from: the server's own where it has one that
# its log's signals are named after, else vLLM's
VOCABULARY_PROBE = "vllm"
VOCABULARY = {"llamacpp": "llamacpp", "tgi": "tgi"}
NOT_IN_LOGS = (
    "not in server logs: the stat-logger lines carry no latency histograms or request counts; save /metrics "
    "(curl -s URL/metrics > metrics.prom) or scan the live server for it"
)
# llama.cpp's and TGI's logs time each finished request: they carry no levels (running, waiting, KV)
NOT_IN_REQUEST_LOGS = (
    "not in {server}'s log: its per-request timings carry no running or waiting requests, KV usage or histograms; "
    "save /metrics (curl -s URL/metrics > metrics.prom) or scan the live server for it"
)
UNTIMED_NOTE = "no timestamps: lines ordered as given"


# ---------------------------------------------------------------------------------------------
# --since / --until

RELATIVE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d)$")
UNIT_SECONDS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_when(text: str, last: float, what: str) -> float:
    """An ISO time (UTC), a time of day on the last line's date, or a span before the last line (``30m``)."""
    text = text.strip()
    relative = RELATIVE_RE.match(text)
    if relative:
        return last - float(relative.group(1)) * UNIT_SECONDS[relative.group(2)]
    candidates = [text.replace("T", " ").removesuffix("Z")]
    day = datetime.fromtimestamp(last, tz=timezone.utc).strftime("%Y-%m-%d")
    candidates.append(f"{day} {text}")
    for candidate in candidates:
        for fmt in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d"):
            try:
                return utc(candidate.split(".")[0], fmt)
            except ValueError:
                continue
    raise UsageError(
        f"{what} {text!r} is neither a time nor a span",
        f"e.g. {what} 2026-11-30T06:40:00, {what} 06:40, or {what} 15m (before the log's last line)",
    )


def window_bounds(first: float, last: float, since: str | None, until: str | None) -> tuple[float, float]:
    """The times between which records are kept: ``since`` and ``until`` resolved against the log's last line."""
    low = parse_when(since, last, option("since")) if since else -math.inf
    high = parse_when(until, last, option("until")) if until else math.inf
    if low >= high:
        since_option, until_option = option("since"), option("until")
        raise UsageError(
            f"{since_option} is not before {until_option}", f"give {since_option} an earlier time than {until_option}"
        )
    return low, high


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


# ---------------------------------------------------------------------------------------------
# records → synthetic scrapes → signals

# TRT-LLM record fields (read in code) and what they become; counts per iteration, scaled by the iterations since the
# previous record (iter_perf_stats_interval samples every N)
TRT_FIELDS = {
    "trt_ctx_tokens": LogField(name="trt_ctx_tokens", signal="prompt_tokens_per_second", kind="count", unit="tokens/s"),
    "trt_gen_tokens": LogField(
        name="trt_gen_tokens", signal="generation_tokens_per_second", kind="count", unit="tokens/s"
    ),
    "trt_paused": LogField(name="trt_paused", signal="preemptions_per_second", kind="count", unit="preemptions/s"),
}
STALE_INTERVALS = 3
# at most this many scrapes (moments) are kept: a long log keeps every k-th moment, so memory stays flat whatever the
# log's length; counters are running totals, so their increase is exact, and gauges are read at the kept moments
MAX_MOMENTS = 4000


@dataclass
class _Catalogue:
    fields: dict[str, LogField]
    interval_counts: set[str]  # formats whose counts cover the interval since the series' previous line
    levels: frozenset[str] = frozenset()  # the fields that hold a level or a per-second average

    def __post_init__(self) -> None:
        self.levels = frozenset(n for n, f in self.fields.items() if f.kind in ("gauge", "rate"))

    @classmethod
    def of(cls, spec: LogSpec) -> _Catalogue:
        fields = {f.name: f for f in spec.field} | TRT_FIELDS
        return cls(
            fields=fields,
            interval_counts={line.name for line in spec.line if line.interval_counts},
        )

    @property
    def rate_names(self) -> set[str]:
        return {name for name, f in self.fields.items() if f.kind == "rate"}

    def level(self, record: Record) -> bool:
        """Whether a record holds a level or a per-second average (a stat line), not only events."""
        return not self.levels.isdisjoint(record.values)


@dataclass
class _SeriesState:
    last_at: float | None = None  # any line of the series
    last_by_format: dict[str, float] = field(default_factory=dict)  # a rate covers the time since its own format
    last_iter: float | None = None
    gauges: dict[str, float] = field(default_factory=dict)
    printed: dict[str, float] = field(default_factory=dict)  # the last per-second average as printed, per signal
    covered_by_format: dict[str, float | None] = field(default_factory=dict)  # the interval of the format's last line
    # signal → (sum, count) of the averages printed in the same second: lines of one second share its interval
    same_second: dict[str, tuple[float, int]] = field(default_factory=dict)
    prefill_since_decode: bool = False  # SGLang: a prefill batch ran since the series' previous decode line
    fleeting: set[str] = field(default_factory=set)  # gauges of one request (per_request fields) since the last scrape


@dataclass
class ItlTally:
    """What the inter-token latency estimate was made from, and what it left out and why."""

    lines: int = 0  # stat lines with running requests
    used: int = 0
    first: int = 0  # a series' first line: its interval began before the log
    near_zero: int = 0  # fewer tokens than running requests over the interval
    mixed: int = 0  # used, but the interval also ran prefill


@dataclass
class _Built:
    scrapes: list[Scrape]
    seen: dict[str, LogField]
    itl: ItlTally
    printed: dict[str, list[float]]  # signal → the server total of the printed per-second averages, per scrape
    moments: int = 0  # moments with a stat line; a scrape is kept for every ``stride``-th of them and the last
    stride: int = 1
    # what the streamed records were, for the report (no record is kept)
    count: int = 0
    formats: set[str] = field(default_factory=set)
    series: set[str] = field(default_factory=set)
    first_at: float | None = None
    last_at: float | None = None
    estimable: bool = False  # some line could give an inter-token latency estimate
    first_format: str = ""
    # cumulative fields: the server's own running total last printed, signal → series → value
    printed_totals: dict[str, dict[str, float]] = field(default_factory=dict)


def _accumulate(record: Record, state: _SeriesState, counters: dict, built: _Built, ctx: tuple) -> None:
    """One record's numbers into its series: gauges held, rates and counts added to the running counters. Times
    have whole seconds: lines of one series and format in the same second (SGLang logs a decode line every 40
    steps) cover that second's interval together, so the interval is counted once at their mean rate."""
    catalogue, covered, first_of_series, same_second = ctx
    series, seen = record.series, built.seen
    for name, value in record.values.items():
        spec = catalogue.fields.get(name)
        if spec is None:
            continue
        signal, kind = spec.signal, spec.kind  # (read once: this runs for every number of every line)
        if signal not in seen:
            seen[signal] = spec
        if kind == "gauge":
            state.gauges[signal] = value * spec.scale
            if spec.per_request:
                state.fleeting.add(signal)
            continue
        totals = counters.get(signal)
        if totals is None:
            totals = counters[signal] = {}
        if series not in totals:
            totals[series] = 0.0
        if kind == "rate":
            rate = value * spec.scale
            state.printed[signal] = rate
            group = state.same_second.get(signal) if same_second else None
            if group is not None:
                before = group[0] / group[1]
                group = (group[0] + rate, group[1] + 1)
                rate = group[0] / group[1] - before  # the change of the second's mean rate
            else:
                group = (rate, 1)
            state.same_second[signal] = group
            if covered:
                totals[series] += rate * covered
        elif kind == "count":
            steps = 1.0
            times: float = 1.0
            if record.iterations is not None and state.last_iter is not None:
                steps = max(record.iterations - state.last_iter, 1.0)
            if spec.times:
                times = record.values.get(spec.times, math.nan)
            # a count in the series' first interval line covers time before the log: only later ones add up
            if not (first_of_series and record.fmt in catalogue.interval_counts) and not math.isnan(times):
                totals[record.series] += value * spec.scale * steps * times
        else:  # cumulative: the increase since the first value seen (from 0 when the first is the 1st event)
            held = state.gauges.get(f"cumulative:{name}")
            base = held if held is not None else (0.0 if value <= 1 else value)
            totals[record.series] += max(value - base, 0.0)
            state.gauges[f"cumulative:{name}"] = value
            built.printed_totals.setdefault(spec.signal, {})[record.series] = value
    for name in record.known_zero:
        spec = catalogue.fields.get(name)
        if spec is not None:
            seen.setdefault(spec.signal, spec)
            totals = counters.get(spec.signal)
            if totals is None:
                totals = counters[spec.signal] = {}
            totals.setdefault(series, 0.0)


def _estimate_itl(record: Record, state: _SeriesState, covered: float | None, tally: ItlTally) -> None:
    """Running ÷ generation throughput, where the line's interval supports it."""
    if "trt_step_seconds" in record.values:  # measured per iteration, not estimated
        state.gauges["itl_seconds"] = record.values["trt_step_seconds"]
        return
    if record.fmt == "sglang-prefill":
        state.prefill_since_decode = True
    if not record.itl_estimate:
        return
    state.gauges.pop("itl_seconds", None)
    mixed = record.values.get("prompt_tps", 0.0) > 0 or state.prefill_since_decode
    state.prefill_since_decode = False
    running, rate = record.values.get("running"), record.values.get("gen_tps")
    if not running:
        return
    tally.lines += 1
    if covered is None:
        tally.first += 1
    elif not rate or rate * covered < running:
        tally.near_zero += 1
    else:
        state.gauges["itl_seconds"] = running / rate
        tally.used += 1
        tally.mixed += mixed


def _tally(built: _Built, record: Record) -> None:
    if not built.count:
        built.first_at, built.first_format = record.at, record.fmt
    built.count += 1
    built.last_at = record.at
    built.formats.add(record.fmt)
    built.series.add(record.series)
    built.estimable = built.estimable or record.itl_estimate


def _scrape(states: dict[str, _SeriesState], counters: dict, moment: float | None, interval: float | None) -> Scrape:
    series: dict[str, dict] = {}
    for key, st in states.items():
        if (
            moment is not None
            and interval
            and st.last_at is not None
            and st.last_at < moment - STALE_INTERVALS * interval
        ):
            continue  # a series that stopped logging (a restarted process) no longer counts in the total
        for signal, value in st.gauges.items():
            if not signal.startswith("cumulative:"):
                series.setdefault(signal, {})[(("engine", key),)] = value
    for signal, per in counters.items():
        for key, total in per.items():
            series.setdefault(signal, {})[(("engine", key),)] = total
    return Scrape(at_unix=moment, series=series)


def _scrapes(records: Iterable[Record], interval: float | None, catalogue: _Catalogue, stride: int) -> _Built:
    """One synthetic scrape per moment with a stat line (per line when there are no times): every series' held
    gauges and running counters. Event lines (a preemption warning, a retraction) add to the counters read at the
    next stat line (a scrape of their own would weigh the held gauges twice); those after the last stat line, or in
    a log of events alone, are read at one last moment."""
    states: dict[str, _SeriesState] = {}
    counters: dict[str, dict[str, float]] = {}  # signal → series → running total
    built = _Built(scrapes=[], seen={}, itl=ItlTally(), printed={}, stride=stride)
    pending: float | None = None
    has_level = False
    events_after_flush = False  # event lines since the last scrape (retractions after the last stat line)

    def keep(last: bool) -> None:
        built.moments += 1
        if (built.moments - 1) % built.stride and not last:
            return
        built.scrapes.append(_scrape(states, counters, pending, interval))
        for signal in {s for st in states.values() for s in st.printed}:
            built.printed.setdefault(signal, []).append(sum(st.printed.get(signal, 0.0) for st in states.values()))

    def flush(last: bool = False) -> None:
        keep(last)
        for st in states.values():  # one request's latency is a sample of its moment, not a level that lasts
            for signal in st.fleeting:
                st.gauges.pop(signal, None)
            st.fleeting.clear()

    for record in records:
        if has_level and (record.at is None or record.at != pending):
            flush()
            has_level = events_after_flush = False
        _tally(built, record)
        pending = record.at
        state = states.get(record.series)
        if state is None:  # (not setdefault: a new state's dicts are built only when needed)
            state = states[record.series] = _SeriesState()
        previous = state.last_by_format.get(record.fmt)
        same_second = previous is not None and record.at == previous
        if same_second:
            covered = state.covered_by_format.get(record.fmt)
        else:
            gap = record.at - previous if previous is not None and record.at is not None else None
            covered = min(gap, interval) if gap is not None and interval else gap
        _accumulate(record, state, counters, built, (catalogue, covered, covered is None, same_second))
        _estimate_itl(record, state, covered, built.itl)
        if record.at is not None:
            state.last_at = record.at
            state.last_by_format[record.fmt] = record.at
            state.covered_by_format[record.fmt] = covered
        if record.iterations is not None:
            state.last_iter = record.iterations
        level = catalogue.level(record)
        has_level = has_level or level
        events_after_flush = events_after_flush or not level
    if has_level or events_after_flush:
        # the events after the last stat line (or a log of events alone) count at a last moment of their own
        flush(last=True)
    return built


def _probe_spec(server: str, seen: dict[str, LogField], has_itl: bool) -> ProbeSpec:
    signals = []
    for name, spec in seen.items():
        kind = "gauge" if spec.kind == "gauge" else "counter"
        signals.append(
            SignalSpec(
                name=name,
                kind=kind,
                unit=spec.unit,
                metrics=[name],
                help=name,
                aggregate=spec.aggregate,
                valid_min=0.0,
                valid_max=1.0 if spec.unit == "ratio" else None,
            )
        )
    if has_itl and "itl_seconds" not in seen:
        signals.append(
            SignalSpec(
                name="itl_seconds", kind="gauge", unit="seconds", metrics=["itl_seconds"], help="itl", aggregate="mean"
            )
        )
    return ProbeSpec(
        name=f"{server}-log",
        title=f"{SERVER_NAMES[server]} log",
        server=SERVER_NAMES[server],
        metrics_path="log",
        detect_prefixes=[""],
        signal=signals,
        verify="-",
    )


SOURCES = {
    "vllm": {
        "requests_running": "'Running: N reqs'",
        "requests_waiting": "'Waiting: N reqs' (V0: 'Pending: N reqs')",
        "requests_swapped": "'Swapped: N reqs' (V0)",
        "requests_waiting_deferred": "'Deferred: N reqs'",
        "kv_cache_usage_ratio": "'GPU KV cache usage: U%'",
        "cpu_kv_cache_usage_ratio": "'CPU KV cache usage: C%' (V0)",
        "prompt_tokens_per_second": "'Avg prompt throughput' x the interval it covers",
        "generation_tokens_per_second": "'Avg generation throughput' x the interval it covers",
        "preemptions_per_second": "V1 'Preemptions: N' (printed only when > 0); V0 'is preempted by' warnings' "
        "total_num_cumulative_preemption (V0 warns on every 50th)",
        "itl_seconds": "estimated per line as Running ÷ Avg generation throughput (one token per request per step)",
    },
    "sglang": {
        "requests_running": "'#running-req'",
        "requests_waiting": "'#queue-req'",
        "kv_cache_usage_ratio": "'token usage'",
        "prompt_tokens_per_second": "'#new-token' of each 'Prefill batch' line",
        "generation_tokens_per_second": "'gen throughput (token/s)' x the interval since the previous decode line",
        "preemptions_per_second": "'Decode out of memory happened. #retracted_reqs: N' (retractions)",
        "itl_seconds": "estimated per decode line as #running-req ÷ gen throughput (one token per request per step)",
    },
    "trtllm": {
        "requests_running": "numActiveRequests",
        "requests_waiting": "numQueuedRequests",
        "kv_cache_usage_ratio": "kvCacheStats.usedNumBlocks ÷ maxNumBlocks",
        "prompt_tokens_per_second": "inflightBatchingStats.numCtxTokens x iterations since the previous record",
        "generation_tokens_per_second": "numGenRequests x avgNumDecodedTokensPerIter x iterations",
        "preemptions_per_second": "inflightBatchingStats.numPausedRequests x iterations (requests paused, KV evicted)",
        "itl_seconds": "iterLatencyMS of iterations with generation requests",
    },
    "llamacpp": {
        "ttft_seconds": "'prompt eval time = X ms' of each finished request (the prompt's processing, without the "
        "queue wait)",
        "itl_seconds": "'eval time = … (X ms per token, …)' of each finished request (old builds: 'generation eval "
        "time')",
        "prompt_tokens_per_second": "'prompt eval time = … / N tokens' of each finished request",
        "generation_tokens_per_second": "'eval time = … / N tokens' of each finished request",
        "generation_busy_seconds_per_second": "'eval time = X ms' of each finished request, summed",
        "requests_finished_per_second": "one per 'eval time = …' row (print_timings, once per finished request)",
    },
    "tgi": {
        "queue_time_seconds": 'the router\'s queue_time="…" of each request span',
        "e2e_latency_seconds": 'the router\'s total_time="…" of each request span',
        "inference_time_seconds": 'the router\'s inference_time="…" of each request span',
        "itl_seconds": 'the router\'s time_per_token="…" of each request span (inference time over its tokens)',
        "requests_finished_per_second": "one per request span's 'Success' event",
    },
}
# disaggregated serving: the KV-transfer lines and the PD queues, whichever server's log holds them
KV_SOURCES = {
    "kv_transfers_per_second": "'KV Transfer metrics: Num successful transfers=N' (vLLM NIXL/Mooncake connector)",
    "kv_transfer_throughput_bytes_per_second": "'KV Transfer metrics' Avg MB per transfer x transfers (MiB), or the "
    "Mooncake transfer engine's '[Metrics] Transfer Engine Throughput: X MB/s (over last N s)' x N s, per thread, "
    "summed: the bytes that crossed the network, over the window",
    "kv_transfer_seconds": "'KV Transfer metrics' Avg xfer time (ms)",
    "kv_transfer_speed_bytes_per_second": "'KV Transfer metrics' Throughput (MB/s): MiB over the summed transfer "
    "durations (one transfer's speed; overlapping transfers are not added up)",
    "kv_prealloc_queue_requests": "'#prealloc-req' of PD decode lines (requests waiting for KV preallocation)",
    "kv_bootstrap_queue_requests": "'#unbootstrapped-req' / '#prealloc-req' of PD prefill lines (requests waiting "
    "for the bootstrap handshake with a decode instance)",
    "kv_transfer_queue_requests": "'#transferring-req' / '#inflight-req' of PD prefill lines, '#transfer-req' of PD "
    "decode lines (KV transfers in flight)",
    "cuda_graph_batches_ratio": "'cuda graph: True/False' of each decode line, read as 1/0",
}
KV_GREP = {
    "kv_transfers_per_second": "grep 'KV Transfer metrics' FILE",
    "kv_transfer_throughput_bytes_per_second": "grep -E 'KV Transfer metrics|Transfer Engine Throughput' FILE",
    "kv_transfer_seconds": "grep 'KV Transfer metrics' FILE",
    "kv_transfer_speed_bytes_per_second": "grep 'KV Transfer metrics' FILE",
}
GREP = {
    "vllm": "grep -E 'Avg prompt throughput|is preempted by' FILE",
    "sglang": "grep -E 'Decode batch|Prefill batch|out of memory happened' FILE",
    "trtllm": "grep '\"iterLatencyMS\"' FILE",
    "llamacpp": "grep 'eval time' FILE",
    "tgi": "grep 'queue_time' FILE",
}


def _servers(server: str | None) -> set[str] | None:
    """The servers whose line formats to use: all, or the one named (with the lines any server's log may hold)."""
    if server is None:
        return None
    name = str(server).lower().replace("-", "").replace("_", "").replace(".", "")
    if name not in SERVER_NAMES:
        known = ", ".join(sorted(SERVER_NAMES))
        raise UsageError(
            f"{option('server')} {server!r} has no log formats; logs of {known} are read",
            f"give {option('server')} one of {known}, or leave it out to tell the server from the lines",
        )
    return {name, "any"}


def collect_logs(
    paths: list[Path],
    since: str | None = None,
    until: str | None = None,
    max_bytes: int = 256 * 1024 * 1024,
    server: str | None = None,
) -> SignalSet:
    """Read server logs into a SignalSet over the time their stat lines cover (filtered by --since/--until);
    ``server`` (a name: "vllm", "sglang", "trtllm") restricts the line formats to that server's; another name is
    refused."""
    if not paths:
        raise UsageError("no log files given", "llmdiag analyze server.log [more.log …]")
    spec = load_log_spec()
    catalogue = _Catalogue.of(spec)
    reader = LineReader(spec, _servers(server))
    # a log is millions of short-lived objects and no reference cycle: the cyclic collector would only walk them
    collecting = gc.isenabled()
    gc.disable()
    try:
        scan = scan_logs(paths, max_bytes, reader, catalogue.rate_names)
        try:
            return _collect(paths, (since, until), server, scan, (reader, catalogue, max_bytes))
        finally:
            scan.close()  # the spooled records
    finally:
        if collecting:
            gc.enable()


def _collect(
    paths: list[Path],
    when: tuple[str | None, str | None],
    server: str | None,
    scan: LogScan,
    reading: tuple[LineReader, _Catalogue, int],
) -> SignalSet:
    """The second pass, over the first pass's scan: the records into scrapes, the scrapes into signals."""
    since, until = when
    reader, catalogue, max_bytes = reading
    where = ", ".join(str(p) for p in paths)
    name = _one_server(scan, where, server)
    timed = scan.timed > 0
    low, high = -math.inf, math.inf
    if timed:
        first, last = scan.bounds()
        low, high = window_bounds(first, last, since, until)
    elif since is not None or until is not None:
        raise UsageError(
            f"{option('since')}/{option('until')} need times, and {where} has none ({UNTIMED_NOTE})",
            f"leave {option('since')}/{option('until')} out, or give the log with its timestamps",
        )
    interval = statistics.median(scan.gaps) if scan.gaps else None
    stride = max(1, -(-(scan.timed or scan.untimed) // MAX_MOMENTS))
    records = iter_records(scan, reader, max_bytes)
    if timed and (since is not None or until is not None):
        records = (r for r in records if r.at is not None and low <= r.at <= high)
    built = _scrapes(records, interval, catalogue, stride)
    if not built.count:
        span = f"{_iso(first)} … {_iso(last)}"
        raise InputFileError(
            f"no stat lines between {option('since')} and {option('until')} (the log covers {span})", LOG_HINT
        )
    has_itl = any("itl_seconds" in s.series for s in built.scrapes)
    probe = _probe_spec(name, built.seen, has_itl)
    signal_set = build_signal_set(probe, built.scrapes, where)
    snapshot = built.moments == 1 or (timed and built.first_at == built.last_at)
    if not timed or snapshot:
        _without_interval(signal_set, built, snapshot)
    _preemptions_reported(signal_set, built)
    _describe(signal_set, name, where, built, interval)
    _itl_source(signal_set, name, built.itl, timed, built.estimable)
    _window_note(signal_set, scan.untimed if timed else 0, timed, snapshot)
    if built.stride > 1:
        signal_set.window.note += (
            f"; gauges read at every {built.stride}th of {built.moments} logged moments ({len(built.scrapes)} kept: "
            f"a cap of {MAX_MOMENTS} keeps memory flat; counters are exact)"
        )
    return signal_set


def _one_server(scan: LogScan, where: str, server: str | None) -> str:
    servers = sorted(scan.servers - {"any"})
    if not servers:
        seen = " | ".join(scan.first_lines) or "an empty file"
        only = f"{SERVER_NAMES[str(server).lower()]} " if str(server).lower() in SERVER_NAMES else ""
        what = (
            "only KV-transfer lines"
            if scan.servers
            else f"no {only or 'vLLM, SGLang, TensorRT-LLM, llama.cpp or TGI '}stat lines"
        )
        raise InputFileError(f"{where}: {what} in {scan.lines} line(s); it starts: {seen}", LOG_HINT)
    if len(servers) > 1:
        raise InputFileError(
            f"{where} mixes logs of {', '.join(SERVER_NAMES[s] for s in servers)}: one server's logs at a time",
            "analyze each server's log on its own",
        )
    return servers[0]


PREEMPTIONS = "preemptions_per_second"


def _preemptions_reported(signal_set: SignalSet, built: _Built) -> None:
    """How many preemptions the log itself reports (its events counted, or the server's printed running total): a
    count that needs no interval, so a log of preemption warnings alone, or one moment, still shows that no KV block
    was free."""
    if PREEMPTIONS not in built.seen or not built.scrapes:
        return
    counted = sum(built.scrapes[-1].series.get(PREEMPTIONS, {}).values())
    total = max(counted, sum(built.printed_totals.get(PREEMPTIONS, {}).values()))
    signal_set.add(
        Signal(
            name="preemptions_reported",
            kind="gauge",
            unit="preemptions",
            stats={"last": total, "mean": total, "min": total, "max": total},
            source=f"{signal_set.signals[PREEMPTIONS].source}: the preemptions the log reports, in all",
        )
    )


def _without_interval(signal_set: SignalSet, built: _Built, snapshot: bool) -> None:
    """No interval to integrate over (one moment, or no times): a counter is unavailable, except the per-second
    averages the server printed itself, which are read as printed; untimed samples are placed at their index."""
    why = (
        "one moment (a snapshot): counts per second need an interval"
        if snapshot
        else f"{UNTIMED_NOTE}: counts per second need times"
    )
    for name, signal in signal_set.signals.items():
        if signal.kind != "counter":
            if not snapshot and signal.samples:
                signal.samples = [(float(i), v) for i, (_, v) in enumerate(signal.samples)]
            continue
        printed = built.printed.get(name)
        if printed:
            signal_set.signals[name] = Signal(
                name=name,
                kind="counter",
                unit=signal.unit,
                stats={"rate": statistics.fmean(printed)},
                samples=[] if snapshot else [(float(i), v) for i, v in enumerate(printed)],
                source=signal.source,
            )
            continue
        signal.stats = {}
        signal.unavailable = why
    signal_set.window.duration_seconds = None
    if snapshot:
        signal_set.window.kind = "snapshot"
    else:
        signal_set.window.start_unix = signal_set.window.end_unix = None


def _itl_source(signal_set: SignalSet, server: str, tally: ItlTally, timed: bool, estimable: bool) -> None:
    """Say what the estimate was made of; unavailable, with the reason, when the lines could give one but did not."""
    signal = signal_set.signals.get("itl_seconds")
    if server == "trtllm" or signal is None or not estimable:
        return
    left = []
    if tally.first:
        left.append(f"{tally.first} first line(s) of a series (their interval began before the log)")
    if tally.near_zero:
        left.append(f"{tally.near_zero} line(s) whose throughput gave fewer tokens than running requests")
    if not timed or tally.used < 2:
        why = UNTIMED_NOTE if not timed else f"estimated from {tally.used} stat line(s); at least two are needed"
        if left and timed:
            why += f" (left out: {'; '.join(left)})"
        source = f"{SERVER_NAMES[server]} log: {SOURCES[server]['itl_seconds']}"
        signal_set.signals["itl_seconds"] = Signal.missing(
            "itl_seconds", "gauge", "seconds", f"{why}: the estimate needs each line's interval", source
        )
        return
    signal.source += f"; from {tally.used} of {tally.lines} stat lines with running requests"
    if left:
        signal.source += f" (left out: {'; '.join(left)})"
    if tally.mixed:
        signal.source += (
            f"; {tally.mixed} of the {tally.used} intervals also ran prefill, so their estimate includes prefill time"
        )


def _window_note(signal_set: SignalSet, untimed: int, timed: bool, snapshot: bool) -> None:
    window = signal_set.window
    if not timed:
        window.note = f"{UNTIMED_NOTE}; {window.note}"
    elif snapshot:
        window.note = f"one moment (a snapshot of every series at {_iso(window.start_unix or 0.0)}); {window.note}"
    if untimed:
        window.note += f"; {untimed} stat line(s) without a time left out (they cannot be placed among the others)"


def _describe(signal_set: SignalSet, server: str, where: str, built: _Built, interval: float | None) -> None:
    label = SERVER_NAMES[server]
    grep = GREP[server].replace("FILE", where)
    sources = SOURCES[server] | KV_SOURCES
    for name, signal in signal_set.signals.items():
        if name in sources:
            signal.source = f"{label} log: {sources[name]}"
            signal.verify = KV_GREP[name].replace("FILE", where) if name in KV_GREP else grep
    series = sorted(built.series)
    untimed = built.first_at is None
    every = f"every {interval:.0f} s" if interval else "at each line" if untimed else "at each stat line"
    signal_set.window.note = (
        f"from {built.count} log lines ({', '.join(sorted(built.formats))}): gauges sampled {every} by "
        f"the server's own logger, {len(series)} series ({', '.join(series)})"
    )
    vocabulary = load_probe(VOCABULARY.get(server, VOCABULARY_PROBE))
    why = NOT_IN_REQUEST_LOGS.format(server=label) if server in VOCABULARY else NOT_IN_LOGS
    for spec in vocabulary.signal:
        if spec.name not in signal_set.signals:
            signal_set.add(Signal.missing(spec.name, spec.kind, spec.unit, why))
    source = signal_set.sources[-1]
    source.probe = f"{server}-log"
    source.url = where
    source.engines = series if len(series) > 1 else []
    source.note = "server log lines"


EXPOSITION_LINE = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:]*(\{.*\})?\s+[-+0-9.eEINFnaif]+(\s+\d+)?\s*$")
HEAD_BYTES = 65536


def looks_like_log(path: Path) -> bool:
    """True when any line of the file's head (64 KB) holds a known stat record anywhere in it, once unquoted, whatever
    the lines before it are (prose, fences, quotes); otherwise True unless the file starts like a /metrics dump
    (Prometheus text, or TensorRT-LLM's JSON array), so that a log without stat lines is refused as a log."""
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            head = handle.read(HEAD_BYTES)
    except OSError:
        return False  # let the dump reader name the problem
    return holds_record(head, load_log_spec(), json=False) or not starts_like_a_dump(head)


def starts_like_a_dump(head: str) -> bool:
    """Whether a text's first line is a /metrics dump's (Prometheus text, or TensorRT-LLM's JSON array); an empty
    text counts as one, so that no reader takes it for a log."""
    for line in head.splitlines():
        text = line.strip()
        if not text:
            continue
        if text.startswith("#"):
            return bool(re.match(r"#\s*(HELP|TYPE|EOF|llmdiag-scraped-at)\b", text))
        return bool(text.startswith("[{") or text == "[" or EXPOSITION_LINE.match(text))
    return True
