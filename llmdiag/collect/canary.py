"""Canary requests: a few small streaming requests through the server's own API during a scan's window.

They measure what a user sees now (time to first token, time per output token) from the client side, to set
beside the server's histograms: the gap between the two is frontend, proxy or network time the server cannot see.
One user, one request every few seconds, bounded in count: a probe, not a load. A server that cannot be asked
(no model, a refused API) gives a coverage line; the scan goes on with its metrics.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from llmdiag.client.deadline import current
from llmdiag.client.endpoint import Connection, redact_url
from llmdiag.client.openai import ClientOptions, OpenAIClient
from llmdiag.client.prompts import PromptFactory
from llmdiag.client.result import RequestPlan, RequestResult
from llmdiag.client.runners import BackgroundLoad, LoadShape
from llmdiag.collect.source import unavailable_source
from llmdiag.errors import LlmdiagError
from llmdiag.model import Percentiles, Signal, SignalSet, SourceInfo
from llmdiag.model.load import percentiles

CANARY_PROMPT_TOKENS = 64
CANARY_OUTPUT_TOKENS = 32
CANARY_INTERVAL_SECONDS = 1.0
CANARY_MAX_REQUESTS = 12
CANARY_TIMEOUT_SECONDS = 30.0
STOP_SECONDS = 30.0  # the longest the canaries' thread is waited for at the window's end
LABEL = "canary requests"
# the signals a scan with canaries adds are declared in probes/signals.toml (producer "canary"); rules may read them
# the canary in flight at the window's last scrape: the server has counted its prompt and some of its output, but
# it may end (or be cancelled) without a result that says so; allow for one of each
PROMPT_TOKENS_IN_FLIGHT = 2 * CANARY_PROMPT_TOKENS
OUTPUT_TOKENS_IN_FLIGHT = CANARY_OUTPUT_TOKENS


def _histogram(name: str, values: Iterable[float | None], source: str, window_seconds: float) -> Signal:
    dist: Percentiles = percentiles(v for v in values if v is not None)
    if not dist.count:
        return Signal.missing(name, "histogram", "seconds", "no canary request got that far", source=source)
    stats = {"count": float(dist.count), "mean": dist.mean, "p50": dist.p50, "p90": dist.p90, "p99": dist.p99}
    return Signal(
        name=name,
        kind="histogram",
        unit="seconds",
        stats={k: v for k, v in stats.items() if v is not None},
        source=source,
        verify="curl -N -s URL/v1/completions -H 'Content-Type: application/json' -d "
        '\'{"model": "M", "prompt": "hello", "max_tokens": 32, "stream": true}\'  # time the first data line',
        window_seconds=window_seconds,
    )


class Canary:
    """Start before the window, ``finish()`` after it: the results as signals, or a coverage line."""

    def __init__(self, connection: Connection, duration_seconds: float, seed: int = 0):
        self.connection = connection
        self.duration_seconds = duration_seconds
        self.rng = random.Random(seed)
        self.prompts: PromptFactory | None = None
        self.load: BackgroundLoad | None = None
        self.failed: str | None = None
        self.deadline = current()  # the scan's: the canaries start, stream and stop by it

    async def _prepare(self, client: OpenAIClient) -> None:
        self.prompts = PromptFactory(client, seed=self.rng.randrange(1 << 30))
        await self.prompts.calibrate()

    async def _plan(self) -> RequestPlan:
        assert self.prompts is not None
        return RequestPlan(
            prompt=await self.prompts.prompt(CANARY_PROMPT_TOKENS),
            max_tokens=CANARY_OUTPUT_TOKENS,
            ignore_eos=True,
            min_tokens=CANARY_OUTPUT_TOKENS,
        )

    def start(self) -> None:
        # a scan may point at a remote production server on purpose: a handful of small requests is not a load
        self.load = BackgroundLoad(
            self.connection.base_url,
            self._plan,
            LoadShape(
                self.duration_seconds,
                users=1,
                think_time_seconds=CANARY_INTERVAL_SECONDS,
                max_requests=CANARY_MAX_REQUESTS,
            ),
            client=ClientOptions(
                api_key=self.connection.api_key,
                headers=self.connection.headers,
                insecure=self.connection.insecure,
                timeout_seconds=min(CANARY_TIMEOUT_SECONDS, max(self.connection.timeout_seconds, 10.0)),
            ),
            allow_remote=True,
            keep_results=True,
            prepare=self._prepare,
            name="llmdiag-canary",
        )
        ready_seconds = max(10.0, self.connection.timeout_seconds * 2)
        if self.deadline is not None:  # the window waits for the start: it may use the scan's spare time, no more
            spare = self.deadline.remaining() - self.duration_seconds - 1.0
            ready_seconds = max(0.5, min(ready_seconds, spare))
        try:
            self.load.start(ready_timeout_seconds=ready_seconds)
        except (LlmdiagError, OSError) as exc:
            self.failed = str(getattr(exc, "message", exc))
            self.load.stop(self._stop_seconds())

    def _stop_seconds(self) -> float:
        """How long the canaries' thread is waited for once cancelled: by the scan's deadline (its thread is a
        daemon: one that has not ended by then is left behind, not waited for)."""
        if self.deadline is None:
            return STOP_SECONDS
        return max(0.5, min(STOP_SECONDS, self.deadline.remaining()))

    def finish(self) -> SignalSet | SourceInfo:
        if self.load is None:
            return unavailable_source("canary", LABEL, f"{LABEL}: not sent")
        self.load.stop(self._stop_seconds())
        if self.failed is not None:
            return unavailable_source("canary", LABEL, f"{LABEL}: unavailable ({self.failed})")
        results = list(self.load.results)
        ok = [r for r in results if r.ok]
        failed = [r for r in results if not r.ok and r.error_kind != "cancelled"]
        if not ok:
            why = failed[0].error if failed else "none finished inside the window"
            return unavailable_source("canary", LABEL, f"{LABEL}: unavailable ({len(failed)} failed: {why})")
        return self._signals(ok, failed, results)

    def _signals(self, ok: list[RequestResult], failed: list[RequestResult], sent: list[RequestResult]) -> SignalSet:
        client = self.load.client if self.load else None
        model = client.model if client is not None and client.model else "?"
        source = (
            f"canary: {len(ok)} streamed /v1/completions requests "
            f"({CANARY_PROMPT_TOKENS} → {CANARY_OUTPUT_TOKENS} tokens)"
        )
        window = self.duration_seconds
        signals = SignalSet()
        signals.add(_histogram("client_ttft_seconds", (r.ttft_seconds for r in ok), source, window))
        signals.add(_histogram("client_tpot_seconds", (r.tpot_seconds for r in ok), source, window))
        signals.add(_histogram("client_e2e_seconds", (r.e2e_seconds for r in ok), source, window))
        # what the canaries themselves put on the server's counters, so an otherwise idle server still reads idle
        for name, value in (
            ("client_request_errors", len(failed)),
            ("client_requests_sent", len(sent)),
            ("client_output_tokens", sum(r.output_tokens or 0 for r in sent) + OUTPUT_TOKENS_IN_FLIGHT),
            (
                "client_prompt_tokens",
                sum(r.prompt_tokens or CANARY_PROMPT_TOKENS for r in ok) + PROMPT_TOKENS_IN_FLIGHT,
            ),
        ):
            signals.add(
                Signal(
                    name=name,
                    kind="derived",
                    unit="count" if "token" not in name else "tokens",
                    stats={"value": float(value)},
                    source=source,
                )
            )
        details = {"model": model, "requests": f"{len(ok)} ok, {len(failed)} failed"}
        if failed:
            details["first error"] = (failed[0].error or "")[:160]
        url = redact_url(self.connection.base_url)
        signals.sources.append(SourceInfo(probe="canary", url=url, server=LABEL, config=details))
        return signals
