"""Saved /metrics dumps turned into a SignalSet: one dump gives lifetime values, two or more a window between them."""

from __future__ import annotations

import os
import re
from pathlib import Path

from llmdiag.client.endpoint import format_bytes
from llmdiag.collect.exposition import Scrape, parse_exposition
from llmdiag.collect.servers.pages import build_server_signals, check_server
from llmdiag.errors import (
    ExpositionParseError,
    InputFileError,
    NotMetricsError,
    UsageError,
    option,
)
from llmdiag.model import SignalSet
from llmdiag.schema.loader import load_probe

SCRAPED_AT_RE = re.compile(r"^#\s*llmdiag-scraped-at:\s*([0-9.eE+-]+)\s*$", re.MULTILINE)
PROCESS_START = "process_start_time_seconds"
DUMP_HINT = "give a saved vLLM /metrics page: curl -s http://HOST:PORT/metrics > metrics.prom"


def read_dump(path: Path, max_bytes: int) -> Scrape:
    try:
        size = path.stat().st_size
        if path.is_dir():
            raise InputFileError(f"{path} is a directory, not a metrics dump")
        if size > max_bytes:
            raise InputFileError(
                f"{path} is {format_bytes(size)}, over the {format_bytes(max_bytes)} cap",
                f"raise the cap with {option('max_bytes')} if the dump really is that large",
            )
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file") from None
    except PermissionError:
        raise InputFileError(f"{path}: permission denied") from None
    match = SCRAPED_AT_RE.search(text[:4096])
    at = float(match.group(1)) if match else path.stat().st_mtime
    if text.lstrip()[:1] == "[":  # TensorRT-LLM's JSON iteration stats, saved with curl
        from llmdiag.collect.servers.trtllm import parse_iteration_stats

        try:
            return parse_iteration_stats(text, at, origin=str(path))
        except NotMetricsError:
            pass  # not iteration records: the exposition parser says what it is
    try:
        return parse_exposition(text, at, origin=str(path))
    except (NotMetricsError, ExpositionParseError) as exc:
        raise InputFileError(exc.message, DUMP_HINT) from None


def collect_files(paths: list[Path], probe: str | None = "vllm", max_bytes: int = 16 * 1024 * 1024) -> SignalSet:
    """One dump: lifetime values since process start. Two or more: window values between the dumps.

    ``probe`` None: the server is worked out from the dumps (``llmdiag.collect.detect``), and its coverage line
    says so."""
    if not paths:
        raise UsageError("no dump files given", "llmdiag analyze metrics.prom [more.prom …]")
    scrapes = sorted((read_dump(p, max_bytes) for p in paths), key=lambda s: s.at_unix or 0.0)
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
    times = [s.at_unix for s in scrapes]
    if len(set(times)) != len(times):
        raise UsageError(
            "two dumps carry the same time, so no rate can be measured between them",
            "start each dump with '# llmdiag-scraped-at: <unix time>' (llmdiag record does), or keep their mtimes",
        )
    where = os.fspath(paths[0]) if len(paths) == 1 else f"{len(paths)} dumps"
    origin = None
    if len(scrapes) == 1 and not hasattr(scrapes[0], "records"):  # JSON records carry their own times
        start = scrapes[0].series.get(PROCESS_START, {})
        origin = Scrape(at_unix=next(iter(start.values())) if start else None)
    signal_set = build_server_signals(spec, scrapes, where, origin=origin, live=False)
    if origin is not None and origin.at_unix is None:
        signal_set.window.note += " (no process_start_time_seconds: rates unavailable)"
    from llmdiag.collect.detect import note_server_choice

    note_server_choice(signal_set, probe, why)
    return signal_set
