"""Server logs as a time series: the stat-logger lines of vLLM (V0 and V1), SGLang's batch lines and TensorRT-LLM's
iteration-stats JSON records, turned into the same SignalSet a scan builds.

The line formats are data (``probes/logs.toml``: a prefix gives the time and the series tags, a line pattern names
the numbers, a field says what each becomes); only the JSON records are read in code. Each series (a DP engine, a
process) keeps its last value between its own lines, and at every line of any series a synthetic "scrape" holds all
of them, so the server total is the sum over engines at each moment and ``by_series`` keeps each engine for the
imbalance rule. Per-second averages printed by the stat logger become counters (rate x interval since the series'
previous line, capped at the usual interval so a quiet gap is not read as busy), so rates, charts and rules work
as they do on /metrics.

What logs never carry (latency histograms, finished requests) is unavailable with the reason, never zero. The
inter-token latency is estimated per line as running requests / generation throughput (each running request gets
one token per step), and says so in its source.

Times: vLLM prints ``MM-DD hh:mm:ss`` without a year; the year is the file's (its mtime), one less for a line that
would lie in the future of the file. All naive times, and --since/--until, are read as UTC.
"""

from __future__ import annotations

import calendar
import json
import math
import re
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from llmdiag.collect.exposition import Scrape
from llmdiag.collect.signals import build_signal_set
from llmdiag.errors import InputFileError, UsageError, option
from llmdiag.model import Signal, SignalSet
from llmdiag.schema.loader import load_probe
from llmdiag.schema.logs import LogField, LogSpec, load_log_spec
from llmdiag.schema.probes import ProbeSpec, SignalSpec

LOG_HINT = (
    "give the server's own log: vLLM stat-logger lines ('Avg prompt throughput: …'), SGLang 'Decode batch.' / "
    "'Prefill batch.' lines, or TensorRT-LLM iteration-stats JSON records, one a line"
)
SERVER_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
# the probe whose signal vocabulary a log's missing signals are listed from
VOCABULARY_PROBE = "vllm"
NOT_IN_LOGS = (
    "not in server logs: the stat-logger lines carry no latency histograms or request counts; save /metrics "
    "(curl -s URL/metrics > metrics.prom) or scan the live server for it"
)


# ---------------------------------------------------------------------------------------------
# reading lines


@dataclass
class Record:
    """One recognised line: when, which series, what it says."""

    at: float
    series: str
    server: str
    fmt: str
    values: dict[str, float]  # field name → value as printed (before scale)
    known_zero: set[str] = field(default_factory=set)  # absent_zero fields this line stands for
    itl_estimate: bool = False
    iterations: float | None = None  # TRT-LLM: the iteration counter


@dataclass
class LogRead:
    records: list[Record]
    lines: int
    first_lines: list[str]
    files: list[str]


ISO_LEAD = re.compile(r"^(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d)(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s+")
TRT_TIME = "%m-%d-%Y %H:%M:%S"


def _utc(text: str, fmt: str) -> float:
    return calendar.timegm(datetime.strptime(text.replace("T", " "), fmt).timetuple())


class _Reader:
    def __init__(self, spec: LogSpec):
        self.spec = spec
        self.prefixes = {p.name: (re.compile(p.pattern), p.time_format) for p in spec.prefix}
        self.lines = [(line, re.compile(line.pattern), [re.compile(o) for o in line.optional]) for line in spec.line]

    def _time(self, prefix: str, raw: str, year: int, file_time: float, lead: float | None) -> float:
        pattern_fmt = self.prefixes[prefix][1]
        if "%Y" in pattern_fmt:
            return _utc(raw, pattern_fmt)
        if lead is not None:  # docker/kubectl --timestamps: the lead stamp has the year
            year = datetime.fromtimestamp(lead, tz=timezone.utc).year
        at = _utc(f"{year}-{raw}", f"%Y-{pattern_fmt}")
        if lead is None and at > file_time + 86400:  # a December line in a January file
            at = _utc(f"{year - 1}-{raw}", f"%Y-{pattern_fmt}")
        return at

    def read_line(self, text: str, year: int, file_time: float) -> Record | None:
        lead: float | None = None
        body = text
        match = ISO_LEAD.match(body)
        if match and not body.startswith("["):
            lead = _utc(match.group(1), "%Y-%m-%d %H:%M:%S")
            body = body[match.end() :]
        if "{" in body and '"iter' in body:
            return self._json(body, lead)
        for line, pattern, optional in self.lines:
            found = pattern.search(body)
            if found is None:
                continue
            prefix_re, _ = self.prefixes[line.prefix]
            head = prefix_re.match(body)
            if head is not None:
                at = self._time(line.prefix, head.group("time"), year, file_time, lead)
            elif lead is not None:
                at = lead
            else:
                iso = self.prefixes["iso"][0].match(body)
                if iso is None:
                    continue  # a stat message without any time: cannot be placed on the timeline
                at = _utc(iso.group("time"), self.prefixes["iso"][1])
            groups = {k: v for k, v in found.groupdict().items() if v is not None}
            for extra in optional:
                hit = extra.search(body, found.end())
                if hit:
                    groups.update({k: v for k, v in hit.groupdict().items() if v is not None})
            values = {k: float(v) for k, v in groups.items() if k not in ("engine", "mode")}
            tags = head.groupdict() if head is not None else {}
            return Record(
                at=at,
                series=_series(line.server, groups.get("engine"), tags),
                server=line.server,
                fmt=line.name,
                values=values,
                known_zero={f for f in line.absent_zero if f not in values},
                itl_estimate=line.itl_estimate,
            )
        return None

    def _json(self, body: str, lead: float | None) -> Record | None:
        start = body.find("{")
        try:
            record = json.loads(body[start:])
        except ValueError:
            return None
        if not isinstance(record, dict) or "iter" not in record or "numActiveRequests" not in record:
            return None
        return trtllm_record(record, lead)


def _series(server: str, engine: str | None, tags: dict[str, str | None]) -> str:
    """The series a line belongs to: a DP engine of one process."""
    parts: list[str] = []
    if tags.get("pid"):
        parts.append(f"pid {tags['pid']}")
    rank_tags = dict(re.findall(r"([A-Z_]*[A-Z])(\d+)", tags.get("tags") or ""))
    dp = engine if engine is not None else rank_tags.get("DP")
    parts.append(str(int(dp)) if dp is not None else "0")
    return "/".join(parts)


def trtllm_record(record: dict, lead: float | None = None) -> Record | None:
    """One TensorRT-LLM iteration-stats record (the JSON of trtllm-serve's /metrics, one per line in a log)."""
    at = lead
    stamp = record.get("timestamp")
    if isinstance(stamp, str):
        try:
            at = _utc(stamp.split(".")[0], TRT_TIME)
        except ValueError:
            at = lead
    if at is None:
        return None
    values: dict[str, float] = {}

    def put(name: str, value: object) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values[name] = float(value)

    put("running", record.get("numActiveRequests"))
    put("waiting", record.get("numQueuedRequests"))
    kv = record.get("kvCacheStats") or {}
    if isinstance(kv, dict) and kv.get("maxNumBlocks"):
        put("kv_ratio", kv.get("usedNumBlocks", 0) / kv["maxNumBlocks"])
    batching = record.get("inflightBatchingStats") or {}
    if isinstance(batching, dict):
        put("trt_ctx_tokens", batching.get("numCtxTokens"))
        gen = batching.get("numGenRequests")
        per = batching.get("avgNumDecodedTokensPerIter") or 1.0
        if isinstance(gen, (int, float)):
            put("trt_gen_tokens", gen * per)
        put("trt_paused", batching.get("numPausedRequests"))
    latency = record.get("iterLatencyMS")
    if isinstance(latency, (int, float)) and batching.get("numGenRequests"):
        put("trt_step_seconds", latency / 1000.0)
    iteration = record.get("iter")
    return Record(
        at=at,
        series="0",
        server="trtllm",
        fmt="trtllm-iteration-json",
        values=values,
        known_zero={"trt_paused"} - set(values),
        iterations=float(iteration) if isinstance(iteration, (int, float)) else None,
    )


# TRT-LLM record fields (read in code) and what they become; "per_iteration": counts per iteration, scaled by the
# iterations since the previous record (iter_perf_stats_interval samples every N)
TRT_FIELDS = {
    "trt_ctx_tokens": LogField(name="trt_ctx_tokens", signal="prompt_tokens_per_second", kind="count", unit="tokens/s"),
    "trt_gen_tokens": LogField(
        name="trt_gen_tokens", signal="generation_tokens_per_second", kind="count", unit="tokens/s"
    ),
    "trt_paused": LogField(name="trt_paused", signal="preemptions_per_second", kind="count", unit="preemptions/s"),
}


def read_logs(paths: list[Path], max_bytes: int, spec: LogSpec | None = None) -> LogRead:
    spec = spec or load_log_spec()
    reader = _Reader(spec)
    records: list[Record] = []
    first: list[str] = []
    count = 0
    for path in paths:
        try:
            if path.is_dir():
                raise InputFileError(f"{path} is a directory, not a log file")
            stat = path.stat()
            if stat.st_size > max_bytes:
                raise InputFileError(
                    f"{path} is {stat.st_size / 1e6:.0f} MB, over the {max_bytes / 1e6:.0f} MB cap",
                    f"cut the log to the incident (grep the stat lines, or {option('since')}/{option('until')} on a "
                    f"shorter file), or raise {option('max_bytes')}",
                )
            year = datetime.fromtimestamp(stat.st_mtime, tz=timezone.utc).year
            with path.open(encoding="utf-8", errors="replace") as handle:
                for raw in handle:
                    text = raw.rstrip("\r\n")
                    if not text.strip():
                        continue
                    count += 1
                    if len(first) < 3:
                        first.append(text.strip()[:80])
                    record = reader.read_line(text, year, stat.st_mtime)
                    if record is not None:
                        records.append(record)
        except FileNotFoundError:
            raise InputFileError(f"{path}: no such file") from None
        except PermissionError:
            raise InputFileError(f"{path}: permission denied") from None
    records.sort(key=lambda r: r.at)  # stable: a file's own order is kept within one second
    # SGLang prints a retraction on every TP rank of the scheduler: one event, many identical lines
    unique: list[Record] = []
    marks: set[tuple] = set()
    for record in records:
        mark = (record.at, record.series, record.fmt, tuple(sorted(record.values.items())))
        if record.server == "sglang" and mark in marks:
            continue
        marks.add(mark)
        unique.append(record)
    records = unique
    return LogRead(records=records, lines=count, first_lines=first, files=[str(p) for p in paths])


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
                return _utc(candidate.split(".")[0], fmt)
            except ValueError:
                continue
    raise UsageError(
        f"{what} {text!r} is neither a time nor a span",
        f"e.g. {what} 2026-11-30T06:40:00, {what} 06:40, or {what} 15m (before the log's last line)",
    )


def window_records(records: list[Record], since: str | None, until: str | None) -> list[Record]:
    if not records or (since is None and until is None):
        return records
    last = records[-1].at
    low = parse_when(since, last, option("since")) if since else -math.inf
    high = parse_when(until, last, option("until")) if until else math.inf
    if low >= high:
        since_option, until_option = option("since"), option("until")
        raise UsageError(
            f"{since_option} is not before {until_option}", f"give {since_option} an earlier time than {until_option}"
        )
    kept = [r for r in records if low <= r.at <= high]
    if not kept:
        span = f"{_iso(records[0].at)} … {_iso(last)}"
        raise InputFileError(
            f"no stat lines between {option('since')} and {option('until')} (the log covers {span})", LOG_HINT
        )
    return kept


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


# ---------------------------------------------------------------------------------------------
# records → synthetic scrapes → signals


@dataclass
class _SeriesState:
    last_at: float | None = None  # any line of the series
    last_by_format: dict[str, float] = field(default_factory=dict)  # a rate covers the time since its own format
    last_iter: float | None = None
    gauges: dict[str, float] = field(default_factory=dict)


def _typical_interval(records: list[Record]) -> float | None:
    by_series: dict[str, list[float]] = {}
    for r in records:
        if any((found := _field(r, name)) is not None and found.kind == "rate" for name in r.values):
            by_series.setdefault(r.series, []).append(r.at)
    gaps = [b - a for times in by_series.values() for a, b in zip(times, times[1:], strict=False) if b > a]
    return statistics.median(gaps) if gaps else None


_FIELDS: dict[str, LogField] = {}


def _field(record: Record, name: str) -> LogField | None:
    return TRT_FIELDS.get(name) or _FIELDS.get(name)


STALE_INTERVALS = 3


def _scrapes(records: list[Record], interval: float | None) -> tuple[list[Scrape], dict[str, LogField]]:
    """One synthetic scrape per record time: every series' held gauges and running counters."""
    states: dict[str, _SeriesState] = {}
    counters: dict[str, dict[str, float]] = {}  # signal → series → running total
    cumulative_seen: dict[str, float] = {}  # series → last cumulative value
    seen: dict[str, LogField] = {}
    scrapes: list[Scrape] = []
    for record in records:
        state = states.setdefault(record.series, _SeriesState())
        previous = state.last_by_format.get(record.fmt)
        gap = record.at - previous if previous is not None else None
        covered = min(gap, interval) if gap is not None and interval else gap
        for name, value in record.values.items():
            spec = _field(record, name)
            if spec is None:
                continue
            seen.setdefault(spec.signal, spec)
            if spec.kind == "gauge":
                state.gauges[spec.signal] = value * spec.scale
                continue
            totals = counters.setdefault(spec.signal, {})
            if spec.kind == "rate":
                totals.setdefault(record.series, 0.0)
                if covered:
                    totals[record.series] += value * spec.scale * covered
            elif spec.kind == "count":
                totals.setdefault(record.series, 0.0)
                steps = 1.0
                if record.iterations is not None and state.last_iter is not None:
                    steps = max(record.iterations - state.last_iter, 1.0)
                # a count in the series' first stat line covers time before the log: only later ones add up
                if previous is not None or record.fmt not in ("vllm-v1-stats",):
                    totals[record.series] += value * spec.scale * steps
            else:  # cumulative: the increase since the first value seen (from 0 when the first is the 1st event)
                before = cumulative_seen.get(record.series)
                base = before if before is not None else (0.0 if value <= 1 else value)
                totals[record.series] = totals.get(record.series, 0.0) + max(value - base, 0.0)
                cumulative_seen[record.series] = value
        for name in record.known_zero:
            spec = _field(record, name)
            if spec is not None:
                seen.setdefault(spec.signal, spec)
                counters.setdefault(spec.signal, {}).setdefault(record.series, 0.0)
        if record.itl_estimate:
            running, rate = record.values.get("running"), record.values.get("gen_tps")
            if running and rate:
                state.gauges["itl_seconds"] = running / rate
            else:
                state.gauges.pop("itl_seconds", None)
        if "trt_step_seconds" in record.values:
            state.gauges["itl_seconds"] = record.values["trt_step_seconds"]
        state.last_at = record.at
        state.last_by_format[record.fmt] = record.at
        if record.iterations is not None:
            state.last_iter = record.iterations
        series: dict[str, dict] = {}
        for key, st in states.items():
            if interval and st.last_at is not None and st.last_at < record.at - STALE_INTERVALS * interval:
                continue  # a series that stopped logging (a restarted process) no longer counts in the total
            for signal, value in st.gauges.items():
                series.setdefault(signal, {})[(("engine", key),)] = value
        for signal, per in counters.items():
            for key, total in per.items():
                series.setdefault(signal, {})[(("engine", key),)] = total
        # an event line (a preemption warning, a retraction) adds to the counters read at the next stat line; a
        # scrape of its own would weigh the held gauges twice
        if any((spec := _field(record, n)) is not None and spec.kind in ("gauge", "rate") for n in record.values):
            scrapes.append(Scrape(at_unix=record.at, series=series))
    return scrapes, seen


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
    if has_itl:
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
}
GREP = {
    "vllm": "grep -E 'Avg prompt throughput|is preempted by' FILE",
    "sglang": "grep -E 'Decode batch|Prefill batch|out of memory happened' FILE",
    "trtllm": "grep '\"iterLatencyMS\"' FILE",
}


def collect_logs(
    paths: list[Path], since: str | None = None, until: str | None = None, max_bytes: int = 256 * 1024 * 1024
) -> SignalSet:
    """Read server logs into a SignalSet over the time their stat lines cover (filtered by --since/--until)."""
    if not paths:
        raise UsageError("no log files given", "llmdiag analyze server.log [more.log …]")
    spec = load_log_spec()
    _FIELDS.clear()
    _FIELDS.update({f.name: f for f in spec.field})
    read = read_logs(paths, max_bytes, spec)
    where = ", ".join(read.files)
    if not read.records:
        seen = " | ".join(read.first_lines) or "an empty file"
        raise InputFileError(
            f"{where}: no vLLM, SGLang or TensorRT-LLM stat lines in {read.lines} line(s); it starts: {seen}", LOG_HINT
        )
    servers = sorted({r.server for r in read.records})
    if len(servers) > 1:
        raise InputFileError(
            f"{where} mixes logs of {', '.join(SERVER_NAMES[s] for s in servers)}: one server's logs at a time",
            "analyze each server's log on its own",
        )
    server = servers[0]
    records = window_records(read.records, since, until)
    if len(records) < 2 or records[-1].at <= records[0].at:
        raise InputFileError(
            f"{where}: only {len(records)} stat line(s) at one moment in the window: no time series to judge",
            f"give a longer log (the stat logger prints every 5-10 s), or widen {option('since')}/{option('until')}",
        )
    interval = _typical_interval(records)
    scrapes, fields_seen = _scrapes(records, interval)
    has_itl = any("itl_seconds" in s.series for s in scrapes)
    probe = _probe_spec(server, fields_seen, has_itl)
    signal_set = build_signal_set(probe, scrapes, where)
    _describe(signal_set, server, where, records, interval)
    return signal_set


def _describe(signal_set: SignalSet, server: str, where: str, records: list[Record], interval: float | None) -> None:
    label = SERVER_NAMES[server]
    grep = GREP[server].replace("FILE", where)
    for name, signal in signal_set.signals.items():
        if name in SOURCES[server]:
            signal.source = f"{label} log: {SOURCES[server][name]}"
            signal.verify = grep
    series = sorted({r.series for r in records})
    every = f"every {interval:.0f} s" if interval else "at each logged iteration"
    signal_set.window.note = (
        f"from {len(records)} log lines ({', '.join(sorted({r.fmt for r in records}))}): gauges sampled {every} by "
        f"the server's own logger, {len(series)} series ({', '.join(series)})"
    )
    vocabulary = load_probe(VOCABULARY_PROBE)
    for spec in vocabulary.signal:
        if spec.name not in signal_set.signals:
            signal_set.add(Signal.missing(spec.name, spec.kind, spec.unit, NOT_IN_LOGS))
    source = signal_set.sources[-1]
    source.probe = f"{server}-log"
    source.url = where
    source.engines = series if len(series) > 1 else []
    source.note = "server log lines"


EXPOSITION_LINE = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:]*(\{.*\})?\s+[-+0-9.eEINFnaif]+(\s+\d+)?\s*$")


def looks_like_log(path: Path) -> bool:
    """True unless the file starts like a /metrics dump (Prometheus text, or TensorRT-LLM's JSON array)."""
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            head = handle.read(65536)
    except OSError:
        return False  # let the dump reader name the problem
    for line in head.splitlines():
        text = line.strip()
        if not text:
            continue
        if text.startswith("#"):
            return not re.match(r"#\s*(HELP|TYPE|EOF|llmdiag-scraped-at)\b", text)
        return not (text.startswith("[{") or text == "[" or EXPOSITION_LINE.match(text))
    return False
