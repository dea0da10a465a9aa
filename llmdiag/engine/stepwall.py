"""The decode step's time against the batch, interval by interval (the step signals of llmdiag.engine.derived: CMP008's
proof that the step is the wall, SCH014's that it is not)."""

from __future__ import annotations

from dataclasses import dataclass

from llmdiag.engine.series import Missing, fit, value_at
from llmdiag.model import SignalSet

# a fit of the step against the batch needs this many intervals, over a batch that varied by at least this much
STEP_FIT_MIN_INTERVALS = 4
STEP_FIT_MIN_BATCH_SPREAD = 1.5  # largest over smallest batch


def itl_by_batch(signals: SignalSet) -> list[tuple[float, float]]:
    """(requests running, seconds between one request's tokens) per interval between readings. Each decode step
    makes one token per running request, so the interval's running requests over its output tokens/s is its step
    time: no histogram needed, and every server and log has both. The interval's batch is the mean of the readings
    at its ends, known only where they agree: an interval across which the batch jumped (a load level changing, a
    stall and its recovery) is left out, since its mean batch could be anything between its ends."""
    if signals.window.kind != "window":
        raise Missing("one dump: the step's growth with the batch shows only between readings over time")
    rate = signals.get("generation_tokens_per_second")
    running = signals.get("requests_running")
    if rate is None or running is None or rate.unavailable is not None or running.unavailable is not None:
        raise Missing("no output tokens/s or running requests reading by reading")
    gauge, rates = sorted(running.samples), sorted(rate.samples)
    points = []
    for at, tokens_per_second in rates:
        now = value_at(gauge, at)
        earlier = [value for when, value in gauge if when < at - 1e-6]
        before = earlier[-1] if earlier else None
        if now is None or tokens_per_second <= 0:
            continue
        # ends further apart than the spread the fit needs between intervals: a jump, not a level
        if before is not None and max(now, before) > STEP_FIT_MIN_BATCH_SPREAD * min(now, before):
            continue
        batch = now if before is None else (now + before) / 2
        if batch >= 1:
            points.append((batch, batch / tokens_per_second))
    if len(points) < STEP_FIT_MIN_INTERVALS:
        raise Missing(f"{len(points)} intervals with a steady batch: a fit against it needs {STEP_FIT_MIN_INTERVALS}")
    smallest, largest = min(b for b, _ in points), max(b for b, _ in points)
    if largest < STEP_FIT_MIN_BATCH_SPREAD * smallest:
        raise Missing(f"the batch held at {smallest:.3g}-{largest:.3g} requests: too little spread to fit against")
    return points


@dataclass(frozen=True)
class StepFit:
    slope_seconds_per_request: float
    r2: float
    # the batch's share of the mean step: slope x mean batch / mean step (0: flat, the batch sets none of its pace)
    batch_share_ratio: float


def step_fit(signals: SignalSet) -> StepFit:
    points = itl_by_batch(signals)
    slope, _, r2 = fit(points)
    mean_batch = sum(b for b, _ in points) / len(points)
    mean_step = sum(s for _, s in points) / len(points)
    return StepFit(slope, r2, slope * mean_batch / mean_step)
