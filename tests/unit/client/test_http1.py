"""The HTTP/1.1 + SSE parser of the load client, fed bytes in-process (the socket is replaced by a transport that
only records what is written: the asyncio boundary). Each answer is written here by hand, so the expected counts,
texts and errors are known; every answer is also fed one byte per read, where every split lands, and must read
the same."""

from __future__ import annotations

import asyncio
import functools
import json
import socket
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from llmdiag.client.http1 import (
    _STALE,
    ERROR_TEXT_CHARS,
    READ_BUFFER_BYTES,
    _connect_failure,
    _Connection,
    _error_message,
    _header_line,
)
from llmdiag.client.result import RequestResult
from llmdiag.errors import UsageError


def in_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test on its own event loop (the parser needs a running loop for its futures and timer)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


REQUEST = b"POST /v1/completions HTTP/1.1\r\nHost: h\r\n\r\n{}"


class RecordingTransport:
    """What the protocol needs of an asyncio transport: it writes, aborts and may be closing."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def sse(*events: dict[str, Any] | str) -> list[bytes]:
    return [b"data: " + (e.encode() if isinstance(e, str) else json.dumps(e).encode()) + b"\n\n" for e in events]


def text_event(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "text": text}]}


STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
USAGE = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}


def completion_stream() -> bytes:
    return STREAM_HEAD + chunked(*sse(text_event("Hello"), text_event(" big"), text_event(" world"), USAGE, "[DONE]"))


class Exchange:
    """One connection; ``feed`` hands it reads as the event loop would, ``send`` starts a request."""

    def __init__(self, timeout_seconds: float = 5.0) -> None:
        self.buffer = bytearray(READ_BUFFER_BYTES)
        self.connection = _Connection(asyncio.get_running_loop(), timeout_seconds, self.buffer)
        self.transport = RecordingTransport()
        self.connection.connection_made(self.transport)  # type: ignore[arg-type]

    def send(self, chat: bool = False, completion: bool = True) -> tuple[RequestResult, asyncio.Future[Any]]:
        result = RequestResult(request_id="r1", started_at=0.0)
        return result, self.connection.begin(result, REQUEST, chat, completion)

    def feed(self, data: bytes, read_bytes: int | None = None) -> None:
        step = read_bytes or len(data)
        for start in range(0, len(data), step):
            piece = data[start : start + step]
            self.buffer[: len(piece)] = piece
            self.connection.buffer_updated(len(piece))


async def answer(data: bytes, read_bytes: int | None = None, close: bool = False, **send: bool) -> RequestResult:
    exchange = Exchange()
    result, waiter = exchange.send(**send)
    exchange.feed(data, read_bytes)
    if close:
        exchange.connection.connection_lost(None)
    await asyncio.wait_for(waiter, 2)
    assert exchange.transport.written == [REQUEST]
    return result


def summary(result: RequestResult) -> tuple:
    return (
        result.status,
        result.error_kind,
        result.error,
        result.output_tokens,
        result.output_tokens_from,
        result.prompt_tokens,
        len(result.token_times),
        result.received_text_chars,
    )


@pytest.mark.parametrize("read_bytes", [None, 1, 7])
@in_loop
async def test_a_streamed_completion_reads_its_events_and_usage_however_the_reads_split(read_bytes: int | None):
    result = await answer(completion_stream(), read_bytes)
    # three text events, 5 + 4 + 6 characters; the usage event says 3 tokens and 7 prompt tokens
    assert summary(result) == (200, None, None, 3, "usage", 7, 3, 15)
    assert result.ok and result.first_token_at == result.token_times[0]
    assert result.token_times == sorted(result.token_times)


@in_loop
async def test_the_connection_is_reused_after_a_whole_answer_and_not_after_connection_close():
    exchange = Exchange()
    _, waiter = exchange.send()
    exchange.feed(completion_stream())
    await waiter
    assert exchange.connection.reusable
    _, waiter = exchange.send()
    exchange.feed(completion_stream().replace(b"Transfer-Encoding", b"Connection: close\r\nTransfer-Encoding"))
    await waiter
    assert not exchange.connection.reusable


@in_loop
async def test_without_usage_the_tokens_are_the_content_events_counted():
    body = STREAM_HEAD + chunked(*sse(text_event("a"), text_event(""), text_event("b"), "[DONE]"))
    result = await answer(body)
    assert (result.output_tokens, result.output_tokens_from, len(result.token_times)) == (2, "chunks", 2)


@in_loop
async def test_chat_text_with_escapes_counts_each_escape_as_one_character():
    events = sse({"choices": [{"delta": {"role": "assistant"}}]}, {"choices": [{"delta": {"content": 'a\n"b'}}]})
    result = await answer(STREAM_HEAD + chunked(*events, b"data: [DONE]\n\n"), chat=True)
    assert (len(result.token_times), result.received_text_chars) == (1, 4)  # a, newline, quote, b


@in_loop
async def test_crlf_line_endings_and_comments_are_sse_too():
    body = b": keep-alive\r\n\r\n" + b"".join(e.replace(b"\n", b"\r\n") for e in sse(text_event("x"), "[DONE]"))
    result = await answer(STREAM_HEAD + chunked(body), read_bytes=3)
    assert summary(result)[:7] == (200, None, None, 1, "chunks", None, 1)


@in_loop
async def test_a_non_streamed_completion_reads_its_usage_from_the_body():
    body = json.dumps({"choices": [{"text": "four"}], "usage": {"prompt_tokens": 2, "completion_tokens": 1}}).encode()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    result = await answer(head + body, read_bytes=5)
    assert summary(result) == (200, None, None, 1, "body", 2, 0, 4)


@in_loop
async def test_an_interim_100_continue_is_skipped():
    result = await answer(b"HTTP/1.1 100 Continue\r\n\r\n" + completion_stream())
    assert result.ok and result.output_tokens == 3


@in_loop
async def test_an_http_error_keeps_the_message_the_code_and_retry_after():
    body = json.dumps({"error": {"message": "Rate  limit\nreached", "code": "rate_limit_exceeded"}}).encode()
    head = b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 2\r\nContent-Length: %d\r\n\r\n" % len(body)
    result = await answer(head + body)
    assert (result.status, result.error_kind, result.error) == (429, "http", "HTTP 429: Rate limit reached")
    assert (result.error_code, result.retry_after_seconds) == ("rate_limit_exceeded", 2.0)


@in_loop
async def test_an_error_inside_the_stream_fails_the_request_with_its_code():
    events = sse(text_event("a"), {"error": {"message": "engine died", "code": 503}})
    result = await answer(STREAM_HEAD + chunked(*events))
    assert result.error_kind == "stream" and "engine died" in (result.error or "") and result.error_code == 503
    assert result.output_tokens == 1  # what arrived before the error is kept


@in_loop
async def test_a_stream_closed_without_done_is_a_stream_error():
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"  # no length, no chunking: until close
    result = await answer(head + b"".join(sse(text_event("a"))), close=True)
    assert result.error_kind == "stream" and "[DONE]" in (result.error or "")


@pytest.mark.parametrize(
    "data, words",
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP answer"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n", "Content-Length"),
        (STREAM_HEAD + b"zz\r\n", "chunk-size"),
        (STREAM_HEAD + chunked(b"data: {not json}\n\n"), "not JSON"),
        (STREAM_HEAD + chunked(b"bogus line\n\n"), "malformed SSE line"),
    ],
)
@in_loop
async def test_broken_answers_fail_the_request_and_drop_the_connection(data: bytes, words: str):
    exchange = Exchange()
    result, waiter = exchange.send()
    exchange.feed(data)
    await asyncio.wait_for(waiter, 2)
    assert result.error_kind == "stream" and words in (result.error or "")
    assert exchange.transport.aborted and not exchange.connection.reusable


@in_loop
async def test_a_reused_connection_closed_before_any_answer_asks_for_a_retry():
    exchange = Exchange()
    _, waiter = exchange.send()
    exchange.feed(completion_stream())
    await waiter
    result, waiter = exchange.send()
    exchange.connection.connection_lost(ConnectionResetError())
    assert await waiter is _STALE and result.error is None  # the request was never answered: send it again


@in_loop
async def test_no_answer_within_the_timeout_is_a_timeout():
    exchange = Exchange(timeout_seconds=0.05)
    result, waiter = exchange.send()
    await asyncio.wait_for(waiter, 5)
    assert result.error_kind == "timeout" and "no answer" in (result.error or "")


def test_error_bodies_in_their_usual_shapes():
    assert _error_message(b'{"error": {"message": "m", "code": 503}}') == ("m", 503)
    assert _error_message(b'{"error": {"message": "m", "code": true}}') == ("m", None)  # a bool is no code
    assert _error_message(b'{"detail": "Not Found"}') == ("Not Found", None)
    assert _error_message(b'{"detail": [{"loc": ["body"]}]}') == ('[{"loc": ["body"]}]', None)
    text, code = _error_message(b"<html>\n  " + b"x" * 1000)
    assert text.startswith("<html> xxx") and len(text) == ERROR_TEXT_CHARS and code is None


def test_header_lines_cannot_smuggle_a_second_header():
    assert _header_line("X-Tenant", "team-a") == b"X-Tenant: team-a\r\n"
    for name, value in (("X-A", "b\r\nX-Evil: 1"), ("X:A", "b"), ("", "b")):
        with pytest.raises(UsageError):
            _header_line(name, value)


@pytest.mark.parametrize(
    "error, words",
    [
        (ConnectionRefusedError(111, "Connection refused"), "refused"),
        (socket.gaierror(-2, "Name or service not known"), "DNS"),
        (OSError(24, "Too many open files"), "ulimit -n"),
        (OSError(113, "No route to host"), "No route to host"),
        (RuntimeError("odd"), "RuntimeError"),
    ],
)
def test_connect_failures_are_said_in_words(error: BaseException, words: str):
    assert words in _connect_failure(error, "http://h:1")
