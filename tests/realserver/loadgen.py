"""Bounded closed-loop load generator for a vLLM OpenAI server on loopback.

``Load`` is ``llmdiag.client.runners.BackgroundLoad`` (the project's one way to send requests) with what the
real-vLLM tests count: ``users`` concurrent "users", each sending one streaming ``/v1/completions`` request
(``prompt_tokens`` random words calibrated with the server's /tokenize, ``output_tokens`` with ignore_eos) and the
next one as soon as the previous ends. It stops after ``max_seconds`` or ``max_requests`` (started requests), or
when the context manager exits (in-flight requests are cancelled, which aborts them in vLLM).

    with Load(server.base_url, server.model_name, users=4) as load:
        time.sleep(10)
    print(load.stats.ok, load.stats.http_errors)
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from llmdiag.client.openai import ClientOptions, OpenAIClient
from llmdiag.client.prompts import PromptFactory
from llmdiag.client.result import RequestPlan, RequestResult
from llmdiag.client.runners import BackgroundLoad, LoadShape

# Short common words; most are one or two tokens in the stdlib-trained BPE.
WORDS = (
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "it",
    "at",
    "from",
    "this",
    "be",
    "or",
    "are",
    "an",
    "not",
    "if",
    "else",
    "return",
    "import",
    "def",
    "class",
    "self",
    "none",
    "true",
    "false",
    "value",
    "name",
    "data",
    "list",
    "dict",
    "type",
    "file",
    "path",
    "line",
    "text",
    "time",
    "size",
    "item",
    "key",
    "error",
    "result",
    "test",
    "object",
    "string",
    "number",
    "index",
    "start",
    "end",
    "read",
    "write",
    "open",
    "close",
    "call",
    "args",
    "kwargs",
    "default",
    "module",
    "method",
    "function",
    "local",
    "global",
    "node",
    "tree",
    "next",
    "first",
    "last",
    "count",
    "total",
    "state",
    "mode",
    "flag",
    "info",
    "level",
    "format",
    "print",
    "buffer",
    "stream",
    "socket",
    "server",
    "client",
    "request",
    "response",
    "header",
    "body",
    "status",
    "code",
    "message",
)


@dataclass
class LoadStats:
    started: int = 0
    ok: int = 0
    http_errors: Counter = field(default_factory=Counter)  # status -> count
    # errors sent inside an already started (HTTP 200) stream, by their "code"
    stream_errors: Counter = field(default_factory=Counter)
    exceptions: Counter = field(default_factory=Counter)  # exception type -> count
    cancelled: int = 0
    completion_tokens: int = 0
    ttfts: list = field(default_factory=list)  # client-side seconds
    latencies: list = field(default_factory=list)  # client-side seconds (ok requests)
    last_error: str | None = None
    error_messages: Counter = field(default_factory=Counter)  # first 160 chars -> count
    prompt_words: int | None = None
    prompt_tokens_measured: int | None = None
    # every request as its user timed it (time.monotonic()), cancelled ones too: (sent, first token or None, ended,
    # output tokens or None, ok)
    timings: list = field(default_factory=list)

    @property
    def errors_total(self) -> int:
        return sum(self.http_errors.values()) + sum(self.stream_errors.values()) + sum(self.exceptions.values())

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
            "started": self.started,
            "ok": self.ok,
            "http_errors": {str(k): v for k, v in sorted(self.http_errors.items())},
            "stream_errors": {str(k): v for k, v in sorted(self.stream_errors.items(), key=lambda kv: str(kv[0]))},
            "exceptions": dict(self.exceptions),
            "cancelled": self.cancelled,
            "completion_tokens": self.completion_tokens,
            "client_ttft_p50": pct(self.ttfts, 0.5),
            "client_latency_p50": pct(self.latencies, 0.5),
            "prompt_words": self.prompt_words,
            "prompt_tokens_measured": self.prompt_tokens_measured,
            "last_error": self.last_error,
            "error_messages": dict(self.error_messages.most_common(5)),
        }


class Load(BackgroundLoad):
    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        users: int = 4,
        prompt_tokens: int = 64,
        output_tokens: int = 128,
        max_seconds: float = 120.0,
        max_requests: int = 100_000,
        error_backoff: float = 0.1,
        request_timeout: float = 600.0,
        seed: int | None = 0,
    ) -> None:
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.max_seconds = max_seconds
        self.max_requests = max_requests
        self.stats = LoadStats()
        self.prompts: PromptFactory | None = None
        shape = LoadShape(
            max_seconds,
            users=users,
            max_requests=max_requests,
            error_backoff_seconds=error_backoff,
            seed=random.randrange(2**32) if seed is None else seed,
        )
        super().__init__(
            base_url,
            self._next_request,
            shape,
            client=ClientOptions(model=model, timeout_seconds=request_timeout),
            on_result=self._count,
            prepare=self._calibrate,
        )

    async def _calibrate(self, client: OpenAIClient) -> None:
        """Pick the number of random words so the prompt is about prompt_tokens (the server's /tokenize, where
        it has one), and measure one such prompt."""
        self.prompts = PromptFactory(client, seed=self.shape.seed, words=WORDS)
        prompt = await self.prompts.prompt(self.prompt_tokens)
        self.stats.prompt_words = self.prompts.words_for(self.prompt_tokens)
        self.stats.prompt_tokens_measured = await client.count_tokens(prompt)

    async def _next_request(self) -> RequestPlan:
        assert self.prompts is not None
        self.stats.started += 1
        return RequestPlan(
            await self.prompts.prompt(self.prompt_tokens), self.output_tokens, extra_body={"temperature": 1.0}
        )

    def _count(self, result: RequestResult) -> None:
        stats = self.stats
        stats.timings.append(
            (result.started_at, result.first_token_at, result.ended_at, result.output_tokens, result.ok)
        )
        if result.ok:
            stats.ok += 1
            stats.completion_tokens += result.output_tokens or 0
            if result.ttft_seconds is not None:
                stats.ttfts.append(result.ttft_seconds)
            stats.latencies.append(result.e2e_seconds)
            return
        if result.error_kind == "cancelled":
            stats.cancelled += 1
            return
        if result.error_kind == "http" and result.status is not None:
            stats.http_errors[result.status] += 1
        elif result.error_kind == "stream" and result.error_code is not None:
            stats.stream_errors[result.error_code] += 1  # an error event inside an HTTP 200 stream
        else:
            stats.exceptions[result.error_kind or "error"] += 1
        stats.last_error = result.error
        stats.error_messages[(result.error or "")[:160]] += 1
