"""What the window loop samples: a server's page, a DCGM page, NVML, the host. One shape for all of them.

A source is read on its own interval. The server is *required*: its first failure ends the scan. Telemetry
sources are *optional*: when one cannot be opened or its first read fails, the scan goes on without it and
the coverage says why, in one line. Missing telemetry is never read as zero.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from llmdiag.collect.exposition import Scrape
from llmdiag.model import SourceInfo
from llmdiag.schema.probes import ProbeSpec


@dataclass
class Source:
    spec: ProbeSpec
    display_url: str
    read: Callable[[], Scrape]
    close: Callable[[], None] = lambda: None
    interval_seconds: float = 1.0
    required: bool = False
    # how the coverage names it when it fails: "DCGM exporter", "GPU telemetry (NVML)", "host"
    label: str = ""
    hint: str = ""
    # check the first read holds this probe's metrics (pages at a URL the user typed)
    check_first: bool = True
    scrapes: list[Scrape] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    # set when the source was dropped: why, in plain words
    dropped: str | None = None
    # what the source learned about itself (device names, driver version, processes found)
    details: dict[str, str] = field(default_factory=dict)


def unavailable_source(probe: str, server: str, note: str) -> SourceInfo:
    """A probe that could not run, as the coverage shows it: never silent, never zeros."""
    return SourceInfo(probe=probe, server=server, ok=False, note=note)
