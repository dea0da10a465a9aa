"""What users actually get: an async client for the OpenAI-compatible API, prompts of a chosen length, and bounded
load runners, all measured from the client side.

    OpenAIClient(base_url, ...)     async context manager; ``complete()`` sends one /v1/completions or
                                    /v1/chat/completions request (SSE streaming or not) and returns a RequestResult;
                                    ``models()``, ``count_tokens()`` (vLLM's /tokenize)
    RequestResult                   one request as the user saw it: TTFT, every inter-token gap, end-to-end time,
                                    tokens, HTTP status, and the error with its kind when it failed
    RequestPlan                     what to send next (prompt, max_tokens, chat, stream, ...)
    PromptFactory                   prompts of a requested token length from random common words
    closed_loop(), open_loop()      N users each sending its next request when the last ends, or Poisson arrivals;
                                    bounded by a duration and a request count
    BackgroundLoad                  either runner on its own event loop in a thread, for sync code

Why a small HTTP/1.1 client of its own instead of aiohttp or httpx: the cost and the accuracy of the per-token
path. Each SSE event is timestamped in ``data_received``, when the bytes come off the socket, not after a task
wake-up behind every other ready callback; and the event is looked at with a few ``bytes.find`` calls on the
received buffer (no copies, no JSON parsing) unless it is not a plain content event: only the final usage event, an
error event or something odd is parsed. Sockets are read into one preallocated buffer (``BufferedProtocol``), so a
read allocates nothing. Measured on a 2-core machine against a trivial SSE server in another process (300 streams,
an event every 20 ms): about 11 µs of CPU per streamed event in all, of which about 2 µs is this module's parsing
and the rest the event loop and the system calls; aiohttp reading the same streams with ``iter_any`` and one
``bytes.count`` per read took 25–32 µs, and httpx costs more than aiohttp. Connections are kept alive and reused,
one per request in flight (``max_connections`` caps them; 0: no cap). TLS goes through the standard ``ssl``
module. Proxies, redirects and compressed bodies are not supported (the client asks for ``identity``).

Failures are results, never exceptions: ``complete()`` returns a RequestResult whose ``error_kind`` is one of

    connect     the TCP connection or TLS handshake failed (refused, DNS, certificate, too many open files)
    http        the server answered a status other than 2xx (429, 503, 500, ...); the body's message is kept
    timeout     no bytes for ``timeout_seconds`` (while connecting, waiting for the answer, or mid-stream)
    stream      the answer broke: connection dropped mid-body, malformed HTTP or SSE, an error event inside the
                stream (its ``code`` in ``error_code``), a stream that ended without ``data: [DONE]``
    cancelled   the caller cancelled it (a runner does at its deadline); not an error of the server

and what was received before the failure is kept (token times, output tokens counted from the events, text size).

Timestamps come from ``time.monotonic()``, which on Linux is one clock for every process of the machine, so they can
be compared with a server's own (the simulator's ``/sim/timings``). Arrivals are the kernel's receive stamps of each
read (``llmdiag.collect.rxtime``): when the bytes reached the machine, not when this process got round to them.
The API key is sent as a bearer token and appears in no error, result or repr.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
import ipaddress
import itertools
import json
import math
import random
import re
import secrets
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from llmdiag.collect.http import Connection, normalise_base_url, redact_url
from llmdiag.collect.rxtime import StampingSocket
from llmdiag.errors import ConnectError, HTTPStatusError, ProbeError, ProbeTimeout, UsageError

try:  # not on every platform
    import resource
except ImportError:  # pragma: no cover
    resource = None  # type: ignore[assignment]

DEFAULT_TIMEOUT_SECONDS = 60.0
DEFAULT_ERROR_BACKOFF_SECONDS = 0.1
MAX_RETRY_AFTER_SECONDS = 1.0  # a runner honours Retry-After up to this; a load run is short
READ_BUFFER_BYTES = 256 * 1024  # one socket read at most (asyncio's own read size)
MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024  # a non-streamed answer
MAX_ERROR_BODY_BYTES = 64 * 1024  # what is kept of an error body
MAX_SSE_EVENT_BYTES = 4 * 1024 * 1024
ERROR_TEXT_CHARS = 300
OPEN_FILES_MARGIN = 64  # sockets beyond one per user: the event loop, logs, the pool's spares

ERROR_KINDS = ("connect", "http", "timeout", "stream", "cancelled")

_monotonic = time.monotonic

# --- results -------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class RequestResult:
    """One request as its user saw it. Times are ``time.monotonic()`` seconds.

    ``token_times`` holds the arrival time of every content-bearing SSE event (non-empty text, content or reasoning
    content). One event may carry more than one token (a server that falls behind sends what piled up in one event),
    so ``len(token_times)`` can be below ``output_tokens``; gaps of 0 in ``itl_seconds`` are events that arrived in
    the same read. ``output_tokens_from`` says where ``output_tokens`` came from: "usage" (the streamed usage event,
    asked for with ``stream_options.include_usage``), "body" (the usage object of a non-streamed answer) or
    "chunks" (content-bearing events counted: a lower bound). ``received_text_chars`` is the size of the generated
    text received: characters for ASCII text, UTF-8 bytes otherwise (counted without decoding, to keep the per-token
    cost down); an escape such as ``\\n`` counts as one.

    ``error`` is None on success; otherwise ``error_kind`` says which kind of failure (see the module docstring),
    ``status`` is the HTTP status when one arrived, and ``error_code`` is the ``code`` of an OpenAI-style error
    object (an HTTP error body or an error event inside the stream), e.g. 503 or "rate_limit_exceeded".
    """

    request_id: str
    started_at: float  # when the request was sent (after the connection was ready)
    first_token_at: float | None = None
    token_times: list[float] = field(default_factory=list)
    ended_at: float = 0.0
    output_tokens: int | None = None
    output_tokens_from: str = "chunks"  # "usage" | "chunks" | "body"
    prompt_tokens: int | None = None
    status: int | None = None
    error: str | None = None
    error_kind: str | None = None  # "connect" | "http" | "timeout" | "stream" | "cancelled"
    received_text_chars: int = 0
    error_code: int | str | None = None
    retry_after_seconds: float | None = None  # the server's Retry-After header on an error answer

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft_seconds(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.started_at

    @property
    def e2e_seconds(self) -> float:
        return self.ended_at - self.started_at

    @property
    def itl_seconds(self) -> list[float]:
        times = self.token_times
        return [later - earlier for earlier, later in zip(times, times[1:], strict=False)]

    @property
    def tpot_seconds(self) -> float | None:
        """Time per output token after the first: (end − first token) / (output tokens − 1)."""
        if self.first_token_at is None or self.output_tokens is None or self.output_tokens < 2:
            return None
        return (self.ended_at - self.first_token_at) / (self.output_tokens - 1)

    @property
    def tokens_per_second(self) -> float | None:
        e2e = self.e2e_seconds
        if not self.output_tokens or e2e <= 0:
            return None
        return self.output_tokens / e2e


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """The next request to send. ``extra_body`` is merged into the JSON body last (e.g. temperature)."""

    prompt: str | list[int]
    max_tokens: int
    chat: bool = False
    stream: bool = True
    ignore_eos: bool = True
    min_tokens: int | None = None
    request_id: str | None = None
    extra_body: Mapping[str, Any] | None = None


RequestFactory = Callable[[], "RequestPlan | Awaitable[RequestPlan]"]
ResultCallback = Callable[[RequestResult], None]

# --- the HTTP/1.1 connection: the hot path ---------------------------------------------------------------------

_HEAD, _BODY, _IDLE = 0, 1, 2
_CHUNKED, _LENGTH, _UNTIL_CLOSE = 0, 1, 2
_CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _CHUNK_TRAILER = 0, 1, 2, 3
_STALE = object()  # the waiter's value when a reused keep-alive connection was closed before any answer
_STALE_ERRORS = (ConnectionResetError, BrokenPipeError)

_CONTENT_RE = re.compile(rb'"(?:text|content|reasoning_content|reasoning)"\s*:\s*"')
_USAGE_RE = re.compile(rb'"usage"\s*:\s*\{')
_DATA_OBJECT = (b"data: {", b"data:{")
_DONE_EVENTS = (b"data: [DONE]", b"data:[DONE]")
_QUOTE, _CLOSE_BRACE, _NEWLINE = 34, 125, 10


def _text_of(choice: Any) -> str:
    """The generated text of one choice, streamed (delta) or not (message), completions or chat."""
    if not isinstance(choice, dict):
        return ""
    parts = [choice.get("text")]
    for holder in (choice.get("delta"), choice.get("message")):
        if isinstance(holder, dict):
            parts += [holder.get("content"), holder.get("reasoning_content"), holder.get("reasoning")]
    return "".join(p for p in parts if isinstance(p, str))


def _error_message(body: bytes) -> tuple[str, int | str | None]:
    """The message and code of an error body: OpenAI's {"error": {...}}, FastAPI's {"detail": ...}, or the text."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        return " ".join(text.split())[:ERROR_TEXT_CHARS], None
    code = None
    message: Any = parsed
    if isinstance(parsed, dict):
        inner = parsed.get("error", parsed)
        if isinstance(inner, dict):
            message = inner.get("message") or inner.get("detail") or inner
            code = inner.get("code")
            if isinstance(code, bool) or not isinstance(code, (int, str)):
                code = None
        elif inner is not None:
            message = inner
        if message is parsed and "detail" in parsed:
            message = parsed["detail"]
    if not isinstance(message, str):
        message = json.dumps(message)
    return " ".join(message.split())[:ERROR_TEXT_CHARS], code


class _Connection(asyncio.BufferedProtocol):
    """One keep-alive HTTP/1.1 connection, one exchange at a time. Parses the answer as it arrives: the head, the
    body's framing (chunked, Content-Length or until close), then SSE events or a whole body.

    The socket is read into ``buffer``, shared by all of a client's connections: the event loop hands each read
    to ``buffer_updated`` at once, which copies out only what must outlive it (a split event, a body). A plain
    Protocol would get a new bytes object per read, which costs an allocation of the loop's whole read size and,
    depending on the heap, a brk or mmap system call or two each time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_seconds: float, buffer: bytearray) -> None:
        self._loop = loop
        self._buffer = buffer
        self._view = memoryview(buffer)
        self._timeout = timeout_seconds
        self.transport: asyncio.Transport | None = None
        self.rx: StampingSocket | None = None  # the socket, whose reads are stamped with the kernel's arrival time
        self.closed = False
        self.exchanges = 0
        self._state = _IDLE
        self._waiter: asyncio.Future[Any] | None = None
        self._result: RequestResult | None = None
        self._append: Callable[[float], None] = _ignore
        self._timer: asyncio.TimerHandle | None = None
        self._reset(b'"text":"')

    def _reset(self, content_key: bytes) -> None:
        self._content_key = content_key
        self._key_length = len(content_key)
        self._head = b""
        self._framing = _UNTIL_CLOSE
        self._left = 0  # body bytes left in the Content-Length body or in the current chunk
        self._chunk_stage = _CHUNK_SIZE
        self._line = b""  # a chunk-size line split across reads
        self._sse = False
        self._pending = b""  # an SSE event split across reads
        self._cr_held = False  # a CR at the end of the last read (CRLF line endings)
        self._body: list[bytes] = []
        self._body_size = 0
        self._received = 0
        self._done = False  # data: [DONE] seen
        self._usage: bytes | dict[str, Any] | None = None
        self._chars = 0
        self._keep_alive = True
        self._last_arrival = 0.0
        self._completion = True
        self.body = b""  # a whole (non-SSE) answer, once read

    # asyncio.BufferedProtocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._state == _IDLE:
            return
        if self._received == 0 and self.exchanges > 1 and (exc is None or isinstance(exc, _STALE_ERRORS)):
            if self._timer is not None:
                self._timer.cancel()
            self._result, self._append = None, _ignore
            self._settle(_STALE)  # the server had closed the idle connection: retry on a new one
            return
        if self._state == _BODY and self._framing == _UNTIL_CLOSE:
            self._end_of_body(_monotonic())
            return
        where = "before answering" if self._received == 0 else "mid-answer"
        reason = f" ({exc.strerror or type(exc).__name__})" if isinstance(exc, OSError) else ""
        self._fail("stream", f"the server closed the connection {where}{reason}{self._so_far()}")

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view  # a view: the TLS reader fills it in parts through slices, which must not be copies

    def buffer_updated(self, nbytes: int) -> None:
        """``nbytes`` new bytes at the start of the shared buffer; read here and now (the next read reuses it)."""
        rx = self.rx
        now = rx.arrived_at if rx is not None else _monotonic()  # arrival time: when the kernel got the bytes
        self._last_arrival = now
        self._received += nbytes
        state = self._state
        data = self._buffer
        if state == _BODY:
            if self._framing == _CHUNKED:
                self._feed_chunked(data, 0, nbytes, now)
            elif self._framing == _LENGTH:
                self._feed_length(data, 0, nbytes, now)
            else:
                self._payload(data, 0, nbytes, now)
        elif state == _HEAD:
            self._feed_head(bytes(data[:nbytes]), now)
        else:  # bytes nobody asked for: the connection cannot be trusted for another request
            self.abort()

    # the exchange

    def begin(self, result: RequestResult, request: bytes, chat: bool, completion: bool = True) -> asyncio.Future[Any]:
        """Send ``request``; the future resolves when the answer has been read (or failed) into ``result``.
        ``completion``: a non-streamed 2xx body is a completion, read for its usage and text."""
        self.exchanges += 1
        self._reset(b'"content":"' if chat else b'"text":"')
        self._completion = completion
        self._result = result
        self._append = result.token_times.append
        self._state = _HEAD
        waiter = self._waiter = self._loop.create_future()
        assert self.transport is not None
        now = _monotonic()
        result.started_at = self._last_arrival = now
        self.transport.write(request)
        self._timer = self._loop.call_at(now + self._timeout, self._check_idle)
        return waiter

    def abandon(self, kind: str, message: str) -> None:
        """End the exchange from outside (cancelled): keep what arrived, drop the connection."""
        if self._state != _IDLE:
            self._fail(kind, message)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    @property
    def reusable(self) -> bool:
        return not self.closed and self._keep_alive and self._state == _IDLE and not self.transport.is_closing()  # type: ignore[union-attr]

    def _check_idle(self) -> None:
        if self._state == _IDLE:
            return
        due = self._last_arrival + self._timeout
        if self._loop.time() >= due - 0.001:
            what = "no answer" if self._received == 0 else "no bytes"
            self._fail("timeout", f"{what} from the server for {self._timeout:g} s{self._so_far()}")
        else:
            self._timer = self._loop.call_at(due, self._check_idle)

    # the head

    def _feed_head(self, data: bytes, now: float) -> None:
        buffer = self._head + data if self._head else data
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(buffer) > MAX_HEAD_BYTES:
                self._fail("stream", f"the answer's HTTP head is larger than {MAX_HEAD_BYTES} bytes")
            else:
                self._head = buffer
            return
        self._head = b""
        lines = buffer[:end].split(b"\r\n")
        status_line = lines[0].split(None, 2)
        try:
            if not status_line[0].startswith(b"HTTP/1."):
                raise ValueError
            status = int(status_line[1])
        except (IndexError, ValueError):
            self._fail("stream", f"not an HTTP answer: {lines[0][:80]!r}")
            return
        length: int | None = None
        chunked = False
        content_type = b""
        keep_alive = status_line[0] != b"HTTP/1.0"
        retry_after: float | None = None
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            value = value.strip()
            if name == b"content-length":
                try:
                    length = int(value)
                    if length < 0:
                        raise ValueError
                except ValueError:
                    self._fail("stream", f"a bad Content-Length: {value[:40]!r}")
                    return
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                keep_alive = b"close" not in value.lower() and (keep_alive or b"keep-alive" in value.lower())
            elif name == b"content-type":
                content_type = value.lower()
            elif name == b"retry-after":
                try:
                    retry_after = max(0.0, float(value))
                except ValueError:
                    retry_after = None  # an HTTP date: not worth parsing for a short back-off
        rest = end + 4
        if 100 <= status < 200:  # an interim answer (100 Continue, 103 Early Hints): the real one follows
            if rest < len(buffer):
                self._feed_head(buffer[rest:], now)
            return
        result = self._result
        assert result is not None
        result.status = status
        result.retry_after_seconds = retry_after if status >= 400 else None
        self._keep_alive = keep_alive
        self._sse = 200 <= status < 300 and b"text/event-stream" in content_type
        self._state = _BODY
        if chunked:
            self._framing = _CHUNKED
        elif length is not None or status in (204, 304):
            self._framing, self._left = _LENGTH, length or 0
            if self._left == 0:
                self._end_of_body(now)
                return
        else:
            self._framing = _UNTIL_CLOSE
        if rest < len(buffer):
            if self._framing == _CHUNKED:
                self._feed_chunked(buffer, rest, len(buffer), now)
            elif self._framing == _LENGTH:
                self._feed_length(buffer, rest, len(buffer), now)
            else:
                self._payload(buffer, rest, len(buffer), now)

    # the body's framing

    def _feed_length(self, data: bytes, pos: int, end: int, now: float) -> None:
        take = min(self._left, end - pos)
        self._left -= take
        self._payload(data, pos, pos + take, now)
        if self._left == 0 and self._state == _BODY:
            if pos + take < end:
                self._keep_alive = False  # bytes after the body
            self._end_of_body(now)

    def _feed_chunked(self, data: bytes, pos: int, end: int, now: float) -> None:
        while pos < end and self._state == _BODY:
            stage = self._chunk_stage
            if stage == _CHUNK_DATA:
                take = min(self._left, end - pos)
                self._left -= take
                if self._left == 0:
                    self._chunk_stage = _CHUNK_CRLF
                self._payload(data, pos, pos + take, now)
                pos += take
                continue
            if stage == _CHUNK_CRLF and not self._line and data.startswith(b"\r\n", pos):
                self._chunk_stage = _CHUNK_SIZE
                pos += 2
                continue
            newline = data.find(b"\n", pos, end)
            if newline < 0:
                self._line += data[pos:end]
                if len(self._line) > 1024:
                    self._fail("stream", "a chunk-size line longer than 1 KiB: not chunked encoding")
                return
            line = data[pos:newline]
            if self._line:
                line, self._line = self._line + line, b""
            pos = newline + 1
            line = line.rstrip(b"\r")
            if stage == _CHUNK_SIZE:
                try:
                    size = int(line.split(b";", 1)[0], 16)
                except ValueError:
                    self._fail("stream", f"a bad chunk-size line: {bytes(line[:40])!r}")
                    return
                if size:
                    self._chunk_stage, self._left = _CHUNK_DATA, size
                else:
                    self._chunk_stage = _CHUNK_TRAILER
            elif stage == _CHUNK_CRLF:
                if line:
                    self._fail("stream", "a chunk longer than its size line said")
                    return
                self._chunk_stage = _CHUNK_SIZE
            elif not line:  # the blank line after the last chunk's trailers
                if newline + 1 < end:
                    self._keep_alive = False
                self._end_of_body(now)
                return

    # the payload: SSE events, or a whole body

    def _payload(self, data: bytes, start: int, end: int, now: float) -> None:
        if start >= end:
            return
        if self._sse:
            self._feed_sse(data, start, end, now)
            return
        self._body_size += end - start
        limit = MAX_BODY_BYTES if self._result is not None and self._result.status == 200 else MAX_ERROR_BODY_BYTES
        if self._body_size <= limit:
            self._body.append(data[start:end])
        elif self._result is not None and self._result.status == 200:
            self._fail("stream", f"the answer is larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB")
        else:
            self._keep_alive = False  # the rest of a long error page is dropped

    def _feed_sse(self, data: bytes, start: int, end: int, now: float) -> None:
        if self._pending or self._cr_held or data.find(b"\r", start, end) >= 0:
            data = self._join_pending(data[start:end])
            start, end = 0, len(data)
        last = data.rfind(b"\n\n", start, end)
        if last < 0:
            self._pending = data[start:end]
            if len(self._pending) > MAX_SSE_EVENT_BYTES:
                self._fail("stream", f"an SSE event longer than {MAX_SSE_EVENT_BYTES // (1024 * 1024)} MiB")
            return
        stop = last + 2
        if stop < end:
            self._pending = data[stop:end]
        if data.find(b"\n\n", start, last) < 0:  # one event: the usual case
            self._event(data, start, last, now)
            return
        pos = start
        while pos < stop and self._state == _BODY:
            while pos < stop and data[pos] == _NEWLINE:
                pos += 1
            if pos >= stop:
                break
            boundary = data.find(b"\n\n", pos, stop)
            self._event(data, pos, boundary, now)
            pos = boundary + 2

    def _join_pending(self, piece: bytes) -> bytes:
        """The slow path: an event split across reads, or CR / CRLF line endings (normalised to LF)."""
        joined = self._pending + (b"\r" if self._cr_held else b"") + piece
        self._pending, self._cr_held = b"", False
        if joined.endswith(b"\r"):  # maybe half of a CRLF: decide with the next read
            joined, self._cr_held = joined[:-1], True
        if b"\r" in joined:
            joined = joined.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        return joined

    def _event(self, data: bytes, start: int, end: int, now: float) -> None:
        """One SSE event, data[start:end] without its blank line. The fast path reads a plain content event with
        three finds; anything else goes to _event_slowly."""
        if self._done:
            return
        if data.startswith(_DATA_OBJECT, start) and data[end - 1] == _CLOSE_BRACE:
            key = data.find(self._content_key, start, end)
            if key >= 0:
                text_start = key + self._key_length
                if data[text_start] != _QUOTE:  # non-empty text
                    close = data.find(b'"', text_start, end)
                    if close > 0 and data.find(b"\\", text_start, close) < 0:  # no escapes: count bytes
                        self._append(now)
                        self._chars += close - text_start
                        return
        self._event_slowly(bytes(data[start:end]), now)

    def _event_slowly(self, event: bytes, now: float) -> None:
        if event.startswith(_DONE_EVENTS) and event.rstrip().endswith(b"[DONE]"):
            self._done = True
            return
        if event.startswith(_DATA_OBJECT) and event.rstrip().endswith(b"}"):
            # a one-line JSON event: usage, the role, an empty text, spaced JSON, escapes, an error
            matches = [m for m in _CONTENT_RE.finditer(event) if event[m.end() : m.end() + 1] != b'"']
            if not matches or b'"error"' in event or any(b"\\" in event[m.end() :] for m in matches):
                # parsed: the few events without text (role, finish, usage; validated on the way), errors, and
                # text with escapes (decoded to count it exactly)
                self._parse_event(event[5:], now)
                return
            # text events of a server that writes spaced JSON, or with reasoning content
            self._append(now)
            for match in matches:
                self._chars += event.find(b'"', match.end()) - match.end()
            if _USAGE_RE.search(event):
                self._usage = event[5:]  # with continuous usage stats; parsed once, at the end
            return
        # the general SSE grammar: comments, event/id/retry fields, data split over several lines
        data_lines = []
        for line in event.split(b"\n"):
            if not line or line.startswith(b":"):
                continue
            name, colon, value = line.partition(b":")
            if name == b"data":
                data_lines.append(value[1:] if value.startswith(b" ") else value)
            elif not colon or name not in (b"event", b"id", b"retry"):
                self._fail("stream", f"a malformed SSE line: {line[:120]!r}{self._so_far()}")
                return
        if not data_lines:
            return  # a comment or keep-alive
        payload = b"\n".join(data_lines).strip()
        if payload == b"[DONE]":
            self._done = True
            return
        self._parse_event(payload, now)

    def _parse_event(self, payload: bytes, now: float) -> None:
        try:
            chunk = json.loads(payload)
        except ValueError:
            self._fail("stream", f"an SSE event that is not JSON: {payload[:120]!r}{self._so_far()}")
            return
        if not isinstance(chunk, dict):
            self._fail("stream", f"an SSE event that is not a JSON object: {payload[:120]!r}{self._so_far()}")
            return
        if chunk.get("error"):
            message, code = _error_message(json.dumps(chunk).encode())
            result = self._result
            if result is not None:
                result.error_code = code
            self._fail("stream", f"the server sent an error inside the stream: {message}{self._so_far()}")
            return
        choices = chunk.get("choices")
        text = "".join(_text_of(c) for c in choices) if isinstance(choices, list) else ""
        if text:
            self._append(now)
            self._chars += len(text)
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]

    # the end

    def _end_of_body(self, now: float) -> None:
        result = self._result
        assert result is not None
        if self._sse:
            if self._pending.strip() or self._cr_held:  # a last event without its blank line
                tail = self._join_pending(b"\n\n")
                if tail.strip():
                    self._feed_sse(tail, 0, len(tail), now)
                if self._state != _BODY:
                    return
            if self._framing == _UNTIL_CLOSE and not self._done:
                self._fail("stream", f"the stream ended without data: [DONE]{self._so_far()}")
                return
        status = result.status or 0
        body = b"".join(self._body)
        self._body = []
        if not 200 <= status < 300:
            message, code = _error_message(body)
            result.error_code = code
            self._finish(now, "http", f"HTTP {status}: {message}" if message else f"HTTP {status}")
            return
        if not self._sse:
            self.body = body
            if self._completion and not self._read_completion(body):
                return
        self._finish(now, None, None)

    def _read_completion(self, body: bytes) -> bool:
        """A non-streamed completion: its usage and text. False (and failed) when it is not one."""
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            self._fail("stream", f"the answer is not a JSON object: {body[:120]!r}")
            return False
        if answer.get("error"):
            message, code = _error_message(body)
            if self._result is not None:
                self._result.error_code = code
            self._fail("stream", f"the server answered an error: {message}")
            return False
        choices = answer.get("choices")
        self._chars = len("".join(_text_of(c) for c in choices)) if isinstance(choices, list) else 0
        self._usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else None
        return True

    def _fail(self, kind: str, message: str) -> None:
        self._keep_alive = False
        self._finish(_monotonic(), kind, message)
        self.abort()

    def _finish(self, now: float, kind: str | None, message: str | None) -> None:
        result = self._result
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._append = _ignore
        if result is not None:
            result.ended_at = now
            result.error_kind, result.error = kind, message
            times = result.token_times
            if times:
                result.first_token_at = times[0]
            result.received_text_chars = self._chars
            usage = self._usage
            if isinstance(usage, (bytes, bytearray)):
                try:
                    usage = json.loads(usage).get("usage")
                except (ValueError, AttributeError):
                    usage = None
            if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                result.output_tokens = usage["completion_tokens"]
                result.output_tokens_from = "usage" if self._sse else "body"
                prompt = usage.get("prompt_tokens")
                result.prompt_tokens = prompt if isinstance(prompt, int) else None
            elif self._sse or (kind is not None and times):
                result.output_tokens, result.output_tokens_from = len(times), "chunks"
            elif self._completion and result.status is not None and 200 <= result.status < 300:
                result.output_tokens_from = "body"  # a non-streamed answer without usage: unknown
        self._result = None
        self._settle(None)

    def _settle(self, value: object) -> None:
        waiter, self._waiter = self._waiter, None
        self._state = _IDLE
        if waiter is not None and not waiter.done():
            waiter.set_result(value)

    def _so_far(self) -> str:
        result = self._result
        if result is None:
            return ""
        events = len(result.token_times)
        return f" (after {self._received:,} bytes, {events:,} content events)" if self._received else ""


def _ignore(_: float) -> None:
    pass


# --- the client ----------------------------------------------------------------------------------------------


def _header_line(name: str, value: str) -> bytes:
    if not name or any(c in name for c in "\r\n:") or any(c in value for c in "\r\n"):
        raise UsageError(f"header {name!r} has a line break or colon where it cannot", "give headers as 'Name: value'")
    return f"{name}: {value}\r\n".encode("latin-1", errors="strict")


def _connect_failure(exc: BaseException, where: str) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS certificate of {where} not trusted ({exc.verify_message}); pass --insecure for a self-signed one"
    if isinstance(exc, ssl.SSLError):
        return f"TLS handshake with {where} failed ({exc.reason or exc})"
    if isinstance(exc, ConnectionRefusedError):
        return f"connection to {where} refused (nothing listens there)"
    if isinstance(exc, socket.gaierror):
        return f"the host of {where} does not resolve (DNS)"
    if isinstance(exc, OSError) and exc.errno == 24:
        return "too many open files: raise the limit (ulimit -n) or run fewer users"
    if isinstance(exc, OSError):
        return f"cannot connect to {where}: {exc.strerror or type(exc).__name__}"
    return f"cannot connect to {where}: {type(exc).__name__}"


class OpenAIClient:
    """An async client for one OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp, OpenAI ...).

        async with OpenAIClient("http://127.0.0.1:8000", model="m") as client:
            result = await client.complete("Hello", 64)

    ``base_url`` may end in /v1 or not. ``model=None`` takes the first model of /v1/models (once).
    ``timeout_seconds`` bounds every wait for bytes: connecting, the answer's first byte and each gap mid-stream
    (not the whole answer, which can rightly take minutes). ``insecure`` skips TLS verification.
    ``max_connections`` caps the requests in flight, and so the open connections (0: no cap).
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        insecure: bool = False,
        max_connections: int = 0,
    ) -> None:
        if timeout_seconds <= 0:
            raise UsageError(f"timeout_seconds must be positive, got {timeout_seconds:g}")
        if max_connections < 0:
            raise UsageError(f"max_connections must be 0 (no cap) or more, got {max_connections}")
        self.base_url = normalise_base_url(base_url)
        self.display_url = redact_url(self.base_url)
        parts = urlsplit(self.base_url)
        self.host = parts.hostname or ""
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        prefix = parts.path.rstrip("/")
        self._prefix = prefix[:-3] if prefix.endswith("/v1") else prefix
        self.model = model
        self.timeout_seconds = timeout_seconds
        self.max_connections = max_connections
        host_header = f"[{self.host}]" if ":" in self.host else self.host
        if parts.port is not None:
            host_header += f":{parts.port}"
        lines = [
            _header_line("Host", host_header),
            b"User-Agent: llmdiag\r\nAccept-Encoding: identity\r\nContent-Type: application/json\r\n",
        ]
        for name, value in (headers or {}).items():
            if name.lower() not in ("host", "content-length", "transfer-encoding"):
                lines.append(_header_line(name, value))
        if api_key:
            lines.append(_header_line("Authorization", f"Bearer {api_key}"))
        elif parts.username is not None and not any(n.lower() == "authorization" for n in headers or {}):
            basic = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            lines.append(_header_line("Authorization", f"Basic {base64.b64encode(basic).decode()}"))
        self._headers = b"".join(lines)  # the secrets live here and nowhere else
        self._ssl: ssl.SSLContext | None = None
        if self.tls:
            self._ssl = ssl.create_default_context()
            if insecure:
                self._ssl.check_hostname = False
                self._ssl.verify_mode = ssl.CERT_NONE
        self._idle: list[_Connection] = []
        self._read_buffer = bytearray(READ_BUFFER_BYTES)  # one for all connections: see _Connection
        self._slots = asyncio.Semaphore(max_connections) if max_connections else None
        self._id_prefix = secrets.token_hex(4)
        self._ids = itertools.count(1)
        self._model_checked = model is not None
        self._model_lookup: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return f"OpenAIClient({self.display_url!r}, model={self.model!r})"

    @classmethod
    def from_connection(cls, connection: Connection, **kwargs: Any) -> OpenAIClient:
        """A client with a scan's Connection (its URL, headers, API key and TLS choice)."""
        kwargs.setdefault("headers", connection.headers)
        kwargs.setdefault("api_key", connection.api_key)
        kwargs.setdefault("insecure", connection.insecure)
        return cls(connection.base_url, **kwargs)

    async def __aenter__(self) -> OpenAIClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the kept-alive connections (those in flight belong to their requests)."""
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.abort()  # no TLS close_notify exchange: nothing is left to say on an idle connection
        if idle:
            await asyncio.sleep(0)  # the transports close on the loop's next turn

    # requests

    def new_result(self, request_id: str | None = None) -> RequestResult:
        """A result to fill; its id goes to the server as X-Request-Id (unique per client unless given)."""
        if request_id is not None and (not request_id.isprintable() or not request_id.isascii()):
            raise UsageError(f"request ids are printable ASCII (they go in a header), got {request_id!r}")
        return RequestResult(request_id or f"llmdiag-{self._id_prefix}-{next(self._ids)}", _monotonic())

    async def complete(
        self,
        prompt: str | list[int],
        max_tokens: int,
        *,
        chat: bool = False,
        stream: bool = True,
        ignore_eos: bool = True,
        min_tokens: int | None = None,
        request_id: str | None = None,
    ) -> RequestResult:
        """Send one completion and read the whole answer. Failures are in the result, never raised (bad arguments
        raise UsageError). ``ignore_eos`` and ``min_tokens`` are vLLM's extensions: they make the output as long as
        asked; servers that do not know them may refuse them (HTTP 400, in the result)."""
        plan = RequestPlan(prompt, max_tokens, chat, stream, ignore_eos, min_tokens, request_id)
        result = self.new_result(request_id)
        await self.execute(plan, result)
        return result

    async def execute(self, plan: RequestPlan, result: RequestResult) -> None:
        """Send ``plan`` and fill ``result`` in place. Cancelled, it records the result as "cancelled" (with what
        had arrived) and re-raises, so a runner that cancels keeps the result it created."""
        if not self._model_checked:
            await self._default_model()
        path, body = self._completion(plan)
        request = b"POST %s HTTP/1.1\r\n%sAccept: %s\r\nContent-Length: %d\r\nX-Request-Id: %s\r\n\r\n%s" % (
            path,
            self._headers,
            b"text/event-stream" if plan.stream else b"application/json",
            len(body),
            result.request_id.encode(),
            body,
        )
        await self._exchange(request, result, plan.chat)

    def _completion(self, plan: RequestPlan) -> tuple[bytes, bytes]:
        if isinstance(plan.max_tokens, bool) or not isinstance(plan.max_tokens, int) or plan.max_tokens < 1:
            raise UsageError(f"max_tokens must be a positive integer, got {plan.max_tokens!r}")
        body: dict[str, Any] = {"model": self.model} if self.model else {}
        if plan.chat:
            if not isinstance(plan.prompt, str):
                raise UsageError("a chat request takes a text prompt, not token ids")
            body["messages"] = [{"role": "user", "content": plan.prompt}]
        else:
            body["prompt"] = plan.prompt
        body["max_tokens"] = plan.max_tokens
        if plan.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if plan.ignore_eos:
            body["ignore_eos"] = True
        if plan.min_tokens is not None:
            body["min_tokens"] = plan.min_tokens
        if plan.extra_body:
            body.update(plan.extra_body)
        path = f"{self._prefix}/v1/chat/completions" if plan.chat else f"{self._prefix}/v1/completions"
        return path.encode(), json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()

    async def _exchange(self, request: bytes, result: RequestResult, chat: bool, completion: bool = True) -> bytes:
        """Send ``request`` on a kept-alive or new connection and read the answer into ``result``; returns the
        answer's body when it was not an event stream."""
        slots = self._slots
        if slots is not None:
            await slots.acquire()
        connection: _Connection | None = None
        try:
            for _attempt in range(2):
                connection = await self._connection(result)
                if connection is None:
                    return b""
                outcome = await connection.begin(result, request, chat, completion)
                if outcome is not _STALE:
                    break
                connection = None  # a stale keep-alive connection: once more on a fresh one
            if connection is None:
                return b""
            if connection.reusable:
                self._idle.append(connection)
            return connection.body
        except asyncio.CancelledError:
            if connection is not None:
                connection.abandon("cancelled", "cancelled before the answer ended")
            if result.ended_at == 0.0:  # not finished: connecting, or waiting for a slot
                result.ended_at = _monotonic()
                result.error_kind, result.error = "cancelled", "cancelled before the answer ended"
            raise
        finally:
            if slots is not None:
                slots.release()

    async def _connection(self, result: RequestResult) -> _Connection | None:
        """A kept-alive connection, or a new one; None with the failure in ``result``."""
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable:
                return connection
        loop = asyncio.get_running_loop()
        connection = _Connection(loop, self.timeout_seconds, self._read_buffer)
        where = f"{self.host}:{self.port}"
        try:
            await asyncio.wait_for(self._connect(loop, connection), self.timeout_seconds)
        except asyncio.TimeoutError:
            result.ended_at = _monotonic()
            result.error_kind = "timeout"
            result.error = f"connecting to {where} took longer than {self.timeout_seconds:g} s"
            return None
        except (OSError, ssl.SSLError) as exc:
            result.ended_at = _monotonic()
            result.error_kind, result.error = "connect", _connect_failure(exc, where)
            await asyncio.sleep(0)  # asyncio closes a transport whose TLS handshake failed on the next turn
            return None
        return connection

    async def _connect(self, loop: asyncio.AbstractEventLoop, connection: _Connection) -> None:
        """Connect ``connection`` on a socket of our own: one whose reads carry the kernel's arrival stamps."""
        addresses = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        failure: OSError | None = None
        for family, kind, proto, _name, address in addresses:
            sock = StampingSocket(family, kind, proto)
            try:
                sock.setblocking(False)
                sock.enable_stamps()
                await loop.sock_connect(sock, address)
                connection.rx = sock
                await loop.create_connection(
                    lambda: connection, sock=sock, ssl=self._ssl, server_hostname=self.host if self._ssl else None
                )
                return
            except OSError as exc:
                sock.close()
                failure = exc
            except BaseException:
                sock.close()
                raise
        raise failure or OSError(f"{self.host} resolves to no address")

    async def request_json(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One small JSON request (GET /v1/models, POST /tokenize): (status, parsed body or None).
        Raises ConnectError, ProbeTimeout or ProbeError when no HTTP answer came."""
        payload = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        request = b"%s %s%s HTTP/1.1\r\n%sAccept: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
            method.encode(),
            self._prefix.encode(),
            path.encode(),
            self._headers,
            len(payload),
            payload,
        )
        result = self.new_result()
        answer = await self._exchange(request, result, chat=False, completion=False)
        url = f"{self.display_url}{path}"
        if result.error_kind == "connect":
            raise ConnectError(result.error or f"cannot connect to {url}")
        if result.error_kind == "timeout":
            raise ProbeTimeout(f"{url}: {result.error}")
        if result.status is None:
            raise ProbeError(f"{url}: {result.error}")
        try:
            parsed = json.loads(answer) if answer else None
        except ValueError:
            parsed = None
        return result.status, parsed

    async def models(self) -> list[str]:
        """The served model names (GET /v1/models)."""
        status, body = await self.request_json("GET", "/v1/models")
        if status != 200:
            raise HTTPStatusError(f"{self.display_url}/v1/models", status)
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise ProbeError(f"{self.display_url}/v1/models did not list models", "is this an OpenAI-compatible API?")
        return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]

    async def count_tokens(self, text: str) -> int | None:
        """The server's token count for ``text`` (vLLM's POST /tokenize); None when it has no such endpoint or it
        fails."""
        body: dict[str, Any] = {"prompt": text}
        if self.model:
            body["model"] = self.model
        try:
            status, parsed = await self.request_json("POST", "/tokenize", body)
        except ProbeError:
            return None
        if status != 200 or not isinstance(parsed, dict):
            return None
        count = parsed.get("count")
        if isinstance(count, int) and not isinstance(count, bool):
            return count
        tokens = parsed.get("tokens")
        return len(tokens) if isinstance(tokens, list) else None

    async def _default_model(self) -> None:
        """Look the model up once; requests that start meanwhile wait for the same lookup."""
        if self._model_lookup is None:
            self._model_lookup = asyncio.ensure_future(self._look_up_model())
        await asyncio.shield(self._model_lookup)

    async def _look_up_model(self) -> None:
        try:
            names = await self.models()
        except ProbeError:
            names = []  # send no model; the server may have a default
        if names and self.model is None:
            self.model = names[0]
        self._model_checked = True


# --- prompts of a chosen length ------------------------------------------------------------------------------

# Common, short English words. Each, with its leading space, is a single token in the vocabularies of the model
# families served most (Llama 2/3, Mistral, Qwen, GPT-2/4): hence the estimate of one token per word.
COMMON_WORDS = tuple(
    """the of and to in is for on that with as by it at from this be or are an not but have has had was were
    will would can could should may might must do does did done make made take took give gave get got go went come
    came see saw know knew think thought say said tell told ask asked work worked call called find found use used
    want need feel leave put mean keep let begin seem help show hear play run move live believe hold bring write
    sit stand lose pay meet include continue set learn change lead understand watch follow stop create speak read
    spend grow open walk win offer remember love consider appear buy wait serve die send expect build stay fall
    cut reach kill remain time year people way day man thing woman life child world school state family student
    group country problem hand part place case week company system program question number night point home water
    room mother area money story fact month lot right study book eye job word business issue side kind head house
    service friend father power hour game line end member law car city name team minute idea kid body information
    back parent face others level office door health person art war history party result change morning reason
    research girl guy moment air teacher force education good new first last long great little own other old big
    high different small large next early young important few public bad same able""".split()  # noqa: SIM905
)
DEFAULT_TOKENS_PER_WORD = 1.0  # see COMMON_WORDS; calibrated against the server's /tokenize where it has one
CALIBRATION_WORDS = 512


class PromptFactory:
    """Prompts of a requested token length from random common words, deterministic for a seed.

    The tokens-per-word ratio is measured once with the server's /tokenize (vLLM) when it has one (the count of a
    long sample minus the count of an empty prompt, which is the special tokens), otherwise
    DEFAULT_TOKENS_PER_WORD. ``prompt()`` then costs no request; ``exact_prompt()`` also checks the result with
    /tokenize and adds or drops words until it is right (a few requests; use it for canaries, not per request of a
    load). Every prompt is a new random draw, so a server's prefix cache cannot serve it.
    """

    def __init__(
        self,
        client: OpenAIClient | None = None,
        *,
        seed: int = 0,
        words: tuple[str, ...] = COMMON_WORDS,
        tokens_per_word: float | None = None,
    ) -> None:
        if not words:
            raise UsageError("PromptFactory needs at least one word")
        self.client = client
        self._rng = random.Random(seed)
        self._words = words
        self.tokens_per_word = tokens_per_word or DEFAULT_TOKENS_PER_WORD
        self.special_tokens = 0  # what the server adds to any prompt (BOS ...), when measured
        self.calibrated_from = "given" if tokens_per_word else "estimate"  # "tokenize" once measured
        self._calibrated = tokens_per_word is not None or client is None
        self._lock: asyncio.Lock | None = None

    def words_for(self, tokens: int) -> int:
        return max(1, round((tokens - self.special_tokens) / self.tokens_per_word))

    def text(self, words: int) -> str:
        choice, pool = self._rng.choice, self._words
        return " ".join(choice(pool) for _ in range(words))

    async def calibrate(self) -> float:
        """Tokens per word, measured with /tokenize once (or the estimate)."""
        if self._calibrated:
            return self.tokens_per_word
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if not self._calibrated and self.client is not None:
                sample = await self.client.count_tokens(self.text(CALIBRATION_WORDS))
                empty = await self.client.count_tokens("") if sample else None
                if sample and empty is not None and sample > empty:
                    self.special_tokens = empty
                    self.tokens_per_word = (sample - empty) / CALIBRATION_WORDS
                    self.calibrated_from = "tokenize"
            self._calibrated = True
        return self.tokens_per_word

    async def prompt(self, tokens: int) -> str:
        """About ``tokens`` tokens (exact on a server whose tokenizer makes each word one token)."""
        if tokens < 1:
            raise UsageError(f"a prompt needs at least one token, got {tokens}")
        await self.calibrate()
        return self.text(self.words_for(tokens))

    async def exact_prompt(self, tokens: int, attempts: int = 4) -> tuple[str, int | None]:
        """A prompt checked with /tokenize: (text, its token count; None where the server cannot count)."""
        words = (await self.prompt(tokens)).split()
        count = None
        for _ in range(attempts):
            count = await self.client.count_tokens(" ".join(words)) if self.client is not None else None
            if count is None or count == tokens:
                break
            missing = round((tokens - count) / self.tokens_per_word) or (1 if tokens > count else -1)
            if missing > 0:
                words += self.text(missing).split()
            else:
                words = words[: max(1, len(words) + missing)]
        return " ".join(words), count


# --- runners -------------------------------------------------------------------------------------------------

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def is_loopback(base_url: str) -> bool:
    host = (urlsplit(normalise_base_url(base_url)).hostname or "").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_target(base_url: str, allow_remote: bool) -> None:
    """Load goes to this machine only, unless the user says otherwise: a load run against someone's production
    server by a typo is the accident to prevent."""
    if not allow_remote and not is_loopback(base_url):
        raise UsageError(
            f"refusing to send load to {redact_url(base_url)}: it is not this machine",
            "pass --allow-remote (allow_remote=True) to load a server on another machine",
        )


def raise_open_files_limit(wanted: int) -> int:
    """Raise this process's soft limit on open files toward ``wanted`` (never above the hard limit, never down).
    Returns the soft limit in force; one socket per user needs it on machines whose default soft limit is 1024."""
    if resource is None:  # pragma: no cover
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return wanted if soft == resource.RLIM_INFINITY else soft
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft
    return target


async def _next_plan(request_factory: RequestFactory) -> RequestPlan:
    plan = request_factory()
    if inspect.isawaitable(plan):
        plan = await plan
    if not isinstance(plan, RequestPlan):
        raise TypeError(f"the request factory returned {type(plan).__name__}, not a RequestPlan")
    return plan


def _backoff_seconds(result: RequestResult, base_seconds: float) -> float:
    if result.retry_after_seconds is not None:
        return min(max(result.retry_after_seconds, base_seconds), max(MAX_RETRY_AFTER_SECONDS, base_seconds))
    return base_seconds


class _Run:
    """What a runner shares between its tasks: the caps, the results, the requests in flight."""

    def __init__(
        self,
        client: OpenAIClient,
        request_factory: RequestFactory,
        duration_seconds: float,
        max_requests: int | None,
        on_result: ResultCallback | None,
        keep_results: bool,
        allow_remote: bool,
    ) -> None:
        check_target(client.base_url, allow_remote)
        if not duration_seconds > 0 or math.isinf(duration_seconds):
            raise UsageError(f"duration_seconds must be positive and finite, got {duration_seconds!r}")
        if max_requests is not None and max_requests < 0:
            raise UsageError(f"max_requests must be 0 or more, got {max_requests}")
        self.client = client
        self.request_factory = request_factory
        self.deadline = _monotonic() + duration_seconds
        self.max_requests = max_requests
        self.on_result = on_result
        self.keep_results = keep_results
        self.claimed = 0
        self.results: list[RequestResult] = []

    def claim(self) -> bool:
        if _monotonic() >= self.deadline or (self.max_requests is not None and self.claimed >= self.max_requests):
            return False
        self.claimed += 1
        return True

    async def send(self, plan: RequestPlan) -> RequestResult:
        result = self.client.new_result(plan.request_id)
        try:
            await self.client.execute(plan, result)
        except asyncio.CancelledError:  # at the deadline: the result says "cancelled", with what had arrived
            self.record(result)
            raise
        self.record(result)
        return result

    def record(self, result: RequestResult) -> None:
        if self.keep_results:
            self.results.append(result)
        if self.on_result is not None:
            self.on_result(result)

    async def wait(self, tasks: set[asyncio.Task[Any]]) -> list[RequestResult]:
        """Until every task ends or the deadline; then cancel what is left (recorded as "cancelled")."""
        try:
            while tasks:
                remaining = self.deadline - _monotonic()
                if remaining <= 0:
                    break
                done, _ = await asyncio.wait(tasks, timeout=remaining, return_when=asyncio.FIRST_EXCEPTION)
                tasks -= done
                failures = [t.exception() for t in done if not t.cancelled() and t.exception() is not None]
                if failures:
                    raise failures[0]  # type: ignore[misc]  # a bug in a factory or callback
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
        self.results.sort(key=lambda r: r.started_at)
        return self.results


async def closed_loop(
    client: OpenAIClient,
    users: int,
    request_factory: RequestFactory,
    *,
    duration_seconds: float,
    max_requests: int | None,
    think_time_seconds: float = 0.0,
    on_result: ResultCallback | None = None,
    allow_remote: bool = False,
    keep_results: bool = True,
    error_backoff_seconds: float = DEFAULT_ERROR_BACKOFF_SECONDS,
) -> list[RequestResult]:
    """``users`` users, each sending its next request when its last one ends (after ``think_time_seconds``).

    Stops starting requests after ``duration_seconds`` or ``max_requests`` started (None: no count cap); requests
    still in flight at the deadline are cancelled and recorded with error_kind "cancelled". After a failure a user
    waits ``error_backoff_seconds`` (or the server's Retry-After, up to a second) so that a 429 or 503 does not make
    it spin. ``on_result`` is called with each result as it ends; ``keep_results=False`` keeps none in memory (for
    long runs that only count). Returns the kept results in the order they started.
    """
    if users < 1:
        raise UsageError(f"a closed loop needs at least one user, got {users}")
    run = _Run(client, request_factory, duration_seconds, max_requests, on_result, keep_results, allow_remote)
    raise_open_files_limit(users + OPEN_FILES_MARGIN)

    async def user() -> None:
        while run.claim():
            result = await run.send(await _next_plan(request_factory))
            if result.error_kind is not None and result.error_kind != "cancelled":
                await asyncio.sleep(_backoff_seconds(result, error_backoff_seconds))
            elif think_time_seconds > 0:
                await asyncio.sleep(think_time_seconds)

    tasks = {asyncio.create_task(user(), name=f"llmdiag-user-{i}") for i in range(users)}
    return await run.wait(tasks)


async def open_loop(
    client: OpenAIClient,
    rate_per_second: float,
    request_factory: RequestFactory,
    *,
    duration_seconds: float,
    max_requests: int | None,
    seed: int = 0,
    on_result: ResultCallback | None = None,
    allow_remote: bool = False,
    keep_results: bool = True,
) -> list[RequestResult]:
    """Requests arriving as a Poisson process of ``rate_per_second``, whatever the server's speed (each in its own
    task; ``client.max_connections`` caps how many are in flight). Arrival times are drawn ahead, so a late
    event loop catches up instead of lowering the rate. Bounded like ``closed_loop``."""
    if not rate_per_second > 0 or math.isinf(rate_per_second):
        raise UsageError(f"rate_per_second must be positive and finite, got {rate_per_second!r}")
    run = _Run(client, request_factory, duration_seconds, max_requests, on_result, keep_results, allow_remote)
    wanted = client.max_connections or max(4096, int(rate_per_second * 60))
    raise_open_files_limit(wanted + OPEN_FILES_MARGIN)
    rng = random.Random(seed)
    tasks: set[asyncio.Task[Any]] = set()

    async def one(plan: RequestPlan) -> None:
        await run.send(plan)

    async def arrivals() -> None:
        next_at = _monotonic()
        while True:
            next_at += rng.expovariate(rate_per_second)
            if next_at >= run.deadline:
                return
            delay = next_at - _monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if not run.claim():
                return
            task = asyncio.create_task(one(await _next_plan(request_factory)))
            tasks.add(task)
            task.add_done_callback(_forget_if_clean(tasks))

    source = asyncio.create_task(arrivals(), name="llmdiag-arrivals")
    try:
        await run.wait({source})
    finally:
        await run.wait(tasks)  # at the deadline: cancels what is in flight
    return run.results


def _forget_if_clean(tasks: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    """Drop a finished request task from the set (keeps the set small in long runs), unless it raised."""

    def forget(task: asyncio.Task[Any]) -> None:
        if task.cancelled() or task.exception() is None:
            tasks.discard(task)

    return forget


# --- load from sync code -------------------------------------------------------------------------------------


@dataclass
class LoadTally:
    """Running counts of a background load, updated as each request ends (read them from any thread)."""

    started: int = 0  # requests planned (sent, or about to be)
    ok: int = 0
    cancelled: int = 0
    errors: Counter[str] = field(default_factory=Counter)  # by error_kind
    http_statuses: Counter[int] = field(default_factory=Counter)  # statuses of the "http" errors
    output_tokens: int = 0  # of the successful requests
    last_error: str | None = None

    @property
    def failed(self) -> int:
        return sum(self.errors.values())

    def add(self, result: RequestResult) -> None:
        if result.ok:
            self.ok += 1
            self.output_tokens += result.output_tokens or 0
        elif result.error_kind == "cancelled":
            self.cancelled += 1
        else:
            self.errors[result.error_kind or "error"] += 1
            if result.error_kind == "http" and result.status is not None:
                self.http_statuses[result.status] += 1
            self.last_error = result.error


class BackgroundLoad:
    """A bounded load on its own event loop in a background thread, for sync code (the simulator's demo load,
    tests, ``llmdiag capacity --simulate``):

        with BackgroundLoad(url, factory, users=8, duration_seconds=30) as load:
            time.sleep(10)
        load.tally.ok, load.tally.errors

    Give ``users`` (a closed loop) or ``rate_per_second`` (an open loop). It ends by itself at
    ``duration_seconds`` or ``max_requests``, or when ``stop()`` (or leaving the block) cancels what is in flight.
    ``prepare(client)`` runs first (e.g. calibrating prompts); ``start()`` returns once it has. ``on_result`` is
    called on the load's thread. ``keep_results`` keeps every result in ``results`` (memory grows with the run).
    Refuses a server that is not on this machine unless ``allow_remote``.
    """

    def __init__(
        self,
        base_url: str,
        request_factory: RequestFactory,
        *,
        users: int | None = None,
        rate_per_second: float | None = None,
        duration_seconds: float,
        max_requests: int | None = None,
        think_time_seconds: float = 0.0,
        model: str | None = None,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        insecure: bool = False,
        max_connections: int = 0,
        allow_remote: bool = False,
        keep_results: bool = False,
        on_result: ResultCallback | None = None,
        prepare: Callable[[OpenAIClient], Awaitable[None]] | None = None,
        error_backoff_seconds: float = DEFAULT_ERROR_BACKOFF_SECONDS,
        seed: int = 0,
        name: str = "llmdiag-load",
    ) -> None:
        if (users is None) == (rate_per_second is None):
            raise UsageError("give users (a closed loop) or rate_per_second (an open loop), not both or neither")
        check_target(base_url, allow_remote)
        self.base_url = base_url
        self._factory = request_factory
        self._client_options: dict[str, Any] = dict(
            model=model,
            api_key=api_key,
            headers=headers,
            timeout_seconds=timeout_seconds,
            insecure=insecure,
            max_connections=max_connections,
        )
        self._run_options: dict[str, Any] = dict(
            duration_seconds=duration_seconds, max_requests=max_requests, allow_remote=allow_remote, keep_results=False
        )
        self.users = users
        self.rate_per_second = rate_per_second
        self.think_time_seconds = think_time_seconds
        self.error_backoff_seconds = error_backoff_seconds
        self.seed = seed
        self.keep_results = keep_results
        self.on_result = on_result
        self.prepare = prepare
        self.name = name
        self.tally = LoadTally()
        self.results: list[RequestResult] = []
        self.client: OpenAIClient | None = None
        self.error: BaseException | None = None  # what stopped the load thread, if anything did
        self._setup_error: BaseException | None = None  # what failed before requests began (raised by start)
        self.started_at: float | None = None  # time.time() when requests began
        self.stopped_at: float | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._ready = threading.Event()
        self._done = threading.Event()

    # control

    def start(self, ready_timeout_seconds: float = 60.0) -> BackgroundLoad:
        if self._thread is not None:
            raise RuntimeError("the load is already started")
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()
        if not self._ready.wait(ready_timeout_seconds):
            self.stop()
            raise UsageError(f"the load did not start within {ready_timeout_seconds:g} s")
        if self._setup_error is not None:
            raise self._setup_error
        return self

    def stop(self, timeout_seconds: float = 30.0) -> None:
        """Cancel what is in flight and end the load; returns when its thread has ended (or after the timeout)."""
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not self._done.is_set():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(task.cancel)
        if self._thread is not None:
            self._thread.join(timeout_seconds)

    def wait(self, timeout_seconds: float | None = None) -> bool:
        """Until the load ends by itself (duration or request count); True when it has."""
        if self._thread is None:
            return True
        return self._done.wait(timeout_seconds)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> BackgroundLoad:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # the load's thread

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._task = loop.create_task(self._run())
            loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass  # stopped
        except BaseException as exc:  # surfaced by start() or .error; a thread has nowhere else to report it
            self.error = exc
            if not self._ready.is_set():
                self._setup_error = exc
        finally:
            self.stopped_at = time.time()
            self._ready.set()
            self._done.set()
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    def _record(self, result: RequestResult) -> None:
        self.tally.add(result)
        if self.keep_results:
            self.results.append(result)
        if self.on_result is not None:
            self.on_result(result)

    def _plan(self) -> RequestPlan | Awaitable[RequestPlan]:
        self.tally.started += 1
        return self._factory()

    async def _run(self) -> None:
        async with OpenAIClient(self.base_url, **self._client_options) as client:
            self.client = client
            if self.prepare is not None:
                await self.prepare(client)
            self.started_at = time.time()
            self._ready.set()
            if self.users is not None:
                await closed_loop(
                    client,
                    self.users,
                    self._plan,
                    think_time_seconds=self.think_time_seconds,
                    on_result=self._record,
                    error_backoff_seconds=self.error_backoff_seconds,
                    **self._run_options,
                )
            else:
                assert self.rate_per_second is not None
                await open_loop(
                    client,
                    self.rate_per_second,
                    self._plan,
                    seed=self.seed,
                    on_result=self._record,
                    **self._run_options,
                )
