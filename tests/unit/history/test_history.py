"""The check's side outputs under stress: the SQLite history with parallel writers (no lost rows), its baseline,
and the node_exporter textfile when its writer is killed mid-write (the previous file stays intact)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmdiag.engine.baseline import add_baseline_signals
from llmdiag.engine.derived import NO_BASELINE, add_derived
from llmdiag.errors import HistoryError
from llmdiag.history import CheckRow, History
from llmdiag.model import Signal, SignalSet
from llmdiag.model.check import CheckReport, State, TargetResult, state_of
from llmdiag.render.textfile import write_textfile
from tests.conftest import REPO_ROOT

WRITERS, ROWS_EACH = 8, 25


def _writer(path: str, worker: int, barrier) -> None:
    history = History.open(Path(path))
    barrier.wait()  # all writers start together: the most contention
    for i in range(ROWS_EACH):
        history.record([CheckRow(at_unix=time.time(), target=f"w{worker}", url=str(i), state="OK")])


def test_parallel_writers_lose_no_rows(tmp_path: Path):
    path = tmp_path / "history.sqlite"
    ctx = multiprocessing.get_context("spawn")  # separate interpreters, as separate cron jobs are
    barrier = ctx.Barrier(WRITERS)
    procs = [ctx.Process(target=_writer, args=(str(path), w, barrier)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    history = History(path)
    rows = history.rows()
    assert len(rows) == WRITERS * ROWS_EACH
    assert {(r.target, r.url) for r in rows} == {(f"w{w}", str(i)) for w in range(WRITERS) for i in range(ROWS_EACH)}
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == "1"


def test_baseline_is_the_median_of_busy_checks_and_needs_enough_of_them(tmp_path: Path):
    history = History.open(tmp_path / "h.sqlite")
    now = 1_000_000.0
    rows = [
        CheckRow(
            at_unix=now - 3600 * i,
            target="a",
            url="",
            state="OK",
            bottleneck="healthy",
            ttft_p95_seconds=v,
            generation_tokens_per_second=None,
        )
        for i, v in enumerate([0.1, 0.2, 0.3, 0.4, 10.0], start=1)
    ]
    rows.append(CheckRow(at_unix=now - 60, target="a", url="", state="OK", bottleneck="idle", ttft_p95_seconds=9.0))
    rows.append(
        CheckRow(at_unix=now - 8 * 86400, target="a", url="", state="OK", bottleneck="healthy", ttft_p95_seconds=9.0)
    )  # older than 7 days
    rows.append(CheckRow(at_unix=now - 60, target="b", url="", state="OK", bottleneck="healthy", ttft_p95_seconds=9.0))
    history.record(rows)
    baseline = history.baseline("a", days=7, min_checks=5, now=now)
    assert baseline.checks == 5 and baseline.medians["ttft_p95_seconds"] == 0.3
    assert baseline.medians["generation_tokens_per_second"] is None  # NULLs are missing, not zeros

    signals = SignalSet()
    signals.add(Signal(name="ttft_seconds", kind="histogram", unit="seconds", stats={"p95": 0.9, "count": 50}))
    add_baseline_signals(signals, baseline)
    add_derived(signals)
    assert signals.get("ttft_p95_vs_baseline_ratio").stat("value") == pytest.approx(3.0)
    throughput = signals.get("generation_throughput_vs_baseline_ratio")
    assert throughput.stat("value") is None and "not enough history: 0 past checks" in throughput.unavailable

    too_few = history.baseline("b", days=7, min_checks=5, now=now)
    assert too_few.describe() == "baseline: not enough history (1 of 5 checks needed in 7 days)"
    bare = SignalSet()
    add_derived(bare)
    assert bare.get("ttft_p95_vs_baseline_ratio").unavailable == NO_BASELINE


def test_a_newer_schema_or_a_bad_file_is_a_clear_error(tmp_path: Path):
    path = tmp_path / "h.sqlite"
    History.open(path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(HistoryError, match="schema version 99"):
        History.open(path)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(HistoryError, match="junk.sqlite"):
        History.open(junk)


def test_state_ranking_follows_the_nagios_convention():
    from llmdiag.model.check import worst

    assert worst([State.OK, State.UNKNOWN]) is State.UNKNOWN
    assert worst([State.UNKNOWN, State.WARNING]) is State.WARNING
    assert worst([State.WARNING, State.CRITICAL, State.UNKNOWN]) is State.CRITICAL
    assert callable(state_of)


def _report(name: str) -> CheckReport:
    return CheckReport(
        state=State.UNKNOWN,
        at_unix=time.time(),
        targets=[TargetResult(name=name, url="http://127.0.0.1:1", state=State.UNKNOWN, error="refused")],
    )


# A child that writes the textfile through write_to_textfile, but whose file object stops halfway through the
# bytes, says so on stdout and waits to be killed: the kill lands while the temporary file is being written.
SLOW_WRITER = r"""
import sys, time
from pathlib import Path
import prometheus_client.exposition as exposition
from llmdiag.model.check import CheckReport, State, TargetResult
from llmdiag.render.textfile import write_textfile

real_open = open

class Stalling:
    def __init__(self, path, mode):
        self.path, self.handle = path, real_open(path, mode)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self.handle.close()
    def write(self, data):
        self.handle.write(data[: len(data) // 2])
        self.handle.flush()
        print("WRITING", self.path, flush=True)
        time.sleep(600)

exposition.open = Stalling  # the module's own name lookup: the only open() that write_to_textfile makes
report = CheckReport(state=State.UNKNOWN, at_unix=time.time(), targets=[
    TargetResult(name="new", url="http://127.0.0.1:1", state=State.UNKNOWN, error="refused")])
write_textfile(report, Path(sys.argv[1]))
"""


def targets_in(path: Path) -> set[str]:
    families = {f.name: f for f in text_string_to_metric_families(path.read_text())}
    return {s.labels["target"] for s in families["llmdiag_check_state"].samples}


def test_a_writer_killed_mid_write_leaves_the_previous_textfile_intact(tmp_path: Path):
    write_textfile(_report("old"), tmp_path)
    target = tmp_path / "llmdiag.prom"
    before = target.read_bytes()
    assert targets_in(target) == {"old"}

    child = subprocess.Popen(
        [sys.executable, "-c", SLOW_WRITER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        line = child.stdout.readline()  # blocks until the child is halfway through its temporary file
        assert line.startswith("WRITING "), line
        temporary = Path(line.split(" ", 1)[1].strip())
        assert temporary.parent == tmp_path and temporary.name.startswith(f"llmdiag.prom.{child.pid}.")
        assert temporary.stat().st_size > 0 and target.read_bytes() == before
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(30)
    assert child.returncode == -signal.SIGKILL
    assert target.read_bytes() == before and targets_in(target) == {"old"}
    assert temporary.exists()  # the half-written file is the one left behind …

    write_textfile(_report("next"), tmp_path)
    assert targets_in(target) == {"next"}
    assert not temporary.exists()  # … and the next run clears it
