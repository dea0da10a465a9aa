"""HTTP/1.1 and SSE on one asyncio protocol, the connection OpenAIClient sends each request on: each read stamped as
it arrives, each event looked at in place (see llmdiag.client for why this client is its own)."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import ssl
from collections.abc import Callable
from typing import Any, cast

from llmdiag.client.result import RequestResult, _monotonic
from llmdiag.client.rxtime import StampingSocket
from llmdiag.errors import UsageError, option

_HEAD, _BODY, _IDLE = 0, 1, 2
_CHUNKED, _LENGTH, _UNTIL_CLOSE = 0, 1, 2
_CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _CHUNK_TRAILER = 0, 1, 2, 3
_QUOTE, _CLOSE_BRACE, _NEWLINE = 34, 125, 10

READ_BUFFER_BYTES = 256 * 1024  # one socket read at most (asyncio's own read size)
MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024  # a non-streamed answer
MAX_ERROR_BODY_BYTES = 64 * 1024  # what is kept of an error body
MAX_SSE_EVENT_BYTES = 4 * 1024 * 1024
ERROR_TEXT_CHARS = 300
# what the parser reads: the shared read buffer, or bytes (a head's rest, a joined split event)
_Bytes = bytes | bytearray
_STALE = object()  # the waiter's value when a reused keep-alive connection was closed before any answer
_STALE_ERRORS = (ConnectionResetError, BrokenPipeError)

_CONTENT_RE = re.compile(rb'"(?:text|content|reasoning_content|reasoning)"\s*:\s*"')
_USAGE_RE = re.compile(rb'"usage"\s*:\s*\{')
_DATA_OBJECT = (b"data: {", b"data:{")
_DONE_EVENTS = (b"data: [DONE]", b"data:[DONE]")


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
        self._pending: _Bytes = b""  # an SSE event split across reads
        self._cr_held = False  # a CR at the end of the last read (CRLF line endings)
        self._body: list[_Bytes] = []
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
        self.transport = cast(asyncio.Transport, transport)  # a stream connection's (asyncio types it as the base)

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
        transport = self.transport
        return (
            not self.closed
            and self._keep_alive
            and self._state == _IDLE
            and transport is not None
            and not transport.is_closing()
        )

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

    def _feed_length(self, data: _Bytes, pos: int, end: int, now: float) -> None:
        take = min(self._left, end - pos)
        self._left -= take
        self._payload(data, pos, pos + take, now)
        if self._left == 0 and self._state == _BODY:
            if pos + take < end:
                self._keep_alive = False  # bytes after the body
            self._end_of_body(now)

    def _feed_chunked(self, data: _Bytes, pos: int, end: int, now: float) -> None:
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

    def _payload(self, data: _Bytes, start: int, end: int, now: float) -> None:
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

    def _feed_sse(self, data: _Bytes, start: int, end: int, now: float) -> None:
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

    def _join_pending(self, piece: _Bytes) -> _Bytes:
        """The slow path: an event split across reads, or CR / CRLF line endings (normalised to LF)."""
        joined = self._pending + (b"\r" if self._cr_held else b"") + piece
        self._pending, self._cr_held = b"", False
        if joined.endswith(b"\r"):  # maybe half of a CRLF: decide with the next read
            joined, self._cr_held = joined[:-1], True
        if b"\r" in joined:
            joined = joined.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        return joined

    def _event(self, data: _Bytes, start: int, end: int, now: float) -> None:
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
        return (
            f"TLS certificate of {where} not trusted ({exc.verify_message}); pass {option('insecure')} for a "
            "self-signed one"
        )
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
