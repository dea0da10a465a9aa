"""A preset's bounded closed-loop load: ``ClosedLoopLoad`` is ``llmdiag.client.runners.BackgroundLoad`` with the
preset's LoadSpec, and ``run_for`` drives one for a while and returns what the clients saw."""

from __future__ import annotations

import random
from typing import Any

from llmdiag.client.openai import ClientOptions
from llmdiag.client.result import RequestPlan
from llmdiag.client.runners import BackgroundLoad, LoadShape, LoadTally
from llmdiag.sim.openai import WORDS
from llmdiag.sim.presets import LoadSpec
from llmdiag.sim.server import SimServer


class ClosedLoopLoad(BackgroundLoad):
    """A preset's load: ``load.users`` users on their own event loop in a background thread, each sending one
    streaming /v1/completions request (ignore_eos, ``load.prompt_tokens`` words, max_tokens drawn from
    ``load.output_range()``, include_usage) and the next as soon as it ends; after an HTTP error it pauses
    ``error_backoff_seconds``. Stops after ``max_seconds`` or ``max_requests`` started requests, or when the
    context manager exits (in-flight requests are cancelled). Talks to loopback only. ``tally`` counts what it saw.
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
            return RequestPlan(prompt, rng.randint(low, high), chat=chat)

        self.load = load
        shape = LoadShape(
            max_seconds,
            users=load.users,
            max_requests=max_requests,
            error_backoff_seconds=error_backoff_seconds,
            seed=seed,
        )
        # no idle timeout worth the name: a deep simulated queue can hold a request for minutes; the run's own
        # deadline bounds it
        client = ClientOptions(model=model, timeout_seconds=max(max_seconds, 60.0))
        super().__init__(base_url, plan, shape, client=client, name="llmdiag-sim-load")


def run_for(server: SimServer, load: LoadSpec, seconds: float, **kwargs: Any) -> LoadTally:
    """Drive ``load`` against ``server`` for ``seconds`` and return what the clients saw (a blocking helper)."""
    driver = ClosedLoopLoad(server.url, server.model, load, max_seconds=seconds, **kwargs)
    with driver:
        driver.wait(seconds + 10)
    return driver.tally
