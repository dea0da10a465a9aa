"""Formatting shared by every renderer: values in the units a person reads, times, and the words for what bounds a
decode step. Plain functions of plain values that return strings: no rich styles (those are the terminal's), and
nothing here prints.

A value that could not be measured is ``UNAVAILABLE`` (the trace table says "n/a" through ``missing``), never 0.
"""

from __future__ import annotations

from datetime import datetime, timezone

UNAVAILABLE = "unavailable"

# short unit labels for the terminal; JSON keeps the full unit
UNIT_LABELS = {
    "preemptions/request": "per req",
    "preemptions/s": "/s",
    "requests/s": "req/s",
    "tokens/s": "tok/s",
    "requests": "req",
    "tokens": "tok",
}

# large physical quantities in the prefix a person reads them in: (unit, [(factor, label), …] largest first)
SCALED_UNITS: dict[str, list[tuple[float, str]]] = {
    "bytes": [(2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")],
    "bytes/s": [(1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s")],
    "bits_per_second": [(1e9, "Gb/s"), (1e6, "Mb/s")],
    "hertz": [(1e9, "GHz"), (1e6, "MHz")],
}
UNIT_SYMBOLS = {"celsius": "°C", "watts": "W"}

# the verdict classes that name what limits the server ("MEMORY-BOUND"); the others are states (stalled, idle …)
CAPACITY_CLASSES = ("memory", "compute", "scheduling", "network")


def confidence_words(label: str, window_kind: str) -> str:
    """The confidence label as shown: "medium", or "low, snapshot" for a verdict judged from one moment."""
    return f"{label}, snapshot" if window_kind == "snapshot" else label


def window_words(kind: str) -> str | None:
    """What the verdict was judged over, in words; None for a window (the caller says its length)."""
    if kind == "lifetime":
        return "lifetime averages (one dump)"
    if kind == "snapshot":
        return "one snapshot (gauges at one moment, no rates)"
    return None


# what sets a decode step's time in the physics model (model.capacity.StepBound), in words
BOUND_WORDS = {
    "compute": "math (peak FLOP/s)",
    "hbm_bandwidth": "HBM bandwidth (reading weights and KV)",
    "interconnect": "the tensor-parallel all-reduce",
    "scheduler": "per-step CPU overhead",
}


def _scaled(value: float, unit: str) -> str | None:
    if unit in UNIT_SYMBOLS:
        return f"{value:.0f} {UNIT_SYMBOLS[unit]}" if abs(value) >= 10 else f"{value:.3g} {UNIT_SYMBOLS[unit]}"
    for factor, label in SCALED_UNITS.get(unit, []):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {label}" if abs(value) / factor < 100 else f"{value / factor:,.0f} {label}"
    return None


def format_value(value: float | None, unit: str) -> str:
    """A signal's value with its unit, as a person reads it: 12.5 ms, 87.0 %, 1.2 GiB, 2,400 tok/s."""
    if value is None:
        return UNAVAILABLE
    if unit == "ratio":
        return f"{value:.1%}"
    if unit == "seconds":
        return f"{value * 1000:.1f} ms" if abs(value) < 1 else f"{value:.2f} s"
    scaled = _scaled(value, unit)
    if scaled is not None:
        return scaled
    label = UNIT_LABELS.get(unit, unit)
    if unit in ("requests", "blocks", "tokens", "count"):
        return f"{value:.1f} {label}" if value != int(value) else f"{value:.0f} {label}"
    if abs(value) >= 100:
        return f"{value:,.0f} {label}"
    return f"{value:.3g} {label}"


def milliseconds(seconds: float | None, decimals: int | None = None, missing: str = UNAVAILABLE) -> str:
    """A duration as a number of milliseconds without the unit (a table says it in the header). ``decimals`` None:
    whole milliseconds from 100 ms up, one decimal below."""
    if seconds is None:
        return missing
    if decimals is None:
        decimals = 0 if seconds >= 0.1 else 1
    return f"{seconds * 1000:.{decimals}f}"


def rate(value: float | None, whole_from: float = 100.0, below_one: str = ".1f", missing: str = UNAVAILABLE) -> str:
    """A per-second figure without the unit: whole and comma-grouped from ``whole_from`` up, one decimal from 1 up,
    ``below_one`` (a format spec) under 1."""
    if value is None:
        return missing
    if value >= whole_from:
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 1 else format(value, below_one)


def when(unix: float | None) -> str:
    """A moment in UTC, to the second: 2026-11-30 06:02:31 UTC."""
    if unix is None:
        return UNAVAILABLE
    return datetime.fromtimestamp(unix, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def clock(unix: float, seconds: bool = True) -> str:
    """The time of day in UTC, for axes and strips: 06:02:31, or 06:02 without ``seconds``."""
    return datetime.fromtimestamp(unix, tz=timezone.utc).strftime("%H:%M:%S" if seconds else "%H:%M")
