"""A signal's readings over time (llmdiag.engine.series): the reading at a moment, a least-squares line, a trend."""

from __future__ import annotations

import pytest

from llmdiag.engine.series import Missing, fit, trend, value_at
from llmdiag.model import Signal, SignalSet, Window


def test_the_reading_at_a_moment_is_the_last_one_taken_by_then():
    samples = [(10.0, 1.0), (11.0, 2.0), (12.0, 3.0)]
    assert value_at(samples, 11.5) == 2.0
    assert value_at(samples, 12.0) == 3.0
    assert value_at(samples, 9.0) is None  # nothing read yet


def test_a_line_through_points_on_a_line():
    points = [(x, 0.02 + 0.004 * x) for x in (4.0, 8.0, 16.0, 24.0)]
    slope, last, r2 = fit(points)
    assert slope == pytest.approx(0.004)
    assert last == pytest.approx(0.02 + 0.004 * 24)
    assert r2 == pytest.approx(1.0)


def test_points_with_no_line_explain_nothing():
    # two levels, each with the same two values: a flat line that explains none of the spread
    slope, _, r2 = fit([(1.0, 1.0), (1.0, 3.0), (2.0, 1.0), (2.0, 3.0)])
    assert slope == pytest.approx(0.0) and r2 == pytest.approx(0.0)
    with pytest.raises(Missing, match="one moment"):
        fit([(5.0, 1.0), (5.0, 2.0)])


def test_a_steady_trend_and_one_that_is_not():
    window = Window(kind="window", start_unix=0.0, end_unix=7.0, duration_seconds=7.0, scrapes=8)
    rising = [(float(t), 0.5 + 0.01 * t) for t in range(8)]
    noisy = [(float(t), 0.5 + (0.2 if t % 2 else -0.2)) for t in range(8)]
    signals = SignalSet(window=window)
    signals.add(Signal(name="kv_cache_usage_ratio", kind="gauge", unit="ratio", stats={"max": 0.57}, samples=rising))
    signals.add(Signal(name="requests_running", kind="gauge", unit="", stats={"max": 0.7}, samples=noisy))
    slope, first, last, span = trend(signals, "kv_cache_usage_ratio")
    assert (slope, first, last, span) == pytest.approx((0.01, 0.5, 0.57, 7.0))
    with pytest.raises(Missing, match="not steadily"):
        trend(signals, "requests_running")
