"""Run one job per target, several at once: what `llmdiag check` and a multi-target `llmdiag scan` share.

Each target runs in its own worker, at most ``concurrency`` at a time. A job that raises does not sink the others:
``on_error`` turns the exception into that target's result. With ``timeout_seconds``, a job still running after
that long is given up on: ``on_timeout`` gives its result and the run moves on. Python cannot stop a thread, so the
abandoned job finishes (its HTTP timeouts bound it) in a daemon thread whose result is dropped; until it does it
holds no worker slot, so for a short while more than ``concurrency`` requests may be in flight. With ``deadline``
(the run's total), no job starts after it and none is waited for past it: each such target is ``on_timeout``'s.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from llmdiag.client.deadline import Deadline

T = TypeVar("T")
R = TypeVar("R")


def _with_deadline(
    job: Callable[[T], R],
    item: T,
    timeout_seconds: float,
    on_timeout: Callable[[T, float], R],
    on_error: Callable[[T, BaseException], R] | None,
) -> R:
    results: list[R] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(job(item))
        except BaseException as exc:  # handed to the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=run, name="llmdiag-target", daemon=True)
    thread.start()
    thread.join(timeout_seconds)
    if thread.is_alive():
        return on_timeout(item, timeout_seconds)
    if errors:
        if on_error is None:
            raise errors[0]
        return on_error(item, errors[0])
    return results[0]


def run_bounded(
    items: Sequence[T],
    job: Callable[[T], R],
    concurrency: int,
    timeout_seconds: float | None = None,
    on_timeout: Callable[[T, float], R] | None = None,
    on_error: Callable[[T, BaseException], R] | None = None,
    name: str = "llmdiag",
    deadline: Deadline | None = None,
) -> list[R]:
    """``job(item)`` for every item, at most ``concurrency`` at once; results in the items' order."""
    if (timeout_seconds is not None or deadline is not None) and on_timeout is None:
        raise ValueError("a timeout needs on_timeout to say what a timed-out target's result is")

    def guarded(item: T) -> R:
        limit = timeout_seconds
        if deadline is not None:
            limit = deadline.remaining() if limit is None else min(limit, deadline.remaining())
        if limit is not None and on_timeout is not None:
            if limit <= 0:
                return on_timeout(item, 0.0)  # its turn came after the run's deadline: not started
            return _with_deadline(job, item, limit, on_timeout, on_error)
        if on_error is None:
            return job(item)
        try:
            return job(item)
        except Exception as exc:
            return on_error(item, exc)

    if not items:
        return []
    workers = max(1, min(concurrency, len(items)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name) as pool:
        futures = [pool.submit(guarded, item) for item in items]
        return [f.result() for f in futures]
