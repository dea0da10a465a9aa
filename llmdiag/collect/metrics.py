"""The servers' metrics pages, live or saved, turned into a SignalSet measured over a window."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from llmdiag.client.endpoint import Connection, format_bytes, normalise_base_url
from llmdiag.collect import DEFAULT_DURATION_SECONDS
from llmdiag.collect.canary import Canary
from llmdiag.collect.http import HttpMetricsSource
from llmdiag.collect.prometheus import Scrape, parse_exposition
from llmdiag.collect.signals import build_signal_set
from llmdiag.collect.source import Source, unavailable_source
from llmdiag.errors import (
    EmptyWindowError,
    ExpositionParseError,
    HTTPStatusError,
    InputFileError,
    NotMetricsError,
    ProbeError,
    UsageError,
)
from llmdiag.model import SignalSet, SourceInfo
from llmdiag.schema.loader import load_probe
from llmdiag.schema.probes import ProbeSpec

DEFAULT_INTERVAL_SECONDS = 1.0
MIN_SCRAPES = 3
SCRAPED_AT_RE = re.compile(r"^#\s*llmdiag-scraped-at:\s*([0-9.eE+-]+)\s*$", re.MULTILINE)
PROCESS_START = "process_start_time_seconds"
COLLECTOR_COUNTS = ("counter_resets", "implausible_samples")

ProgressCallback = Callable[[int, int], None]
DUMP_HINT = "give a saved vLLM /metrics page: curl -s http://HOST:PORT/metrics > metrics.prom"


DCGM_HINT = "is dcgm-exporter running there? its page is usually http://HOST:9400/metrics; or leave out --dcgm-url"
# a server detected by its other endpoints whose metrics page answers 404: the option that turns the page on
PAGE_OFF_HINTS = {
    "sglang": "SGLang serves /metrics only when started with --enable-metrics: restart it with that flag "
    "(or give --metrics-url where its metrics are)",
    "llamacpp": "llama-server serves /metrics only when started with --metrics: restart it with that flag",
}


def check_server(spec: ProbeSpec, scrape: Scrape, where: str, hint: str | None = None) -> None:
    if any(name.startswith(tuple(spec.detect_prefixes)) for name in scrape.names()):
        return
    if set(spec.legacy_names) & scrape.names():
        return  # an older release's names, too generic to detect the server by
    if getattr(scrape, "records", None) is not None:  # TensorRT-LLM's JSON iteration stats
        if spec.prometheus_path:
            return
        raise NotMetricsError(
            f"{where} is TensorRT-LLM's JSON iteration stats, not {spec.server} metrics", "give --probe trtllm"
        )
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


def build_server_signals(
    spec: ProbeSpec, scrapes: list[Scrape], where: str, origin: Scrape | None = None, live: bool = True
) -> SignalSet:
    """A server page's signals; TensorRT-LLM and Triton pages go through their own module (JSON, estimates)."""
    if spec.name in ("trtllm", "triton"):
        from llmdiag.collect import trtllm

        return trtllm.build_server_signals(spec, scrapes, where, origin, live)
    signal_set = build_signal_set(spec, scrapes, where, origin=origin)
    if spec.name == "llamacpp":  # ITL from the generation counters (llmdiag/collect/llamacpp.py)
        from llmdiag.collect.llamacpp import finish_llamacpp_signals

        finish_llamacpp_signals(signal_set)
    return signal_set


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


@dataclass
class TelemetryOptions:
    """Which telemetry a live scan reads beside the server's own page."""

    dcgm_url: str | None = None
    # "auto": NVML when a GPU is visible here; "off": never. ``nvml_library`` stands in for the pynvml module
    # (a recording's replay in tests)
    nvml: str = "auto"
    nvml_library: object | None = None
    # the server's processes: these pids, or (when empty) whatever listens on the server's port on this machine
    pids: list[int] = field(default_factory=list)
    host: bool = True


def dcgm_source(url: str, like: Connection) -> Source:
    page = HttpMetricsSource(dcgm_connection(url, like))
    return Source(
        spec=load_probe("dcgm"),
        display_url=page.display_url,
        read=page.scrape,
        close=page.close,
        label="DCGM exporter",
        hint=DCGM_HINT,
    )


def open_telemetry(connection: Connection, options: TelemetryOptions) -> tuple[list[Source], list[SourceInfo]]:
    """The telemetry sources that could be opened, and a coverage line for each one that could not."""
    sources: list[Source] = []
    missing: list[SourceInfo] = []

    def add(opened: Source | SourceInfo) -> None:
        (sources if isinstance(opened, Source) else missing).append(opened)

    if options.dcgm_url:
        add(dcgm_source(options.dcgm_url, connection))
    if options.nvml != "off":
        from llmdiag.collect.nvml import open_nvml_source

        add(open_nvml_source(options.nvml_library, remote_gpus=bool(options.dcgm_url)))
    if options.host:
        from llmdiag.collect.host import open_host_source

        add(open_host_source(connection.base_url, options.pids))
    return sources, missing


def _read(source: Source, index: int, count: int) -> None:
    """One read of a source. A required source's first failure raises; an optional one's drops it."""
    try:
        scrape = source.read()
        if not source.scrapes and source.check_first:
            check_server(source.spec, scrape, source.display_url, source.hint or None)
        source.scrapes.append(scrape)
    except ProbeError as exc:
        if source.required and not source.scrapes:
            page_off = PAGE_OFF_HINTS.get(source.spec.name)
            if page_off and isinstance(exc, HTTPStatusError) and exc.status == 404:
                exc.message = f"{exc.message}: {source.spec.server} answers, but without its metrics page"
                exc.hint = page_off
            raise
        if not source.scrapes:
            source.dropped = f"{source.label}: {exc.message}" + (f" ({source.hint})" if source.hint else "")
            return
        of = f"{index}/{count}" if count else f"{index}"
        source.failures.append(f"{'scrape' if source.required else source.label + ' read'} {of} failed: {exc.message}")


def collect_live(
    connection: Connection,
    duration_seconds: float = DEFAULT_DURATION_SECONDS,
    probe: str | None = "vllm",
    on_progress: ProgressCallback | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    telemetry: TelemetryOptions | None = None,
    canary: bool = False,
) -> SignalSet:
    """Read the server's page and every telemetry source over one window, each on its own interval.

    With ``canary``, a few small streaming requests go through the server's API in the same window (started once
    the first scrape shows the server is up): what a user sees, from the client side.

    The server's first failure is fatal; later ones are tolerated and noted. Telemetry that cannot be read is
    left out with a line in the coverage; the rules that need it are then skipped, never fed zeros.
    """
    telemetry = telemetry or TelemetryOptions(nvml="off", host=False)
    first, first_at, why = None, None, ""
    scrape_plan(duration_seconds)  # a bad --duration is said before anything is fetched
    if probe is None:  # which server: worked out from its page (reused as the first scrape) or its endpoints
        from llmdiag.collect.detect import detect_for_scan

        probe, why, first, first_at = detect_for_scan(connection, clock)
    spec = load_probe(probe)
    page = HttpMetricsSource(connection, spec.metrics_path)
    read = page.scrape
    if spec.prometheus_path:  # TensorRT-LLM: JSON iteration stats at metrics_path, Prometheus beside it
        from llmdiag.collect.trtllm import json_or_prometheus, prometheus_companion

        read = json_or_prometheus(page)
    server = Source(
        spec=spec, display_url=page.display_url, read=read, close=page.close, required=True, label=spec.server
    )
    optional, missing = open_telemetry(connection, telemetry)
    if spec.prometheus_path and not connection.metrics_url:
        optional.insert(0, prometheus_companion(spec, connection))
    count, interval = scrape_plan(duration_seconds)
    probe_requests: Canary | None = None
    try:
        start = clock() if first_at is None else first_at
        end = start + (count - 1) * interval
        due = {id(s): start for s in optional}
        server_reads = 0
        if first is not None:  # detection's read of the page is the window's first scrape
            server.scrapes.append(first)
            server_reads = 1
            if canary:
                probe_requests = Canary(connection, max(end - clock(), interval))
                probe_requests.start()
            if on_progress:
                on_progress(1, count)
        while server_reads < count:
            server_due = start + server_reads * interval
            active = [s for s in optional if s.dropped is None and due[id(s)] <= min(server_due, end)]
            # telemetry due before (or with) the server's next scrape goes first
            source = min(active, key=lambda s: due[id(s)]) if active else server
            at = due[id(source)] if source is not server else server_due
            wait = at - clock()
            if wait > 0:
                sleep(wait)
            if source is server:
                server_reads += 1
                _read(server, server_reads, count)
                if canary and probe_requests is None:
                    probe_requests = Canary(connection, max(end - clock(), interval))
                    probe_requests.start()
                if on_progress:
                    on_progress(server_reads, count)
            else:
                _read(source, len(source.scrapes) + 1, 0)
                # never fall behind by more than one interval: a slow read skips samples, it does not pile them up
                due[id(source)] = max(due[id(source)] + source.interval_seconds, clock())
    finally:
        for source in (server, *optional):
            source.close()
        canary_part = probe_requests.finish() if probe_requests is not None else None
    if len(server.scrapes) < 2:
        raise EmptyWindowError(
            f"only {len(server.scrapes)} of {count} scrapes of {server.display_url} succeeded: no window to measure"
            + (f" ({server.failures[-1]})" if server.failures else "")
        )
    signal_set = build_server_signals(spec, server.scrapes, server.display_url)
    signal_set.anomalies += server.failures
    if spec.name == "llamacpp":  # the slot count, from /props: one read
        from llmdiag.collect.llamacpp import read_props

        for signal in read_props(connection):
            signal_set.add(signal)
    for source in optional:
        if source.dropped is None and len(source.scrapes) < 2:
            source.dropped = f"{source.label}: only {len(source.scrapes)} read(s) in the window, too few to measure"
        if source.dropped is not None:
            missing.append(unavailable_source(source.spec.name, source.label, source.dropped))
            continue
        part = build_signal_set(source.spec, source.scrapes, source.display_url)
        part.sources[-1].config.update(source.details)
        merge_signal_sets(signal_set, part)
        signal_set.anomalies += source.failures
    if isinstance(canary_part, SignalSet):
        merge_signal_sets(signal_set, canary_part)
    elif canary_part is not None:
        missing.append(canary_part)
    signal_set.sources += missing
    if why:
        from llmdiag.collect.detect import note_server_choice

        note_server_choice(signal_set, probe, why)
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
    if text.lstrip()[:1] == "[":  # TensorRT-LLM's JSON iteration stats, saved with curl
        from llmdiag.collect.trtllm import parse_iteration_stats

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

        probe, why = check_server_name(probe), f"--server {probe} given"
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
