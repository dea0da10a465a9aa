"""NVML telemetry: placeholder."""

from __future__ import annotations

from llmdiag.collect.source import Source, unavailable_source
from llmdiag.model import SourceInfo


def open_nvml_source(library: object | None = None, remote_gpus: bool = False) -> Source | SourceInfo:
    return unavailable_source("nvml", "GPU telemetry", "GPU telemetry: unavailable (no NVIDIA driver found; "
                              "pass --dcgm-url for remote GPUs)")
