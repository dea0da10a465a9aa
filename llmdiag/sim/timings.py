"""Server-side timings, off by default (``SimServer(..., record_timings=True)``): for each request that carries an
``X-Request-Id`` header, ``received_at`` (when its first bytes arrived on the connection), ``event_times`` (just
before each content event is written) with ``event_tokens`` (tokens in each), and ``ended_at``, all
``time.monotonic()`` seconds: one clock for every process of the machine, so a client's own timestamps can be
compared with them. The last ``max_timed_requests`` requests are kept (``TimingLog``); the cost is a float and an
int appended per event.

The arrival stamp is the kernel's receive stamp of the read that brought a request's first bytes
(``llmdiag.client.rxtime``): under a thousand streams the handler starts tens of milliseconds later, behind the
event loop's other work. The plumbing: ``stamping_listener`` makes aiohttp's server hand out a connection protocol
that stamps each request's head as it is read, and the ``take_arrival`` middleware moves the stamp onto the request
(``ARRIVAL_KEY``) as it starts.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from llmdiag.client.rxtime import StampingListener, StampingSocket
from llmdiag.client.rxtime import listener as rx_listener
from llmdiag.errors import UsageError

MAX_TIMED_REQUESTS = 4096  # server-side timings kept, newest first out


class RequestTimings:
    """One request's server-side timestamps (``time.monotonic()``): appended to on the hot path, so slots."""

    __slots__ = ("received_at", "event_times", "event_tokens", "ended_at", "status")

    def __init__(self, received_at: float) -> None:
        self.received_at = received_at
        self.event_times: list[float] = []
        self.event_tokens: list[int] = []
        self.ended_at: float | None = None
        self.status: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "received_at": self.received_at,
            "event_times": self.event_times,
            "event_tokens": self.event_tokens,
            "ended_at": self.ended_at,
            "status": self.status,
        }


class TimingLog:
    """The last ``capacity`` requests' timings, keyed by the client's X-Request-Id."""

    def __init__(self, capacity: int = MAX_TIMED_REQUESTS) -> None:
        if capacity < 1:
            raise UsageError(f"max_timed_requests must be at least 1, got {capacity}")
        self.capacity = capacity
        self.requests: OrderedDict[str, RequestTimings] = OrderedDict()
        self.dropped = 0

    def start(self, request_id: str, received_at: float) -> RequestTimings:
        timings = self.requests[request_id] = RequestTimings(received_at)
        if len(self.requests) > self.capacity:
            self.requests.popitem(last=False)
            self.dropped += 1
        return timings

    def snapshot(self, clear: bool = False) -> dict[str, Any]:
        out = {
            "clock": "time.monotonic",
            "capacity": self.capacity,
            "dropped": self.dropped,
            "requests": {rid: t.as_dict() for rid, t in self.requests.items()},
        }
        if clear:
            self.requests = OrderedDict()
            self.dropped = 0
        return out


class _ArrivalStampingHandler(web.RequestHandler):
    """aiohttp's connection protocol, stamping when a request's first bytes reached the machine (timings only):
    the kernel's receive stamp of the read, from the listener's StampingSocket for this connection."""

    llmdiag_arrived_at: float | None = None
    _rx: StampingSocket | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        listener = getattr(self._manager, "llmdiag_listener", None)
        sock = transport.get_extra_info("socket")
        if listener is not None and sock is not None:
            self._rx = listener.accepted.get(sock.fileno())
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        # the first read of a request's head (not the rest of a body that came in a later read)
        if self.llmdiag_arrived_at is None and data[:8].split(b" ", 1)[0] in _METHODS:
            rx = self._rx
            self.llmdiag_arrived_at = rx.arrived_at if rx is not None else time.monotonic()
        super().data_received(data)


_METHODS = frozenset((b"GET", b"POST", b"PUT", b"HEAD", b"DELETE", b"OPTIONS", b"PATCH"))
# where a request keeps its arrival stamp (aiohttp >= 3.12 wants typed keys for request storage)
ARRIVAL_KEY: Any = web.RequestKey("llmdiag_arrived_at", float) if hasattr(web, "RequestKey") else "llmdiag_arrived_at"


@web.middleware
async def take_arrival(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    """As every request starts, whatever its route, it takes its arrival stamp off the connection, so that the next
    request stamps its own: a client may send the next one before this one's handler has returned."""
    protocol = request.protocol
    if isinstance(protocol, _ArrivalStampingHandler) and protocol.llmdiag_arrived_at is not None:
        request[ARRIVAL_KEY] = protocol.llmdiag_arrived_at
        protocol.llmdiag_arrived_at = None
    return await handler(request)


class _ArrivalStampingServer(web.Server):
    llmdiag_listener: StampingListener | None = None

    def __call__(self) -> web.RequestHandler:
        return _ArrivalStampingHandler(self, loop=self._loop, **self._kwargs)


def stamping_listener(server: web.Server, host: str, port: int, backlog: int) -> StampingListener:
    """Make aiohttp's ``server`` hand out the stamping protocol, and open the listener whose sockets stamp each read
    (serve it with ``web.SockSite``)."""
    server.__class__ = _ArrivalStampingServer  # only to hand out the stamping protocol
    assert isinstance(server, _ArrivalStampingServer)  # as the line above made it (a type checker cannot follow)
    listener = server.llmdiag_listener = rx_listener(host, port, backlog)
    return listener
