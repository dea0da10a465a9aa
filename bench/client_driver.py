"""The child process in which bench/bench_client.py runs our load client as a library (``llmdiag.client``):

    python bench/client_driver.py SPEC_JSON

SPEC_JSON: url, model, users, seconds, prompt_tokens, output_tokens, output_spread, records (a path or null).
Prints one JSON line of totals; with ``records``, writes every request's id and timestamps there after the load.
``LOAD_CLIENT_PROFILE=FILE`` cProfiles the client's run into FILE.
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import os
import random
import statistics
import sys
from pathlib import Path
from typing import Any

from llmdiag.client.openai import OpenAIClient
from llmdiag.client.prompts import PromptFactory
from llmdiag.client.result import RequestPlan
from llmdiag.client.runners import closed_loop


def driver_main(spec: dict[str, Any]) -> int:
    """The child process: our client's closed loop (``llmdiag.client``), then one JSON line of totals on
    stdout, and with ``spec["records"]`` every request's id and timestamps written there (after the load)."""
    words = PromptFactory(seed=os.getpid()).text  # the simulator counts one token per word
    prompt_words, output, chat = spec["prompt_tokens"], spec["output_tokens"], spec.get("chat", True)
    spread = spec.get("output_spread", 0.0)  # outputs drawn from O·(1 − s) … O·(1 + s): users out of lockstep
    low, high = max(1, round(output * (1 - spread))), max(1, round(output * (1 + spread)))
    draw = random.Random(0).randint

    def plan() -> RequestPlan:
        return RequestPlan(words(prompt_words), draw(low, high) if spread else output, chat=chat)

    async def run() -> list[Any]:
        async with OpenAIClient(spec["url"], model=spec["model"]) as client:
            return await closed_loop(client, spec["users"], plan, duration_seconds=spec["seconds"], max_requests=None)

    profile_path = os.environ.get("LOAD_CLIENT_PROFILE")  # cProfile the client's run into this file
    if profile_path:
        with cProfile.Profile() as profiler:
            results = asyncio.run(run())
        profiler.dump_stats(profile_path)
    else:
        results = asyncio.run(run())
    kinds: dict[str, int] = {}
    for r in results:
        if r.error_kind and r.error_kind != "cancelled":
            kinds[r.error_kind] = kinds.get(r.error_kind, 0) + 1
    gaps = [g for r in results for g in r.itl_seconds]  # cancelled ones too: long outputs may outlast the run
    summary = {
        "requests": len(results),
        "ok": sum(r.ok for r in results),
        "cancelled": sum(r.error_kind == "cancelled" for r in results),
        "errors": sum(kinds.values()),
        "error_kinds": kinds,
        "tokens": sum(r.output_tokens or 0 for r in results),
        "events": sum(len(r.token_times) for r in results),
        "itl_ms": 1e3 * statistics.median(gaps) if gaps else None,
    }
    if spec.get("records"):
        records = [
            {
                "id": r.request_id,
                "ok": r.ok,
                "started": r.started_at,
                "first_token": r.first_token_at,
                "token_times": r.token_times,
                "ended": r.ended_at,
                "output_tokens": r.output_tokens,
            }
            for r in results
        ]
        Path(spec["records"]).write_text(json.dumps(records))
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(driver_main(json.loads(sys.argv[1])))
