"""Signals: measured quantities over a window, in base units (the unit is in the name).

A value that could not be measured is ``None`` with ``unavailable`` saying why: missing is never zero.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

SignalKind = Literal["gauge", "counter", "histogram", "info", "derived"]
# window: between two or more scrapes; lifetime: one dump since process start; snapshot: one moment, no interval
WindowKind = Literal["window", "lifetime", "snapshot"]


class Window(BaseModel):
    kind: WindowKind = "window"
    start_unix: float | None = None
    end_unix: float | None = None
    duration_seconds: float | None = None
    scrapes: int = 0
    note: str = ""


class Signal(BaseModel):
    """One measured quantity over the window.

    ``stats`` holds what the kind allows: gauges ``last/mean/min/max``; counters ``rate/increase``;
    histograms ``p50/p90/p95/p99/mean/count/sum`` and, for durations with scrape times, ``sum_in_window_max`` (the
    most of ``sum`` that lies inside the window: a duration is counted when it ends); derived signals ``value``.
    """

    name: str
    kind: SignalKind
    unit: str
    stats: dict[str, float] = Field(default_factory=dict)
    unavailable: str | None = None
    source: str = ""
    verify: str = ""
    window_seconds: float | None = None
    # per-scrape points (unix time, value) kept for charts and the JSON record: a gauge's value at each scrape;
    # a counter's rate over the interval that ends at that scrape (in ``unit``)
    samples: list[tuple[float, float]] = Field(default_factory=list)
    # histograms: the window's bucket deltas as (upper bound, cumulative count), finite bounds only; the
    # observations above the last bound are ``stats["count"]`` minus the last count
    buckets: list[tuple[float, float]] = Field(default_factory=list)
    # per-label-set breakdown, e.g. per engine, for imbalance checks
    by_series: dict[str, float] = Field(default_factory=dict)

    def stat(self, name: str) -> float | None:
        if self.unavailable is not None:
            return None
        return self.stats.get(name)

    @classmethod
    def missing(cls, name: str, kind: SignalKind, unit: str, reason: str, source: str = "") -> Signal:
        return cls(name=name, kind=kind, unit=unit, unavailable=reason, source=source)


class SourceInfo(BaseModel):
    """What a probe talked to, and what it saw."""

    probe: str
    url: str = ""
    server: str = ""
    models: list[str] = Field(default_factory=list)
    engines: list[str] = Field(default_factory=list)
    ok: bool = True
    note: str = ""
    config: dict[str, str] = Field(default_factory=dict)


class SignalSet(BaseModel):
    signals: dict[str, Signal] = Field(default_factory=dict)
    window: Window = Field(default_factory=Window)
    sources: list[SourceInfo] = Field(default_factory=list)
    # anomalies the collector noticed in the raw data (counter resets, out-of-range values …)
    anomalies: list[str] = Field(default_factory=list)

    def get(self, name: str) -> Signal | None:
        return self.signals.get(name)

    def add(self, signal: Signal) -> None:
        self.signals[signal.name] = signal
