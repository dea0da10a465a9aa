"""One request as the user saw it (RequestResult), and what to send next (RequestPlan)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

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
