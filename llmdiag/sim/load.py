"""A preset's bounded closed-loop load: ``ClosedLoopLoad`` is ``llmdiag.client.runners.BackgroundLoad`` with the
preset's LoadSpec, and ``run_for`` drives one for a while and returns what the clients saw."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from llmdiag.client.result import RequestPlan, RequestResult
from llmdiag.client.runners import BackgroundLoad
from llmdiag.sim.openai import WORDS
from llmdiag.sim.presets import LoadSpec
from llmdiag.sim.server import SimServer


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
