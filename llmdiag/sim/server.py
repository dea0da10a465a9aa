"""The simulated inference server: the engine run in (scaled) real time behind vLLM's HTTP API, on aiohttp.

    SimServer(preset_or_config)   a context manager; its own event loop in a background thread, bound to
                                  127.0.0.1 (port 0 by default); ``.url``, ``.metrics_url``, ``.dcgm_url``;
                                  ``.switch_preset(name)`` restarts it in place in another preset (counters reset)
    GET  /metrics                 vLLM 0.33's Prometheus page (``llmdiag.sim.metrics``)
    GET  /dcgm/metrics            dcgm-exporter's page for the simulated GPUs
    GET  /health  /v1/models  /version
                                  with ``dialect=`` another server's pages instead of /metrics and /version
                                  (``llmdiag.sim.dialects``: SGLang, TGI, llama.cpp, TensorRT-LLM ...), rendered
                                  from the same engine; the OpenAI routes below are served in every dialect
    GET  /sim/stats               the simulator's own numbers (steps, lag behind real time, KV blocks) as JSON
    GET  /sim/timings             with ``record_timings``: when each request arrived and each SSE event was written,
                                  keyed by the client's X-Request-Id (``?clear=1`` empties it); see below
    POST /v1/completions  /v1/chat/completions
                                  OpenAI-compatible, streaming (SSE) or not, ``stream_options.include_usage``
    POST /tokenize                vLLM's: {"prompt": str} or {"messages": [...]} → {"count", "max_model_len",
                                  "tokens", "token_strs"}, counted as the engine counts (below)

What a request costs the engine:
    prompt tokens   ≈ one per whitespace-separated word of the prompt (or of the chat messages' text), one per
                    id when the prompt is a list of token ids; at least 1. Real BPE tokenizers give ~1.3 tokens
                    per English word; the simulator keeps the estimate simple so that a load generator can aim at
                    a prompt length by counting words.
    output tokens   ``max_tokens`` (``max_completion_tokens`` for chat; ``default_max_tokens`` when absent), finish
                    reason "length". When the config sets ``stop_after_tokens`` (a model that says EOS there) and
                    the request does not set ``ignore_eos``, the output stops at max(min_tokens, stop_after_tokens)
                    with reason "stop" if that comes first.
    rejections      when --max-num-queued-reqs is reached: HTTP 503 with vLLM's message, counted in
                    ``vllm:admission_rejections_total{reason="max_num_queued_reqs"}``.

Tokens leave when the engine produces them: at the end of each simulated step every request with new tokens gets
one SSE event carrying them (one token per event in steady decode; a handler that falls behind sends what piled up
in one event, as vLLM's ``--stream-interval`` does). The output text is a fixed cycle of plain words.

Timing: the engine's clock is ``time.monotonic()`` × ``time_scale`` from the server's start. A step ends
``step_time`` after it starts; the runner sleeps until then, delivers the tokens and starts the next step at that
end, so timer jitter does not slow the simulated GPU. When the host cannot keep up (more than
``LAG_TOLERANCE_SECONDS`` late), the next step starts at the real time instead and the gap is counted as lag
(``/sim/stats``): the pages then report what clients really saw.

Server-side timings (off by default; ``SimServer(..., record_timings=True)``): for each request that carries an
``X-Request-Id`` header, ``received_at`` (when its first bytes arrived on the connection), ``event_times`` (just
before each content event is written) with ``event_tokens`` (tokens in each), and ``ended_at``, all
``time.monotonic()`` seconds: one clock for every process of the machine, so a client's own timestamps can be
compared with them. The last
``max_timed_requests`` requests are kept; the cost is a float and an int appended per event.

The load driver ``ClosedLoopLoad`` is ``llmdiag.client.runners.BackgroundLoad`` with the preset's LoadSpec.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import threading
import time
import zlib
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from llmdiag.client.result import RequestPlan, RequestResult
from llmdiag.client.runners import BackgroundLoad
from llmdiag.client.rxtime import StampingListener, StampingSocket
from llmdiag.client.rxtime import listener as rx_listener
from llmdiag.errors import UsageError
from llmdiag.sim.dialects import Dialect, Page, PageUnavailable, SimState, get_dialect
from llmdiag.sim.engine import AdmissionRejected, Engine, EngineConfig, FinishReason, SimRequest
from llmdiag.sim.metrics import CONTENT_TYPE, HttpCounts, dcgm_registry, render
from llmdiag.sim.presets import LoadSpec, Preset, get_preset

BUSY_MESSAGE = (
    "The engine is currently busy and cannot accept new requests. Please try again later or on a different instance."
)
LAG_TOLERANCE_SECONDS = 0.05
SHUTDOWN_SECONDS = 2.0
MAX_TIMED_REQUESTS = 4096  # server-side timings kept, newest first out
LISTEN_BACKLOG = 4096  # a thousand users connect at once
VOCABULARY_SIZE = 32_000  # /tokenize's ids: a hash of each word (the engine needs only counts)
WORDS = (
    "the",
    "model",
    "answers",
    "with",
    "plain",
    "words",
    "so",
    "that",
    "every",
    "token",
    "is",
    "one",
    "word",
    "and",
    "nothing",
    "needs",
    "escaping",
    "in",
    "json",
)


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


class BadRequest(Exception):
    """A request the OpenAI API would refuse with HTTP 400."""


class _Text:
    """The output text: token i is " " + WORDS[i % len(WORDS)]; slices by token index, no per-token objects."""

    def __init__(self, tokens: int) -> None:
        pieces = [" " + WORDS[i % len(WORDS)] for i in range(tokens)]
        self.offsets = [0, *itertools.accumulate(len(p) for p in pieces)]
        self.text = "".join(pieces)

    def span(self, start: int, end: int) -> str:
        return self.text[self.offsets[start] : self.offsets[end]]


def _count_words(text: object) -> int:
    return len(text.split()) if isinstance(text, str) else 0


def completion_prompt_tokens(prompt: object) -> int:
    """The prompt's token estimate: words of a string, ids of a token list; one prompt per request."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return max(1, _count_words(prompt))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return len(prompt)
    if isinstance(prompt, list) and len(prompt) > 1:
        raise BadRequest("the simulator serves one prompt per request")
    raise BadRequest("'prompt' must be a string or a list of token ids")


def chat_prompt_tokens(messages: object) -> int:
    """Words of every message's text (string content or text parts)."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    words = 0
    for message in messages:
        if not isinstance(message, dict):
            raise BadRequest("each message must be an object with 'role' and 'content'")
        content = message.get("content")
        if isinstance(content, list):
            words += sum(_count_words(part.get("text")) for part in content if isinstance(part, dict))
        else:
            words += _count_words(content)
    return max(1, words)


def _words_of(prompt: object, messages: object) -> list[str]:
    """The words the engine counts: of a completion prompt, or of the chat messages' text."""
    if messages is not None:
        chat_prompt_tokens(messages)  # validates
        texts: list[str] = []
        for message in messages:  # type: ignore[union-attr]
            content = message.get("content")
            if isinstance(content, list):
                texts += [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
            elif isinstance(content, str):
                texts.append(content)
        return " ".join(texts).split()
    if isinstance(prompt, str):
        return prompt.split()
    raise BadRequest("'prompt' must be a string (or give 'messages')")


def _token_id(word: str) -> int:
    return zlib.crc32(word.encode()) % VOCABULARY_SIZE


def _int_param(body: dict[str, Any], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BadRequest(f"'{name}' must be an integer >= {minimum}, got {value!r}")
    return value


def _error_body(status: int, message: str, kind: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": status}}).encode()


def error_response(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    return web.Response(status=status, body=_error_body(status, message, kind), content_type="application/json")


class _SseEvents:
    """vLLM's SSE events for one request. Every event shares a head; the text is plain words from WORDS, so it goes
    in without JSON escaping (the hot path formats strings instead of calling json.dumps per token)."""

    def __init__(self, request_id: str, model_json: str, chat: bool) -> None:
        self.chat = chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{request_id}"
        self.object = "chat.completion.chunk" if chat else "text_completion"
        self.created = int(time.time())
        self.model_json = model_json
        self.head = (
            f'data: {{"id":"{self.id}","object":"{self.object}","created":{self.created},'
            f'"model":{model_json},"choices":[{{"index":0,'
        )

    def role(self) -> bytes:
        delta = '"delta":{"role":"assistant","content":""}'
        return f'{self.head}{delta},"logprobs":null,"finish_reason":null}}]}}\n\n'.encode()

    def tokens(self, text: str, finish_reason: str | None) -> bytes:
        reason = f'"{finish_reason}"' if finish_reason else "null"
        if self.chat:
            delta = f'"delta":{{"content":"{text}"}}'
            return f'{self.head}{delta},"logprobs":null,"finish_reason":{reason}}}]}}\n\n'.encode()
        return (
            f'{self.head}"text":"{text}","logprobs":null,"finish_reason":{reason},"stop_reason":null}}],'
            '"usage":null}\n\n'
        ).encode()

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        """The last event with stream_options.include_usage: no choices, the token counts."""
        numbers = {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        }
        chunk = {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": json.loads(self.model_json),
            "choices": [],
            "usage": numbers,
        }
        return f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode()


class RequestTimings:
    """One request's server-side timestamps (``time.monotonic()``): appended to on the hot path, so slots."""

    __slots__ = ("received_at", "event_times", "event_tokens", "ended_at", "status")

    def __init__(self, received_at: float) -> None:
        self.received_at = received_at
        self.event_times: list[float] = []
        self.event_tokens: list[int] = []
        self.ended_at: float | None = None
        self.status: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "received_at": self.received_at,
            "event_times": self.event_times,
            "event_tokens": self.event_tokens,
            "ended_at": self.ended_at,
            "status": self.status,
        }


class TimingLog:
    """The last ``capacity`` requests' timings, keyed by the client's X-Request-Id."""

    def __init__(self, capacity: int = MAX_TIMED_REQUESTS) -> None:
        if capacity < 1:
            raise UsageError(f"max_timed_requests must be at least 1, got {capacity}")
        self.capacity = capacity
        self.requests: OrderedDict[str, RequestTimings] = OrderedDict()
        self.dropped = 0

    def start(self, request_id: str, received_at: float) -> RequestTimings:
        timings = self.requests[request_id] = RequestTimings(received_at)
        if len(self.requests) > self.capacity:
            self.requests.popitem(last=False)
            self.dropped += 1
        return timings

    def snapshot(self, clear: bool = False) -> dict[str, Any]:
        out = {
            "clock": "time.monotonic",
            "capacity": self.capacity,
            "dropped": self.dropped,
            "requests": {rid: t.as_dict() for rid, t in self.requests.items()},
        }
        if clear:
            self.requests = OrderedDict()
            self.dropped = 0
        return out


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
        self._text = _Text(config.engine.model_len)
        self._ids = itertools.count(1)
        state = SimState(
            self.engine, self.runner.clock, self.wall_start, self.http, self.model, config.engine.model_len
        )
        self.pages = dict(self.dialect.setup(state))
        middlewares = [_forget_arrival]
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
        self._text = _Text(config.engine.model_len)
        state = SimState(
            self.engine, self.runner.clock, self.wall_start, self.http, self.model, config.engine.model_len
        )
        self.pages = dict(self.dialect.setup(state))
        self.runner.wake()

    # --- plain endpoints ------------------------------------------------------------------------------

    async def dcgm_metrics(self, request: web.Request) -> web.Response:
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
            body = await _json_object(request)
            if not self._serves(body):
                return self._unknown_model(body)
            words = _words_of(body.get("prompt"), body.get("messages"))
        except BadRequest as exc:
            return error_response(400, str(exc))
        tokens = [_token_id(w) for w in words]
        strs = words if body.get("return_token_strs") else None
        return web.json_response(
            {"count": len(tokens), "max_model_len": self.config.engine.model_len, "tokens": tokens, "token_strs": strs}
        )

    def snapshot(self) -> dict[str, Any]:
        engine, stats = self.engine, self.engine.stats
        return {
            "clock_seconds": self.runner.clock(),
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
        n = _int_param(body, "n", 1)
        if n not in (None, 1):
            raise BadRequest("the simulator serves n=1 only")
        max_tokens = _int_param(body, "max_completion_tokens", 1) if chat else None
        max_tokens = max_tokens or _int_param(body, "max_tokens", 1)
        if max_tokens is None:
            max_tokens = min(self.config.default_max_tokens, max_len - prompt)
        if max_tokens < 1 or prompt + max_tokens > max_len:
            raise BadRequest(
                f"This model's maximum context length is {max_len} tokens. However, you requested "
                f"{prompt + max_tokens} tokens ({prompt} in the messages, {max_tokens} in the completion). "
                "Please reduce the length of the messages or completion."
            )
        min_tokens = _int_param(body, "min_tokens", 0) or 0
        if min_tokens > max_tokens:
            raise BadRequest(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.")
        stop_at = self.config.stop_after_tokens
        if stop_at is not None and not body.get("ignore_eos") and max(min_tokens, stop_at) < max_tokens:
            return prompt, max_tokens, max(1, min_tokens, stop_at), "stop"
        return prompt, max_tokens, max_tokens, "length"

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        # when the request's bytes arrived (stamped by _ArrivalStampingHandler when timings are recorded): under a
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
            body = await _json_object(request)
            if not self._serves(body):
                self.http.add(handler, "POST", 404)
                return self._unknown_model(body)
            prompt, max_tokens, output, reason = self._sizes(body, chat)
        except BadRequest as exc:
            self.http.add(handler, "POST", 400)
            return error_response(400, str(exc))
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
        events = _SseEvents(sim.request_id, self._model_json, chat)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        try:
            pending = events.role() if chat else b""  # vLLM's first chat event names the role
            sent = 0
            while True:
                if sim.generated == sent and not sim.finished:
                    waiter[0] = loop.create_future()
                    await waiter[0]
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


async def _json_object(request: web.Request) -> dict[str, Any]:
    """The request's JSON object body, or BadRequest in vLLM's words."""
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadRequest("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


class _ArrivalStampingHandler(web.RequestHandler):
    """aiohttp's connection protocol, stamping when a request's first bytes reached the machine (timings only):
    the kernel's receive stamp of the read, from the listener's StampingSocket for this connection."""

    llmdiag_arrived_at: float | None = None
    _rx: StampingSocket | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        listener = getattr(self._manager, "llmdiag_listener", None)
        sock = transport.get_extra_info("socket")
        if listener is not None and sock is not None:
            self._rx = listener.accepted.get(sock.fileno())
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        # the first read of a request's head (not the rest of a body that came in a later read)
        if self.llmdiag_arrived_at is None and data[:8].split(b" ", 1)[0] in _METHODS:
            rx = self._rx
            self.llmdiag_arrived_at = rx.arrived_at if rx is not None else time.monotonic()
        super().data_received(data)


_METHODS = frozenset((b"GET", b"POST", b"PUT", b"HEAD", b"DELETE", b"OPTIONS", b"PATCH"))
# where a request keeps its arrival stamp (aiohttp >= 3.12 wants typed keys for request storage)
ARRIVAL_KEY: Any = web.RequestKey("llmdiag_arrived_at", float) if hasattr(web, "RequestKey") else "llmdiag_arrived_at"


def _page_handler(page: Page) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        try:
            result = page()
        except PageUnavailable as exc:
            return error_response(404, str(exc), "NotFoundError")
        body, content_type = result[0], result[1]
        status = result[2] if len(result) > 2 else 200  # type: ignore[misc]
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


@web.middleware
async def _forget_arrival(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    """As every request starts, whatever its route, it takes its arrival stamp off the connection, so that the next
    request stamps its own: a client may send the next one before this one's handler has returned."""
    protocol = request.protocol
    arrived_at = getattr(protocol, "llmdiag_arrived_at", None)
    if arrived_at is not None:
        request[ARRIVAL_KEY] = arrived_at
        protocol.llmdiag_arrived_at = None  # type: ignore[union-attr]
    return await handler(request)


class _ArrivalStampingServer(web.Server):
    llmdiag_listener: StampingListener | None = None

    def __call__(self) -> web.RequestHandler:
        return _ArrivalStampingHandler(self, loop=self._loop, **self._kwargs)


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
            runner.server.__class__ = _ArrivalStampingServer  # only to hand out the stamping protocol
            listener = runner.server.llmdiag_listener = rx_listener(self.host, self.port, LISTEN_BACKLOG)
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


# --- a bounded closed-loop load ------------------------------------------------------------------------------


@dataclass
class LoadStats:
    """What the simulator's load saw, counted as requests end."""

    started: int = 0
    ok: int = 0
    rejected: int = 0  # HTTP 503
    errors: Counter[str] = field(default_factory=Counter)  # other failures: "HTTP 500", "connect", "stream" ...
    completion_tokens: int = 0
    ttft_seconds: list[float] = field(default_factory=list)  # client side, successful requests: sent → first token

    def add(self, result: RequestResult) -> None:
        if result.ok:
            self.ok += 1
            self.completion_tokens += result.output_tokens or 0
            if result.ttft_seconds is not None:
                self.ttft_seconds.append(result.ttft_seconds)
        elif result.error_kind == "cancelled":
            return
        elif result.error_kind == "http" and result.status == 503:
            self.rejected += 1
        elif result.error_kind == "http":
            self.errors[f"HTTP {result.status}"] += 1
        else:
            self.errors[result.error_kind or "error"] += 1


class ClosedLoopLoad(BackgroundLoad):
    """A preset's load: ``load.users`` users on their own event loop in a background thread, each sending one
    streaming /v1/completions request (ignore_eos, ``load.prompt_tokens`` words, max_tokens drawn from
    ``load.output_range()``, include_usage) and the next as soon as it ends; after an HTTP error it pauses
    ``error_backoff_seconds``. Stops after ``max_seconds`` or ``max_requests`` started requests, or when the
    context manager exits (in-flight requests are cancelled). Talks to loopback only. ``stats`` counts what it saw.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        load: LoadSpec,
        *,
        max_seconds: float = 60.0,
        max_requests: int | None = None,
        error_backoff_seconds: float = 0.05,
        chat: bool = False,
        seed: int = 0,
    ) -> None:
        rng = random.Random(seed)
        prompt = " ".join(WORDS[i % len(WORDS)] for i in range(load.prompt_tokens))  # the engine counts words
        low, high = load.output_range()

        def plan() -> RequestPlan:
            self.stats.started += 1
            return RequestPlan(prompt, rng.randint(low, high), chat=chat)

        self.load = load
        self.stats = LoadStats()
        # no idle timeout worth the name: a deep simulated queue can hold a request for minutes; the run's own
        # deadline bounds it
        super().__init__(
            base_url,
            plan,
            users=load.users,
            duration_seconds=max_seconds,
            max_requests=max_requests,
            model=model,
            timeout_seconds=max(max_seconds, 60.0),
            on_result=self.stats.add,
            error_backoff_seconds=error_backoff_seconds,
            seed=seed,
            name="llmdiag-sim-load",
        )


def run_for(server: SimServer, load: LoadSpec, seconds: float, **kwargs: Any) -> LoadStats:
    """Drive ``load`` against ``server`` for ``seconds`` and return what the clients saw (a blocking helper)."""
    driver = ClosedLoopLoad(server.url, server.model, load, max_seconds=seconds, **kwargs)
    with driver:
        driver.wait(seconds + 10)
    return driver.stats
