"""The simulated inference server: the engine run in (scaled) real time behind vLLM's HTTP API, on aiohttp.

    SimServer(preset_or_config)   a context manager; its own event loop in a background thread, bound to
                                  127.0.0.1 (port 0 by default); ``.url``, ``.metrics_url``, ``.dcgm_url``;
                                  ``.switch_preset(name)`` restarts it in place in another preset (counters reset);
                                  ``.snapshot()`` and ``.timings()`` read /sim/stats and /sim/timings without HTTP

What it serves is ``llmdiag.sim.app`` (the routes), how requests are counted and answered ``llmdiag.sim.openai``,
the engine's clock ``llmdiag.sim.realtime``, and the server-side timings ``llmdiag.sim.timings``. The load that
drives a preset is ``llmdiag.sim.load``.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aiohttp import web

from llmdiag.errors import UsageError
from llmdiag.sim.app import SimApp, SimConfig, as_config
from llmdiag.sim.dialects import Dialect, get_dialect
from llmdiag.sim.engine import EngineConfig
from llmdiag.sim.presets import Preset
from llmdiag.sim.timings import MAX_TIMED_REQUESTS, TimingLog, stamping_listener

SHUTDOWN_SECONDS = 2.0
LISTEN_BACKLOG = 4096  # a thousand users connect at once


class SimServer:
    """A simulated vLLM on its own event loop in a background thread.

        with SimServer("memory") as server:
            ... server.url, server.metrics_url, server.dcgm_url ...

    ``preset_or_config`` is a preset name (``llmdiag.sim.presets``), a Preset, a SimConfig or an EngineConfig.
    ``dialect`` names the server whose pages it serves (``llmdiag.sim.dialects``; vLLM by default).
    ``record_timings`` keeps server-side timestamps of the last ``max_timed_requests`` requests that carry an
    X-Request-Id (``timings()``, ``GET /sim/timings``).
    """

    def __init__(
        self,
        preset_or_config: str | Preset | SimConfig | EngineConfig,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        time_scale: float | None = None,
        record_timings: bool = False,
        max_timed_requests: int = MAX_TIMED_REQUESTS,
        dialect: str | Dialect = "vllm",
    ) -> None:
        config = as_config(preset_or_config)
        self.dialect = get_dialect(dialect) if isinstance(dialect, str) else dialect
        self._timings = TimingLog(max_timed_requests) if record_timings else None
        if time_scale is not None:
            config = SimConfig(config.engine, config.default_max_tokens, config.stop_after_tokens, time_scale)
        self.config = config
        self.host = host
        self.port = port
        self.app: SimApp | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.failure: BaseException | None = None  # what stopped the engine early, if anything did

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        """The dialect's main metrics page (vLLM's /metrics by default)."""
        return f"{self.url}{self.dialect.metrics_path}"

    @property
    def dcgm_url(self) -> str:
        return f"{self.url}/dcgm/metrics"

    @property
    def model(self) -> str:
        return self.config.engine.served_model_name

    def start(self) -> SimServer:
        if self._thread is not None:
            raise RuntimeError("the server is already started")
        self._thread = threading.Thread(target=self._main, name="llmdiag-sim", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout=30):
            raise UsageError("the simulator did not start within 30 s", "check that the host is not overloaded")
        if self._error is not None:
            self._thread.join(timeout=5)
            if isinstance(self._error, OSError):
                raise UsageError(
                    f"the simulator cannot listen on {self.host}:{self.port}: {self._error.strerror or self._error}",
                    "pick another port, or 0 for any free one",
                ) from None
            raise self._error
        return self

    def stop(self) -> None:
        """Abort what is in flight, end every stream, close the port. Raises what stopped the engine early."""
        loop, stop, thread = self._loop, self._stop, self._thread
        if loop is not None and stop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(stop.set)
        if thread is not None:
            thread.join(timeout=SHUTDOWN_SECONDS + 10)
        if self.failure is not None:
            raise RuntimeError(f"the simulated engine stopped: {self.failure!r}") from self.failure

    def __enter__(self) -> SimServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def snapshot(self) -> dict[str, Any]:
        """``/sim/stats`` without HTTP, read on the server's own loop."""
        if self._loop is None or self.app is None:
            raise RuntimeError("the server is not running")
        app = self.app

        async def read() -> dict[str, Any]:
            return app.snapshot()

        return asyncio.run_coroutine_threadsafe(read(), self._loop).result(timeout=10)

    def switch_preset(self, preset_or_config: str | Preset | SimConfig | EngineConfig) -> None:
        """Restart the simulated server in place in another preset (same URL): in-flight requests are aborted and
        its counters start over, as after a real restart with other flags. The caller changes the load, if wanted."""
        if self._loop is None or self.app is None:
            raise RuntimeError("the server is not running")
        config = as_config(preset_or_config)
        config = SimConfig(
            config.engine, self.config.default_max_tokens, self.config.stop_after_tokens, self.config.time_scale
        )
        self.config = config
        app = self.app

        async def switch() -> None:
            app.switch(config)

        asyncio.run_coroutine_threadsafe(switch(), self._loop).result(timeout=10)

    def timings(self, clear: bool = False) -> dict[str, Any]:
        """``/sim/timings`` without HTTP: {"requests": {X-Request-Id: {"received_at", "event_times",
        "event_tokens", "ended_at", "status"}}, ...}, read on the server's own loop."""
        log = self._timings
        if log is None:
            raise RuntimeError("timings are not recorded: start the server with record_timings=True")
        if self._loop is None:
            raise RuntimeError("the server is not running")

        async def read() -> dict[str, Any]:
            return log.snapshot(clear)

        return asyncio.run_coroutine_threadsafe(read(), self._loop).result(timeout=10)

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # surfaced by start(); a thread has nowhere else to report it
            self._error = exc
            self._ready.set()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        app = SimApp(self.config, self._timings, self.dialect)
        self.app = app
        # handler_cancellation: a client that hangs up cancels its handler, which aborts its request
        runner = web.AppRunner(
            app.web_app, access_log=None, handler_cancellation=True, shutdown_timeout=SHUTDOWN_SECONDS
        )
        await runner.setup()
        listener = None
        if self._timings is not None and isinstance(runner.server, web.Server):
            listener = stamping_listener(runner.server, self.host, self.port, LISTEN_BACKLOG)
        try:
            if listener is not None:
                site: web.BaseSite = web.SockSite(runner, listener, backlog=LISTEN_BACKLOG)
            else:
                site = web.TCPSite(runner, self.host, self.port, backlog=LISTEN_BACKLOG)
            await site.start()
            self.port = runner.addresses[0][1]
            engine_task = asyncio.create_task(app.runner.run(), name="llmdiag-sim-engine")
            stopping = asyncio.create_task(self._stop.wait())
            self._ready.set()
            await asyncio.wait([engine_task, stopping], return_when=asyncio.FIRST_COMPLETED)
            if engine_task.done() and not engine_task.cancelled() and engine_task.exception() is not None:
                self.failure = engine_task.exception()  # a bug: end every stream instead of hanging the clients
            engine_task.cancel()
            stopping.cancel()
            app.shutdown()
            await asyncio.sleep(0)  # let the handlers just woken finish their streams
        finally:
            await runner.cleanup()
