"""TensorRT-LLM's ``trtllm-serve`` ``GET /metrics``: JSON iteration statistics, read into llmdiag's signals.

The page is not Prometheus: a JSON array of per-iteration records (metrics catalog §2.1), one per engine step
(``iter_perf_stats_interval: N`` keeps one in N). The server keeps them in a bounded queue and **removes what it
returns**: a second scraper steals records from the first, and a slow scraper loses the oldest when the queue is
full. So a live scan reads the page every interval, keeps every record it got, and checks the ``iter`` numbers for
holes; missing records are reported (anomaly + ``iteration_records_missing_ratio``), never guessed.

Window: the first read returns the backlog from before the scan; it only sets the starting iteration. The records
of the later reads are the window, whose duration is the time between the first and the last read, as counter
deltas are. ``signals_from_iteration_records`` turns any list of records into signals (part C reads the same
records out of server logs), with the window's duration when it is known, else from the records' timestamps.

What each record gives (vLLM's vocabulary, so the same rules judge both):

    requests_running              gauge   numActiveRequests            (context + generation requests in flight)
    requests_waiting              gauge   numQueuedRequests
    kv_cache_usage_ratio          gauge   kvCacheStats.usedNumBlocks / maxNumBlocks
    requests_paused               gauge   inflightBatchingStats.numPausedRequests (paused this iteration)
    max_active_requests           gauge   maxNumActiveRequests
    preemptions_per_second        counter Σ numPausedRequests: a paused request's KV is freed and it is rescheduled
                                          later, as a vLLM preemption (TRT-LLM pauses only under the MAX_UTILIZATION
                                          capacity policy; see below)
    requests_finished_per_second  counter Σ numCompletedRequests
    generation_tokens_per_second  counter Σ numGenRequests × max(1, avgNumDecodedTokensPerIter)
    prompt_tokens_per_second      counter Σ numCtxTokens (context tokens computed; chunked prefill counts each chunk)
    itl_seconds                   histogram-like stats of iterLatencyMS, one observation per generation request of
                                  the iteration (each gets one token gap of that length)
    iteration_seconds             the same, one observation per iteration
    queue_time_seconds            histogram-like stats of newActiveRequestsQueueLatencyMS (read as the mean over the
                                  iteration's newly activated requests), numNewActiveRequests observations
    kv_cache_blocks / kv_cache_block_size_tokens      maxNumBlocks / tokensPerBlock (last record)
    queued_with_batch_room_ratio  share of iterations with requests queued, fewer active than maxNumActiveRequests,
                                  the context-token budget not full and nothing paused: the scheduler held requests
                                  back for a reason other than batch slots, pauses or the token budget

Capacity policies. ``MAX_UTILIZATION`` packs the batch and pauses (evicts) running requests when KV runs out:
memory pressure shows as ``numPausedRequests`` > 0, which the memory rule MEM001 reads as preemptions.
``GUARANTEED_NO_EVICT`` (TRT-LLM's default) admits a request only when blocks for its whole sequence can be
reserved: it never pauses, so memory pressure shows as a queue while ``usedNumBlocks`` (blocks allocated so far, not
the reservation) can sit well below ``maxNumBlocks``. With usage at ≥ 90 % the memory rule MEM003 (KV nearly full,
requests waiting, no preemptions) names it; below that, ``queued_with_batch_room_ratio`` near 1 is the sign: the
memory rule MEM006 reads it (so SCH001 does not lead with a batch cap that is not there), and the collector adds a
note naming the policy, since the records do not say which policy runs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from typing import Any

from llmdiag.client.endpoint import Connection
from llmdiag.collect.exposition import Scrape, parse_exposition
from llmdiag.collect.http import HttpMetricsSource
from llmdiag.collect.signals import build_signal_set
from llmdiag.collect.source import Source
from llmdiag.errors import NotMetricsError, option
from llmdiag.model import Signal, SignalKind, SignalSet, SourceInfo, Window
from llmdiag.schema.probes import ProbeSpec

PROBE = "trtllm"
SERVER = "TensorRT-LLM"
JSON_SOURCE = "trtllm /metrics (JSON iteration stats)"
TIMESTAMP_FORMAT = "%m-%d-%Y %H:%M:%S.%f"
ENABLE_HINT = "set enable_iter_perf_stats: true in the trtllm-serve --extra_llm_api_options YAML"
PROMETHEUS_PATH = "/prometheus/metrics"
# the share of iterations with an unexplained queue above which the GUARANTEED_NO_EVICT note is added
RESERVED_KV_NOTE_SHARE = 0.5
# what the records give beyond probes/trtllm.toml's names is declared in probes/signals.toml ("trtllm-records")


Record = Mapping[str, Any]


def drain_hint() -> str:
    """What to do when another scraper drains the JSON page's records."""
    return (
        f"read {PROMETHEUS_PATH} instead ({option('metrics_url')} http://HOST:PORT{PROMETHEUS_PATH}; it needs "
        "return_perf_metrics: true and enable_iter_perf_stats: true), or stop the other scraper of /metrics"
    )


@dataclass
class IterationScrape(Scrape):
    """One read of the JSON page: the records it returned (already removed from the server's queue)."""

    records: list[dict[str, Any]] = field(default_factory=list)


def parse_iteration_stats(text: str, at_unix: float | None, origin: str = "metrics page") -> IterationScrape:
    """The JSON array of records (or JSON lines, one record per line, as some logs carry them)."""
    stripped = text.strip()
    try:
        if stripped.startswith("["):
            data = json.loads(stripped)
        else:
            data = [json.loads(line) for line in stripped.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise NotMetricsError(f"{origin} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise NotMetricsError(f"{origin} is JSON nested deeper than any iteration record") from None
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise NotMetricsError(f"{origin} is JSON but not a list of TensorRT-LLM iteration records")
    bad = [r for r in data if not _is_iter(r.get("iter"))]
    if bad:
        raise NotMetricsError(
            f"{origin}: {len(bad)} record(s) without an integer 'iter': not TensorRT-LLM iteration stats"
        )
    return IterationScrape(at_unix=at_unix, size_bytes=len(text), records=data)


def _is_iter(value: object) -> bool:
    """TensorRT-LLM numbers its iterations with an integer (json.loads also reads NaN, Infinity and 1e309)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63


def looks_like_json(text: str) -> bool:
    return text.lstrip()[:1] in ("[", "{")


# ---------------------------------------------------------------------------------------------
# records → signals


def _num(record: Record, *path: str) -> float | None:
    value: Any = record
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float (10**400)
        return None
    # NaN and ±Inf (json.loads reads them; TensorRT-LLM writes null) are no measurement
    return number if math.isfinite(number) else None


def record_time(record: Record) -> float | None:
    """The record's ``timestamp`` as unix seconds (the server's local time, read as this machine's)."""
    raw = record.get("timestamp")
    if not isinstance(raw, str):
        return None
    for fmt in (TIMESTAMP_FORMAT, "%m-%d-%Y %H:%M:%S"):
        try:
            return datetime.strptime(raw, fmt).timestamp()
        except ValueError:
            continue
    return None


def _weighted_stats(pairs: list[tuple[float, float]]) -> dict[str, float]:
    """count/sum/mean/p50/p90/p95/p99 of values observed ``weight`` times each (exact, no buckets)."""
    pairs = sorted((v, w) for v, w in pairs if w > 0)
    count = sum(w for _, w in pairs)
    if count <= 0:
        return {}
    stats = {"count": count, "sum": sum(v * w for v, w in pairs)}
    stats["mean"] = stats["sum"] / count
    for q, key in ((0.5, "p50"), (0.9, "p90"), (0.95, "p95"), (0.99, "p99")):
        seen = 0.0
        for value, weight in pairs:
            seen += weight
            if seen >= q * count:
                stats[key] = value
                break
    return stats


def _gauge(name: str, unit: str, points: list[tuple[float, float]], source: str, window: float | None) -> Signal:
    values = [v for _, v in points]
    ordered = sorted(values)
    stats = {
        "last": values[-1],
        "mean": sum(values) / len(values),
        "min": ordered[0],
        "max": ordered[-1],
        "p90": ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)],
    }
    return Signal(
        name=name,
        kind="gauge",
        unit=unit,
        stats=stats,
        samples=points[-512:],
        source=source,
        verify=VERIFY,
        window_seconds=window,
    )


VERIFY = "curl -s URL/metrics | python3 -m json.tool  # note: reading it removes the records from the server"


def missing_records(iters: Iterable[int], before: int | None = None, stride: int | None = None) -> tuple[int, int, int]:
    """(missing, expected, stride) for a run of iteration numbers; ``before`` is the last one seen earlier.

    The stride (``iter_perf_stats_interval``) is given, or the smallest step between consecutive records; any
    larger step is a hole: records someone else read, or that the server's queue dropped.
    """
    numbers = sorted(set(iters))
    if before is not None:
        numbers = [before, *[n for n in numbers if n > before]]
    steps = [b - a for a, b in zip(numbers, numbers[1:], strict=False) if b > a]
    if not steps:
        return 0, len(numbers) - (before is not None), 1
    stride = stride or min(steps)
    expected = sum(step // stride for step in steps)
    got = len(steps)
    return expected - got, expected, stride


def signals_from_iteration_records(
    records: Iterable[Record],
    window_seconds: float | None = None,
    source: str = JSON_SOURCE,
    previous_iter: int | None = None,
    stride: int | None = None,
) -> SignalSet:
    """Signals from TensorRT-LLM iteration records (see the module docstring for the mapping).

    ``window_seconds``: the measuring window; None takes it from the records' timestamps (first to last, plus the
    last iteration's latency). ``previous_iter``: the last iteration seen before these records, so a hole at the
    start counts as missing too. Every signal a record lacks the field for is unavailable, with the reason.
    """
    ordered = sorted(records, key=lambda r: r.get("iter", 0))
    signal_set = SignalSet()
    signal_set.window = _records_window(ordered, window_seconds)
    reader = _RecordReader(ordered, signal_set, source, signal_set.window.duration_seconds)
    _add_gauges(reader)
    reader.add_info("kv_cache_blocks", "blocks", "kvCacheStats", "maxNumBlocks")
    reader.add_info("kv_cache_block_size_tokens", "tokens", "kvCacheStats", "tokensPerBlock")
    _add_counters(reader)
    _add_histograms(reader)
    _add_policy_evidence(signal_set, ordered)
    _add_missing_records(signal_set, ordered, source, previous_iter, stride)
    signal_set.sources.append(SourceInfo(probe=PROBE, server=SERVER, url=source))
    return signal_set


def _records_window(records: list[Record], window_seconds: float | None) -> Window:
    """The given window, else the span of the records' timestamps plus the last iteration's latency."""
    times = [t for r in records if (t := record_time(r)) is not None]
    if window_seconds is None and len(times) >= 2:
        last_latency = (_num(records[-1], "iterLatencyMS") or 0.0) / 1000.0
        window_seconds = max(times) - min(times) + last_latency
    return Window(
        kind="window",
        start_unix=min(times) if times else None,
        end_unix=max(times) if times else None,
        duration_seconds=window_seconds if window_seconds and window_seconds > 0 else None,
        scrapes=len(records),
        note=f"{len(records)} TensorRT-LLM iteration records",
    )


@dataclass
class _RecordReader:
    """Adds one signal at a time from the records, each a missing signal with the reason when no record has it."""

    records: list[Record]
    signal_set: SignalSet
    source: str
    window: float | None  # seconds; None when the records carry no time span

    def points(self, *path: str) -> list[tuple[float, float]]:
        """(record time, value) of every record with the field."""
        return [(record_time(r) or 0.0, v) for r in self.records if (v := _num(r, *path)) is not None]

    def missing(self, name: str, kind: SignalKind, unit: str, field_name: str) -> None:
        self.signal_set.add(Signal.missing(name, kind, unit, _why_missing(self.records, field_name)))

    def add_gauge(self, name: str, unit: str, points: list[tuple[float, float]], field_name: str) -> None:
        if points:
            self.signal_set.add(_gauge(name, unit, points, f"{self.source}: {field_name}", self.window))
        else:
            self.missing(name, "gauge", unit, field_name)

    def add_info(self, name: str, unit: str, *path: str) -> None:
        """The last record's value."""
        found = [v for r in reversed(self.records) if (v := _num(r, *path)) is not None]
        if not found:
            self.missing(name, "info", unit, ".".join(path))
            return
        self.signal_set.add(
            Signal(
                name=name,
                kind="info",
                unit=unit,
                stats={"value": found[0]},
                source=f"{self.source}: {'.'.join(path)}",
                verify=VERIFY,
            )
        )

    def add_counter(self, name: str, unit: str, values: list[float | None], field_name: str) -> None:
        """Σ of the per-iteration values over the window: the increase, and the rate when the window is known."""
        known = [v for v in values if v is not None]
        if not self.records or not known:
            self.missing(name, "counter", unit, field_name)
            return
        increase, source = sum(known), f"{self.source}: Σ {field_name}"
        if self.window is None:
            unavailable = "the records carry no time span for a rate"
            counter = Signal(
                name=name,
                kind="counter",
                unit=unit,
                stats={"increase": increase},
                unavailable=unavailable,
                source=source,
            )
        else:
            stats = {"rate": increase / self.window, "increase": increase}
            counter = Signal(
                name=name,
                kind="counter",
                unit=unit,
                stats=stats,
                source=source,
                verify=VERIFY,
                window_seconds=self.window,
            )
        self.signal_set.add(counter)

    def add_histogram(self, name: str, pairs: list[tuple[float, float]], field_name: str, how: str) -> None:
        """Exact stats of (value, observations) pairs; no observations is not the same as no field."""
        stats = _weighted_stats(pairs)
        if stats:
            self.signal_set.add(
                Signal(
                    name=name,
                    kind="histogram",
                    unit="seconds",
                    stats=stats,
                    source=f"{self.source}: {field_name} ({how})",
                    verify=VERIFY,
                    window_seconds=self.window,
                )
            )
        elif self.records and any(_num(r, *field_name.split(".")) is not None for r in self.records):
            self.signal_set.add(
                Signal(
                    name=name,
                    kind="histogram",
                    unit="seconds",
                    stats={"count": 0.0},
                    unavailable="no observations in the window",
                    source=f"{self.source}: {field_name}",
                )
            )
        else:
            self.missing(name, "histogram", "seconds", field_name)


def _add_gauges(reader: _RecordReader) -> None:
    """The queue, the batch, its cap, the paused requests, and KV use (refused when outside [0, 1])."""
    reader.add_gauge("requests_running", "requests", reader.points("numActiveRequests"), "numActiveRequests")
    reader.add_gauge("requests_waiting", "requests", reader.points("numQueuedRequests"), "numQueuedRequests")
    reader.add_gauge("max_active_requests", "requests", reader.points("maxNumActiveRequests"), "maxNumActiveRequests")
    paused = "inflightBatchingStats.numPausedRequests"
    reader.add_gauge("requests_paused", "requests", reader.points(*paused.split(".")), paused)
    usage: list[tuple[float, float]] = []
    for r in reader.records:
        used, total = _num(r, "kvCacheStats", "usedNumBlocks"), _num(r, "kvCacheStats", "maxNumBlocks")
        if used is not None and total:
            usage.append((record_time(r) or 0.0, used / total))
    reader.add_gauge("kv_cache_usage_ratio", "ratio", usage, "kvCacheStats.usedNumBlocks / maxNumBlocks")
    bad = [v for _, v in usage if not 0.0 <= v <= 1.0]
    if bad:
        reader.signal_set.anomalies.append(f"kvCacheStats used/max blocks outside [0, 1] in {len(bad)} record(s)")
        reader.signal_set.add(Signal.missing("kv_cache_usage_ratio", "gauge", "ratio", "implausible used/max blocks"))


def _add_counters(reader: _RecordReader) -> None:
    """Pauses (as preemptions), finished requests, prompt tokens, and generated tokens (speculative ones too)."""

    def values(*path: str) -> list[float | None]:
        return [_num(r, *path) for r in reader.records]

    paused, ctx = "inflightBatchingStats.numPausedRequests", "inflightBatchingStats.numCtxTokens"
    reader.add_counter("preemptions_per_second", "preemptions/s", values(*paused.split(".")), paused)
    finished = values("numCompletedRequests")
    reader.add_counter("requests_finished_per_second", "requests/s", finished, "numCompletedRequests")
    reader.add_counter("prompt_tokens_per_second", "tokens/s", values(*ctx.split(".")), ctx)
    generated: list[float | None] = []
    for r in reader.records:
        gen = _num(r, "inflightBatchingStats", "numGenRequests")
        per = _num(r, "inflightBatchingStats", "avgNumDecodedTokensPerIter")
        generated.append(None if gen is None else gen * max(1.0, per or 0.0))
    reader.add_counter(
        "generation_tokens_per_second",
        "tokens/s",
        generated,
        "inflightBatchingStats.numGenRequests × avgNumDecodedTokensPerIter",
    )


def _add_histograms(reader: _RecordReader) -> None:
    """Token gaps and iteration times from iterLatencyMS; queue time per newly activated request."""
    latency = [(ms / 1000.0, r) for r in reader.records if (ms := _num(r, "iterLatencyMS")) is not None and ms > 0]
    reader.add_histogram(
        "itl_seconds",
        [(seconds, _num(r, "inflightBatchingStats", "numGenRequests") or 0.0) for seconds, r in latency],
        "iterLatencyMS",
        "one token gap per generation request of each iteration",
    )
    reader.add_histogram(
        "iteration_seconds", [(seconds, 1.0) for seconds, _ in latency], "iterLatencyMS", "one per iteration"
    )
    reader.add_histogram(
        "queue_time_seconds",
        [
            (q / 1000.0, n)
            for r in reader.records
            if (q := _num(r, "newActiveRequestsQueueLatencyMS")) is not None and (n := _num(r, "numNewActiveRequests"))
        ],
        "newActiveRequestsQueueLatencyMS",
        "per newly activated request",
    )


def _add_missing_records(
    signal_set: SignalSet, records: list[Record], source: str, previous_iter: int | None, stride: int | None
) -> None:
    """``iteration_records_missing_ratio`` from the holes in ``iter``, and an anomaly naming the likely cause."""
    missing, expected, stride = missing_records([int(r["iter"]) for r in records], previous_iter, stride)
    signal_set.add(
        Signal(
            name="iteration_records_missing_ratio",
            kind="derived",
            unit="ratio",
            stats={"value": missing / expected if expected else 0.0},
            source=f"{source}: holes in 'iter' (stride {stride})",
        )
    )
    if missing:
        signal_set.anomalies.append(
            f"{missing} of {expected} TensorRT-LLM iteration records missing (holes in 'iter'): another scraper is "
            f"reading /metrics, which removes the records it returns, or the server's record queue overflowed "
            f"between reads; rates and averages cover only the records seen. {drain_hint()}"
        )


def _add_policy_evidence(signal_set: SignalSet, records: list[Record]) -> None:
    """``queued_with_batch_room_ratio`` and, when high, the GUARANTEED_NO_EVICT note (module docstring)."""
    judged = held = 0
    for r in records:
        queued, active = _num(r, "numQueuedRequests"), _num(r, "numActiveRequests")
        cap = _num(r, "maxNumActiveRequests")
        paused = _num(r, "inflightBatchingStats", "numPausedRequests")
        ctx, budget = _num(r, "inflightBatchingStats", "numCtxTokens"), _num(r, "maxNumTokensRuntime")
        if queued is None or active is None or cap is None or paused is None:
            continue
        judged += 1
        budget_full = ctx is not None and budget is not None and bool(budget) and ctx >= 0.9 * budget
        if queued and active < cap and not paused and not budget_full:
            held += 1
    name, unit = "queued_with_batch_room_ratio", "ratio"
    if not judged:
        signal_set.add(Signal.missing(name, "derived", unit, "records lack the queue, active or paused counts"))
        return
    share = held / judged
    signal_set.add(
        Signal(
            name=name,
            kind="derived",
            unit=unit,
            stats={"value": share},
            source=f"{JSON_SOURCE}: numQueuedRequests > 0, numActiveRequests < maxNumActiveRequests, "
            "no paused requests, numCtxTokens below maxNumTokensRuntime",
        )
    )
    paused_any = (signal_set.get("preemptions_per_second") or Signal(name="", kind="counter", unit="")).stats.get(
        "increase", 0.0
    )
    if share >= RESERVED_KV_NOTE_SHARE and not paused_any:
        signal_set.anomalies.append(
            f"requests queued in {share:.0%} of iterations although the batch had free slots, the token budget had "
            "room and nothing was paused: under TensorRT-LLM's default GUARANTEED_NO_EVICT capacity policy this is "
            "KV memory reserved for the running requests' whole sequences (usedNumBlocks counts only blocks "
            "allocated so far); more KV (kv_cache_config.free_gpu_memory_fraction, FP8 KV) or "
            "scheduler_config.capacity_scheduler_policy: MAX_UTILIZATION admits more"
        )


def _why_missing(records: list[Record], field_name: str) -> str:
    if not records:
        return (
            "no TensorRT-LLM iteration records in the window: the engine ran no iteration (idle), or iteration "
            f"stats are off ({ENABLE_HINT})"
        )
    return f"the iteration records carry no {field_name} (an older TensorRT-LLM, or a backend that leaves it out)"


# ---------------------------------------------------------------------------------------------
# a live window of reads


def signals_from_scrapes(scrapes: list[IterationScrape], source_url: str) -> SignalSet:
    """A live window: the first read's records (the backlog from before the scan) only set the starting ``iter``."""
    first, rest = scrapes[0], scrapes[1:]
    before = max((int(r["iter"]) for r in first.records), default=None)
    records = [r for s in rest for r in s.records if before is None or int(r["iter"]) > before]
    # the records of one read are contiguous: their smallest step is the sampling interval
    steps: list[int] = []
    for scrape in scrapes:
        iters = sorted(int(r["iter"]) for r in scrape.records)
        steps += [b - a for a, b in zip(iters, iters[1:], strict=False) if b > a]
    duration = None
    if first.at_unix is not None and scrapes[-1].at_unix is not None:
        duration = scrapes[-1].at_unix - first.at_unix
    signal_set = signals_from_iteration_records(
        records, duration, f"trtllm /metrics at {source_url}", before, min(steps) if steps else None
    )
    signal_set.window = Window(
        kind="window",
        start_unix=first.at_unix,
        end_unix=scrapes[-1].at_unix,
        duration_seconds=duration,
        scrapes=len(scrapes),
        note=f"{len(records)} TensorRT-LLM iteration records in the window (the first read's backlog left out)",
    )
    signal_set.sources[-1].url = source_url
    if not any(s.records for s in scrapes):
        signal_set.sources[-1].note = f"every read returned []: idle, or {ENABLE_HINT}"
    return signal_set


# ---------------------------------------------------------------------------------------------
# live reads and the Prometheus pages (trtllm_ and Triton's nv_trt_llm_)


def json_or_prometheus(page: HttpMetricsSource) -> Callable[[], Scrape]:
    """A reader of trtllm-serve's metrics URL: JSON iteration stats at /metrics, Prometheus at /prometheus/metrics."""

    def read() -> Scrape:
        text, at = page.fetch_text()
        if looks_like_json(text):
            return parse_iteration_stats(text, at, origin=page.display_url)
        return parse_exposition(text, at, origin=page.display_url)

    return read


def build_server_signals(
    spec: ProbeSpec, scrapes: list[Scrape], source_url: str, origin: Scrape | None = None, live: bool = True
) -> SignalSet:
    """The server's signals: from iteration records, or from a Prometheus page plus the TensorRT-LLM estimates.

    Live, the first read's records are the backlog from before the window; saved dumps (``live`` False) are each
    one drain of the queue, so all their records count, over the span of their timestamps.
    """
    pages = [s for s in scrapes if isinstance(s, IterationScrape)]
    if pages and live:
        return signals_from_scrapes(pages, source_url)
    if pages:
        signal_set = signals_from_iteration_records([r for p in pages for r in p.records], None, source_url)
        return signal_set
    signal_set = build_signal_set(spec, scrapes, source_url, origin)
    finish_prometheus_signals(signal_set)
    return signal_set


def _stat(signal_set: SignalSet, name: str, stat: str) -> float | None:
    signal = signal_set.get(name)
    return signal.stat(stat) if signal is not None else None


def finish_prometheus_signals(signal_set: SignalSet) -> None:
    """What a TensorRT-LLM or Triton Prometheus page gives only indirectly, derived here and said so.

    * ``kv_cache_usage_ratio`` from used / max blocks when the page has no utilization (older Triton backends);
    * ``kv_cache_blocks`` / ``kv_cache_block_size_tokens`` (the values the memory rules show) from the block gauges;
    * ``preemptions_per_second``: the pages carry paused requests only as a gauge of the *last* iteration, so the
      rate is estimated as mean(sampled paused) × iterations per second (Triton: the iteration counter's increase;
      trtllm: 1 / mean iteration latency, which assumes the engine steps back to back);
    * ``itl_seconds`` on Triton (no latency histogram at all): window / iterations, one mean step (an upper bound
      when the engine idles part of the window).
    """
    window = signal_set.window.duration_seconds
    _kv_usage_from_blocks(signal_set, window)
    _kv_block_infos(signal_set)
    iterations_per_second, how = _iteration_rate(signal_set, window)
    if signal_set.get("preemptions_per_second") is None:
        _estimate_preemptions(signal_set, window, iterations_per_second, how)


def _kv_usage_from_blocks(signal_set: SignalSet, window: float | None) -> None:
    """``kv_cache_usage_ratio`` as used / max blocks, when the page's own is unavailable and the blocks are there."""
    used, total = _stat(signal_set, "kv_cache_used_blocks", "mean"), _stat(signal_set, "kv_cache_max_blocks", "last")
    kv = signal_set.get("kv_cache_usage_ratio")
    if kv is None or kv.unavailable is None or used is None or not total:
        return
    peak = _stat(signal_set, "kv_cache_used_blocks", "max") or used
    signal_set.add(
        Signal(
            name="kv_cache_usage_ratio",
            kind="gauge",
            unit="ratio",
            stats={
                "mean": used / total,
                "max": peak / total,
                "last": used / total,
                "min": (_stat(signal_set, "kv_cache_used_blocks", "min") or 0.0) / total,
                "p90": (_stat(signal_set, "kv_cache_used_blocks", "p90") or used) / total,
            },
            source="derived: used / max KV blocks",
            window_seconds=window,
        )
    )


def _kv_block_infos(signal_set: SignalSet) -> None:
    """``kv_cache_blocks`` / ``kv_cache_block_size_tokens`` from the block gauges' last values."""
    for name, gauge, unit in (
        ("kv_cache_blocks", "kv_cache_max_blocks", "blocks"),
        ("kv_cache_block_size_tokens", "kv_cache_tokens_per_block", "tokens"),
    ):
        if signal_set.get(name) is None and signal_set.get(gauge) is not None:
            value = _stat(signal_set, gauge, "last")
            reason = f"{gauge} unavailable"
            signal_set.add(
                Signal(
                    name=name,
                    kind="info",
                    unit=unit,
                    stats={"value": value} if value is not None else {},
                    unavailable=None if value is not None else reason,
                    source=signal_set.signals[gauge].source,
                )
            )


def _steps_between_readings(readings: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Steps per second over each interval between two readings of the iteration counter, stamped at its end, as a
    counter's rates are: Triton counts tokens and requests only when a request ends, so the step counter is what shows,
    reading by reading, that a long request is still moving."""
    return [
        (after, max(value_after - value_before, 0.0) / (after - before))
        for (before, value_before), (after, value_after) in pairwise(readings)
        if after > before
    ]


def _iteration_rate(signal_set: SignalSet, window: float | None) -> tuple[float | None, str]:
    """Iterations per second and how they were found: Triton's iteration counter (which also gives
    ``engine_steps_per_second`` and, lacking a latency histogram, a mean ``itl_seconds``), else trtllm's mean
    iteration latency. None when neither tells."""
    iterations_per_second, how = None, ""
    counter = signal_set.get("iteration_counter")
    if counter is not None and counter.unavailable is None and window and len(counter.samples) >= 2:
        steps = counter.samples[-1][1] - counter.samples[0][1]
        if signal_set.get("engine_steps_per_second") is None:
            signal_set.add(
                Signal(
                    name="engine_steps_per_second",
                    kind="counter",
                    unit="steps/s",
                    stats={"rate": max(steps, 0.0) / window, "increase": max(steps, 0.0)},
                    samples=_steps_between_readings(counter.samples),
                    source="derived: the increase of nv_trt_llm_general_metrics iteration_counter / window",
                    window_seconds=window,
                )
            )
        if steps > 0:
            iterations_per_second, how = steps / window, "the iteration counter's increase / window"
            if signal_set.get("itl_seconds") is None:
                signal_set.add(
                    Signal(
                        name="itl_seconds",
                        kind="histogram",
                        unit="seconds",
                        stats={"mean": window / steps, "count": steps},
                        source="derived: window / iterations (nv_trt_llm_general_metrics "
                        "iteration_counter): the mean engine step, each a token per running request",
                        window_seconds=window,
                    )
                )
    latency = _stat(signal_set, "iteration_latency_seconds", "mean")
    if iterations_per_second is None and latency:
        iterations_per_second, how = 1.0 / latency, "1 / mean trtllm_iteration_latency_seconds"
    if signal_set.get("itl_seconds") is None and signal_set.get("iteration_counter") is not None:
        signal_set.add(
            Signal.missing(
                "itl_seconds",
                "histogram",
                "seconds",
                "Triton's page has no token latency and the iteration counter did not move",
            )
        )
    return iterations_per_second, how


def _estimate_preemptions(
    signal_set: SignalSet, window: float | None, iterations_per_second: float | None, how: str
) -> None:
    """``preemptions_per_second`` ≈ mean sampled paused requests × iterations per second (the page has no counter)."""
    paused = _stat(signal_set, "requests_paused", "mean")
    if paused is None or iterations_per_second is None or not window:
        why = (
            "no paused-requests gauge on this page"
            if paused is None
            else "no iteration rate to scale the sampled paused-requests gauge by"
        )
        signal_set.add(Signal.missing("preemptions_per_second", "counter", "preemptions/s", why))
        return
    rate = paused * iterations_per_second
    signal_set.add(
        Signal(
            name="preemptions_per_second",
            kind="counter",
            unit="preemptions/s",
            stats={"rate": rate, "increase": rate * window},
            window_seconds=window,
            source=f"estimated: mean sampled paused requests per iteration × iterations/s ({how})",
        )
    )


def prometheus_companion(spec: ProbeSpec, connection: Connection) -> Source:
    """trtllm-serve's Prometheus page beside the JSON one: the per-request histograms (TTFT, queue time) the
    iteration records lack. Optional: without it those signals are unavailable and the coverage says how to enable
    the page."""
    page = HttpMetricsSource(connection, spec.prometheus_path)
    return Source(
        spec=spec,
        display_url=page.display_url,
        read=page.scrape,
        close=page.close,
        label=f"{spec.server} {spec.prometheus_path}",
        hint="trtllm-serve serves it with return_perf_metrics: true in the --extra_llm_api_options YAML",
    )
