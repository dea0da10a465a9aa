"""Stage 1: turn sources (live servers, saved dumps) into a SignalSet measured over a window."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from llmdiag.collect.http import Connection, HttpMetricsSource, format_bytes, normalise_base_url
from llmdiag.collect.prometheus import Scrape, parse_exposition
from llmdiag.collect.signals import build_signal_set
from llmdiag.engine.loader import load_probe
from llmdiag.engine.schema import ProbeSpec
from llmdiag.errors import (
    EmptyWindowError,
    ExpositionParseError,
    InputFileError,
    NotMetricsError,
    ProbeError,
    UsageError,
)
from llmdiag.model import SignalSet

DEFAULT_DURATION_SECONDS = 20.0
DEFAULT_INTERVAL_SECONDS = 1.0
MIN_SCRAPES = 3
SCRAPED_AT_RE = re.compile(r"^#\s*llmdiag-scraped-at:\s*([0-9.eE+-]+)\s*$", re.MULTILINE)
PROCESS_START = "process_start_time_seconds"
COLLECTOR_COUNTS = ("counter_resets", "implausible_samples")

ProgressCallback = Callable[[int, int], None]
DUMP_HINT = "give a saved vLLM /metrics page: curl -s http://HOST:PORT/metrics > metrics.prom"


DCGM_HINT = "is dcgm-exporter running there? its page is usually http://HOST:9400/metrics; or leave out --dcgm-url"


def check_server(spec: ProbeSpec, scrape: Scrape, where: str, hint: str | None = None) -> None:
    if any(name.startswith(tuple(spec.detect_prefixes)) for name in scrape.names()):
        return
    sample = ", ".join(sorted({n.split("_")[0] for n in scrape.names()})[:5])
    raise NotMetricsError(
        f"{where} has Prometheus metrics but none from {spec.server} "
        f"(no '{spec.detect_prefixes[0]}*' names; saw {sample} …)",
        hint or f"is this a {spec.server} server? if its metrics are on another port, give --metrics-url",
    )


def dcgm_connection(url: str, like: Connection) -> Connection:
    """The DCGM page's own connection: the server's timeouts and TLS choice, never its credentials.

    A bare ``http://HOST:9400`` means dcgm-exporter's page at ``/metrics``.
    """
    url = normalise_base_url(url)
    if urlsplit(url).path in ("", "/"):
        url += "/metrics"
    return Connection(
        base_url=url,
        metrics_url=url,
        api_key="",
        timeout_seconds=like.timeout_seconds,
        insecure=like.insecure,
        max_metrics_bytes=like.max_metrics_bytes,
    )


def merge_signal_sets(into: SignalSet, other: SignalSet) -> SignalSet:
    """Add another source's signals to a set: one window, several sources. Collector counts add up."""
    for name, signal in other.signals.items():
        mine = into.signals.get(name)
        if name in COLLECTOR_COUNTS and mine is not None:
            mine.stats["value"] = mine.stats.get("value", 0.0) + signal.stats.get("value", 0.0)
        elif mine is None:
            into.add(signal)
    into.sources += other.sources
    into.anomalies += other.anomalies
    return into


def scrape_plan(duration_seconds: float, interval_seconds: float = DEFAULT_INTERVAL_SECONDS) -> tuple[int, float]:
    """How many scrapes, how far apart: at least MIN_SCRAPES spread over the duration."""
    if duration_seconds <= 0:
        raise UsageError(f"--duration must be positive, got {duration_seconds:g}", "e.g. --duration 20")
    interval = min(interval_seconds, duration_seconds / (MIN_SCRAPES - 1))
    return int(round(duration_seconds / interval)) + 1, interval


def collect_live(
    connection: Connection,
    duration_seconds: float = DEFAULT_DURATION_SECONDS,
    probe: str = "vllm",
    on_progress: ProgressCallback | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    dcgm_url: str | None = None,
) -> SignalSet:
    """Scrape the server (and the DCGM page, when given) over the window, both in the same loop.

    The first failure of either page is fatal; later ones are tolerated and noted. Without ``dcgm_url`` no GPU
    signal is collected at all: the rules that need them are skipped, never fed zeros.
    """
    spec = load_probe(probe)
    source = HttpMetricsSource(connection, spec.metrics_path)
    dcgm_spec = load_probe("dcgm") if dcgm_url else None
    dcgm = HttpMetricsSource(dcgm_connection(dcgm_url, connection)) if dcgm_url else None
    count, interval = scrape_plan(duration_seconds)
    scrapes: list[Scrape] = []
    dcgm_scrapes: list[Scrape] = []
    failures: list[str] = []
    try:
        start = clock()
        for i in range(count):
            due = start + i * interval
            wait = due - clock()
            if wait > 0:
                sleep(wait)
            try:
                scrapes.append(source.scrape())
            except ProbeError as exc:
                if not scrapes:
                    raise
                failures.append(f"scrape {i + 1}/{count} failed: {exc.message}")
            if i == 0:  # the first scrape succeeded, or we raised above
                check_server(spec, scrapes[0], source.display_url)
            if dcgm is not None and dcgm_spec is not None:
                try:
                    dcgm_scrapes.append(dcgm.scrape())
                except ProbeError as exc:
                    if not dcgm_scrapes:
                        exc.message, exc.hint = f"DCGM exporter: {exc.message}", DCGM_HINT
                        exc.args = (exc.message,)
                        raise
                    failures.append(f"DCGM scrape {i + 1}/{count} failed: {exc.message}")
                if i == 0:
                    check_server(dcgm_spec, dcgm_scrapes[0], dcgm.display_url, DCGM_HINT)
            if on_progress:
                on_progress(i + 1, count)
    finally:
        source.close()
        if dcgm is not None:
            dcgm.close()
    if len(scrapes) < 2:
        raise EmptyWindowError(
            f"only {len(scrapes)} of {count} scrapes of {source.display_url} succeeded: no window to measure"
            + (f" ({failures[-1]})" if failures else "")
        )
    signal_set = build_signal_set(spec, scrapes, source.display_url)
    if dcgm is not None and dcgm_spec is not None:
        merge_signal_sets(signal_set, build_signal_set(dcgm_spec, dcgm_scrapes, dcgm.display_url))
    signal_set.anomalies += failures
    return signal_set


def read_dump(path: Path, max_bytes: int) -> Scrape:
    try:
        size = path.stat().st_size
        if path.is_dir():
            raise InputFileError(f"{path} is a directory, not a metrics dump")
        if size > max_bytes:
            raise InputFileError(
                f"{path} is {format_bytes(size)}, over the {format_bytes(max_bytes)} cap",
                "raise the cap with --max-metrics-bytes if the dump really is that large",
            )
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file") from None
    except PermissionError:
        raise InputFileError(f"{path}: permission denied") from None
    match = SCRAPED_AT_RE.search(text[:4096])
    at = float(match.group(1)) if match else path.stat().st_mtime
    try:
        return parse_exposition(text, at, origin=str(path))
    except (NotMetricsError, ExpositionParseError) as exc:
        raise InputFileError(exc.message, DUMP_HINT) from None


def collect_files(paths: list[Path], probe: str = "vllm", max_bytes: int = 16 * 1024 * 1024) -> SignalSet:
    """One dump: lifetime values since process start. Two or more: window values between the dumps."""
    if not paths:
        raise UsageError("no dump files given", "llmdiag analyze metrics.prom [more.prom …]")
    spec = load_probe(probe)
    scrapes = sorted((read_dump(p, max_bytes) for p in paths), key=lambda s: s.at_unix or 0.0)
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
    if len(scrapes) == 1:
        start = scrapes[0].series.get(PROCESS_START, {})
        origin = Scrape(at_unix=next(iter(start.values())) if start else None)
    signal_set = build_signal_set(spec, scrapes, where, origin=origin)
    if origin is not None and origin.at_unix is None:
        signal_set.window.note += " (no process_start_time_seconds: rates unavailable)"
    return signal_set
