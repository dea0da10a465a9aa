"""Bounded closed-loop load generator for a vLLM OpenAI server on loopback.

``Load`` runs an asyncio loop with aiohttp in a background thread: ``users``
concurrent "users", each sending one streaming ``/v1/completions`` request and
the next one as soon as the previous ends. It stops after ``max_seconds`` or
``max_requests`` (started requests), or when the context manager exits
(in-flight requests are cancelled, which aborts them in vLLM).

    with Load(server.base_url, server.model_name, users=4) as load:
        time.sleep(10)
    print(load.stats.ok, load.stats.http_errors)
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlparse

import aiohttp

# Short common words; most are one or two tokens in the stdlib-trained BPE.
WORDS = (
    "the", "of", "and", "to", "in", "is", "for", "on", "that", "with", "as", "by", "it",
    "at", "from", "this", "be", "or", "are", "an", "not", "if", "else", "return", "import",
    "def", "class", "self", "none", "true", "false", "value", "name", "data", "list",
    "dict", "type", "file", "path", "line", "text", "time", "size", "item", "key", "error",
    "result", "test", "object", "string", "number", "index", "start", "end", "read",
    "write", "open", "close", "call", "args", "kwargs", "default", "module", "method",
    "function", "local", "global", "node", "tree", "next", "first", "last", "count",
    "total", "state", "mode", "flag", "info", "level", "format", "print", "buffer",
    "stream", "socket", "server", "client", "request", "response", "header", "body",
    "status", "code", "message",
)


@dataclass
class LoadStats:
    started: int = 0
    ok: int = 0
    http_errors: Counter = field(default_factory=Counter)  # status -> count
    # errors sent inside an already started (HTTP 200) stream, by their "code"
    stream_errors: Counter = field(default_factory=Counter)
    exceptions: Counter = field(default_factory=Counter)   # exception type -> count
    cancelled: int = 0
    completion_tokens: int = 0
    ttfts: list = field(default_factory=list)      # client-side seconds
    latencies: list = field(default_factory=list)  # client-side seconds (ok requests)
    last_error: str | None = None
    error_messages: Counter = field(default_factory=Counter)  # first 160 chars -> count
    prompt_words: int | None = None
    prompt_tokens_measured: int | None = None

    @property
    def errors_total(self) -> int:
        return (sum(self.http_errors.values()) + sum(self.stream_errors.values())
                + sum(self.exceptions.values()))

    def count_status(self, status: int) -> int:
        """Requests rejected with this status, as an HTTP status or in-stream error."""
        return self.http_errors.get(status, 0) + self.stream_errors.get(status, 0)

    def as_dict(self) -> dict:
        def pct(xs, q):
            if not xs:
                return None
            s = sorted(xs)
            return s[min(len(s) - 1, int(q * len(s)))]
        return {
            "started": self.started, "ok": self.ok,
            "http_errors": {str(k): v for k, v in sorted(self.http_errors.items())},
            "stream_errors": {str(k): v for k, v in sorted(self.stream_errors.items(),
                                                           key=lambda kv: str(kv[0]))},
            "exceptions": dict(self.exceptions), "cancelled": self.cancelled,
            "completion_tokens": self.completion_tokens,
            "client_ttft_p50": pct(self.ttfts, 0.5),
            "client_latency_p50": pct(self.latencies, 0.5),
            "prompt_words": self.prompt_words,
            "prompt_tokens_measured": self.prompt_tokens_measured,
            "last_error": self.last_error,
            "error_messages": dict(self.error_messages.most_common(5)),
        }


class Load:
    def __init__(self, base_url: str, model: str, *, users: int = 4,
                 prompt_tokens: int = 64, output_tokens: int = 128,
                 max_seconds: float = 120.0, max_requests: int = 100_000,
                 error_backoff: float = 0.1, request_timeout: float = 600.0,
                 seed: int | None = 0) -> None:
        host = urlparse(base_url).hostname
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"load generator only talks to loopback, not {host!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.users = users
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.max_seconds = max_seconds
        self.max_requests = max_requests
        self.error_backoff = error_backoff
        self.request_timeout = request_timeout
        self.stats = LoadStats()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._done = threading.Event()
        self._words_per_prompt = max(1, prompt_tokens)
        self.error: BaseException | None = None
        self.started_at: float | None = None
        self.stopped_at: float | None = None

    # -- public ---------------------------------------------------------------
    def start(self) -> Load:
        self._thread = threading.Thread(target=self._thread_main, name="llmdiag-load",
                                        daemon=True)
        self._thread.start()
        self._ready.wait(timeout=60)
        if self.error:
            raise self.error
        return self

    def stop(self, timeout: float = 30.0) -> None:
        if self._loop is not None and self._stop is not None and not self._done.is_set():
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the load ends by itself (max_seconds / max_requests)."""
        return self._done.wait(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> Load:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- internals ------------------------------------------------------------
    def _thread_main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except BaseException as exc:  # surfaced via .error
            self.error = exc
        finally:
            self._ready.set()
            self._done.set()
            self.stopped_at = time.time()
            loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        timeout = aiohttp.ClientTimeout(total=self.request_timeout)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            await self._calibrate(session)
            self.started_at = time.time()
            self._ready.set()
            tasks = [asyncio.create_task(self._user(session)) for _ in range(self.users)]
            stopper = asyncio.create_task(self._stop.wait())
            try:
                await asyncio.wait([stopper, *tasks], timeout=self.max_seconds,
                                   return_when=asyncio.FIRST_COMPLETED)
                # Either stop was requested, time ran out, or a user finished
                # (max_requests reached): wait for the remaining users to hit
                # the request budget unless stop/time says otherwise.
                remaining = self.max_seconds - (time.time() - self.started_at)
                if not self._stop.is_set() and remaining > 0:
                    await asyncio.wait([stopper, asyncio.gather(*tasks)],
                                       timeout=remaining,
                                       return_when=asyncio.FIRST_COMPLETED)
            finally:
                self._stop.set()
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                stopper.cancel()

    async def _calibrate(self, session: aiohttp.ClientSession) -> None:
        """Pick the number of random words so the prompt is about prompt_tokens."""
        sample = " ".join(self._rng.choice(WORDS) for _ in range(400))
        ratio = 1.3  # tokens per word if /tokenize is unavailable
        try:
            async with session.post(self.base_url + "/tokenize",
                                    json={"model": self.model, "prompt": sample,
                                          "add_special_tokens": False}) as r:
                if r.status == 200:
                    body = await r.json()
                    n = body.get("count") or len(body.get("tokens", []))
                    if n:
                        ratio = n / 400
        except aiohttp.ClientError:
            pass
        self._words_per_prompt = max(1, round(self.prompt_tokens / ratio))
        self.stats.prompt_words = self._words_per_prompt
        try:
            async with session.post(self.base_url + "/tokenize",
                                    json={"model": self.model, "prompt": self._prompt()}) as r:
                if r.status == 200:
                    body = await r.json()
                    self.stats.prompt_tokens_measured = body.get("count")
        except aiohttp.ClientError:
            pass

    def _prompt(self) -> str:
        return " ".join(self._rng.choice(WORDS) for _ in range(self._words_per_prompt))

    def _claim_request(self) -> bool:
        with self._lock:
            if self.stats.started >= self.max_requests:
                return False
            self.stats.started += 1
            return True

    async def _user(self, session: aiohttp.ClientSession) -> None:
        assert self._stop is not None
        while not self._stop.is_set() and self._claim_request():
            ok = False
            try:
                ok = await self._one_request(session)
            except asyncio.CancelledError:
                with self._lock:
                    self.stats.cancelled += 1
                raise
            except Exception as exc:  # connection reset, timeout, bad stream ...
                with self._lock:
                    self.stats.exceptions[type(exc).__name__] += 1
                    self.stats.last_error = repr(exc)
                    self.stats.error_messages[repr(exc)[:160]] += 1
            if not ok and self.error_backoff:
                await asyncio.sleep(self.error_backoff)

    async def _one_request(self, session: aiohttp.ClientSession) -> bool:
        payload = {
            "model": self.model,
            "prompt": self._prompt(),
            "max_tokens": self.output_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            "temperature": 1.0,
        }
        t0 = time.monotonic()
        ttft = None
        usage_tokens = None
        async with session.post(self.base_url + "/v1/completions", json=payload) as r:
            if r.status != 200:
                text = await r.text()
                with self._lock:
                    self.stats.http_errors[r.status] += 1
                    self.stats.last_error = f"HTTP {r.status}: {text[:200]}"
                    self.stats.error_messages[f"HTTP {r.status}: {text[:150]}"] += 1
                return False
            # Parse as little JSON as possible: this process shares the two
            # cores with the server, and every chunk is one token.
            async for raw in r.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                if ttft is None:
                    ttft = time.monotonic() - t0
                if b'"error"' in data or b'"usage":{' in data.replace(b" ", b""):
                    chunk = json.loads(data)
                    if chunk.get("error"):
                        err = chunk["error"]
                        code = err.get("code") if isinstance(err, dict) else None
                        msg = err.get("message") if isinstance(err, dict) else err
                        with self._lock:
                            self.stats.stream_errors[code] += 1
                            self.stats.last_error = f"in-stream {code}: {msg}"
                            self.stats.error_messages[f"in-stream {code}: {str(msg)[:140]}"] += 1
                        return False
                    if chunk.get("usage"):
                        usage_tokens = chunk["usage"].get("completion_tokens")
        with self._lock:
            self.stats.ok += 1
            self.stats.completion_tokens += usage_tokens or 0
            if ttft is not None:
                self.stats.ttfts.append(ttft)
            self.stats.latencies.append(time.monotonic() - t0)
        return True
