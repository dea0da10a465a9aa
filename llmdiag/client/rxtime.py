"""When bytes reached this machine: the kernel's receive timestamp (``SO_TIMESTAMPNS``) of what a read returned.

A process that stamps arrivals with its own clock stamps when its event loop got round to the socket. Under a
thousand streams on two cores that is milliseconds to tens of milliseconds late, and the lag belongs to the
measuring process, not to the server it measures. The kernel stamps each packet as it lands (on loopback, inside
the sender's write), so a read's stamp is when its bytes arrived, however late the read.

A read that returns several packets carries the stamp of the last one: events that piled up while the reader was
busy share one arrival time, as they would with a user-space stamp. Where the kernel gives no stamp (not Linux,
the option refused) the read is stamped with ``time.monotonic()`` when it returns, as before.
Linux turns stamping on lazily: the first socket to ask flips a static key through deferred work, and a packet
that lands before that is stamped by the kernel as it is read, so the first reads on a quiet system may carry
their read time (the fallback's time, never a wrong one).

Stamps are ``time.monotonic()`` seconds: the kernel's wall-clock stamp is moved onto the monotonic clock by the
offset between the two clocks, measured from back-to-back readings (the tightest of a few, so that a process
descheduled between two readings does not skew it) and measured again every second. A stamp later than now, or
more than ``MAX_LAG_SECONDS`` old (a wall-clock step), is replaced by now.
"""

from __future__ import annotations

import math
import socket
import struct
import time
import weakref
from typing import Any

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux's value; the control message has the same type
MAX_LAG_SECONDS = 10.0
_TIMESPEC = struct.Struct("@qq")
_ANCILLARY_BYTES = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0

OFFSET_REFRESH_SECONDS = 1.0
_OFFSET_SAMPLES = 5

_monotonic = time.monotonic
_monotonic_ns = time.monotonic_ns
_time_ns = time.time_ns
_offset = [0, -math.inf]  # wall clock − monotonic clock (ns), and when it was measured (monotonic seconds)


def clock_offset_ns() -> int:
    """Wall clock minus monotonic clock, in ns: of a few readings of wall time between two of monotonic time, the
    one with the shortest gap (a reading the scheduler did not interrupt)."""
    best_gap, offset = None, 0
    for _ in range(_OFFSET_SAMPLES):
        before = _monotonic_ns()
        wall = _time_ns()
        after = _monotonic_ns()
        if best_gap is None or after - before < best_gap:
            best_gap, offset = after - before, wall - (before + after) // 2
    return offset


def _arrival(ancillary: list[tuple[int, int, bytes]]) -> float:
    now = _monotonic()
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            if now - _offset[1] >= OFFSET_REFRESH_SECONDS:
                _offset[0], _offset[1] = clock_offset_ns(), now
            seconds, nanoseconds = _TIMESPEC.unpack_from(data)
            arrived = (seconds * 1_000_000_000 + nanoseconds - _offset[0]) * 1e-9
            if now - MAX_LAG_SECONDS <= arrived <= now:
                return arrived
            break
    return now


class StampingSocket(socket.socket):
    """A socket whose every read records ``arrived_at``: when the kernel received the bytes it returned.

    asyncio's transports read a socket with ``recv_into`` (a BufferedProtocol) or ``recv`` (a Protocol); both
    are answered here with ``recvmsg``, which also returns the kernel's stamp."""

    __slots__ = ("arrived_at", "stamped")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.arrived_at = 0.0
        self.stamped = False  # the kernel agreed to stamp this socket's packets

    def enable_stamps(self) -> bool:
        if not _ANCILLARY_BYTES:
            return False
        try:
            self.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            return False
        self.stamped = True
        return True

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        if not self.stamped:
            count = super().recv_into(buffer, nbytes, flags)
            self.arrived_at = _monotonic()
            return count
        target = memoryview(buffer)[:nbytes] if nbytes else buffer
        count, ancillary, _flags, _address = self.recvmsg_into((target,), _ANCILLARY_BYTES, flags)
        self.arrived_at = _arrival(ancillary)
        return count

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        if not self.stamped:
            data = super().recv(bufsize, flags)
            self.arrived_at = _monotonic()
            return data
        data, ancillary, _flags, _address = self.recvmsg(bufsize, _ANCILLARY_BYTES, flags)
        self.arrived_at = _arrival(ancillary)
        return data


class StampingListener(socket.socket):
    """A listening socket whose accepted connections are StampingSockets, each findable by its file descriptor
    (``accepted``): a server's protocol sees only the transport, and the transport hides its socket."""

    __slots__ = ("accepted",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.accepted: weakref.WeakValueDictionary[int, StampingSocket] = weakref.WeakValueDictionary()

    def accept(self) -> tuple[StampingSocket, Any]:
        fd, address = self._accept()  # type: ignore[attr-defined]  # _socket.socket's C accept: not in typeshed
        connection = StampingSocket(self.family, self.type, self.proto, fileno=fd)
        if socket.getdefaulttimeout() is None and self.gettimeout():
            connection.setblocking(True)  # what socket.accept does
        connection.enable_stamps()
        self.accepted[fd] = connection
        return connection, address


def listener(host: str, port: int, backlog: int) -> StampingListener:
    """A bound, listening StampingListener on ``host``:``port`` (0: any free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = StampingListener(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock
