"""Many diagnoses in one process do not leak (issue 19 §5), a short version of bench/leaks.py: 100 analyze-path
diagnoses of recorded pages, 10 live scans against a replay server (detection, host probe, NVML auto, canary) and
5 checks of a mixed fleet with a history. After a warm-up, open file descriptors and threads stay where they were,
the replay server sees every connection closed, and memory grows by no more than a loose bound (the figures of
the long runs are in bench/leaks.py's output). No absolute times."""

from __future__ import annotations

from pathlib import Path

from bench.leaks import LEFT_OPEN, STILL_OPEN, Snapshot, analyses, checks, growth, scans, snapshot

# loose: the long runs grow by a few per cent (bench/leaks.py); a leak per call grows without bound
RSS_GROWTH_RATIO = 0.25


def flat(snaps: list[Snapshot]) -> None:
    g = growth(snaps)
    assert g["fds"] <= 1, snaps
    assert g["threads"] <= 0 and g["os_threads"] <= 0, snaps
    assert g["rss_ratio"] < RSS_GROWTH_RATIO, snaps


def test_snapshot_counts_what_the_process_holds(tmp_path: Path):
    before = snapshot("before", 0)
    with open(tmp_path / "a", "w"), open(tmp_path / "b", "w"):
        held = snapshot("held", 0)
    assert held.fds == before.fds + 2
    assert held.rss_bytes > 0 and held.threads >= 1


def test_analyze_path_diagnoses_do_not_leak():
    snaps, classes = analyses(100, warmup=10)
    assert sum(classes.values()) == 100
    # the recordings' own states come back (each state's windows are judged: not all unknown)
    assert {"healthy", "memory", "idle"} <= set(classes)
    flat(snaps)


def test_live_scans_do_not_leak_and_close_their_connections():
    snaps, classes = scans(10, warmup=3, window_seconds=1.0)
    assert classes.pop(STILL_OPEN) == 0 and classes.pop(LEFT_OPEN) == 0
    assert classes == {"healthy": 10}
    flat(snaps)


def test_checks_with_a_history_do_not_leak(tmp_path: Path):
    snaps, states = checks(5, warmup=2, window_seconds=1.0, history_path=tmp_path / "history.sqlite")
    assert states == {"CRITICAL": 5}
    flat(snaps)
