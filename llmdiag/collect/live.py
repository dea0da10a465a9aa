"""A live scan: the server's page and its telemetry read over a window, turned into one SignalSet."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from llmdiag.client.deadline import Deadline, current, within
from llmdiag.client.endpoint import Connection
from llmdiag.collect import DEFAULT_DURATION_SECONDS
from llmdiag.collect.canary import Canary
from llmdiag.collect.exposition import Scrape
from llmdiag.collect.http import HttpMetricsSource
from llmdiag.collect.merge import merge_signal_sets
from llmdiag.collect.servers.pages import build_server_signals, check_server, page_off_hint
from llmdiag.collect.signals import build_signal_set
from llmdiag.collect.source import Source, unavailable_source
from llmdiag.collect.tape import window_clock
from llmdiag.collect.taped import taped_canary, taped_source
from llmdiag.collect.telemetry.dcgm import dcgm_source
from llmdiag.errors import (
    EmptyWindowError,
    HTTPStatusError,
    ProbeError,
    UsageError,
    option,
)
from llmdiag.model import SignalSet, SourceInfo
from llmdiag.schema.loader import load_probe
from llmdiag.schema.probes import ProbeSpec

DEFAULT_INTERVAL_SECONDS = 1.0
MIN_SCRAPES = 3
# a scan ends by its window + one timeout + this, however slowly the server answers: detection, the reads, the
# canaries' stop and the one-off reads after the window (llama.cpp's /props) all run under that deadline
SCAN_MARGIN_SECONDS = 2.0
# a read is not started with less of the scan's time left than this
MIN_READ_SECONDS = 0.5


def window_cut_at(deadline: Deadline) -> str:
    """The note a window cut short by ``deadline`` carries (a check tells its run's deadline cut it by this)."""
    return f"the window was cut short at {deadline.describe()}"


def scan_deadline(duration_seconds: float, timeout_seconds: float) -> Deadline:
    """The latest a live scan may end: ``duration_seconds + timeout_seconds + SCAN_MARGIN_SECONDS`` from now."""
    return Deadline.after(duration_seconds + timeout_seconds + SCAN_MARGIN_SECONDS, "the scan's deadline")


ProgressCallback = Callable[[int, int], None]
# judged on the window so far after each scrape, with the seconds it has run: True ends the window there
SettledCallback = Callable[[SignalSet, float], bool]


def scrape_plan(duration_seconds: float, interval_seconds: float = DEFAULT_INTERVAL_SECONDS) -> tuple[int, float]:
    """How many scrapes, how far apart: at least MIN_SCRAPES spread over the duration."""
    if duration_seconds <= 0:
        duration = option("duration_seconds")
        raise UsageError(f"{duration} must be positive, got {duration_seconds:g}", f"e.g. {duration} 20")
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
        if isinstance(opened, Source):
            sources.append(opened)
        else:
            missing.append(opened)

    if options.dcgm_url:
        add(dcgm_source(options.dcgm_url, connection))
    if options.nvml != "off":
        from llmdiag.collect.telemetry.nvml import open_nvml_source

        add(taped_source("nvml", lambda: open_nvml_source(options.nvml_library, remote_gpus=bool(options.dcgm_url))))
    if options.host:
        from llmdiag.collect.telemetry.host import open_host_source

        add(taped_source("host", lambda: open_host_source(connection.base_url, options.pids)))
    return sources, missing


def _read(source: Source, count: int) -> None:
    """One read of a source. A required source's first failure raises; an optional one's drops it."""
    source.reads += 1
    try:
        scrape = source.read()
        if not source.scrapes and source.check_first:
            check_server(source.spec, scrape, source.display_url, source.hint or None)
        source.scrapes.append(scrape)
    except ProbeError as exc:
        if source.required and not source.scrapes:
            page_off = page_off_hint(source.spec.name)
            if page_off and isinstance(exc, HTTPStatusError) and exc.status == 404:
                exc.message = f"{exc.message}: {source.spec.server} answers, but without its metrics page"
                exc.hint = page_off
            raise
        if not source.scrapes:
            source.dropped = f"{source.label}: {exc.message}" + (f" ({source.hint})" if source.hint else "")
            return
        _note_failure(source, count, exc.message)


def _note_failure(source: Source, count: int, why: str) -> None:
    """A failed read as one line; a run of reads that fail alike is one line too ("reads 4-9 failed: …"), never the
    same line per read (a GPU fallen off the bus, an exporter gone, fails every read after)."""
    index, of = source.reads, f"/{count}" if count else ""
    word = "scrape" if source.required else f"{source.label} read"
    run = source.failing
    if run is not None and run[1] == index - 1 and run[2] == why:
        source.failing = (run[0], index, why)
        source.failures[-1] = f"{word}s {run[0]}-{index}{of} failed: {why}"
    else:
        source.failing = (index, index, why)
        source.failures.append(f"{word} {index}{of} failed: {why}")


def collect_live(
    connection: Connection,
    duration_seconds: float = DEFAULT_DURATION_SECONDS,
    probe: str | None = "vllm",
    on_progress: ProgressCallback | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    telemetry: TelemetryOptions | None = None,
    canary: bool = False,
    settled: SettledCallback | None = None,
) -> SignalSet:
    """Read the server's page and every telemetry source over one window, each on its own interval.

    With ``settled``, ``duration_seconds`` is the longest the window runs: after each scrape the window so far is
    handed to it, and the window ends at the first scrape it accepts.

    With ``canary``, a few small streaming requests go through the server's API in the same window (started once
    the first scrape shows the server is up): what a user sees, from the client side.

    The server's first failure is fatal; later ones are tolerated and noted. Telemetry that cannot be read is
    left out with a line in the coverage; the rules that need it are then skipped, never fed zeros.
    """
    telemetry = telemetry or TelemetryOptions(nvml="off", host=False)
    clock, sleep = window_clock(clock, sleep)  # recorded, or replayed from a bundle (llmdiag.collect.tape)
    scrape_plan(duration_seconds)  # a bad --duration is said before anything is fetched
    with within(scan_deadline(duration_seconds, connection.timeout_seconds)):
        return _collect(connection, duration_seconds, probe, on_progress, clock, sleep, telemetry, canary, settled)


def _collect(
    connection: Connection,
    duration_seconds: float,
    probe: str | None,
    on_progress: ProgressCallback | None,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    telemetry: TelemetryOptions,
    canary: bool,
    settled: SettledCallback | None,
) -> SignalSet:
    first, first_at, why = None, None, ""
    if probe is None:  # which server: worked out from its page (reused as the first scrape) or its endpoints
        from llmdiag.collect.detect import detect_for_scan

        probe, why, first, first_at = detect_for_scan(connection, clock)
    server, optional, missing = _open_sources(connection, load_probe(probe), telemetry)
    count, interval = scrape_plan(duration_seconds)
    window = _LiveWindow(
        server, optional, count, interval, clock, sleep, on_progress, connection if canary else None, settled=settled
    )
    canary_part: SignalSet | SourceInfo | None = None
    try:
        window.read(first, start=clock() if first_at is None else first_at)
    finally:
        for source in (server, *optional):
            source.close()
        canary_part = window.canary.finish() if window.canary is not None else None
    signal_set = _window_signals(connection, server, count, optional, missing)
    if isinstance(canary_part, SignalSet):
        merge_signal_sets(signal_set, canary_part)
    elif canary_part is not None:
        missing.append(canary_part)
    signal_set.sources += missing
    if why:
        from llmdiag.collect.detect import note_server_choice

        note_server_choice(signal_set, probe, why)
    return signal_set


def _open_sources(
    connection: Connection, spec: ProbeSpec, telemetry: TelemetryOptions
) -> tuple[Source, list[Source], list[SourceInfo]]:
    """The server's own page (required, its first read checked to be this server's), the optional sources beside
    it, and a coverage line for each telemetry source that could not be opened."""
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
    return server, optional, missing


@dataclass
class _LiveWindow:
    """One window's reads: the server's page ``count`` times, ``interval`` apart; each telemetry source on its own
    interval in between; the canary (when given a connection) started once a server read is in."""

    server: Source
    optional: list[Source]
    count: int
    interval: float
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    on_progress: ProgressCallback | None
    canary_connection: Connection | None
    canary: Canary | None = None
    settled: SettledCallback | None = None

    def read(self, first: Scrape | None, start: float) -> None:
        """Every read of the window from ``start``; ``first``, detection's read of the page, is its first scrape."""
        end = start + (self.count - 1) * self.interval
        due = {id(s): start for s in self.optional}
        server_reads = 0
        if first is not None:
            self.server.scrapes.append(first)
            server_reads = self.server.reads = 1
            self._server_read(1, end)
        while server_reads < self.count:
            server_due = start + server_reads * self.interval
            active = [s for s in self.optional if s.dropped is None and due[id(s)] <= min(server_due, end)]
            # telemetry due before (or with) the server's next scrape goes first
            source = min(active, key=lambda s: due[id(s)]) if active else self.server
            wait = (due[id(source)] if source is not self.server else server_due) - self.clock()
            if self._past_deadline(wait):
                break
            if wait > 0:
                self.sleep(wait)
            if source is self.server:
                server_reads += 1
                _read(self.server, self.count)
                self._server_read(server_reads, end)
                if self._judged_settled(start):
                    break
            else:
                _read(source, 0)
                # never fall behind by more than one interval: a slow read skips samples, it does not pile them up
                due[id(source)] = max(due[id(source)] + source.interval_seconds, self.clock())

    def _past_deadline(self, wait: float) -> bool:
        """True (and said in the server's failures) when the next read would start after the scan's deadline: a
        slow server has used the time, and the window ends with the scrapes it has."""
        deadline = current()
        if deadline is None or wait < deadline.remaining() - MIN_READ_SECONDS:
            return False
        self.server.failures.append(
            f"{window_cut_at(deadline)}: {len(self.server.scrapes)} of {self.count} "
            "scrapes read (the server answered slowly)"
        )
        return True

    def _judged_settled(self, start: float) -> bool:
        """The window so far, handed to ``settled`` (if given): the server's signals with each source read twice or
        more."""
        if self.settled is None or len(self.server.scrapes) < MIN_SCRAPES:
            return False
        try:
            so_far = build_server_signals(self.server.spec, list(self.server.scrapes), self.server.display_url)
            for source in self.optional:
                if source.dropped is None and len(source.scrapes) >= 2:
                    merge_signal_sets(so_far, build_signal_set(source.spec, source.scrapes, source.display_url))
        except ProbeError:  # a window that cannot be read yet is not a settled one
            return False
        return self.settled(so_far, self.clock() - start)

    def _server_read(self, reads: int, end: float) -> None:
        if self.canary_connection is not None and self.canary is None:
            self.canary = taped_canary(self.canary_connection, max(end - self.clock(), self.interval))
            self.canary.start()
        if self.on_progress:
            self.on_progress(reads, self.count)


def _window_signals(
    connection: Connection, server: Source, count: int, optional: list[Source], missing: list[SourceInfo]
) -> SignalSet:
    """The server's signals with each telemetry source's merged in; a source read too rarely joins ``missing``."""
    spec = server.spec
    if len(server.scrapes) < 2:
        raise EmptyWindowError(
            f"only {len(server.scrapes)} of {count} scrapes of {server.display_url} succeeded: no "
            "window to measure" + (f" ({server.failures[-1]})" if server.failures else "")
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
        if source.failures:  # read for part of the window only: the coverage says so, beside the notes
            part.sources[-1].note = "; ".join(source.failures)
        merge_signal_sets(signal_set, part)
        signal_set.anomalies += source.failures
    return signal_set
