"""The firehose: vLLM's streaming chat wire format with no engine behind it, an SSE server that costs far less per
token than the simulator, so that in bench/bench_client.py's max-ingest section the client is what runs out of CPU.

    python bench/firehose.py TICK_SECONDS    # prints its URL, serves until SIGINT; SimProcess(firehose_tick=…)
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
from typing import Any

FIREHOSE_MODEL = "firehose"
_MAX_TOKENS_RE = re.compile(rb'"max_(?:completion_)?tokens"\s*:\s*(\d+)')


def firehose_main(tick: float) -> int:
    """vLLM's streaming chat wire format without an engine: every ``tick`` seconds (0: as fast as its one event loop
    goes) each open stream gets one event of one token, in one write, as the simulator sends them. GET /v1/models,
    /health and /sim/stats (generation_tokens, prompt_tokens, request_success, lag_seconds, as the bench reads them)
    are answered too. Bound to 127.0.0.1; SIGINT stops it."""
    stats = {"generation_tokens": 0, "prompt_tokens": 0, "request_success": {"length": 0}, "lag_seconds": 0.0}
    streams: dict[Any, list[Any]] = {}  # protocol -> [tokens left, head bytes, total]
    words = [b" w%d" % i for i in range(64)]
    stop_event = asyncio.Event()

    def chunk(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)

    class Proto(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            self.buffer = b""

        def connection_lost(self, exc: Exception | None) -> None:
            streams.pop(self, None)

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while True:
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = self.buffer[:end].decode("latin-1")
                length = int(re.search(r"(?im)^content-length:\s*(\d+)", head).group(1)) if "ength:" in head else 0
                if len(self.buffer) < end + 4 + length:
                    return
                body, self.buffer = self.buffer[end + 4 : end + 4 + length], self.buffer[end + 4 + length :]
                self.request(head.split(" ", 2)[:2], body)

        def reply(self, payload: bytes, content_type: str = "application/json") -> None:
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
                % (content_type.encode(), len(payload), payload)
            )

        def request(self, line: list[str], body: bytes) -> None:
            method, path = line
            if method == "GET" and path.startswith("/sim/stats"):
                self.reply(json.dumps(stats).encode())
            elif method == "GET" and path.startswith("/v1/models"):
                self.reply(json.dumps({"object": "list", "data": [{"id": FIREHOSE_MODEL, "object": "model"}]}).encode())
            elif method == "GET":
                self.reply(b"")
            else:
                found = _MAX_TOKENS_RE.search(body)
                total = int(found.group(1)) if found else 16
                stats["prompt_tokens"] += len(body.split())
                self.transport.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                )
                head = (
                    b'data: {"id":"chatcmpl-%d","object":"chat.completion.chunk","created":1,"model":"%s",'
                    b'"choices":[{"index":0,' % (id(self), FIREHOSE_MODEL.encode())
                )
                streams[self] = [total, head, total]

    async def ticker() -> None:
        while not stop_event.is_set():
            for proto, state in list(streams.items()):
                left, head, total = state
                i = total - left
                reason = b'"length"' if left == 1 else b"null"
                event = head + b'"delta":{"content":"%s"},"logprobs":null,"finish_reason":%s}]}\n\n' % (
                    words[i % 64],
                    reason,
                )
                if left == 1:
                    usage = (
                        b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":%d,'
                        b'"total_tokens":%d}}\n\n' % (total, total + 1)
                    )
                    proto.transport.write(chunk(event) + chunk(usage + b"data: [DONE]\n\n") + b"0\r\n\r\n")
                    del streams[proto]
                    stats["request_success"]["length"] += 1
                else:
                    proto.transport.write(chunk(event))
                    state[0] = left - 1
                stats["generation_tokens"] += 1
            await asyncio.sleep(tick)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, stop_event.set)
        server = await loop.create_server(Proto, "127.0.0.1", 0, backlog=4096)
        port = server.sockets[0].getsockname()[1]
        print(f"firehose http://127.0.0.1:{port} tick {tick:g} s", flush=True)
        task = asyncio.create_task(ticker())
        await stop_event.wait()
        task.cancel()
        server.close()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(firehose_main(float(sys.argv[1])))
