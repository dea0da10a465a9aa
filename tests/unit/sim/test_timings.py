"""The simulator's server-side timing log: keyed by the client's request id, bounded (oldest dropped first and
counted), and read whole or drained."""

from __future__ import annotations

import pytest

from llmdiag.errors import UsageError
from llmdiag.sim.timings import TimingLog


def test_a_request_is_kept_with_its_events_and_end():
    log = TimingLog(capacity=4)
    timings = log.start("r1", received_at=10.0)
    timings.event_times += [10.5, 10.6]
    timings.event_tokens += [1, 2]
    timings.ended_at, timings.status = 10.7, 200
    snap = log.snapshot()
    assert snap == {
        "clock": "time.monotonic",
        "capacity": 4,
        "dropped": 0,
        "requests": {
            "r1": {
                "received_at": 10.0,
                "event_times": [10.5, 10.6],
                "event_tokens": [1, 2],
                "ended_at": 10.7,
                "status": 200,
            }
        },
    }


def test_the_oldest_requests_are_dropped_past_the_capacity_and_counted():
    log = TimingLog(capacity=2)
    for i in range(5):
        log.start(f"r{i}", received_at=float(i))
    snap = log.snapshot()
    assert list(snap["requests"]) == ["r3", "r4"] and snap["dropped"] == 3


def test_a_drained_snapshot_starts_the_log_afresh():
    log = TimingLog(capacity=1)
    log.start("a", 1.0)
    log.start("b", 2.0)
    assert list(log.snapshot(clear=True)["requests"]) == ["b"]
    assert log.snapshot() == {"clock": "time.monotonic", "capacity": 1, "dropped": 0, "requests": {}}


def test_a_log_must_keep_something():
    with pytest.raises(UsageError, match="at least 1"):
        TimingLog(capacity=0)
