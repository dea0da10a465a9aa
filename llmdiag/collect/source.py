"""What the window loop samples: a server's page, a DCGM page, NVML, the host. One shape for all of them.

A source is read on its own interval. The server is *required*: its first failure ends the scan. Telemetry
sources are *optional*: when one cannot be opened or its first read fails, the scan goes on without it and
the coverage says why, in one line. Missing telemetry is never read as zero.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from llmdiag.collect.exposition import Scrape
from llmdiag.errors import UsageError
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
    # reads tried so far (failed ones included), and the run of failed reads that ends the list: (first, last, why)
    reads: int = 0
    failing: tuple[int, int, str] | None = None
    # set when the source was dropped: why, in plain words
    dropped: str | None = None
    # what the source learned about itself (device names, driver version, processes found)
    details: dict[str, str] = field(default_factory=dict)


def unavailable_source(probe: str, server: str, note: str) -> SourceInfo:
    """A probe that could not run, as the coverage shows it: never silent, never zeros."""
    return SourceInfo(probe=probe, server=server, ok=False, note=note)


def catalogue_gpu(name: str) -> str | None:
    """The probes/tables/gpus.toml entry nvidia-smi's product name is, or None ('NVIDIA H100 80GB HBM3' → H100)."""
    from llmdiag.physics.hardware import find_gpu  # the GPU tables load on first use only

    for candidate in (name, re.sub(r"^NVIDIA\s+", "", name)):
        try:
            return find_gpu(candidate).name
        except UsageError:
            continue
    return None


def gpus_config(names: Iterable[str]) -> dict[str, str]:
    """What a telemetry source's coverage says of its GPUs: ``gpus`` (``2 × NVIDIA H100 80GB HBM3``) and ``gpu``,
    the probes/tables/gpus.toml entry they all are, where the table has one (the deployment the scan prices)."""
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    config = {"gpus": ", ".join(f"{n} × {name}" for name, n in counts.items())}
    known = {catalogue_gpu(name) for name in counts}
    if len(counts) == 1 and None not in known:
        config["gpu"] = known.pop() or ""
    elif None in known:
        config["gpu_note"] = "not in probes/tables/gpus.toml (or cut short in the table): capacity needs the GPU named"
    return config
