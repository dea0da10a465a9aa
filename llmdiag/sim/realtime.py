"""The engine run in (scaled) real time on an event loop, waking each request as its tokens come out.

The engine's clock is ``time.monotonic()`` × ``time_scale`` from the server's start. A step ends ``step_time``
after it starts; the runner sleeps until then, delivers the tokens and starts the next step at that end, so timer
jitter does not slow the simulated GPU. When the host cannot keep up (more than ``LAG_TOLERANCE_SECONDS`` late),
the next step starts at the real time instead and the gap is counted as lag (``/sim/stats``): the pages then report
what clients really saw.
"""

from __future__ import annotations

import asyncio
import time

from llmdiag.sim.engine import Engine

LAG_TOLERANCE_SECONDS = 0.05


class EngineRunner:
    """Runs the engine in (scaled) real time on the current event loop and wakes requests as tokens come out."""

    def __init__(self, engine: Engine, time_scale: float = 1.0) -> None:
        self.engine = engine
        self.time_scale = time_scale
        self._origin = time.monotonic()
        self.lag_seconds = 0.0  # simulated time the host fell behind the physics, summed
        self._wakeup: asyncio.Event | None = None

    def clock(self) -> float:
        """Simulated seconds since the server started."""
        return (time.monotonic() - self._origin) * self.time_scale

    def wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    async def run(self) -> None:
        self._wakeup = asyncio.Event()
        resume_at: float | None = None  # the end of the last step, where the next one starts
        while True:
            engine = self.engine  # read each time: ``SimApp.switch`` replaces it
            if not engine.has_work():
                self._wakeup.clear()
                await self._wakeup.wait()
                resume_at = None
                continue
            now = self.clock()
            if resume_at is not None and now - resume_at <= LAG_TOLERANCE_SECONDS:
                start = resume_at
            else:
                if resume_at is not None:
                    self.lag_seconds += now - resume_at
                start = now
            step = engine.schedule(start)
            if step is None and start < now:  # only requests that arrived after the catch-up point: start now
                step = engine.schedule(now)
            if step is None:  # cannot happen with a valid config; never spin
                resume_at = None
                await asyncio.sleep(0.001)
                continue
            await asyncio.sleep(max(0.0, (step.end - self.clock()) / self.time_scale))
            if engine is not self.engine:  # switched while the step ran: its requests were aborted
                resume_at = None
                continue
            for request in engine.complete(step):
                if request.listener is not None:
                    request.listener()
            resume_at = step.end

    def shutdown(self) -> None:
        for request in self.engine.abort_all(self.clock()):
            if request.listener is not None:
                request.listener()
