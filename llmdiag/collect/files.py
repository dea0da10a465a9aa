"""Saved or pasted metrics pages (a server's /metrics, a dcgm-exporter page, TensorRT-LLM's JSON) turned into a
SignalSet, timed only by the data's own clock.

A page's time is its ``# llmdiag-scraped-at`` line, else its samples' own timestamps; a file's mtime is never
used (a clone, a copy or a download from a bug report sets it, not the scrape). So:

    one dump, process_start_time_seconds and a time    lifetime: the averages since the server started
    one dump, process_start_time_seconds, no time      snapshot: lifetime totals whose end is unknown, no rate
    one dump, no process_start_time_seconds            snapshot: gauges at that moment, no rate
    two or more, each with its own time                a window between the first and the last, by time
    two or more without (distinct) times               taken in the order given; gauges and histogram deltas, no rate

A rate is never computed over an assumed interval: without a time base the counters are unavailable and say why.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from llmdiag.client.endpoint import format_bytes
from llmdiag.collect.exposition import Scrape, check_line_count, describe_skipped, parse_pasted
from llmdiag.collect.paste import data_lines
from llmdiag.collect.servers.pages import build_server_signals, check_server
from llmdiag.collect.signals import build_signal_set
from llmdiag.errors import (
    ExpositionParseError,
    InputFileError,
    NotMetricsError,
    UsageError,
    option,
)
from llmdiag.model import SignalSet, Window
from llmdiag.schema.loader import load_probe
from llmdiag.schema.probes import ProbeSpec

SCRAPED_AT_RE = re.compile(r"^#\s*llmdiag-scraped-at:\s*([0-9.eE+-]+)\s*$")
PROCESS_START = "process_start_time_seconds"
DUMP_HINT = "give a saved vLLM /metrics page: curl -s http://HOST:PORT/metrics > metrics.prom"
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
# where a page's own time is looked for: its first lines (llmdiag record writes it first)
HEADER_LINES = 64
NO_TIME = "no '# llmdiag-scraped-at' line and no sample timestamps"


@contextmanager
def reading(path: Path) -> Iterator[None]:
    """Reading a given file: a missing, forbidden or unreadable path is one InputFileError naming it."""
    try:
        yield
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file") from None
    except PermissionError:
        raise InputFileError(f"{path}: permission denied") from None
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def read_text(path: Path, max_bytes: int) -> str:
    """A file's text; a missing, unreadable, oversized or directory path is one InputFileError."""
    with reading(path):
        if path.is_dir():
            raise InputFileError(f"{path} is a directory, not a metrics dump")
        size = path.stat().st_size
        if size > max_bytes:
            raise InputFileError(
                f"{path} is {format_bytes(size)}, over the {format_bytes(max_bytes)} cap",
                f"raise the cap with {option('max_bytes')} if the dump really is that large",
            )
        return path.read_text(encoding="utf-8", errors="replace")


def scraped_at(lines: list[str]) -> float | None:
    """The ``# llmdiag-scraped-at`` time among a page's first lines (quoted or not), or None."""
    for line in lines[:HEADER_LINES]:
        found = SCRAPED_AT_RE.match(line)
        if found:
            try:
                return unix_time(float(found.group(1)))
            except ValueError:
                return None
    return None


def json_block(lines: list[str]) -> str | None:
    """The JSON array among a paste's data lines: from the first line that opens one to the last that closes it."""
    opens = [i for i, line in enumerate(lines) if line == "[" or line.startswith("[{")]
    closes = [i for i, line in enumerate(lines) if line.endswith("]")]
    if not opens or not closes or closes[-1] < opens[0]:
        return None
    return "\n".join(line for line in lines[opens[0] : closes[-1] + 1] if line)


def read_dump(path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> Scrape:
    """One saved or pasted page: Prometheus text anywhere in the file, or TensorRT-LLM's JSON iteration stats."""
    text = read_text(path, max_bytes)
    check_line_count(text, str(path))  # a page of a million series is refused before its lines are looked at
    lines = data_lines(text)
    at = scraped_at(lines)
    body = json_block(lines)
    if body is not None:  # TensorRT-LLM's JSON iteration stats, saved with curl (or pasted in a fence)
        from llmdiag.collect.servers.trtllm import parse_iteration_stats

        try:
            return parse_iteration_stats(body, at, origin=str(path))
        except NotMetricsError:
            pass  # not iteration records: the exposition parser says what it is
    try:
        return parse_pasted(text, at, origin=str(path))
    except (NotMetricsError, ExpositionParseError) as exc:
        raise InputFileError(exc.message, DUMP_HINT) from None


# the last second a date can be written for (datetime's year 9999): a time past it, or not finite, is no time
LAST_UNIX_SECONDS = 253402300799.0


def unix_time(value: float | None) -> float | None:
    """A page's time or a process's start as unix seconds, or None where no clock could have shown it."""
    return value if value is not None and math.isfinite(value) and 0 < value <= LAST_UNIX_SECONDS else None


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _untimed(scrape: Scrape) -> Scrape:
    return replace(scrape, at_unix=None)


def _process_start(scrape: Scrape) -> float | None:
    starts = [v for v in scrape.series.get(PROCESS_START, {}).values() if unix_time(v) is not None]
    return min(starts) if starts else None


def _no_rates(signal_set: SignalSet, reason: str) -> None:
    """Counters the builder could not turn into a rate (no duration): the reason in this page's words."""
    for signal in signal_set.signals.values():
        if (
            signal.kind == "counter"
            and signal.unavailable
            and "rate" not in signal.stats
            and "increase" in signal.stats
        ):
            signal.unavailable = reason


Builder = Callable[[ProbeSpec, list[Scrape], str, Scrape | None], SignalSet]


def _one_page(spec: ProbeSpec, scrape: Scrape, where: str, build: Builder, since_start: bool) -> SignalSet:
    """One page: lifetime averages when both ends are known, else a snapshot (see the module docstring)."""
    start = _process_start(scrape) if since_start else None
    at = scrape.at_unix
    if start is not None and at is not None and at > start:
        return build(spec, [scrape], where, Scrape(at_unix=start))
    # a zero scrape before the first: histograms and counter totals since the server started, with no duration
    signal_set = build(spec, [scrape], where, Scrape(at_unix=None) if since_start else None)
    if start is not None:
        note = (
            f"one dump without the time it was saved ({NO_TIME}): lifetime totals since the server started at "
            f"{_iso(start)}, end unknown"
        )
        reason = "one dump without the time it was saved: the lifetime since the process started has no known end"
    else:
        when = f" at {_iso(at)}" if at is not None else ""
        note = f"one page{when}: gauges at that moment; no {PROCESS_START}, so no lifetime and no rate"
        reason = f"one page is one moment: a rate needs two timed pages (or {PROCESS_START} and the page's time)"
    if since_start:
        note += "; histograms count since the server started"
    signal_set.window = Window(kind="snapshot", start_unix=start if start is not None else at, end_unix=at, scrapes=1)
    signal_set.window.note = note
    _no_rates(signal_set, reason)
    return signal_set


def pages_signals(
    spec: ProbeSpec, paths: list[Path], scrapes: list[Scrape], build: Builder, since_start: bool = True
) -> SignalSet:
    """The signals of one source's pages over the data's own time; ``since_start``: a server's page, whose
    counters and histograms started at zero with the process (a dcgm-exporter page's did not)."""
    where = os.fspath(paths[0]) if len(paths) == 1 else f"{len(paths)} dumps"
    if any(getattr(s, "records", None) is not None for s in scrapes):  # JSON records carry their own times
        signal_set = build(spec, scrapes, where, None)
    elif len(scrapes) == 1:
        signal_set = _one_page(spec, scrapes[0], where, build, since_start)
    else:
        times = [s.at_unix for s in scrapes]
        if None not in times and len(set(times)) == len(times):
            signal_set = build(spec, sorted(scrapes, key=lambda s: s.at_unix or 0.0), where, None)
        else:
            signal_set = build(spec, [_untimed(s) for s in scrapes], where, None)
            why = NO_TIME if None in times else "two of them carry the same time"
            signal_set.window.note = (
                f"{len(scrapes)} pages without times of their own ({why}): taken in the order given"
            )
            _no_rates(signal_set, f"the pages carry no times of their own ({why}): no interval for a rate")
    skipped = [(os.fspath(p), n) for p, s in zip(paths, scrapes, strict=True) for n in s.skipped_lines]
    said = describe_skipped(skipped)
    if said and signal_set.sources:
        source = signal_set.sources[-1]
        source.note = f"{source.note}; {said}" if source.note else said
    return signal_set


def _server_build(spec: ProbeSpec, scrapes: list[Scrape], where: str, origin: Scrape | None) -> SignalSet:
    return build_server_signals(spec, scrapes, where, origin=origin, live=False)


def _page_build(spec: ProbeSpec, scrapes: list[Scrape], where: str, origin: Scrape | None) -> SignalSet:
    return build_signal_set(spec, scrapes, where, origin=origin)


def collect_files(
    paths: list[Path],
    probe: str | None = "vllm",
    max_bytes: int = DEFAULT_MAX_BYTES,
    scrapes: list[Scrape] | None = None,
) -> SignalSet:
    """A server's saved pages: one gives lifetime values (or a snapshot), two or more a window between them.

    ``probe`` None: the server is worked out from the dumps (``llmdiag.collect.detect``), and its coverage line
    says so. ``scrapes``: the pages already read (one per path)."""
    if not paths:
        raise UsageError("no dump files given", "llmdiag analyze metrics.prom [more.prom …]")
    scrapes = scrapes if scrapes is not None else [read_dump(p, max_bytes) for p in paths]
    why = ""
    if probe is None:
        from llmdiag.collect.detect import detect_files

        try:
            detection = detect_files(scrapes, os.fspath(paths[0]))
        except NotMetricsError as exc:
            raise InputFileError(exc.message, exc.hint) from None
        probe, why = detection.probe, f"detected {detection.describe()}"
    else:
        from llmdiag.collect.detect import check_server_name

        probe, why = check_server_name(probe), f"{option('server')} {probe} given"
    spec = load_probe(probe)
    for path, scrape in zip(paths, scrapes, strict=True):
        try:
            check_server(spec, scrape, str(path))
        except NotMetricsError as exc:
            raise InputFileError(exc.message, DUMP_HINT) from None
    signal_set = pages_signals(spec, paths, scrapes, _server_build)
    from llmdiag.collect.detect import note_server_choice

    note_server_choice(signal_set, probe, why)
    return signal_set


def collect_dcgm_pages(
    paths: list[Path], max_bytes: int = DEFAULT_MAX_BYTES, scrapes: list[Scrape] | None = None
) -> SignalSet:
    """Saved dcgm-exporter pages: the GPUs' signals (one page: a snapshot; two timed pages: a window)."""
    scrapes = scrapes if scrapes is not None else [read_dump(p, max_bytes) for p in paths]
    return pages_signals(load_probe("dcgm"), paths, scrapes, _page_build, since_start=False)
