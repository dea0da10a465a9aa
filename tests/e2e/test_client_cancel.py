"""A request cancelled just as its answer has ended closes its connection (found by bench/leaks.py: scans whose
canary was stopped at that moment left one connection open per scan, until the garbage collector came by).

The answer's end resolves the request's future; the request's task resumes on the loop's next turn. A cancel in
between (the canary's stop, a deadline) lands in a request whose connection is already idle but in no pool: unless
the request drops it, nothing closes it. Driven deterministically here against a real local server that answers
404 at once: a watcher polls each turn and cancels the request the turn its connection goes idle."""

from __future__ import annotations

import asyncio

import pytest

from llmdiag.client import http1, openai
from llmdiag.client.openai import OpenAIClient
from tests.support.httpserver import Reply, ScriptedServer


def test_a_request_cancelled_as_its_answer_ends_closes_its_connection(monkeypatch: pytest.MonkeyPatch):
    made: list[http1._Connection] = []

    class Tracked(http1._Connection):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(openai, "_Connection", Tracked)

    async def cancel_as_the_answer_ends(url: str) -> str:
        client = OpenAIClient(url, model="m", timeout_seconds=5)
        request = asyncio.ensure_future(client.complete("hi", 1))  # the canary's request
        while not (made and made[0].exchanges == 1 and made[0]._state == http1._IDLE):
            assert not request.done(), "the request resumed before the watcher saw its answer end"
            await asyncio.sleep(0)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        await asyncio.sleep(0)  # an aborted transport closes on the loop's next turn
        await client.close()
        return "closed" if made[0].closed else "still open"

    with ScriptedServer(lambda path, headers: Reply(status=404, body=b"not found")) as server:
        assert asyncio.run(cancel_as_the_answer_ends(server.url)) == "closed"


def test_a_canary_stopped_while_the_model_lookup_hangs_is_unavailable_and_closes_its_connection():
    """A server that never answers /v1/models: the canary's request waits for the model's name (a look-up shielded
    from it). Stopped, the request is 'cancelled' (it once counted as 1 ok request with a negative end-to-end time)
    and the look-up is cancelled with it (it once was left pending on a closed loop, its connection open)."""
    import time

    import psutil

    from llmdiag.client.endpoint import Connection
    from llmdiag.collect.canary import Canary
    from tests.support.hostile import HostileServer, silent

    with HostileServer(silent()) as server:
        port = int(server.url.rstrip("/").rsplit(":", 1)[1])
        canary = Canary(Connection(base_url=server.url, timeout_seconds=10), 2.0)
        canary.start()
        time.sleep(1.0)
        outcome = canary.finish()
        end = time.monotonic() + 5  # the aborted transport closes on the loop's last turns
        while time.monotonic() < end:
            mine = psutil.Process().net_connections("tcp")
            still = [c for c in mine if c.raddr and c.raddr.port == port and c.status == "ESTABLISHED"]
            if not still:
                break
            time.sleep(0.05)
    from llmdiag.model import SourceInfo

    assert isinstance(outcome, SourceInfo), outcome  # not signals from a request that never ran
    assert not outcome.ok and "unavailable" in outcome.note, outcome
    assert still == []
