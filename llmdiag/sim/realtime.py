"""The engine run in (scaled) real time on an event loop, waking each request as its tokens come out.

The engine's clock is ``time.monotonic()`` × ``time_scale`` from the server's start, less the host's lag. A step
ends ``step_time`` after it starts; the runner sleeps until then, delivers the tokens and starts the next step at
that end, so timer jitter does not slow the simulated GPU.

A starved host (a busy machine, a process that holds the GIL) must not change the simulated server's state: a
preset that builds no queue must not build one because the event loop ran late. So the clock is dilated: while the
engine is *due* (a step has ended, or work reached an idle engine) and the runner has not yet acted, simulated
time stands still ``LAG_TOLERANCE_SECONDS`` after that moment; the real time it stood still is counted as lag
(``lag_seconds``, ``/sim/stats``). Requests stamped meanwhile arrive at that moment, not after a gap the engine
never had, and every step starts where the previous one ended. Whatever reads the engine (a page, an arrival,
``/sim/stats``) first calls ``settle()``, which completes the steps that have ended by the clock, so a scrape that
runs before the late runner sees the state the engine has at that simulated time. Rates a scraper computes over
real seconds fall by the lag's share; the histograms and gauges, in simulated time, hold.
"""

from __future__ import annotations

import asyncio
import time

from llmdiag.sim.engine import Engine

# real seconds the runner may act late and still catch up by starting steps back to back (timer jitter, the
# listeners' callbacks); beyond it the clock stands still instead
LAG_TOLERANCE_SECONDS = 0.005
# real seconds before the runner looks again when work it cannot schedule is queued (a bug; never spin)
RETRY_SECONDS = 0.001


class EngineRunner:
    """Runs the engine in (scaled) real time on the current event loop and wakes requests as tokens come out."""

    def __init__(self, engine: Engine, time_scale: float = 1.0) -> None:
        self.engine = engine
        self.time_scale = time_scale
        self._origin = time.monotonic()
        self.lag_seconds = 0.0  # simulated seconds the clock stood still because the host fell behind, summed
        self._tolerance = LAG_TOLERANCE_SECONDS * time_scale
        self._ready_at: float | None = None  # when work reached an engine with no step in flight
        self._waiter: asyncio.Future[None] | None = None

    def real_seconds(self) -> float:
        """Scaled real seconds since the start: the clock plus the lag."""
        return (time.monotonic() - self._origin) * self.time_scale

    def _undilated(self) -> float:
        return self.real_seconds() - self.lag_seconds

    def due(self) -> float | None:
        """The simulated time the engine must act at: the end of the step in flight, or when work reached an idle
        engine; None when it has nothing to do."""
        engine = self.engine
        if engine.in_flight is not None:
            return engine.in_flight.end
        if not engine.has_work():
            self._ready_at = None  # what was queued was aborted: the next arrival sets it afresh
            return None
        return self._ready_at

    def clock(self) -> float:
        """Simulated seconds since the server started: real time less the lag, held at the engine's due time
        (plus the tolerance) until the runner acts."""
        now = self._undilated()
        due = self.due()
        if due is not None and now > due + self._tolerance:
            return due + self._tolerance
        return now

    def wake(self) -> None:
        """Work was added: an engine with no step in flight is due now."""
        engine = self.engine
        if engine.in_flight is None and self._ready_at is None and engine.has_work():
            self._ready_at = self.clock()
            waiter = self._waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def settle(self) -> None:
        """Bring the engine up to the clock: complete each step that has ended and start the next at its end,
        counting as lag how long the host kept the engine waiting past the tolerance. Synchronous, on the loop."""
        while True:
            due = self.due()
            if due is None:
                return
            now = self._undilated()
            if now < due:
                return
            if now > due + self._tolerance:
                self.lag_seconds += now - due - self._tolerance
            engine = self.engine
            step = engine.in_flight
            if step is not None:
                for request in engine.complete(step):
                    if request.listener is not None:
                        request.listener()
            self._ready_at = None
            if not engine.has_work():
                return
            if engine.schedule(due) is None:
                now = self.clock()
                # only requests stamped after ``due`` (inside the tolerance) are queued: they start now
                if (now <= due or engine.schedule(now) is None) and engine.has_work():
                    self._ready_at = now + RETRY_SECONDS * self.time_scale  # cannot happen with a valid config
                    return

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self.settle()
            due = self.due()
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiter = waiter
            timer = None
            if due is not None:
                delay = max(0.0, (due - self._undilated()) / self.time_scale)
                timer = loop.call_later(delay, _resolve, waiter)
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()

    def shutdown(self) -> None:
        for request in self.engine.abort_all(self.clock()):
            if request.listener is not None:
                request.listener()


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
