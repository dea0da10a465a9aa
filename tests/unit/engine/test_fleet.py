"""The fleet model without servers: fleet rules on constructed replicas, worst-first order, the timeline's
transitions and first replica to go, the targets file, and the bounded runner's timeout."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from llmdiag.api.runner import run_bounded
from llmdiag.config import read_targets_file
from llmdiag.engine.fleet import build_fleet, build_timeline, majority_class, target_from_error
from llmdiag.errors import UsageError
from llmdiag.model import Bottleneck, FleetStep, FleetTarget, ReplicaNumbers

H, M, IDLE, U = Bottleneck.healthy, Bottleneck.memory, Bottleneck.idle, Bottleneck.unknown


def replica(name: str, rate: float, in_system: float, ttft: float, cls: Bottleneck = H, state: str = "OK"):
    return FleetTarget(
        name=name,
        bottleneck=cls,
        state=state,
        confidence=0.7,  # type: ignore[arg-type]
        numbers=ReplicaNumbers(request_rate_per_second=rate, requests_in_system_mean=in_system, ttft_p90_seconds=ttft),
    )


def test_router_uneven_load_names_the_busy_replica_with_its_numbers():
    report = build_fleet([replica("a", 30.0, 25.0, 0.02), replica("b", 4.0, 3.0, 0.02), replica("c", 5.0, 3.5, 0.02)])
    assert [f.finding.code for f in report.imbalance] == ["SCH008"]
    item = report.imbalance[0]
    assert item.replica == "a" and item.finding.severity.value == "critical"
    # 30 over the upper median of the others (5.0)
    assert item.finding.evidence[0].value == pytest.approx(6.0)
    assert item.values == {"a": 30.0, "b": 4.0, "c": 5.0}
    in_system = next(e for e in item.finding.evidence if e.signal == "replica_requests_in_system_max_over_peers_ratio")
    assert in_system.value == pytest.approx(25.0 / 3.5, rel=1e-3)
    assert report.targets[0].name == "a" and report.targets[0].flagged_by == ["SCH008"]
    outcomes = {o.code: o.status for o in report.fleet_rules}
    assert outcomes == {"SCH008": "fired", "SCH009": "passed"}


def test_one_slow_replica_is_worse_than_peers_and_not_an_uneven_router():
    """The slow replica finishes fewer requests; the upper median keeps its healthy peers from looking over-served."""
    report = build_fleet(
        [
            replica("a", 35.0, 31.0, 0.019),
            replica("b", 34.0, 31.0, 0.020),
            replica("m", 4.7, 34.0, 6.9, cls=M, state="CRITICAL"),
        ]
    )
    assert [f.finding.code for f in report.imbalance] == ["SCH009"]
    item = report.imbalance[0]
    assert item.replica == "m"
    assert item.finding.evidence[0].value == pytest.approx(6.9 / 0.020)
    assert [t.name for t in report.targets] == ["m", "b", "a"]  # critical first, then by TTFT
    assert report.class_counts == {"memory": 1, "healthy": 2}


def test_unreachable_replica_is_unknown_and_left_out_of_the_comparison():
    report = build_fleet([replica("a", 10.0, 5.0, 0.02), target_from_error("down", "http://x:1", "connection refused")])
    assert report.class_counts == {"healthy": 1, "unknown": 1}
    assert report.fleet_signals["fleet_replicas_judged"].stats["value"] == 1.0
    ratio = report.fleet_signals["replica_request_rate_max_over_peers_ratio"]
    assert ratio.unavailable and "1 replica" in ratio.unavailable
    assert {o.code: o.status for o in report.fleet_rules} == {"SCH008": "skipped", "SCH009": "skipped"}
    assert report.targets[0].name == "down" and report.targets[0].error == "connection refused"
    assert report.probed() == 1 and "down" in report.notes[0]


def test_peers_all_idle_is_a_capped_ratio_not_infinity():
    report = build_fleet([replica("a", 8.0, 5.0, 0.02), replica("b", 0.0, 0.0, 0.02), replica("c", 0.0, 0.0, 0.02)])
    signal = report.fleet_signals["replica_request_rate_max_over_peers_ratio"]
    assert signal.stats["value"] == 1000.0 and "all 0" in signal.source


def test_timeline_transitions_and_first_to_go():
    t0 = 1_700_000_000.0
    steps = [
        FleetStep(at_unix=t0, classes={"r1": H, "r2": H, "r3": IDLE}),
        FleetStep(at_unix=t0 + 300, classes={"r1": H, "r2": M, "r3": H}),
        FleetStep(at_unix=t0 + 600, classes={"r1": M, "r2": M, "r3": H}),
        FleetStep(at_unix=t0 + 900, classes={"r1": M, "r2": M}),  # r3 has no data: a gap, not a change
        FleetStep(at_unix=t0 + 1200, classes={"r1": M, "r2": M, "r3": M}),
    ]
    tl = build_timeline(list(reversed(steps)), step_seconds=300)
    assert tl.first_to_go == ["r2"] and tl.first_to_go_at_unix == t0 + 300 and tl.first_to_go_class is M
    got = [(t.replica, t.at_unix - t0, t.from_class.value, t.to_class.value) for t in tl.transitions]
    assert got == [
        ("r2", 300, "healthy", "memory"),
        ("r3", 300, "idle", "healthy"),
        ("r1", 600, "healthy", "memory"),
        ("r3", 1200, "healthy", "memory"),
    ]
    r3 = tl.transitions[-1]
    assert r3.previous_at_unix == t0 + 600  # the last step that showed it healthy
    fleet = [(t.at_unix - t0, t.from_class.value, t.to_class.value) for t in tl.fleet_transitions]
    assert fleet == [(600, "healthy", "memory")]


def test_timeline_ties_and_already_bad():
    t0 = 1000.0
    tl = build_timeline(
        [
            FleetStep(at_unix=t0, classes={"a": H, "b": H}),
            FleetStep(at_unix=t0 + 60, classes={"a": M, "b": Bottleneck.compute}),
        ]
    )
    assert tl.first_to_go == ["a", "b"] and tl.first_to_go_at_unix == t0 + 60
    tl = build_timeline([FleetStep(at_unix=t0, classes={"a": M}), FleetStep(at_unix=t0 + 60, classes={})])
    assert tl.first_to_go == [] and any("already" in n for n in tl.notes) and any("no replica" in n for n in tl.notes)
    assert majority_class({"a": H, "b": M}) is M and majority_class({}) is U


def test_targets_file(tmp_path: Path):
    path = tmp_path / "targets.txt"
    path.write_text("# the pool\nhttp://10.0.0.1:8000\nb=http://10.0.0.2:8000  # second\n\nhttp://10.0.0.1:8000\n")
    targets = read_targets_file(path)
    assert [(t.name, t.url) for t in targets] == [
        ("10.0.0.1:8000", "http://10.0.0.1:8000"),
        ("b", "http://10.0.0.2:8000"),
        ("10.0.0.1:8000#2", "http://10.0.0.1:8000"),
    ]
    path.write_text("not a url\n")
    with pytest.raises(UsageError, match="targets.txt:1"):
        read_targets_file(path)
    toml = tmp_path / "fleet.toml"
    toml.write_text('[[targets]]\nname = "a"\nurl = "http://h:1"\n[[targets]]\nname = "b"\nurl = "http://h:2"\n')
    assert [t.name for t in read_targets_file(toml)] == ["a", "b"]


def test_runner_bounds_concurrency_times_out_and_isolates_errors():
    running, peak = [0], [0]

    def job(item: str) -> str:
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        try:
            if item == "slow":
                time.sleep(1.0)
            if item == "bad":
                raise RuntimeError("boom")
            time.sleep(0.05)
            return f"ok {item}"
        finally:
            running[0] -= 1

    out = run_bounded(
        ["a", "slow", "bad", "b", "c"],
        job,
        concurrency=2,
        timeout_seconds=0.3,
        on_timeout=lambda item, s: f"timeout {item} {s:g}",
        on_error=lambda item, e: f"error {item} {e}",
    )
    assert out == ["ok a", "timeout slow 0.3", "error bad boom", "ok b", "ok c"]
