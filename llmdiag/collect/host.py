"""Host telemetry (psutil): placeholder until the host probe lands."""

from __future__ import annotations

from llmdiag.collect.source import Source, unavailable_source
from llmdiag.model import SourceInfo


def open_host_source(base_url: str, pids: list[int]) -> Source | SourceInfo:
    return unavailable_source("host", "host", "server process CPU: unavailable (host probe not built yet)")
