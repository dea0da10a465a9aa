"""Total deadlines: the latest moment a request, a scan or a check may end, whatever the server does.

A per-read timeout is not enough: a server that sends one byte every 2 s never lets a 5 s read timeout fire, and
holds a scrape (and so a scan, a check) for as long as it likes. So every network read runs under a ``Deadline``:

    Deadline.after(seconds, what)   a monotonic end and the words for it ("the request's 5 s", "the scan's 13 s")
    within(deadline)                the run's deadline for everything below it in this context (a ContextVar):
                                    a scan's, a check target's; nested ones keep the sooner
    request_deadline(timeout)       one request's: its own ``timeout`` or the run's, whichever ends first
    call_within(deadline, fn, late) ``fn()`` (a blocking requests call and its read) in a worker thread; past the
                                    deadline the sockets it opened are shut down (which wakes a blocked read at
                                    once) and ``late()`` is raised, a ProbeTimeout in words
    deadline_session()              a requests.Session whose connections register their sockets for call_within

The worker thread is what bounds the parts no timeout reaches: name resolution (urllib3 calls getaddrinfo with no
timeout, and it cannot be interrupted: the worker is abandoned to it) and a head that arrives one byte at a time
inside http.client. The asyncio client (``openai``) bounds its own: ``getaddrinfo`` under ``wait_for``.
"""

from __future__ import annotations

import contextlib
import contextvars
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from llmdiag.errors import ProbeTimeout

T = TypeVar("T")
# the shortest wait handed to a socket: a timeout of 0 would make it non-blocking, not expired
MIN_WAIT_SECONDS = 0.05
# after the deadline, how long the worker gets to unwind once its sockets are shut (it is abandoned after that)
UNWIND_SECONDS = 0.5
REQUEST_GRACE_SECONDS = 0.5


@dataclass(frozen=True)
class Deadline:
    """A monotonic end (``time.monotonic()``), the budget it was set with and what it bounds, in words."""

    end: float
    seconds: float
    what: str = ""  # "" for one request's own; "the scan's deadline", "the check's deadline" for a run's

    @classmethod
    def after(cls, seconds: float, what: str = "", grace_seconds: float = 0.0) -> Deadline:
        return cls(time.monotonic() + max(0.0, seconds) + grace_seconds, seconds, what)

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def expired(self) -> bool:
        return time.monotonic() >= self.end

    def cap(self, timeout_seconds: float) -> float:
        """A per-read timeout that also ends by the deadline."""
        return max(MIN_WAIT_SECONDS, min(timeout_seconds, self.remaining()))

    def sooner(self, other: Deadline | None) -> Deadline:
        return self if other is None or self.end <= other.end else other

    def describe(self) -> str:
        """'5 s', or 'the scan's deadline (13 s)'."""
        return f"{self.what} ({self.seconds:g} s)" if self.what else f"{self.seconds:g} s"


_CURRENT: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar("llmdiag_deadline", default=None)
# the sockets a call_within worker opened (set in the worker's own context)
_SOCKETS: contextvars.ContextVar[list[socket.socket] | None] = contextvars.ContextVar("llmdiag_sockets", default=None)


def current() -> Deadline | None:
    """The run's deadline in this context (a scan's, a check target's), or None."""
    return _CURRENT.get()


@contextmanager
def within(deadline: Deadline | None) -> Iterator[Deadline | None]:
    """Everything in the block runs by ``deadline`` (or by the enclosing one, when that ends first)."""
    effective = deadline.sooner(_CURRENT.get()) if deadline is not None else _CURRENT.get()
    token = _CURRENT.set(effective)
    try:
        yield effective
    finally:
        _CURRENT.reset(token)


def request_deadline(timeout_seconds: float) -> Deadline:
    """One request's total: ``timeout_seconds`` from now (and a moment, so that a server silent for the whole
    timeout is told by the read timeout, in its own words), or the run's deadline when that ends first."""
    return Deadline.after(timeout_seconds, grace_seconds=REQUEST_GRACE_SECONDS).sooner(_CURRENT.get())


def late_error(display: str, deadline: Deadline) -> ProbeTimeout:
    """The ProbeTimeout for a request the deadline ended."""
    if deadline.what:
        return ProbeTimeout(f"{display} had not finished answering at {deadline.describe()}")
    return ProbeTimeout(
        f"{display} did not send its whole answer within {deadline.seconds:g} s (it kept sending, too slowly)"
    )


def call_within(deadline: Deadline, fn: Callable[[], T], late: Callable[[], BaseException]) -> T:
    """``fn()`` in a worker thread, by ``deadline``: its value, or its exception re-raised here, or ``late()`` when
    the deadline passes first (its sockets shut so that it ends soon; a resolver call is left to finish alone)."""
    if deadline.expired():
        raise late()  # nothing is started after the deadline
    outcome: list[tuple[bool, Any]] = []
    done = threading.Event()
    sockets: list[socket.socket] = []

    def work() -> None:
        _SOCKETS.set(sockets)
        try:
            outcome.append((True, fn()))
        except BaseException as exc:  # handed to the caller's thread
            outcome.append((False, exc))
        finally:
            done.set()

    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(work,), name="llmdiag-request", daemon=True).start()
    if not done.wait(deadline.remaining()):
        _shut(sockets)
        done.wait(UNWIND_SECONDS)
        raise late()
    ok, value = outcome[0]
    if ok:
        return value
    raise value


def _shut(sockets: list[socket.socket]) -> None:
    for sock in list(sockets):
        with contextlib.suppress(OSError):  # already closed
            sock.shutdown(socket.SHUT_RDWR)  # wakes a recv blocked in another thread; close() would not


def _track(sock: socket.socket) -> None:
    sockets = _SOCKETS.get()
    if sockets is not None:
        sockets.append(sock)


# --- requests: connections whose sockets call_within can shut ------------------------------------------------------


class _Tracked:
    """Registers a connection's socket with the running call_within: when opened, and when a kept-alive one is
    reused for another request."""

    sock: socket.socket | None

    def _new_conn(self) -> socket.socket:
        sock: socket.socket = super()._new_conn()  # type: ignore[misc]
        _track(sock)  # under TLS the raw socket: shutting it ends the handshake and the reads above it too
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        if self.sock is not None:
            _track(self.sock)
        super().request(*args, **kwargs)  # type: ignore[misc]


class _TrackedHTTPConnection(_Tracked, HTTPConnection):
    pass


class _TrackedHTTPSConnection(_Tracked, HTTPSConnection):
    pass


class _TrackedPool(HTTPConnectionPool):
    ConnectionCls = _TrackedHTTPConnection


class _TrackedTLSPool(HTTPSConnectionPool):
    ConnectionCls = _TrackedHTTPSConnection


class _TrackedAdapter(HTTPAdapter):
    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _TrackedPool, "https": _TrackedTLSPool}


def deadline_session() -> requests.Session:
    """A requests.Session for ``call_within``: its connections' sockets are shut when a deadline passes."""
    session = requests.Session()
    session.mount("http://", _TrackedAdapter())
    session.mount("https://", _TrackedAdapter())
    return session
