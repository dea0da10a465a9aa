"""`llmdiag load`: drive a bounded load at one level after another and read the server while it runs.

Each level runs for ``warmup_seconds + duration_seconds`` (and a second more, so the last scrape still sees the
load). The server's metrics and telemetry are scraped over the ``duration_seconds`` after the warm-up (the same
window loop as ``scan``, in a thread), and the requests that end inside that window make the level's client-side
numbers. So every level gets both halves: what users got, and why.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import re
import threading
import time
from dataclasses import dataclass, field

from llmdiag.client.endpoint import Connection
from llmdiag.client.openai import OpenAIClient
from llmdiag.client.prompts import PromptFactory
from llmdiag.client.result import RequestPlan, RequestResult
from llmdiag.client.runners import check_target, closed_loop, open_loop
from llmdiag.collect.live import TelemetryOptions, collect_live
from llmdiag.errors import LlmdiagError, UsageError, option
from llmdiag.model import SignalSet
from llmdiag.model.workload import Workload

# hard caps: a load test is bounded whatever the flags say
MAX_LEVEL_SECONDS = 600.0
MAX_REQUESTS_PER_LEVEL = 100_000
MAX_USERS = 5000
MAX_RATE_PER_SECOND = 2000.0
DEFAULT_WARMUP_SECONDS = 3.0
# the load runs on a little past the window, so that the window's last scrape still sees it running
TAIL_SECONDS = 1.0
TOKENS_RE = re.compile(r"^\s*(\d+)\s*(?:[:-]\s*(\d+))?\s*$")
NORMAL_RE = re.compile(r"^\s*normal\s*:\s*(\d+(?:\.\d+)?)\s*,\s*(\d+(?:\.\d+)?)\s*$")


@dataclass(frozen=True)
class TokenLengths:
    """A token count per request: fixed ("256"), uniform ("128:512") or normal ("normal:256,64", at least 1)."""

    low: int
    high: int
    mean: float | None = None
    sd: float | None = None
    text: str = ""

    @classmethod
    def parse(cls, text: str, what: str) -> TokenLengths:
        hint = f"{what} takes 256, 128:512 (uniform) or normal:256,64"
        if match := TOKENS_RE.match(text):
            low = int(match.group(1))
            high = int(match.group(2) or low)
            if low < 1 or high < low:
                raise UsageError(f"{what} {text!r}: need 1 <= low <= high", hint)
            return cls(low, high, text=text.strip())
        if match := NORMAL_RE.match(text):
            mean, sd = float(match.group(1)), float(match.group(2))
            if mean < 1:
                raise UsageError(f"{what} {text!r}: the mean must be at least 1", hint)
            return cls(1, max(1, round(mean + 4 * sd)), mean=mean, sd=sd, text=text.strip())
        raise UsageError(f"{what} {text!r} is not a token count", hint)

    def sample(self, rng: random.Random) -> int:
        if self.mean is not None and self.sd is not None:
            return max(1, min(self.high, round(rng.gauss(self.mean, self.sd))))
        return self.low if self.low == self.high else rng.randint(self.low, self.high)


@dataclass
class LoadPlan:
    """What `llmdiag load` drives: closed-loop users or open-loop rates, one level after another."""

    levels: list[float]
    mode: str = "closed"  # "closed": levels are users; "open": requests per second
    duration_seconds: float = 20.0
    warmup_seconds: float = DEFAULT_WARMUP_SECONDS
    max_requests: int = 20_000  # per level
    prompt_tokens: TokenLengths = field(default_factory=lambda: TokenLengths(256, 256, text="256"))
    output_tokens: TokenLengths = field(default_factory=lambda: TokenLengths(128, 128, text="128"))
    model: str | None = None
    chat: bool = False
    think_time_seconds: float = 0.0
    allow_remote: bool = False
    seed: int = 0
    timeout_seconds: float = 60.0

    def validate(self, base_url: str) -> None:
        check_target(base_url, self.allow_remote)
        self.validate_levels()

    def validate_levels(self) -> None:
        if not self.levels:
            raise UsageError(
                "no load level given", f"e.g. {option('users')} 8, {option('rate')} 4 or {option('sweep')} 1,8,32"
            )
        if self.mode == "closed" and any(u < 1 or u != int(u) or u > MAX_USERS for u in self.levels):
            raise UsageError(f"users must be whole numbers from 1 to {MAX_USERS}", f"e.g. {option('sweep')} 1,8,32,128")
        if self.mode == "open" and any(not 0 < r <= MAX_RATE_PER_SECOND for r in self.levels):
            raise UsageError(f"rates must be above 0 and at most {MAX_RATE_PER_SECOND:g} requests/s")
        if not 1 <= self.duration_seconds <= MAX_LEVEL_SECONDS:
            raise UsageError(f"{option('duration_seconds')} must be between 1 and {MAX_LEVEL_SECONDS:g} s per level")
        if not 1 <= self.max_requests <= MAX_REQUESTS_PER_LEVEL:
            raise UsageError(f"{option('max_requests')} must be between 1 and {MAX_REQUESTS_PER_LEVEL}")


def workload_of(plan: LoadPlan, slo_ttft_seconds: float | None, slo_tpot_seconds: float | None) -> Workload:
    """The plan as a workload to save (the served model and version are stamped once the server is asked)."""
    return Workload(
        mode="closed" if plan.mode == "closed" else "open",
        levels=list(plan.levels),
        think_time_seconds=plan.think_time_seconds,
        duration_seconds=plan.duration_seconds,
        warmup_seconds=plan.warmup_seconds,
        max_requests=plan.max_requests,
        prompt_tokens=plan.prompt_tokens.text,
        output_tokens=plan.output_tokens.text,
        seed=plan.seed,
        chat=plan.chat,
        slo_ttft_seconds=slo_ttft_seconds,
        slo_tpot_seconds=slo_tpot_seconds,
        model=plan.model or "",
    )


def plan_of(workload: Workload, *, timeout_seconds: float, allow_remote: bool) -> LoadPlan:
    """The plan that replays a saved workload: its levels, window, lengths, seed and model."""
    return LoadPlan(
        levels=list(workload.levels),
        mode=workload.mode,
        duration_seconds=workload.duration_seconds,
        warmup_seconds=workload.warmup_seconds,
        max_requests=workload.max_requests,
        prompt_tokens=TokenLengths.parse(workload.prompt_tokens, "the workload's prompt_tokens"),
        output_tokens=TokenLengths.parse(workload.output_tokens, "the workload's output_tokens"),
        model=workload.model or None,
        chat=workload.chat,
        think_time_seconds=workload.think_time_seconds,
        allow_remote=allow_remote,
        seed=workload.seed,
        timeout_seconds=timeout_seconds,
    )


@dataclass
class LevelRun:
    """One level's raw material: every request result, the measured window, and the server's signals."""

    results: list[RequestResult]
    window_start: float  # monotonic
    window_end: float
    signals: SignalSet | None
    scan_error: str | None
    model: str


class _Scraper(threading.Thread):
    """``collect_live`` on its own thread, started when the warm-up ends; keeps its error instead of raising."""

    def __init__(self, connection: Connection, seconds: float, telemetry: TelemetryOptions | None):
        super().__init__(name="llmdiag-load-scan", daemon=True)
        self.connection, self.seconds, self.telemetry = connection, seconds, telemetry
        self.signals: SignalSet | None = None
        self.error: str | None = None
        # the scan runs in its starter's context: a recording's tape (llmdiag.collect.tape) follows it here
        self.context = contextvars.copy_context()

    def run(self) -> None:
        try:
            self.signals = self.context.run(collect_live, self.connection, self.seconds, telemetry=self.telemetry)
        except LlmdiagError as exc:
            self.error = exc.message


async def preflight(connection: Connection, plan: LoadPlan) -> str:
    """The model the load will use. A server that cannot be asked at all is a clean error before any load, not
    a level full of failures."""
    async with OpenAIClient.from_connection(connection, model=plan.model, timeout_seconds=plan.timeout_seconds) as c:
        served = await c.models()
    if plan.model is not None and plan.model not in served:
        raise UsageError(
            f"{option('model')} {plan.model!r} is not served there (it serves {', '.join(served) or 'none'})",
            f"leave out {option('model')} to use the server's first model",
        )
    if not served:
        raise UsageError(f"{connection.base_url}/v1/models lists no model", "is the model loaded yet?")
    return plan.model or served[0]


class RequestStream:
    """A level's requests, drawn from the plan's seed: the same seed, level and prompt calibration give the same
    prompts and lengths in the same order (what a replayed workload relies on)."""

    def __init__(self, plan: LoadPlan, level: float, client: OpenAIClient | None) -> None:
        self.plan = plan
        self.rng = random.Random(plan.seed + int(level * 1000))
        self.prompts = PromptFactory(client, seed=self.rng.randrange(1 << 30))

    async def __call__(self) -> RequestPlan:
        # no await between the draws: requests drawn concurrently still take the seed's values in order
        output = self.plan.output_tokens.sample(self.rng)
        words = self.plan.prompt_tokens.sample(self.rng)
        return RequestPlan(
            prompt=await self.prompts.prompt(words),
            max_tokens=output,
            chat=self.plan.chat,
            ignore_eos=True,
            min_tokens=output,
        )


async def server_facts(connection: Connection, plan: LoadPlan) -> tuple[list[str], str | None, str]:
    """What a replay checks before its load: the served models, and the server's version with where it was read
    (None and why, when no page tells it)."""
    async with OpenAIClient.from_connection(connection, timeout_seconds=plan.timeout_seconds) as c:
        served = await c.models()
        version, source = await c.server_version()
    return served, version, source


async def run_level(
    connection: Connection, plan: LoadPlan, level: float, telemetry: TelemetryOptions | None
) -> LevelRun:
    async with OpenAIClient.from_connection(connection, model=plan.model, timeout_seconds=plan.timeout_seconds) as c:
        next_request = RequestStream(plan, level, c)
        await next_request.prompts.calibrate()

        total = plan.warmup_seconds + plan.duration_seconds + TAIL_SECONDS
        started = time.monotonic()
        scraper = _Scraper(connection, plan.duration_seconds, telemetry)
        timer = asyncio.get_running_loop().call_later(plan.warmup_seconds, scraper.start)
        try:
            if plan.mode == "closed":
                results = await closed_loop(
                    c,
                    int(level),
                    next_request,
                    duration_seconds=total,
                    max_requests=plan.max_requests,
                    think_time_seconds=plan.think_time_seconds,
                    allow_remote=plan.allow_remote,
                )
            else:
                results = await open_loop(
                    c,
                    level,
                    next_request,
                    duration_seconds=total,
                    max_requests=plan.max_requests,
                    seed=plan.seed,
                    allow_remote=plan.allow_remote,
                )
        finally:
            timer.cancel()
        window_start = started + plan.warmup_seconds
        window_end = window_start + plan.duration_seconds
        if scraper.is_alive() or scraper.ident is not None:
            await asyncio.to_thread(scraper.join, plan.duration_seconds + 60)
        else:
            scraper.error = "the load ended before the warm-up did: no window to scan"
        return LevelRun(results, window_start, window_end, scraper.signals, scraper.error, c.model or "")
