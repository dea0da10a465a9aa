"""A signal's readings over time, for the derived signals that read their shape (llmdiag.engine.derived): the reading
at a moment, a least-squares line through readings, and a steady trend. ``Missing`` says why a figure cannot be had.
"""

from __future__ import annotations

from llmdiag.model import SignalSet


class Missing(Exception):
    """An input is unavailable; the message says which and why."""


def value_at(samples: list[tuple[float, float]], at: float) -> float | None:
    """A gauge's reading at ``at``: the last one taken at or before it."""
    found = None
    for when, value in samples:
        if when > at + 1e-6:
            break
        found = value
    return found


def fit(samples: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Least-squares line through the (x, y) points: the slope (per second, for readings over time), the value fitted
    at the last point, and R²."""
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_v = sum(v for _, v in samples) / n
    var_t = sum((t - mean_t) ** 2 for t, _ in samples)
    var_v = sum((v - mean_v) ** 2 for _, v in samples)
    if var_t <= 0:
        raise Missing("every reading at one moment")
    slope = sum((t - mean_t) * (v - mean_v) for t, v in samples) / var_t
    r2 = 1.0 if var_v <= 0 else (slope**2 * var_t) / var_v
    return slope, mean_v + slope * (samples[-1][0] - mean_t), r2


# a trend is told from this many readings at least, and only when a line explains most of their spread
TREND_MIN_READINGS = 6
TREND_MIN_R2 = 0.8


def trend(signals: SignalSet, name: str) -> tuple[float, float, float, float]:
    """slope per second, the fitted first and last values, and the seconds the readings span."""
    if signals.window.kind == "snapshot":
        raise Missing("one moment: a trend needs readings over time")
    signal = signals.get(name)
    if signal is None or signal.unavailable is not None:
        raise Missing(f"{name} unavailable")
    points = sorted(signal.samples)
    if len(points) < TREND_MIN_READINGS:
        raise Missing(f"{len(points)} readings of {name}: a trend needs {TREND_MIN_READINGS}")
    slope, last, r2 = fit(points)
    if r2 < TREND_MIN_R2:
        raise Missing(f"{name} moves but not steadily (R² {r2:.2f} of a straight line)")
    span = points[-1][0] - points[0][0]
    return slope, last - slope * span, last, span
