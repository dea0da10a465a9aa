"""The simulator's aiohttp application: the OpenAI routes over one engine, the dialect's pages, /tokenize and the
simulator's own pages.

    GET  /metrics                 vLLM 0.33's Prometheus page (``llmdiag.sim.metrics``)
    GET  /dcgm/metrics            dcgm-exporter's page for the simulated GPUs
    GET  /health  /v1/models  /version
                                  with ``dialect=`` another server's pages instead of /metrics and /version
                                  (``llmdiag.sim.dialects``: SGLang, TGI, llama.cpp, TensorRT-LLM ...), rendered
                                  from the same engine; the OpenAI routes below are served in every dialect
    GET  /sim/stats               the simulator's own numbers (steps, KV blocks, how long its clock stood still
                                  behind real time: ``lag_seconds`` of ``real_seconds``) as JSON
    GET  /sim/timings             with ``record_timings``: when each request arrived and each SSE event was written,
                                  keyed by the client's X-Request-Id (``?clear=1`` empties it; ``llmdiag.sim.timings``)
    POST /v1/completions  /v1/chat/completions
                                  OpenAI-compatible, streaming (SSE) or not, ``stream_options.include_usage``
    POST /tokenize                vLLM's: {"prompt": str} or {"messages": [...]} → {"count", "max_model_len",
                                  "tokens", "token_strs"}, counted as the engine counts (``llmdiag.sim.openai``)

Tokens leave when the engine produces them: at the end of each simulated step every request with new tokens gets
one SSE event carrying them (one token per event in steady decode; a handler that falls behind sends what piled up
in one event, as vLLM's ``--stream-interval`` does).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from llmdiag.errors import UsageError
from llmdiag.sim.dialects import Dialect, Page, PageUnavailable, SimState, get_dialect
from llmdiag.sim.engine import AdmissionRejected, Engine, EngineConfig, FinishReason, SimRequest
from llmdiag.sim.metrics import CONTENT_TYPE, HttpCounts, dcgm_registry, render
from llmdiag.sim.openai import (
    BUSY_MESSAGE,
    BadRequest,
    OutputText,
    SseEvents,
    chat_prompt_tokens,
    completion_prompt_tokens,
    error_response,
    int_param,
    json_object,
    token_id,
    words_of,
)
from llmdiag.sim.presets import Preset, get_preset
from llmdiag.sim.realtime import EngineRunner
from llmdiag.sim.timings import ARRIVAL_KEY, RequestTimings, TimingLog, take_arrival


@dataclass(frozen=True)
class SimConfig:
    """One simulated server: the engine and the HTTP front end's knobs."""

    engine: EngineConfig
    default_max_tokens: int = 256  # max_tokens when a request leaves it out
    stop_after_tokens: int | None = None  # None: the model never says EOS; outputs run to max_tokens
    time_scale: float = 1.0  # simulated seconds per real second; a real-time scraper sees rates × time_scale

    def __post_init__(self) -> None:
        if self.time_scale <= 0:
            raise UsageError(f"time_scale must be positive, got {self.time_scale:g}")
        if self.default_max_tokens < 1:
            raise UsageError("default_max_tokens must be at least 1")


def as_config(what: str | Preset | SimConfig | EngineConfig) -> SimConfig:
    if isinstance(what, SimConfig):
        return what
    if isinstance(what, EngineConfig):
        return SimConfig(engine=what)
    preset = get_preset(what) if isinstance(what, str) else what
    return SimConfig(engine=preset.engine)


class SimApp:
    """The aiohttp application: the OpenAI routes over one engine, and the dialect's pages (vLLM's by default)."""

    def __init__(self, config: SimConfig, timings: TimingLog | None = None, dialect: str | Dialect = "vllm") -> None:
        self.config = config
        self.timings = timings  # None: not recorded
        self.dialect = get_dialect(dialect) if isinstance(dialect, str) else dialect
        self.engine = Engine(config.engine)
        self.runner = EngineRunner(self.engine, config.time_scale)
        self.wall_start = time.time()
        self.http = HttpCounts()
        self.dcgm_registry = dcgm_registry(self.engine, self.runner.clock)
        self.model = config.engine.served_model_name
        self._model_json = json.dumps(self.model)
        self._text = OutputText(config.engine.model_len)
        self._ids = itertools.count(1)
        state = SimState(
            self.engine, self.runner.clock, self.wall_start, self.http, self.model, config.engine.model_len
        )
        self.pages = dict(self.dialect.setup(state))
        middlewares = [take_arrival]
        if self.dialect.headers:
            middlewares.append(_with_headers(dict(self.dialect.headers)))
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=middlewares)
        for path in self.pages:
            if path != "/v1/models":
                app.router.add_get(path, self._page(path))
        app.router.add_get("/dcgm/metrics", self.dcgm_metrics)
        if "/health" not in self.pages:
            app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/sim/stats", self.sim_stats)
        app.router.add_get("/sim/timings", self.sim_timings)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        self.web_app = app

    def _page(self, path: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            self.runner.settle()  # a late runner must not show a queue the engine does not have at this time
            return await _page_handler(self.pages[path])(request)  # looked up per request: ``switch`` rebuilds them

        return handle

    def switch(self, config: SimConfig) -> None:
        """Restart in place with another setup (same port, same dialect): what is in flight ends as aborted, the
        counters start from zero as a restarted server's do, and every page reads the new engine. On the loop."""
        old = self.engine
        self.config = config
        self.engine = Engine(config.engine)
        self.runner.engine = self.engine
        for request in old.abort_all(self.runner.clock()):
            if request.listener is not None:
                request.listener()
        self.dcgm_registry = dcgm_registry(self.engine, self.runner.clock)
        self.model = config.engine.served_model_name
        self._model_json = json.dumps(self.model)
        self._text = OutputText(config.engine.model_len)
        state = SimState(
            self.engine, self.runner.clock, self.wall_start, self.http, self.model, config.engine.model_len
        )
        self.pages = dict(self.dialect.setup(state))
        self.runner.wake()

    # --- plain endpoints ------------------------------------------------------------------------------

    async def dcgm_metrics(self, request: web.Request) -> web.Response:
        self.runner.settle()
        return web.Response(body=render(self.dcgm_registry), headers={"Content-Type": CONTENT_TYPE})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        created = int(self.wall_start)
        card = {
            "id": self.model,
            "object": "model",
            "created": created,
            "owned_by": self.dialect.owned_by,
            "root": self.model,
            "parent": None,
            "max_model_len": self.config.engine.model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def sim_stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.snapshot())

    async def sim_timings(self, request: web.Request) -> web.Response:
        if self.timings is None:
            return error_response(
                404, "timings are not recorded: start the simulator with record_timings=True", "NotFoundError"
            )
        return web.json_response(self.timings.snapshot(clear=request.query.get("clear") in ("1", "true")))

    def _serves(self, body: dict[str, Any]) -> bool:
        """Whether the request names this server's model (or none, which vLLM takes as its own)."""
        return body.get("model") is None or body.get("model") == self.model

    @staticmethod
    def _unknown_model(body: dict[str, Any]) -> web.Response:
        return error_response(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's POST /tokenize, counted as the engine counts prompts (one token per word)."""
        try:
            body = await json_object(request)
            if not self._serves(body):
                return self._unknown_model(body)
            words = words_of(body.get("prompt"), body.get("messages"))
        except BadRequest as exc:
            return error_response(400, str(exc))
        tokens = [token_id(w) for w in words]
        strs = words if body.get("return_token_strs") else None
        return web.json_response(
            {"count": len(tokens), "max_model_len": self.config.engine.model_len, "tokens": tokens, "token_strs": strs}
        )

    def snapshot(self) -> dict[str, Any]:
        """The engine's state at the simulated clock; ``lag_seconds`` of the ``real_seconds`` since the start the
        clock stood still because the host was late (``llmdiag.sim.realtime``)."""
        self.runner.settle()
        engine, stats = self.engine, self.engine.stats
        return {
            "clock_seconds": self.runner.clock(),
            "real_seconds": self.runner.real_seconds(),
            "lag_seconds": self.runner.lag_seconds,
            "steps": stats.steps,
            "busy_seconds": stats.step_seconds,
            "running": len(engine.running),
            "waiting": len(engine.waiting),
            "kv_usage_ratio": engine.kv_usage,
            "free_blocks": engine.free_blocks,
            "num_gpu_blocks": engine.num_gpu_blocks,
            "prompt_tokens": stats.prompt_tokens,
            "generation_tokens": stats.generation_tokens,
            "preemptions": stats.preemptions,
            "request_success": dict(stats.request_success),
            "admission_rejections": dict(stats.admission_rejections),
        }

    # --- generation -----------------------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    def _sizes(self, body: dict[str, Any], chat: bool) -> tuple[int, int, int, FinishReason]:
        """(prompt tokens, max_tokens, output tokens, finish reason) as vLLM would settle them."""
        prompt = chat_prompt_tokens(body.get("messages")) if chat else completion_prompt_tokens(body.get("prompt"))
        max_len = self.config.engine.model_len
        n = int_param(body, "n", 1)
        if n not in (None, 1):
            raise BadRequest("the simulator serves n=1 only")
        max_tokens = int_param(body, "max_completion_tokens", 1) if chat else None
        max_tokens = max_tokens or int_param(body, "max_tokens", 1)
        if max_tokens is None:
            max_tokens = min(self.config.default_max_tokens, max_len - prompt)
        if max_tokens < 1 or prompt + max_tokens > max_len:
            raise BadRequest(
                f"This model's maximum context length is {max_len} tokens. However, you requested "
                f"{prompt + max_tokens} tokens ({prompt} in the messages, {max_tokens} in the completion). "
                "Please reduce the length of the messages or completion."
            )
        min_tokens = int_param(body, "min_tokens", 0) or 0
        if min_tokens > max_tokens:
            raise BadRequest(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.")
        stop_at = self.config.stop_after_tokens
        if stop_at is not None and not body.get("ignore_eos") and max(min_tokens, stop_at) < max_tokens:
            return prompt, max_tokens, max(1, min_tokens, stop_at), "stop"
        return prompt, max_tokens, max_tokens, "length"

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        # when the request's bytes arrived (stamped by llmdiag.sim.timings when timings are recorded): under a
        # thousand streams the handler starts tens of milliseconds later, behind the event loop's other work
        arrived_at = request.get(ARRIVAL_KEY)
        received_at = arrived_at if arrived_at is not None else time.monotonic()
        handler = request.path
        timings = None
        if self.timings is not None and "X-Request-Id" in request.headers:
            timings = self.timings.start(request.headers["X-Request-Id"], received_at)
        try:
            response = await self._answer(request, chat, handler, timings)
        finally:
            if timings is not None:
                timings.ended_at = time.monotonic()
        if timings is not None:
            timings.status = response.status
        return response

    async def _answer(
        self, request: web.Request, chat: bool, handler: str, timings: RequestTimings | None
    ) -> web.StreamResponse:
        try:
            body = await json_object(request)
            if not self._serves(body):
                self.http.add(handler, "POST", 404)
                return self._unknown_model(body)
            prompt, max_tokens, output, reason = self._sizes(body, chat)
        except BadRequest as exc:
            self.http.add(handler, "POST", 400)
            return error_response(400, str(exc))
        self.runner.settle()  # stamped in simulated time, after the steps that have ended by now
        sim = SimRequest(f"{next(self._ids):x}", prompt, output, self.runner.clock(), reason, max_tokens)
        try:
            self.engine.add_request(sim)
        except AdmissionRejected:
            self.http.add(handler, "POST", 503)
            return error_response(503, BUSY_MESSAGE, "Service Unavailable")
        self.runner.wake()
        self.http.add(handler, "POST", 200)
        stream = bool(body.get("stream"))
        options = body.get("stream_options")
        usage = stream and isinstance(options, dict) and bool(options.get("include_usage"))
        try:
            if stream:
                return await self._stream(request, sim, chat, usage, timings)
            return await self._whole(sim, chat)
        finally:
            if not sim.finished:  # the client went away (handler cancelled) or writing failed
                self.engine.abort(sim, self.runner.clock())

    async def _whole(self, sim: SimRequest, chat: bool) -> web.Response:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def on_output() -> None:
            if sim.finished and not done.done():
                done.set_result(None)

        sim.listener = on_output
        await done
        text = self._text.span(0, sim.generated)
        usage = {
            "prompt_tokens": sim.prompt_tokens,
            "total_tokens": sim.prompt_tokens + sim.generated,
            "completion_tokens": sim.generated,
        }
        head = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{sim.request_id}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model,
        }
        choice: dict[str, Any] = {"index": 0}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice.update(logprobs=None, finish_reason=sim.finish_reason, stop_reason=None)
        return web.json_response({**head, "choices": [choice], "usage": usage})

    async def _stream(
        self, request: web.Request, sim: SimRequest, chat: bool, usage: bool, timings: RequestTimings | None
    ) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        waiter: list[asyncio.Future[None] | None] = [None]

        def on_output() -> None:
            future = waiter[0]
            if future is not None and not future.done():
                future.set_result(None)

        sim.listener = on_output
        events = SseEvents(sim.request_id, self._model_json, chat)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        try:
            pending = events.role() if chat else b""  # vLLM's first chat event names the role
            sent = 0
            while True:
                if sim.generated == sent and not sim.finished:
                    waiter[0] = output_ready = loop.create_future()
                    await output_ready
                produced = sim.generated
                if produced == sent and not sim.finished:
                    continue
                reason = sim.finish_reason if sim.finished else None
                event = pending + events.tokens(self._text.span(sent, produced), reason)
                if timings is not None:
                    timings.event_times.append(time.monotonic())
                    timings.event_tokens.append(produced - sent)
                await response.write(event)
                pending, sent = b"", produced
                if sim.finished:
                    break
            if usage:
                await response.write(events.usage(sim.prompt_tokens, sim.generated))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionError:  # the client hung up mid-stream; _generate aborts the request
            pass
        return response

    def shutdown(self) -> None:
        self.runner.shutdown()


def _page_handler(page: Page) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        try:
            result = page()
        except PageUnavailable as exc:
            return error_response(404, str(exc), "NotFoundError")
        body, content_type = result[0], result[1]
        status = result[2] if len(result) > 2 else 200
        return web.Response(status=status, body=body, headers={"Content-Type": content_type})

    return handle


def _with_headers(headers: dict[str, str]):
    """A middleware adding the dialect's response headers (e.g. ``server``) to every answer."""

    @web.middleware
    async def add(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        response = await handler(request)
        if not response.prepared:
            for name, value in headers.items():
                response.headers[name] = value
        return response

    return add
