"""A live scan: the server's page and its telemetry read over a window, turned into one SignalSet."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from llmdiag.client.endpoint import Connection
from llmdiag.collect import DEFAULT_DURATION_SECONDS
from llmdiag.collect.canary import Canary
from llmdiag.collect.http import HttpMetricsSource
from llmdiag.collect.merge import merge_signal_sets
from llmdiag.collect.servers.pages import PAGE_OFF_HINTS, build_server_signals, check_server
from llmdiag.collect.signals import build_signal_set
from llmdiag.collect.source import Source, unavailable_source
from llmdiag.collect.telemetry.dcgm import dcgm_source
from llmdiag.errors import (
    EmptyWindowError,
    HTTPStatusError,
    ProbeError,
    UsageError,
)
from llmdiag.model import SignalSet, SourceInfo
from llmdiag.schema.loader import load_probe

DEFAULT_INTERVAL_SECONDS = 1.0
MIN_SCRAPES = 3

ProgressCallback = Callable[[int, int], None]


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


def open_telemetry(connection: Connection, options: TelemetryOptions) -> tuple[list[Source], list[SourceInfo]]:
    """The telemetry sources that could be opened, and a coverage line for each one that could not."""
    sources: list[Source] = []
    missing: list[SourceInfo] = []

    def add(opened: Source | SourceInfo) -> None:
        (sources if isinstance(opened, Source) else missing).append(opened)

    if options.dcgm_url:
        add(dcgm_source(options.dcgm_url, connection))
    if options.nvml != "off":
        from llmdiag.collect.telemetry.nvml import open_nvml_source

        add(open_nvml_source(options.nvml_library, remote_gpus=bool(options.dcgm_url)))
    if options.host:
        from llmdiag.collect.telemetry.host import open_host_source

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
        from llmdiag.collect.servers.trtllm import json_or_prometheus, prometheus_companion

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
        from llmdiag.collect.servers.llamacpp import read_props

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
