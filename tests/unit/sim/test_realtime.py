"""The engine run in scaled real time on an event loop (no HTTP): requests added while it sleeps wake it, each
request's listener hears of its tokens and its end, every token is delivered, and shutdown aborts what is left and
tells its listeners. Runs are sped up 1000x where only the end matters; no duration is asserted. A host that runs
the engine late (a busy machine) leaves its history in simulated time as a punctual one has it, and the time the
clock stood still is counted as lag: driven with a hand-moved ``time.monotonic``."""

from __future__ import annotations

import asyncio
import time

import pytest

from llmdiag.sim import realtime
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


# --- a late host: the clock stands still instead of the engine falling behind ------------------------------------


class FakeTime:
    """``time.monotonic`` for the runner, moved by hand: the host is as late as a test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def late_runner(monkeypatch, engine: Engine) -> tuple[EngineRunner, FakeTime]:
    fake = FakeTime()
    monkeypatch.setattr(realtime, "time", fake)
    return EngineRunner(engine, time_scale=1.0), fake


def timeline(engine: Engine) -> list[tuple[float, float, int]]:
    steps: list[tuple[float, float, int]] = []
    engine.step_listeners.append(lambda s: steps.append((s.start, s.end, s.num_tokens)))
    return steps


def drive(runner: EngineRunner, fake: FakeTime, lateness: list[float]) -> int:
    """Settle the runner each time it is due, ``lateness[i % len]`` real seconds after it was; returns the calls."""
    calls = 0
    while (due := runner.due()) is not None:
        # a nanosecond on top: the sum must not round to just before the due time
        fake.now = runner._origin + due + runner.lag_seconds + lateness[calls % len(lateness)] + 1e-9
        runner.settle()
        calls += 1
        assert calls < 10_000
    return calls


def busy_engine() -> Engine:
    engine = tiny(max_num_seqs=3)
    for name, prompt, output in (("a", 6, 9), ("b", 5, 4), ("c", 7, 6), ("d", 3, 8), ("e", 4, 3)):
        engine.add_request(SimRequest(name, prompt, output, arrival=0.0))
    return engine


def test_a_late_host_leaves_the_engine_history_as_an_punctual_one_has_it(monkeypatch):
    """The same requests, driven by a punctual host and by one late by up to 1.5 s: the same steps at the same
    simulated times, the same latency histograms, and the late one's excess over the tolerance counted as lag."""
    punctual, late = busy_engine(), busy_engine()
    steps_punctual, steps_late = timeline(punctual), timeline(late)
    runner, fake = late_runner(monkeypatch, punctual)
    runner.wake()
    drive(runner, fake, [0.0])
    assert runner.lag_seconds == 0.0

    lateness = [0.0, 0.002, 0.3, 0.004, 1.5, 0.0, 0.05]
    runner, fake = late_runner(monkeypatch, late)
    runner.wake()
    calls = drive(runner, fake, lateness)
    assert steps_late == steps_punctual and len(steps_late) > 10
    for name in ("ttft", "itl", "e2e", "queue"):
        mine, theirs = getattr(late.stats, name), getattr(punctual.stats, name)
        assert (mine.counts, mine.total) == (theirs.counts, theirs.total), name
    tolerance = realtime.LAG_TOLERANCE_SECONDS
    expected_lag = sum(max(0.0, lateness[i % len(lateness)] - tolerance) for i in range(calls))
    assert runner.lag_seconds == pytest.approx(expected_lag) and runner.lag_seconds > 1.5
    # the clock reads the real time less the lag
    assert runner.clock() == pytest.approx(runner.real_seconds() - runner.lag_seconds)


def test_while_the_runner_is_late_the_clock_stands_at_the_step_end_and_an_arrival_is_stamped_there(monkeypatch):
    engine = tiny(max_num_seqs=4)
    runner, fake = late_runner(monkeypatch, engine)
    first, _ = listened(engine, runner, "first", 6, 5)
    runner.settle()  # due at once: the first step starts
    step = engine.in_flight
    assert step is not None and step.start == first.arrival
    fake.now += step.end - step.start + 2.0  # the host comes back 2 s after the step ended
    tolerance = realtime.LAG_TOLERANCE_SECONDS
    assert runner.clock() == step.end + tolerance  # held, not 2 s later
    second, _ = listened(engine, runner, "second", 4, 2)
    assert second.arrival == step.end + tolerance
    runner.settle()
    assert runner.lag_seconds == pytest.approx(2.0 - tolerance)
    following = engine.in_flight
    assert following is not None and following.start == step.end  # back to back, as if the host had been on time
    drive(runner, fake, [0.0])
    assert second.finished and second.scheduled_ts is not None
    # it waited for one step at most, never for the time the host was away
    assert second.scheduled_ts - second.arrival <= following.duration


def test_work_reaching_an_idle_engine_starts_when_it_arrived_however_late_the_runner_wakes(monkeypatch):
    engine = tiny()
    runner, fake = late_runner(monkeypatch, engine)
    fake.now += 10.0  # idle: the clock runs with real time and nothing counts as lag
    assert runner.clock() == 10.0 and runner.due() is None
    request, _ = listened(engine, runner, "r", 5, 3)
    assert request.arrival == 10.0 and runner.due() == 10.0
    fake.now += 0.5
    runner.settle()
    assert request.scheduled_ts == request.arrival  # no queue time for a runner the host kept asleep
    assert runner.lag_seconds == pytest.approx(0.5 - realtime.LAG_TOLERANCE_SECONDS)


def test_a_request_aborted_while_queued_leaves_no_due_time_behind(monkeypatch):
    engine = tiny()
    runner, fake = late_runner(monkeypatch, engine)
    request, _ = listened(engine, runner, "r", 5, 3)
    engine.abort(request, runner.clock())
    assert runner.due() is None
    fake.now += 3.0
    later, _ = listened(engine, runner, "later", 5, 3)
    assert later.arrival == 3.0 and runner.due() == 3.0  # due when it came, not when the aborted one did
    runner.settle()
    assert runner.lag_seconds == 0.0 and later.scheduled_ts == later.arrival


def test_a_loop_blocked_mid_run_stretches_no_latency_and_counts_as_lag():
    """A callback that holds the event loop for 0.3 s while tokens stream: every inter-token latency the engine
    records is one of its own step times (none carries the stall), and the stall is counted as lag."""

    async def scenario() -> None:
        engine = tiny(max_num_seqs=4, max_model_len=32)
        durations: list[float] = []
        engine.step_listeners.append(lambda s: durations.append(s.duration))
        runner = EngineRunner(engine, time_scale=1.0)
        task = asyncio.create_task(runner.run())
        request, _ = listened(engine, runner, "long", 4, 20)
        await until(lambda: request.generated >= 3)
        time.sleep(0.3)  # the host is away: nothing on the loop runs
        await until(lambda: request.finished)
        task.cancel()
        assert runner.lag_seconds >= 0.3 - max(durations) - realtime.LAG_TOLERANCE_SECONDS
        itl = engine.stats.itl
        assert itl.count == 19
        assert itl.total == pytest.approx(sum(durations[1:]))  # the first step's token is the first, not an ITL

    asyncio.run(scenario())


def test_the_simulator_s_stats_settle_the_engine_first_and_report_the_lag(monkeypatch):
    """/sim/stats read while the runner is late: the step that has ended is completed (its request is no longer
    half-way) and the time the clock stood still is there beside the real time."""
    from llmdiag.sim.app import SimApp, SimConfig

    fake = FakeTime()
    monkeypatch.setattr(realtime, "time", fake)
    app = SimApp(SimConfig(tiny().config))
    request, _ = listened(app.engine, app.runner, "r", 5, 1)
    app.runner.settle()
    step = app.engine.in_flight
    assert step is not None and app.snapshot()["running"] == 1
    fake.now += step.duration + 1.0
    stats = app.snapshot()
    assert request.finished and (stats["steps"], stats["running"], stats["generation_tokens"]) == (1, 0, 1)
    assert stats["lag_seconds"] == pytest.approx(1.0 - realtime.LAG_TOLERANCE_SECONDS)
    assert stats["clock_seconds"] + stats["lag_seconds"] == pytest.approx(stats["real_seconds"])


def test_a_live_test_s_run_on_a_starved_simulator_is_repeated_once_then_judged(monkeypatch):
    """tests.support.simlag: a run whose simulator clock stood still over half of it runs again, once."""
    from tests.support import simlag

    class Sim:
        def __init__(self, lags: list[float]) -> None:
            self.readings = iter([{"real_seconds": 10.0 * i, "lag_seconds": lag} for i, lag in enumerate(lags)])

        def snapshot(self) -> dict[str, float]:
            return next(self.readings)

    runs: list[tuple[str, ...]] = []
    monkeypatch.setattr(simlag, "run_cli", lambda *args, timeout: runs.append(args) or len(runs))
    resets: list[int] = []
    # 8 s of 10 stood still, then 9 of 10: run twice, the second judged whatever its lag
    with pytest.warns(UserWarning, match="stood still 80% of the run"):
        second = simlag.run_cli_on_sim(Sim([0.0, 8.0, 8.0, 17.0]), "scan", before_each=lambda: resets.append(1))  # type: ignore[arg-type]
    assert (second, runs, resets) == (2, [("scan",), ("scan",)], [1, 1])
    runs.clear()
    assert simlag.run_cli_on_sim(Sim([0.0, 5.0]), "scan") == 1 and runs == [("scan",)]  # half: judged
