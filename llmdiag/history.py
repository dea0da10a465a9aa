"""The check history: one SQLite row per target per `llmdiag check`, for trends and the regression baseline.

Several checks may run at once (cron jobs that overlap, one per target): the database is in WAL mode, so
readers never block the writer, and every connection waits up to ``BUSY_TIMEOUT_SECONDS`` for the write lock
instead of failing with "database is locked". Each insert is one short ``BEGIN IMMEDIATE`` transaction.
Unmeasured values are NULL, never 0. The schema version lives in the ``meta`` table.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path

from llmdiag.engine.baseline import BASELINE_SIGNALS, Baseline
from llmdiag.errors import HistoryError, option

SCHEMA_VERSION = 1
BUSY_TIMEOUT_SECONDS = 10.0
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS checks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at_unix REAL NOT NULL,
    target TEXT NOT NULL,
    url TEXT NOT NULL,
    state TEXT NOT NULL,
    bottleneck TEXT,
    confidence REAL,
    window_seconds REAL,
    ttft_p95_seconds REAL,
    tpot_p95_seconds REAL,
    itl_p50_seconds REAL,
    generation_tokens_per_second REAL,
    requests_running_mean REAL,
    requests_waiting_mean REAL,
    findings TEXT NOT NULL DEFAULT '',
    error TEXT,
    tool_version TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS checks_by_target_time ON checks (target, at_unix);
"""
# a past check counts toward the baseline when the server was judged and busy
BASELINE_EXCLUDES = ("idle", "unknown")


def default_history_path() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "llmdiag" / "history.sqlite"


@dataclass
class CheckRow:
    at_unix: float
    target: str
    url: str
    state: str  # OK WARNING CRITICAL UNKNOWN
    bottleneck: str | None = None  # None: the check could not judge the target (error)
    confidence: float | None = None
    window_seconds: float | None = None
    ttft_p95_seconds: float | None = None
    tpot_p95_seconds: float | None = None
    itl_p50_seconds: float | None = None
    generation_tokens_per_second: float | None = None
    requests_running_mean: float | None = None
    requests_waiting_mean: float | None = None
    findings: str = ""  # "MEM001:critical SCH001:warning"
    error: str | None = None
    tool_version: str = ""


COLUMNS = [f.name for f in fields(CheckRow)]


def disk_trouble(folder: Path) -> str:
    """Why SQLite's terse "disk I/O error" or "unable to open database file" happened, when the disk says: a
    read-only file system or a full disk (SQLite creates its -wal and -shm files beside the database)."""
    try:
        stat = os.statvfs(folder)
    except OSError:
        return ""
    if stat.f_flag & os.ST_RDONLY:
        return f" ({folder} is on a read-only file system)"
    if (stat.f_bfree if os.geteuid() == 0 else stat.f_bavail) == 0:
        return f" (no space left on the disk that holds {folder})"
    return ""


def _hint(exc: sqlite3.DatabaseError) -> str | None:
    """What to do about a history SQLite refuses; None: the error class's own hint."""
    text = str(exc)
    if "not a database" in text or "malformed" in text:
        return (
            "the file is not a readable llmdiag history: move it aside (it is left as it is), "
            f"or give {option('history')} another file"
        )
    if "locked" in text:
        return (
            f"another process held the history for over {BUSY_TIMEOUT_SECONDS:g} s: rerun, "
            f"or give {option('history')} another file"
        )
    return None


class History:
    """One SQLite file. Open with ``History.open(path)``; every method opens its own short-lived connection."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @classmethod
    def open(cls, path: Path) -> History:
        history = cls(path)
        try:
            history.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HistoryError(f"cannot create the history folder {history.path.parent}: {exc.strerror}") from None
        trouble = disk_trouble(history.path.parent)
        if trouble:  # said before SQLite leaves a half-made -wal or -shm file there (which then blocks readers)
            raise HistoryError(
                f"cannot write the history {history.path}{trouble}",
                f"give {option('history')} a file on another disk, or pass {option('no_history')}",
            )
        with history._connect() as db:
            history._migrate(db)
        return history

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)
        except sqlite3.Error as exc:
            raise HistoryError(f"cannot open the history {self.path}: {exc}{disk_trouble(self.path.parent)}") from None
        try:
            db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_SECONDS * 1000)}")
            mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise HistoryError(
                    f"the history {self.path} cannot use WAL mode (it reports '{mode}')",
                    "keep it on a local file system, not NFS",
                )
            db.execute("PRAGMA synchronous = NORMAL")  # safe with WAL: a power cut loses at most the last commit
            yield db
        except sqlite3.DatabaseError as exc:
            raise HistoryError(f"the history {self.path}: {exc}{disk_trouble(self.path.parent)}", _hint(exc)) from None
        finally:
            db.close()

    def _migrate(self, db: sqlite3.Connection) -> None:
        db.execute("BEGIN IMMEDIATE")
        try:
            for statement in filter(str.strip, SCHEMA.split(";")):
                db.execute(statement)
            row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) > SCHEMA_VERSION:
                raise HistoryError(
                    f"the history {self.path} has schema version {row[0]}; this llmdiag knows {SCHEMA_VERSION}",
                    f"upgrade llmdiag, or give a new file with {option('history')}",
                )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def record(self, rows: list[CheckRow]) -> None:
        """Append rows in one transaction; waits for a concurrent writer instead of failing."""
        placeholders = ", ".join("?" for _ in COLUMNS)
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(
                    f"INSERT INTO checks ({', '.join(COLUMNS)}) VALUES ({placeholders})",
                    [tuple(getattr(r, c) for c in COLUMNS) for r in rows],
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def rows(self, target: str | None = None, since_unix: float | None = None) -> list[CheckRow]:
        query = f"SELECT {', '.join(COLUMNS)} FROM checks WHERE 1 = 1"
        params: list[object] = []
        if target is not None:
            query += " AND target = ?"
            params.append(target)
        if since_unix is not None:
            query += " AND at_unix >= ?"
            params.append(since_unix)
        with self._connect() as db:
            found = db.execute(query + " ORDER BY at_unix, id", params).fetchall()
        return [CheckRow(**dict(zip(COLUMNS, row, strict=True))) for row in found]

    def count(self) -> int:
        with self._connect() as db:
            return int(db.execute("SELECT COUNT(*) FROM checks").fetchone()[0])

    def baseline(self, target: str, days: float, min_checks: int, now: float | None = None) -> Baseline:
        """Medians of the target's judged, busy checks in the last ``days`` (the check being made is not in it)."""
        since = (now if now is not None else time.time()) - days * 86400
        past = [
            r for r in self.rows(target, since) if r.bottleneck is not None and r.bottleneck not in BASELINE_EXCLUDES
        ]
        baseline = Baseline(target=target, since_unix=since, days=days, min_checks=min_checks, checks=len(past))
        for column in BASELINE_SIGNALS:
            values = [v for r in past if (v := getattr(r, column)) is not None]
            baseline.counts[column] = len(values)
            baseline.medians[column] = statistics.median(values) if len(values) >= min_checks else None
        return baseline
