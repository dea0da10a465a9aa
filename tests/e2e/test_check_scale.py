"""`llmdiag check` across a mixed fleet (issue 19 §5), a short version of bench/check_fleet200.py: 40 targets on
one scripted server (real vLLM recordings replayed, a server that never answers, HTTP 500/503/429/401, a login page,
not an exposition, a reset mid-body), a closed port and a live simulator.

Asserted: each target gets its kind's state (OK with the class for a recorded or simulated healthy or idle server,
WARNING/CRITICAL with the recorded class for a recorded capacity state, UNKNOWN with an error for the rest), the
results come back in the targets' order, the connections open at once at the scripted server stay within
concurrency × the connections one target holds, and none is left open after the run. No absolute times.

The run-deadline tests (``[check] deadline_seconds`` and ``check --deadline``) add servers that drip one byte
every 0.5 s, which no read timeout ends.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

from bench.check_fleet200 import (
    CONNECTIONS_PER_TARGET,
    DRIP_KINDS,
    Planned,
    check_settings,
    plan_fleet,
    simulators,
    states_by_kind,
    wrong_state,
)
from bench.fleet_servers import FleetProcess
from llmdiag.api.check import run_check
from llmdiag.config import Target
from llmdiag.model.check import CheckReport, State
from tests.conftest import run_cli

TARGETS = 40
CONCURRENCY = 8
WINDOW_SECONDS = 2.0
TIMEOUT_SECONDS = 3.0  # generous: a loaded 2-core machine can hold a local answer past 1 s


def settled_open(server: FleetProcess, seconds: float = 5.0) -> list[str]:
    """The connections still open at the server once the client's closes have reached it: the last path each
    was asked."""
    end = time.monotonic() + seconds
    while server.open_now and time.monotonic() < end:
        time.sleep(0.05)
    return server.open_paths


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[list[Planned], CheckReport, FleetProcess]]:
    with simulators(1) as sim_urls, FleetProcess(hold_seconds=60) as server:
        planned = plan_fleet(server, TARGETS, sim_urls, TIMEOUT_SECONDS)
        report = run_check([p.target for p in planned], check_settings(CONCURRENCY, None), WINDOW_SECONDS)
        yield planned, report, server


def test_every_target_gets_its_kinds_state(fleet):
    planned, report, _ = fleet
    assert [r.name for r in report.targets] == [p.target.name for p in planned]
    pairs = zip(planned, report.targets, strict=True)
    wrong = {p.target.name: why for p, r in pairs if (why := wrong_state(p.kind, r))}
    assert wrong == {}
    table = states_by_kind(planned, report)
    assert table["dead"] == {"UNKNOWN": 3} and table["replay:healthy"] == {"OK": 6}
    # the recorded memory state is critical somewhere, so the fleet is
    assert report.state is State.CRITICAL


def test_unreachable_and_hostile_targets_say_why(fleet):
    planned, report, _ = fleet
    errors = {p.kind: r.error or "" for p, r in zip(planned, report.targets, strict=True)}
    assert "connection refused" in errors["dead"]
    assert "did not answer within 3 s" in errors["blackhole"]
    for code in (500, 503, 429, 401):
        assert f"HTTP {code}" in errors[f"status:{code}"]
    assert "closed the connection mid-page" in errors["reset"]


def test_connections_stay_within_the_concurrency_and_all_close(fleet):
    _, _, server = fleet
    # a target keeps its page's connection open through its window: the connections open at once follow the
    # targets being checked at once (the requests in flight do not: a local answer takes a millisecond)
    assert 0 < server.most_concurrent <= CONCURRENCY * CONNECTIONS_PER_TARGET
    assert settled_open(server) == []


def drip_fleet(server: FleetProcess, drips: int = 4, others: int = 8) -> list[Planned]:
    """Dripping servers first, then the others (recorded states, a closed port, a silent server …)."""
    planned = []
    for i in range(drips):
        kind = DRIP_KINDS[i % len(DRIP_KINDS)]
        name = f"drip{i}-{kind.replace('_', '-')}"
        target = Target(name=name, url=server.add(name, kind), timeout_seconds=TIMEOUT_SECONDS, nvml=False)
        planned.append(Planned(target, kind))
    return planned + plan_fleet(server, others, [], TIMEOUT_SECONDS)


def out_of_time(error: str | None) -> bool:
    return bool(error and re.search(r"in time|deadline", error))


def test_the_runs_deadline_ends_a_fleet_that_drips():
    # sixteen targets two at a time need eight windows of 2 s at the least: more than a 8 s run, so the run ends at
    # its deadline, and whatever it cut is UNKNOWN saying so
    deadline_seconds = 8.0
    with FleetProcess(hold_seconds=120) as server:
        planned = drip_fleet(server, drips=2, others=14)
        started = time.monotonic()
        report = run_check([p.target for p in planned], check_settings(2, deadline_seconds), WINDOW_SECONDS)
        wall = time.monotonic() - started
        assert wall < deadline_seconds + 10  # a generous margin; the drips alone would hold it 120 s
        assert [r.name for r in report.targets] == [p.target.name for p in planned]
        for plan, result in zip(planned, report.targets, strict=True):
            if plan.kind in DRIP_KINDS:
                assert result.state is State.UNKNOWN and result.verdict is None and result.error, result
            elif result.state is State.UNKNOWN and result.verdict is None and out_of_time(result.error):
                continue  # cut by the run's deadline
            else:
                assert wrong_state(plan.kind, result) is None, (plan.target.name, wrong_state(plan.kind, result))
        assert any(out_of_time(r.error) for r in report.targets)
        assert settled_open(server, 15) == []


def test_each_target_has_its_own_deadline_inside_a_long_run_deadline():
    # four drips at once, with a run deadline far beyond each target's own (window + timeout + a small margin):
    # they end at their own deadlines, well before the run's, and the rest are judged as usual
    with FleetProcess(hold_seconds=300) as server:
        planned = drip_fleet(server, drips=4, others=4)
        started = time.monotonic()
        report = run_check([p.target for p in planned], check_settings(4, 200.0), WINDOW_SECONDS)
        wall = time.monotonic() - started
    assert wall < 100
    for plan, result in zip(planned, report.targets, strict=True):
        if plan.kind in DRIP_KINDS:
            assert result.state is State.UNKNOWN and result.verdict is None and result.error, result
        else:
            assert wrong_state(plan.kind, result) is None, (plan.target.name, wrong_state(plan.kind, result))


def test_check_deadline_option_makes_a_dripping_server_unknown():
    with FleetProcess(hold_seconds=120) as server:
        url = server.add("drip", "drip_body")
        started = time.monotonic()
        result = run_cli(
            "check", url, "--deadline", "10", "--duration", "2", "--timeout", "3", "--no-nvml", "--no-history"
        )
        wall = time.monotonic() - started
    assert result.returncode == 3, result.stderr
    assert re.match(r"^LLMDIAG UNKNOWN - ", result.stdout)
    assert "Traceback" not in result.stderr
    assert wall < 60
