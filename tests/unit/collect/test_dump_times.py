"""Saved dumps are timed by their own data, never by the file's mtime or an assumed interval (collect/files.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmdiag.collect.files import collect_files
from tests.conftest import FIXTURES

MEMORY = FIXTURES / "vllm-0.32.0" / "memory"
SGLANG = FIXTURES / "sglang" / "dp2-imbalanced-1.prom"
YEAR_SECONDS = 365 * 86400


def without_time(source: Path, into: Path, pasted: bool = False) -> Path:
    """The real page less its '# llmdiag-scraped-at' line, as a user's curl would save it; mtime: now."""
    lines = [line for line in source.read_text().splitlines() if "llmdiag-scraped-at" not in line]
    if pasted:
        lines = ["from the node that hung:", "```", *lines, "```"]
    into.write_text("\n".join(lines) + "\n")
    return into


def process_start(page: Path) -> float:
    [line] = [x for x in page.read_text().splitlines() if x.startswith("process_start_time_seconds ")]
    return float(line.split()[1])


def test_a_timed_dump_with_a_start_is_lifetime_averages():
    page = MEMORY / "scrape-06.prom"
    signals = collect_files([page], probe=None)
    assert signals.window.kind == "lifetime"
    assert signals.window.start_unix == pytest.approx(process_start(page))
    # 26 requests finished in the page, over the page's own clock (scraped-at minus process start)
    finished = signals.get("requests_finished_per_second")
    assert finished.stats["increase"] == 26
    assert finished.stats["rate"] == pytest.approx(26 / signals.window.duration_seconds)


@pytest.mark.parametrize("pasted", [False, True])
def test_an_old_dump_without_its_time_is_never_measured_to_now(tmp_path, pasted):
    """The page's process started in late 2026; the file's mtime says 2033: no window between them, and no rate."""
    dump = without_time(MEMORY / "scrape-06.prom", tmp_path / "metrics.prom", pasted)
    os.utime(dump, (2e9, 2e9))  # a file time years after the process start must change nothing
    signals = collect_files([dump], probe=None)
    window = signals.window
    assert window.kind == "snapshot" and window.end_unix is None and window.duration_seconds is None
    assert window.start_unix == pytest.approx(process_start(dump))
    assert "end unknown" in window.note
    finished = signals.get("requests_finished_per_second")
    assert finished.unavailable and "no known end" in finished.unavailable and "rate" not in finished.stats
    assert signals.get("requests_waiting").stats["last"] == 30  # the gauge in the page, judged at that moment


def test_a_dump_without_process_start_is_a_snapshot():
    signals = collect_files([SGLANG], probe=None)
    assert signals.window.kind == "snapshot" and signals.window.duration_seconds is None
    assert signals.window.end_unix == 1000.0  # its '# llmdiag-scraped-at: 1000.0'
    assert signals.get("requests_running").stats["last"] == 34  # 30 + 4 on the two DP ranks (TP copies counted once)
    rate = signals.get("generation_tokens_per_second")
    assert rate.unavailable.startswith("one page is one moment") and "rate" not in rate.stats


def test_two_dumps_without_times_are_taken_in_the_order_given(tmp_path):
    first = without_time(MEMORY / "scrape-01.prom", tmp_path / "b.prom")
    last = without_time(MEMORY / "scrape-06.prom", tmp_path / "a.prom")
    os.utime(first, (2e9, 2e9))  # mtimes in the other order: never read
    os.utime(last, (1e9, 1e9))
    signals = collect_files([first, last], probe=None)
    assert "taken in the order given" in signals.window.note and signals.window.duration_seconds is None
    assert [v for _, v in signals.get("requests_waiting").samples] == [31.0, 30.0]  # scrape-01, then scrape-06
    preempted = signals.get("preemptions_per_second")
    assert preempted.unavailable and "no interval for a rate" in preempted.unavailable
    assert preempted.stats["increase"] == 27 - 11  # the counter's rise between the two pages, in the files


def test_two_timed_dumps_are_a_window_whatever_the_order_given():
    pages = [MEMORY / "scrape-06.prom", MEMORY / "scrape-01.prom"]
    signals = collect_files(pages, probe=None)
    assert signals.window.kind == "window"
    assert signals.window.duration_seconds == pytest.approx(1796001597.842 - 1796001587.850)
    assert signals.window.duration_seconds < YEAR_SECONDS
