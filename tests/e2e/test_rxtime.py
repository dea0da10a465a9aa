"""Arrival stamps from the kernel (llmdiag.client.rxtime): a busy reader still stamps when the bytes came.

Real loopback sockets, the real client and the simulator with its server-side timings on. The margins are wide
(a reader held up 300 ms, stamps judged to 50 ms) so that a busy machine cannot fail them by itself.
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from llmdiag.client.openai import OpenAIClient
from llmdiag.client.rxtime import StampingSocket, listener
from llmdiag.sim.server import SimServer

HELD_SECONDS = 0.3
SLACK_SECONDS = 0.05


def stamping_pair() -> tuple[socket.socket, StampingSocket]:
    server = listener("127.0.0.1", 0, 8)
    try:
        sender = socket.create_connection(server.getsockname())
        receiver, _ = server.accept()
    finally:
        server.close()
    assert isinstance(receiver, StampingSocket)
    _until_the_kernel_stamps_arrivals(sender, receiver)
    return sender, receiver


def _until_the_kernel_stamps_arrivals(sender: socket.socket, receiver: StampingSocket) -> None:
    """Linux turns receive stamping on lazily (a static key flipped by deferred work) when the first socket asks for
    it; until then a packet is stamped as it is read, the fallback. Wait for stamps taken on arrival (2 s at most)."""
    if not receiver.stamped:
        return
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        sender.sendall(b".")
        time.sleep(0.02)
        assert receiver.recv(16) == b"."
        if receiver.arrived_at < time.monotonic() - 0.01:
            return


def test_a_late_read_is_stamped_when_its_bytes_arrived():
    sender, receiver = stamping_pair()
    with sender, receiver:
        assert receiver.stamped, "the kernel refused SO_TIMESTAMPNS"
        before = time.monotonic()
        sender.sendall(b"x" * 100)
        after = time.monotonic()
        time.sleep(HELD_SECONDS)
        buffer = bytearray(1024)
        assert receiver.recv_into(buffer) == 100
        read_at = time.monotonic()
        assert before - 0.001 <= receiver.arrived_at <= after + 0.001  # on loopback, inside the sender's send
        assert read_at - receiver.arrived_at >= HELD_SECONDS - 0.01
        sender.sendall(b"yz")
        time.sleep(0.05)
        assert receiver.recv(16) == b"yz" and receiver.arrived_at < time.monotonic() - 0.04


def test_without_stamps_a_read_is_stamped_when_it_returns():
    sender, receiver = stamping_pair()
    with sender, receiver:
        receiver.stamped = False  # what a platform without SO_TIMESTAMPNS gets
        sender.sendall(b"abc")
        time.sleep(0.1)
        assert receiver.recv(16) == b"abc" and receiver.arrived_at >= time.monotonic() - 0.05


def test_the_clients_ttft_is_the_servers_even_when_its_event_loop_is_held_up():
    """The client's loop is blocked while the answer arrives: its TTFT still matches the server's, not the hold."""
    with SimServer("healthy", record_timings=True) as sim:

        async def main():
            async with OpenAIClient(sim.url) as client:
                await client.complete("warm up", 1)  # a kept-alive connection: the timed request sends at once
                task = asyncio.create_task(client.complete("a b c", 1, request_id="held-1"))
                await asyncio.sleep(0)  # the task writes the request on the kept-alive connection, then waits
                time.sleep(HELD_SECONDS)  # the loop reads nothing meanwhile
                return await task

        held_from = time.monotonic()
        result = asyncio.run(main())
        record = sim.timings()["requests"]["held-1"]
    assert result.ok and result.first_token_at is not None
    client_ttft = result.first_token_at - result.started_at
    server_ttft = record["event_times"][0] - record["received_at"]
    assert result.started_at >= held_from
    assert abs(client_ttft - server_ttft) <= SLACK_SECONDS, (client_ttft, server_ttft)
    assert client_ttft < HELD_SECONDS - SLACK_SECONDS  # a stamp taken by the loop would be after the hold


if not hasattr(socket, "CMSG_SPACE"):  # pragma: no cover
    pytest.skip("no ancillary data on this platform", allow_module_level=True)
