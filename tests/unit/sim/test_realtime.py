"""The engine run in scaled real time on an event loop (no HTTP): requests added while it sleeps wake it, each
request's listener hears of its tokens and its end, every token is delivered, and shutdown aborts what is left and
tells its listeners. Runs are sped up 1000x where only the end matters; no duration is asserted."""

from __future__ import annotations

import asyncio
import time

from llmdiag.sim.engine import Engine, SimRequest
from llmdiag.sim.realtime import EngineRunner
from tests.unit.sim.test_sim_engine import tiny

SPEED = 1000.0


def listened(engine: Engine, runner: EngineRunner, name: str, prompt: int, output: int) -> tuple[SimRequest, list[int]]:
    """A request added at the runner's clock whose listener records the tokens generated at each call."""
    request = SimRequest(name, prompt, output, arrival=runner.clock())
    heard: list[int] = []
    request.listener = lambda: heard.append(request.generated)
    engine.add_request(request)
    runner.wake()
    return request, heard


async def until(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the runner did not get there"
        await asyncio.sleep(0.001)


def test_requests_added_to_an_idle_runner_run_to_their_end():
    async def scenario() -> None:
        engine = tiny(max_num_seqs=4)
        runner = EngineRunner(engine, time_scale=SPEED)
        task = asyncio.create_task(runner.run())
        await asyncio.sleep(0.01)  # the runner is asleep: nothing to do
        assert engine.stats.steps == 0
        a, heard_a = listened(engine, runner, "a", 6, 4)
        b, heard_b = listened(engine, runner, "b", 5, 3)
        await until(lambda: a.finished and b.finished)
        task.cancel()
        assert (a.generated, b.generated, a.finish_reason, b.finish_reason) == (4, 3, "length", "length")
        assert engine.stats.generation_tokens == 7 and engine.stats.prompt_tokens == 11
        # each listener heard its tokens come out, one call per step with new tokens, up to the last
        assert heard_a == sorted(heard_a) and heard_a[-1] == 4 and len(heard_a) >= 2
        assert heard_b[-1] == 3 and not engine.has_work()
        assert runner.lag_seconds >= 0.0

    asyncio.run(scenario())


def test_shutdown_aborts_what_is_left_and_tells_its_listeners():
    async def scenario() -> None:
        engine = tiny(max_num_seqs=1, max_model_len=32)
        runner = EngineRunner(engine, time_scale=1.0)  # real time: a step of a few ms, so 'long' is caught mid-way
        task = asyncio.create_task(runner.run())
        long, heard_long = listened(engine, runner, "long", 4, 20)
        queued, heard_queued = listened(engine, runner, "queued", 4, 4)  # one slot: it waits behind 'long'
        await until(lambda: long.generated >= 2)
        task.cancel()
        runner.shutdown()
        assert long.finished and queued.finished
        assert (long.finish_reason, queued.finish_reason) == ("abort", "abort")
        assert heard_queued == [0] and heard_long[-1] == long.generated < 20  # told once more, at the abort
        assert engine.stats.request_success["abort"] == 2

    asyncio.run(scenario())


def test_the_clock_is_monotonic_time_since_the_start_times_the_scale():
    runner = EngineRunner(tiny(), time_scale=SPEED)
    origin = runner._origin
    before = time.monotonic()
    reading = runner.clock()
    after = time.monotonic()
    assert (before - origin) * SPEED <= reading <= (after - origin) * SPEED
