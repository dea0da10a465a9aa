"""Server log lines into records: where a stat message is, when it was printed, which series it belongs to, what
numbers it says. The reading half of ``llmdiag.collect.logs``; the formats are data (``probes/logs.toml``).

Lines come as people save and paste them: a docker/kubectl timestamp in front, a tqdm bar glued before the INFO
prefix, two records glued onto one line, Markdown quotes and fences around them, no prefix at all, or the Python
logging shape ``2024-12-23 18:28:10 - vllm.engine.metrics - INFO - …``. So every prefix is looked for anywhere in
a line, the line is cut at each one, and each piece is matched on its own. A stat message without any time is kept
with ``at = None``: the caller orders such records as given and says so. TensorRT-LLM iteration records are JSON:
one object a line (with or without a prefix), a JSON array, or pretty-printed over many lines.

Files are streamed: a cheap keyword test (each [[line]]'s ``keyword``) skips every other line before any regex, and
a line format whose pattern's literal text is not in the line is not tried. The first pass spools its records to a
temporary file, a block at a time, so the second pass reads them back instead of matching every line again.
"""

from __future__ import annotations

import calendar
import heapq
import json
import marshal
import math
import re
import tempfile
from array import array
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from functools import lru_cache
from pathlib import Path

from llmdiag.collect.paste import QUOTE_RE, unquote_line
from llmdiag.errors import InputFileError, option
from llmdiag.schema.logs import LogLine, LogSpec

try:  # the standard library's own regex parser (required_text): re._parser since 3.11, sre_parse before
    import re._constants as re_constants  # type: ignore[import-not-found]
    import re._parser as re_parser  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as re_constants
    import sre_parse as re_parser

ISO_LEAD = re.compile(r"^(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d)(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s+")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TRT_TIME = "%m-%d-%Y %H:%M:%S"
BOOLEAN = {"True": 1.0, "False": 0.0}  # SGLang's "cuda graph: True"
# a pretty-printed JSON record longer than this is not an iteration record: stop collecting it
JSON_CAP_BYTES = 4 * 1024 * 1024
TRT_KEYS = ('"iter"', '"numActiveRequests"')
# how a pretty-printed JSON text opens: "{", "[", "[{", '{"key": …' (not SGLang's "[2026-11-30 07:10:00 TP0]")
# a record wrapped by a terminal or a paste is joined back from at most this many physical lines
WRAP_LINES = 3
JSON_OPEN = re.compile(r'^[\[{]\s*(?:[\[{]\s*)?(?:"|$)')


@dataclass(slots=True)
class Record:
    """One recognised message: when (None: the line had no time), which series, what it says."""

    at: float | None
    series: str
    server: str
    fmt: str
    values: dict[str, float]  # field name → value as printed (before scale)
    known_zero: tuple[str, ...] = ()  # absent_zero fields this line stands for (a tuple: records are many)
    itl_estimate: bool = False
    iterations: float | None = None  # TRT-LLM: the iteration counter
    order: int = 0  # position in the input (files in the order given): the order of records without a time
    yearless: bool = False  # its time had no year (vLLM, glog): the year was inferred
    clock: bool = False  # its time had no date (old SGLang "[16:43:29 TP0]"): on the file's date


# a time as most stamps print it, all ASCII digits in place: read without strptime (the slow part of a line)
ISO_FORMAT = "%Y-%m-%d %H:%M:%S"
ISO_DIGITS = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})[T ]([0-9]{2}):([0-9]{2}):([0-9]{2})")
EPOCH_ORDINAL = date(1970, 1, 1).toordinal()


def utc(text: str, fmt: str) -> float:
    if fmt == ISO_FORMAT and ISO_DIGITS.fullmatch(text) is not None:
        hour, minute, second = int(text[11:13]), int(text[14:16]), int(text[17:19])
        if hour < 24 and minute < 60 and second < 60:  # else strptime says what is wrong
            return _day_seconds(text[:10]) + hour * 3600 + minute * 60 + second
    return _utc_parsed(text, fmt)


def utc_or_none(text: str, fmt: str) -> float | None:
    """``utc``, or None for a stamp no clock shows (hour 31, 30 February): the line then holds no record."""
    try:
        return utc(text, fmt)
    except (ValueError, OverflowError):
        return None


@lru_cache(maxsize=1024)
def _day_seconds(day: str) -> int:
    # date() refuses what strptime refuses (month 13, 30 February)
    return (date(int(day[:4]), int(day[5:7]), int(day[8:10])).toordinal() - EPOCH_ORDINAL) * 86400


@lru_cache(maxsize=8192)  # stat lines repeat their second many times
def _utc_parsed(text: str, fmt: str) -> float:
    return calendar.timegm(datetime.strptime(text.replace("T", " "), fmt).timetuple())


class LineReader:
    """The catalogue compiled: which lines to try (by keyword), the prefixes to cut at, the patterns to match."""

    def __init__(self, spec: LogSpec, servers: set[str] | None = None):
        self.spec = spec
        self.servers = servers
        self.prefixes = {p.name: (re.compile(p.pattern), p.time_format) for p in spec.prefix}
        self.lines: list[tuple[LogLine, re.Pattern[str], list[re.Pattern[str]]]] = [
            (line, re.compile(line.pattern), [re.compile(o) for o in line.optional])
            for line in spec.line
            if servers is None or line.server in servers
        ]
        self.keywords = tuple(sorted({line.keyword for line, _, _ in self.lines}))
        # the formats that read a record cut short (the throughputs alone): a line read only by them may be wrapped
        self.cut_short = {line.name for line, _, _ in self.lines if line.cut_short}
        self.json = servers is None or "trtllm" in servers
        # the prefixes a kept line may carry (cut points); "iso" is only ever a line's lead
        self.generic = {p.name for p in spec.prefix if p.any_server}
        used = {name for line, _, _ in self.lines for name in line.prefixes} | self.generic
        by_name = {p.name: p for p in spec.prefix}
        # each prefix to cut at; looked for only in a line that holds its keyword and one of its own lines' keywords
        self.cut: list[tuple[str, re.Pattern[str], re.Pattern[str] | None, str, tuple[str, ...]]] = []
        for name in sorted(used - {"iso"}):
            prefix = by_name[name]
            owners = (
                () if prefix.any_server else tuple(line.keyword for line, _, _ in self.lines if name in line.prefixes)
            )
            tag = re.compile(prefix.tag) if prefix.tag else None
            self.cut.append((name, re.compile(prefix.pattern), tag, prefix.keyword or "", owners))
        # what _match tries, worked out once: the prefixes each line may follow, and the literal text its pattern
        # needs (a line without it cannot match: its regex is not run)
        self.tries = [
            (
                line.keyword,
                frozenset((*line.prefixes, *self.generic)),
                required_text(pattern)[::-1],  # the last first: a line's last numbers tell formats apart
                pattern,
                tuple((extra, required_text(extra)) for extra in optional),
                line,
            )
            for line, pattern, optional in self.lines
        ]
        # per prefix: its time format, and whether that has a year and a day
        self.time_kinds = {
            name: (fmt, "%Y" in fmt, "%d" in fmt, f"%Y-{fmt}") for name, (_, fmt) in self.prefixes.items()
        }

    def wanted(self, text: str) -> bool:
        # a plain loop: cheaper than any() over a generator, and it runs on every line
        for keyword in self.keywords:  # noqa: SIM110
            if keyword in text:
                return True
        return False

    def continues(self, text: str) -> bool:
        """Whether a line may be the rest of a wrapped record: it starts with no time or prefix of its own and holds
        no record by itself."""
        if ISO_LEAD.match(text) or any(pattern.match(text) for _, pattern, _, _, _ in self.cut):
            return False
        return not (self.wanted(text) and self.read_line(text, 2000, 0.0))

    # -- time ---------------------------------------------------------------------------------------------------

    def _time(self, prefix: str, raw: str, year: int, file_time: float, lead: float | None) -> float:
        pattern_fmt, has_year, has_day, with_year = self.time_kinds[prefix]
        if has_year:
            return utc(raw, pattern_fmt)
        if not has_day:  # a time of day alone: on the file's date (midnight is crossed in iter_file)
            day = datetime.fromtimestamp(lead if lead is not None else file_time, tz=timezone.utc)
            return utc(f"{day:%Y-%m-%d} {raw}", f"%Y-%m-%d {pattern_fmt}")
        if lead is not None:  # docker/kubectl --timestamps: the lead stamp has the year
            year = datetime.fromtimestamp(lead, tz=timezone.utc).year
        at = utc(f"{year}-{raw}", with_year)
        if lead is None and at > file_time + 86400:  # a December line in a January file
            at = utc(f"{year - 1}-{raw}", with_year)
        return at

    # -- one line -----------------------------------------------------------------------------------------------

    def read_line(self, text: str, year: int, file_time: float) -> list[Record]:
        """Every record on one (unquoted) line."""
        if "\x1b" in text:
            text = ANSI.sub("", text)
        lead: float | None = None
        body = text
        match = ISO_LEAD.match(body)
        if match and (lead := utc_or_none(match.group(1), "%Y-%m-%d %H:%M:%S")) is not None:
            body = body[match.end() :]
        found: list[Record] = []
        if self.json and "{" in body and any(k in body for k in TRT_KEYS):
            found.extend(json_records(body[body.find("{") :], lead))
            if found:
                return found
        for head, segment in self._segments(body):
            record = self._match(head, segment, year, file_time, lead)
            if record is not None:
                found.append(record)
        return found

    def _segments(self, body: str) -> list[tuple[tuple[str, dict[str, str | None]] | None, str]]:
        """The line cut at every server prefix in it: (prefix, the text up to the next one)."""
        heads: list[tuple[int, str, re.Match[str], re.Match[str] | None]] = []
        for name, pattern, tag, needs, owners in self.cut:
            if needs not in body:
                continue
            for keyword in owners:  # loops, not any(): this runs for every prefix of every line
                if keyword in body:
                    break
            else:
                if owners:
                    continue
            for m in pattern.finditer(body):
                start = m.start()
                before = tag.search(body, start - 120 if start > 120 else 0, start) if tag else None
                heads.append((before.start() if before else m.start(), name, m, before))
        if not heads:
            return [(None, body)]
        pieces: list[tuple[tuple[str, dict[str, str | None]] | None, str]] = []
        if len(heads) == 1:  # the common case, in short: one prefix, the record after it
            start, name, m, before = heads[0]
            if start > 0:
                pieces.append((None, body[:start]))
            tags = m.groupdict() | before.groupdict() if before else m.groupdict()
            pieces.append(((name, tags), body[m.end() :]))
            return pieces
        heads.sort(key=lambda h: h[0])
        if heads[0][0] > 0:  # a tqdm bar or other text before the first prefix
            pieces.append((None, body[: heads[0][0]]))
        for i, (_, name, m, before) in enumerate(heads):
            end = heads[i + 1][0] if i + 1 < len(heads) else len(body)
            tags = m.groupdict() | (before.groupdict() if before else {})
            pieces.append(((name, tags), body[m.end() : max(end, m.end())]))
        return pieces

    def _match(
        self,
        head: tuple[str, dict[str, str | None]] | None,
        segment: str,
        year: int,
        file_time: float,
        lead: float | None,
    ) -> Record | None:
        if not self.wanted(segment):
            return None
        for keyword, after, required, pattern, optional, line in self.tries:
            hit = None
            if keyword not in segment or (head is not None and head[0] not in after):
                continue
            for text in required:
                if text not in segment:
                    break
            else:
                hit = pattern.search(segment)
            if hit is None:
                continue
            try:
                at = self._time(head[0], head[1]["time"] or "", year, file_time, lead) if head else lead
            except (ValueError, OverflowError):  # a stamp no clock shows (hour 31): no record, not a crash
                continue
            groups = {k: v for k, v in hit.groupdict().items() if v is not None}
            for extra, needs in optional:  # anywhere in the record: SGLang prints token usage before its core numbers
                for text in needs:
                    if text not in segment:
                        break
                else:
                    more = extra.search(segment)
                    if more:
                        groups.update({k: v for k, v in more.groupdict().items() if v is not None})
            try:  # plain numbers, the common case; number() reads the others
                values = {k: float(v) for k, v in groups.items() if k not in NOT_VALUES}
            except ValueError:
                values = {k: number(v) for k, v in groups.items() if k not in NOT_VALUES}
            if "unix_time" in groups:  # the record's own time (llama.cpp's "timestamp=")
                at = float(groups["unix_time"])
            if head is not None:
                _, has_year, has_day, _ = self.time_kinds[head[0]]
                tags = head[1]
            else:
                has_year, has_day, tags = True, True, {}
            return Record(
                at,
                series_of(groups.get("engine"), tags),
                line.server,
                line.name,
                values,
                tuple([f for f in line.absent_zero if f not in values]) if line.absent_zero else (),
                line.itl_estimate,
                yearless=head is not None and lead is None and not has_year and has_day,
                clock=head is not None and not has_day and "unix_time" not in groups,
            )
        return None


# named groups that are no field's value: the engine (a series), a mode word, the record's own time
NOT_VALUES = frozenset(("engine", "mode", "unix_time"))
RANK_TAG = re.compile(r"([A-Z_]*[A-Z])(\d+)")


def required_text(pattern: re.Pattern[str]) -> tuple[str, ...]:
    """The runs of literal text at a pattern's top level (outside any group, branch or repeat): every match holds
    each of them, so a text without one cannot match. Empty for a case-insensitive pattern."""
    if pattern.flags & re.IGNORECASE:
        return ()
    runs: list[str] = []
    run: list[str] = []
    for op, value in re_parser.parse(pattern.pattern, pattern.flags):
        if op is re_constants.LITERAL:
            run.append(chr(value))
            continue
        if len(run) > 2:
            runs.append("".join(run))
        run = []
    if len(run) > 2:
        runs.append("".join(run))
    return tuple(runs)


DURATION = re.compile(r"^([\d.]+)(ns|µs|us|ms|s)$")
DURATION_SECONDS = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def number(text: str) -> float:
    """A printed value: a number, True/False (SGLang's "cuda graph: True"), a Duration as Rust's Debug prints it
    ("161.454300714s", "681.374µs": TGI's span fields) in seconds, or empty text: an event marker, 1."""
    try:  # the common case first: no Duration, boolean or empty text is a float
        return float(text)
    except ValueError:
        pass
    if text in BOOLEAN:
        return BOOLEAN[text]
    if not text:
        return 1.0
    duration = DURATION.match(text)
    if duration:
        return float(duration.group(1)) * DURATION_SECONDS[duration.group(2)]
    return float(text)


def series_of(engine: str | None, tags: dict[str, str | None]) -> str:
    """The series a line belongs to: a DP engine of one process."""
    return _series(engine, tags.get("tid"), tags.get("pid"), tags.get("tags"))


@lru_cache(maxsize=4096)  # a log has few series, each on many lines
def _series(engine: str | None, tid: str | None, pid: str | None, rank: str | None) -> str:
    parts: list[str] = []
    if tid:  # glog: one series per thread (a Mooncake engine per rank)
        return f"thread {tid}"
    if pid:
        parts.append(f"pid {pid}")
    rank_tags = dict(RANK_TAG.findall(rank or ""))
    dp = engine if engine is not None else rank_tags.get("DP")
    parts.append(str(int(dp)) if dp is not None else "0")
    return "/".join(parts)


# ---------------------------------------------------------------------------------------------
# TensorRT-LLM iteration records (JSON)


def json_records(text: str, lead: float | None) -> list[Record]:
    """The iteration records of one JSON text: an object or an array of them."""
    try:
        parsed = json.loads(text)
    except RecursionError:  # nested deeper than the stack: no record
        return []
    except ValueError:
        try:  # an object followed by other text on the line
            parsed, _ = json.JSONDecoder().raw_decode(text)
        except (ValueError, RecursionError):
            return []
    items = parsed if isinstance(parsed, list) else [parsed]
    found = []
    for item in items:
        if isinstance(item, dict) and "iter" in item and "numActiveRequests" in item:
            record = trtllm_record(item, lead)
            if record is not None:
                found.append(record)
    return found


def trtllm_record(record: dict, lead: float | None = None) -> Record | None:
    """One TensorRT-LLM iteration-stats record (the JSON of trtllm-serve's /metrics, in a log)."""
    at = lead
    stamp = record.get("timestamp")
    if isinstance(stamp, str):
        try:  # microseconds kept: records come many per second
            whole, _, fraction = stamp.partition(".")
            at = utc(whole, TRT_TIME) + (float(f"0.{fraction}") if fraction.isdigit() else 0.0)
        except ValueError:
            at = lead
    values: dict[str, float] = {}

    def put(name: str, value: float | None) -> None:
        if value is not None:
            values[name] = value

    put("running", _finite(record.get("numActiveRequests")))
    put("waiting", _finite(record.get("numQueuedRequests")))
    kv = record.get("kvCacheStats") or {}
    if isinstance(kv, dict) and (blocks := _finite(kv.get("maxNumBlocks"))):
        used = _finite(kv.get("usedNumBlocks", 0))
        put("kv_ratio", used / blocks if used is not None else None)
    batching = record.get("inflightBatchingStats") or {}
    gen = None
    if isinstance(batching, dict):
        put("trt_ctx_tokens", _finite(batching.get("numCtxTokens")))
        gen = _finite(batching.get("numGenRequests"))
        per = _finite(batching.get("avgNumDecodedTokensPerIter")) or 1.0
        put("trt_gen_tokens", gen * per if gen is not None else None)
        put("trt_paused", _finite(batching.get("numPausedRequests")))
    latency = _finite(record.get("iterLatencyMS"))
    if latency is not None and gen:
        put("trt_step_seconds", latency / 1000.0)
    iteration = _finite(record.get("iter"))
    return Record(
        at=at,
        series="0",
        server="trtllm",
        fmt="trtllm-iteration-json",
        values=values,
        known_zero=() if "trt_paused" in values else ("trt_paused",),
        iterations=iteration,
    )


def _finite(value: object) -> float | None:
    """A JSON number as a finite float; a string, a bool, NaN, ±Inf or an integer beyond a float's range is None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


class _JsonBlock:
    """A JSON record pretty-printed over several lines (or an array of them): the lines until the brackets close."""

    def __init__(self, first: str, lead: float | None):
        self.parts = [first]
        self.size = len(first)
        self.depth = _depth(first)
        self.lead = lead

    def add(self, text: str) -> bool:
        """Take one more line; True once the block is closed (or too long to be a record)."""
        self.parts.append(text)
        self.size += len(text)
        self.depth += _depth(text)
        return self.depth <= 0 or self.size > JSON_CAP_BYTES

    def records(self) -> list[Record]:
        text = "\n".join(self.parts)
        if not any(k in text for k in TRT_KEYS):
            return []
        return json_records(text, self.lead)


def _depth(text: str) -> int:
    # iteration records hold no brackets inside their strings, so counting them is enough
    return text.count("{") + text.count("[") - text.count("}") - text.count("]")


def _json_start(text: str) -> tuple[str, float | None] | None:
    """The start of a multi-line JSON text on this line (an open '{' or '[' that does not close on it)."""
    lead = None
    match = ISO_LEAD.match(text)
    if match and (lead := utc_or_none(match.group(1), "%Y-%m-%d %H:%M:%S")) is not None:
        text = text[match.end() :]
    if JSON_OPEN.match(text) and _depth(text) > 0:
        return text, lead
    return None


# ---------------------------------------------------------------------------------------------
# files


def _year_and_time(path: Path) -> tuple[int, float]:
    stat = path.stat()
    return datetime.fromtimestamp(stat.st_mtime, tz=timezone.utc).year, stat.st_mtime


def _check(path: Path, max_bytes: int) -> None:
    if path.is_dir():
        raise InputFileError(f"{path} is a directory, not a log file")
    size = path.stat().st_size
    if size > max_bytes:
        raise InputFileError(
            f"{path} is {size / 1e6:.0f} MB, over the {max_bytes / 1e6:.0f} MB cap",
            f"cut the log to the incident (grep the stat lines, or {option('since')}/{option('until')} on a "
            f"shorter file), or raise {option('max_bytes')}",
        )


def iter_file(path: Path, reader: LineReader, counts: dict[str, int], first: list[str]) -> Iterator[Record]:
    """The records of one file, streamed line by line (a record wrapped over lines joined back, times of day carried
    over midnight)."""
    year, file_time = _year_and_time(path)
    clock = [0.0, -math.inf]  # days added to times of day, the last one
    with path.open(encoding="utf-8", errors="replace") as handle:
        for record in _file_records(handle, reader, (year, file_time), counts, first):
            if record.clock and record.at is not None:
                record.at += clock[0]
                if record.at < clock[1] - 43200:  # back by over 12 hours: past midnight
                    clock[0] += 86400
                    record.at += 86400
                clock[1] = record.at
            yield record


def _file_records(
    handle: Iterable[str], reader: LineReader, when: tuple[int, float], counts: dict[str, int], first: list[str]
) -> Iterator[Record]:
    year, file_time = when
    block: _JsonBlock | None = None
    lines = iter(handle)
    ahead: deque[str] = deque()  # lines read past a record that may be wrapped, not yet taken
    while True:
        raw = ahead.popleft() if ahead else next(lines, None)
        if raw is None:
            break
        if block is not None:
            if not reader.wanted(raw):  # a stat line ends a block that never closed (not a record)
                if block.add(unquote_line(raw)):
                    yield from block.records()
                    block = None
                continue
            block = None
        if raw.isspace():
            continue
        counts["lines"] += 1
        if len(first) < 3:
            first.append(unquote_line(raw)[:80])
        if reader.wanted(raw):
            found = reader.read_line(_unquoted(raw), year, file_time)
            # (the first record first: nearly always a whole one, and then no generator is built)
            if not found or (found[0].fmt in reader.cut_short and all(r.fmt in reader.cut_short for r in found)):
                found = _unwrap(raw, found, reader, (lines, ahead), when)
            yield from found
        elif reader.json and ("{" in raw or "[" in raw):
            text = unquote_line(raw)
            if "{" in text and any(k in text for k in TRT_KEYS):
                yield from reader.read_line(text, year, file_time)
            elif (start := _json_start(text)) is not None:
                block = _JsonBlock(*start)
    if block is not None:
        yield from block.records()


def _unquoted(raw: str) -> str:
    """``unquote_line``, in short for a line that starts with no quote marker or fence (nearly every line of a log):
    then the regexes would take nothing and only the stripping is left."""
    text = raw.strip()
    if text and text[0] not in ">`~":
        return text
    return unquote_line(raw)


def _values(records: list[Record]) -> int:
    return sum(len(r.values) for r in records)


def _unwrap(
    raw: str, found: list[Record], reader: LineReader, source: tuple[Iterator[str], deque[str]], when: tuple[int, float]
) -> list[Record]:
    """A line that holds a record's keyword but not a whole record: joined with the next line(s) (at most
    ``WRAP_LINES`` in all) when that reads more of a record, as a terminal or a paste wraps a long line mid-word.
    The next lines count only when they do not start a record of their own; the lines joined are taken."""
    lines, ahead = source
    joined = raw.rstrip("\r\n")
    best, used = found, 0
    for k in range(WRAP_LINES - 1):
        while len(ahead) <= k:
            more = next(lines, None)
            if more is None:
                return _take(best, used, ahead)
            ahead.append(more)
        piece = QUOTE_RE.sub("", ahead[k].rstrip("\r\n"))
        if not piece.strip() or not reader.continues(piece):
            break
        joined += piece
        records = reader.read_line(unquote_line(joined), *when)
        if _values(records) > _values(best):
            best, used = records, k + 1
            if not all(r.fmt in reader.cut_short for r in records):
                break
    return _take(best, used, ahead)


def _take(best: list[Record], used: int, ahead: deque[str]) -> list[Record]:
    for _ in range(used):
        ahead.popleft()
    return best


# records a spool writes at a time: the memory a spool holds, whatever the log's length
SPOOL_BLOCK = 4096


class _Spool:
    """One file's records as the first pass read them, written to a temporary file in blocks, so that the second
    pass reads them back instead of matching every line again (memory stays flat: one block at a time). marshal keeps
    every value exactly (floats, and the ints a time may be)."""

    def __init__(self) -> None:
        self.handle = tempfile.TemporaryFile()  # noqa: SIM115 (open until close(): deleted then)
        self.block: list[tuple] = []
        self.failed = False  # a write failed (a full disk): the second pass reads the file again

    def add(self, r: Record) -> None:
        if self.failed:
            return
        self.block.append(
            (r.at, r.series, r.server, r.fmt, r.values, r.known_zero, r.itl_estimate, r.iterations, r.yearless, r.clock)
        )
        if len(self.block) >= SPOOL_BLOCK:
            self._write()

    def _write(self) -> None:
        data = marshal.dumps(self.block)  # then read back whole: marshal.load(file) reads it piece by piece, slowly
        self.block = []
        try:
            self.handle.write(len(data).to_bytes(8, "little"))
            self.handle.write(data)
        except OSError:
            self.failed = True
            self.handle.close()

    def ready(self) -> bool:
        """Whether every record added is in the spool (the last block written)."""
        if self.block and not self.failed:
            self._write()
        return not self.failed

    def records(self) -> Iterator[Record]:
        """The records in the order added (each call reads them from the start); only when ``ready()``."""
        self.handle.seek(0)
        while size := int.from_bytes(self.handle.read(8), "little"):
            block = marshal.loads(self.handle.read(size))
            for at, series, server, fmt, values, known_zero, itl, iterations, yearless, clock in block:
                yield Record(
                    at, series, server, fmt, values, known_zero, itl, iterations, yearless=yearless, clock=clock
                )

    def close(self) -> None:
        self.handle.close()


def _spool() -> _Spool | None:
    try:
        return _Spool()
    except OSError:  # no writable temporary folder: the second pass reads the file again
        return None


@dataclass
class LogScan:
    """What a first pass over the files saw, holding no record: enough to resolve the window (its first and last
    times), the logger's own interval (the gaps between a series' rate lines), the servers, and whether each file
    is in time order. The second pass (``iter_records``) streams the records again, in time order: from each file's
    spool (the records the first pass read, on disk), or from the file when it has none."""

    files: list[Path]
    lines: int = 0
    first_lines: list[str] = field(default_factory=list)
    servers: set[str] = field(default_factory=set)
    timed: int = 0
    untimed: int = 0
    gaps: array = field(default_factory=lambda: array("d"))  # seconds between a series' rate lines (one file)
    unsorted: set[int] = field(default_factory=set)  # files whose records are not in time order: sorted in memory
    reference: float | None = None  # the latest dated time (not yearless): the year of the yearless ones
    _dated: list[float] = field(default_factory=lambda: [math.inf, -math.inf])
    _yearless: list[float] = field(default_factory=lambda: [math.inf, -math.inf])
    # each file's records as read (None: read the file again): the second pass reads these
    spools: list[_Spool | None] = field(default_factory=list)

    def close(self) -> None:
        """Delete the spools (the second pass is over)."""
        for spool in self.spools:
            if spool is not None:
                spool.close()
        self.spools = []

    def records(self, index: int, reader: LineReader, max_bytes: int) -> Iterator[Record]:
        """One file's records again: from its spool, or read anew."""
        spool = self.spools[index] if index < len(self.spools) else None
        if spool is not None and spool.ready():
            return spool.records()
        return _open_records(self.files[index], max_bytes, reader, {"lines": 0}, [])

    def rebase(self, at: float) -> float:
        """A yearless time in the year of the log's dated lines (when it has any)."""
        if self.reference is None:
            return at
        reference = datetime.fromtimestamp(self.reference, tz=timezone.utc)
        moved = _with_year(datetime.fromtimestamp(at, tz=timezone.utc), reference.year)
        if moved > self.reference + 86400:  # a December line before a January reference
            moved = _with_year(datetime.fromtimestamp(at, tz=timezone.utc), reference.year - 1)
        return moved

    def bounds(self) -> tuple[float, float]:
        """The first and the last record's time (yearless ones rebased)."""
        low, high = self._dated
        if self._yearless[0] <= self._yearless[1]:
            low, high = min(low, self.rebase(self._yearless[0])), max(high, self.rebase(self._yearless[1]))
        return low, high


def _open_records(path: Path, max_bytes: int, reader: LineReader, counts: dict[str, int], first: list[str]):
    try:
        _check(path, max_bytes)
        yield from iter_file(path, reader, counts, first)
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file") from None
    except PermissionError:
        raise InputFileError(f"{path}: permission denied") from None


def scan_logs(paths: list[Path], max_bytes: int, reader: LineReader, rate_fields: set[str]) -> LogScan:
    """The first pass: counts, servers, time bounds, file order, the gaps between each series' rate lines; each file's
    records spooled for the second pass (``LogScan.close`` deletes them)."""
    scan = LogScan(files=list(paths))
    try:
        _scan_files(scan, max_bytes, reader, rate_fields)
    except BaseException:
        scan.close()
        raise
    return scan


def _scan_files(scan: LogScan, max_bytes: int, reader: LineReader, rate_fields: set[str]) -> None:
    counts = {"lines": 0}
    untimed_servers: set[str] = set()
    for index, path in enumerate(scan.files):
        last_at = -math.inf
        last_rate: dict[tuple[str, str], float] = {}
        spool = _spool()
        scan.spools.append(spool)
        for record in _open_records(path, max_bytes, reader, counts, scan.first_lines):
            if spool is not None:
                spool.add(record)
            if record.at is None:
                scan.untimed += 1
                untimed_servers.add(record.server)
                continue
            scan.timed += 1
            scan.servers.add(record.server)
            span = scan._yearless if record.yearless else scan._dated
            if record.at < span[0]:
                span[0] = record.at
            if record.at > span[1]:
                span[1] = record.at
            if record.at < last_at:
                scan.unsorted.add(index)
            last_at = max(last_at, record.at)
            if not rate_fields.isdisjoint(record.values):
                key = (record.series, record.fmt)
                before = last_rate.get(key)
                if before is not None and record.at > before:
                    scan.gaps.append(record.at - before)
                last_rate[key] = record.at
    scan.lines = counts["lines"]
    if not scan.timed:  # only then are the untimed records read
        scan.servers = untimed_servers
    else:
        scan.reference = scan._dated[1] if scan._dated[0] <= scan._dated[1] else None


def iter_records(scan: LogScan, reader: LineReader, max_bytes: int) -> Iterator[Record]:
    """The second pass: timed records in time order (a file's own order within one moment; files merged as they
    stream, a file out of order sorted in memory), yearless times rebased; untimed ones in the order given when no
    record has a time (when some have, the untimed ones cannot be placed and are left out)."""
    if not scan.timed:
        order = 0
        for index in range(len(scan.files)):
            for record in scan.records(index, reader, max_bytes):
                record.order = order
                order += 1
                yield record
        return
    streams = [_timed(scan, index, reader, max_bytes) for index in range(len(scan.files))]
    # SGLang prints a retraction on every TP rank of the scheduler: one event, many identical lines
    moment: float | None = None
    marks: set[tuple] = set()
    for record in heapq.merge(*streams, key=lambda r: (r.at, r.order)):
        if record.at != moment:
            moment, marks = record.at, set()
        if record.fmt == "sglang-retract":
            mark = (record.series, tuple(sorted(record.values.items())))
            if mark in marks:
                continue
            marks.add(mark)
        yield record


def _timed(scan: LogScan, index: int, reader: LineReader, max_bytes: int) -> Iterator[Record]:
    def records() -> Iterator[Record]:
        for seq, record in enumerate(scan.records(index, reader, max_bytes)):
            if record.at is None:
                continue
            if record.yearless:
                record.at = scan.rebase(record.at)
            record.order = (index << 40) + seq
            yield record

    if index in scan.unsorted:
        yield from sorted(records(), key=lambda r: (r.at, r.order))
    else:
        yield from records()


def _with_year(at: datetime, year: int) -> float:
    try:
        return at.replace(year=year).timestamp()
    except ValueError:  # 29 February in a year without one
        return at.replace(year=year, day=28).timestamp()


def holds_record(head: str, spec: LogSpec, json: bool = True) -> bool:
    """Whether any line of a text (a file's head) holds a known stat record anywhere in it, once unquoted;
    ``json=False`` leaves TensorRT-LLM's JSON records out (a JSON file is a /metrics dump as much as a log)."""
    reader = LineReader(spec)
    reader.json = json
    return any(reader.wanted(raw) and reader.read_line(unquote_line(raw), 2000, 0.0) for raw in head.splitlines())
