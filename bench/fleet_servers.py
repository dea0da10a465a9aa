"""Scripted servers for the scale benches (bench/check_fleet200.py, bench/leaks.py) and their bounded tests: one
HTTP server on 127.0.0.1 that plays many targets at once, each under its own path prefix (a target's base URL is
``http://127.0.0.1:PORT/<name>``), and counts the connections open at once across all of them.

What each target plays (its kind):

- ``replay:<state>``: the recorded vLLM 0.32.0 pages of ``tests/fixtures/vllm-0.32.0/<state>`` (a real server's
  ``/metrics``, kept verbatim), one per ``GET <prefix>/metrics``, in order, then the last one again; every other
  path of the target is 404 (a server without the OpenAI routes the canary asks for);
- ``blackhole``: reads the request and never answers (until the client hangs up, the server stops, or
  ``hold_seconds``);
- ``status:<code>``: that status on every path (``Retry-After: 30`` on 429 and 503);
- ``html``: a login page (200, text/html), ``garbage``: 200 text/plain that is not an exposition;
- ``reset``: headers announcing a body, half of it, then a TCP reset;
- ``drip_headers`` / ``drip_body``: one byte every ``drip_seconds`` (below any read timeout, so that only a total
  deadline ends it), for at most ``hold_seconds`` so that a run without one still ends.

A dead target is a closed port (``closed_port()``): nothing listens there. ``FleetProcess`` runs the server in a
child process (what the benches and tests use); ``FleetServer`` is the server itself.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as the child of FleetProcess: bench/ imports as a package
    sys.path.insert(0, str(REPO))

from bench.page_server import recorded_page  # noqa: E402

RECORDED = REPO / "tests" / "fixtures" / "vllm-0.32.0"
RETRY_AFTER_SECONDS = 30


def recorded_pages(state: str) -> list[bytes]:
    """One recorded vLLM state's pages as the server sent them, in order."""
    return [recorded_page(p) for p in sorted((RECORDED / state).glob("scrape-*.prom"))]


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class _Counter:
    """Connections open at once: now and the most seen."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    now: int = 0
    most: int = 0
    total: int = 0
    # each open connection: the target and path of its last request ("" before its first)
    asked: dict[int, str] = field(default_factory=dict)

    def opened(self, request: Any = None) -> None:
        with self.lock:
            self.now += 1
            self.total += 1
            self.most = max(self.most, self.now)
            if request is not None:
                self.asked[id(request)] = ""

    def closed(self, request: Any = None) -> None:
        with self.lock:
            self.now -= 1
            self.asked.pop(id(request), None)

    def ask(self, request: Any, path: str) -> None:
        with self.lock:
            self.asked[id(request)] = path


class _CountingServer(ThreadingHTTPServer):
    daemon_threads = True
    counter: _Counter

    def process_request(self, request: Any, client_address: Any) -> None:
        self.counter.opened(request)  # at accept, in the serving thread, before the handler's thread starts
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        try:
            super().shutdown_request(request)
        finally:
            self.counter.closed(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients hang up mid-answer on purpose here (timeouts, deadlines)


class FleetServer:
    """Many scripted targets behind one listening socket. ``add(name, kind)`` returns the target's base URL;
    ``most_concurrent`` is the most connections open at once so far, ``most_in_flight`` the most requests being
    answered at once (a connection is counted until the server's side sees it close, a little after the client has
    moved on; a request only until its answer is written). A context manager."""

    def __init__(self, drip_seconds: float = 0.5, hold_seconds: float = 60.0) -> None:
        self.drip_seconds = drip_seconds
        self.hold_seconds = hold_seconds
        self.kinds: dict[str, str] = {}
        self.pages: dict[str, list[bytes]] = {}
        self.served: dict[str, int] = {}
        self.requests: dict[str, int] = {}  # requests per target, every path
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.counter = _Counter()  # connections open
        self.in_flight = _Counter()  # requests read and not yet answered (or, silent, not yet hung up on)
        self.httpd = _CountingServer(("127.0.0.1", 0), self._handler())
        self.httpd.counter = self.counter
        self.thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def add(self, name: str, kind: str) -> str:
        if kind.startswith("replay:"):
            self.pages[name] = recorded_pages(kind.split(":", 1)[1])
        self.kinds[name] = kind
        self.served[name] = 0
        return f"http://127.0.0.1:{self.port}/{name}"

    def rewind(self, name: str) -> None:
        """The replay target starts over at its first page (a fresh server, for the next scan)."""
        with self.lock:
            self.served[name] = 0

    @property
    def most_concurrent(self) -> int:
        return self.counter.most

    @property
    def open_now(self) -> int:
        return self.counter.now

    @property
    def most_in_flight(self) -> int:
        return self.in_flight.most

    def reset_most(self) -> None:
        for counter in (self.counter, self.in_flight):
            with counter.lock:
                counter.most = counter.now

    @property
    def open_paths(self) -> list[str]:
        """The last path asked on each connection still open (what holds it)."""
        with self.counter.lock:
            return sorted(self.counter.asked.values())

    def next_page(self, name: str) -> bytes:
        with self.lock:
            pages = self.pages[name]
            page = pages[min(self.served[name], len(pages) - 1)]
            self.served[name] += 1
        return page

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fleet = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                fleet.counter.ask(self.connection, self.path)
                name, _, rest = self.path.lstrip("/").partition("/")
                with fleet.lock:
                    fleet.requests[name] = fleet.requests.get(name, 0) + 1
                kind = fleet.kinds.get(name, "status:404")
                fleet.in_flight.opened()
                try:
                    fleet.answer(self, name, kind, "/" + rest)
                finally:
                    fleet.in_flight.closed()

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.do_GET()

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def answer(self, handler: BaseHTTPRequestHandler, name: str, kind: str, path: str) -> None:
        if kind.startswith("replay:"):
            if path.split("?")[0] == "/metrics":
                self._send(handler, 200, self.next_page(name))
            else:
                self._send(handler, 404, b"not found")
        elif kind.startswith("status:"):
            code = int(kind.split(":", 1)[1])
            extra = {"Retry-After": str(RETRY_AFTER_SECONDS)} if code in (429, 503) else {}
            self._send(handler, code, f"status {code}\n".encode(), headers=extra)
        elif kind == "html":
            self._send(handler, 200, b"<html><body>Sign in</body></html>", content_type="text/html; charset=utf-8")
        elif kind == "garbage":
            self._send(handler, 200, b"ok\nstatus: fine\nthis is not an exposition {{{\n")
        elif kind == "blackhole":
            self._hold(handler)
        elif kind == "reset":
            self._reset(handler)
        elif kind in ("drip_headers", "drip_body"):
            self._drip(handler, kind)
        else:
            raise ValueError(f"unknown target kind {kind!r}")

    @staticmethod
    def _send(
        handler: BaseHTTPRequestHandler,
        code: int,
        body: bytes,
        content_type: str = "text/plain; version=0.0.4; charset=utf-8",
        headers: dict[str, str] | None = None,
    ) -> None:
        handler.send_response(code)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        try:
            handler.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            handler.close_connection = True

    def _hold(self, handler: BaseHTTPRequestHandler) -> None:
        """Say nothing until the client hangs up (so that a client's abandoned connection is not counted as open),
        the server stops, or ``hold_seconds`` pass."""
        conn = handler.connection
        end = time.monotonic() + self.hold_seconds
        while not self.stopping.is_set() and time.monotonic() < end:
            readable, _, _ = select.select([conn], [], [], 0.1)
            if readable:
                try:
                    if not conn.recv(65536):
                        break  # the client closed its side
                except OSError:
                    break
        handler.close_connection = True

    @staticmethod
    def _reset(handler: BaseHTTPRequestHandler) -> None:
        body = recorded_pages("healthy")[0]
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body[: len(body) // 2])
        handler.wfile.flush()
        # SO_LINGER 0: close sends RST, not FIN
        handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        handler.close_connection = True

    def _drip(self, handler: BaseHTTPRequestHandler, kind: str) -> None:
        out = handler.wfile
        try:
            if kind == "drip_headers":
                out.write(b"HTTP/1.1 200 OK\r\n")
                drip = b"X-Drip: " + b"a" * 10_000
            else:
                out.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: 10000\r\n\r\n"
                )
                drip = b"#" * 10_000
            out.flush()
            waited = 0.0
            for byte in drip:
                if waited >= self.hold_seconds or self.stopping.wait(self.drip_seconds):
                    break
                waited += self.drip_seconds
                out.write(bytes([byte]))
                out.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        handler.close_connection = True

    def __enter__(self) -> FleetServer:
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="fleet-server", daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        if self.thread is not None:
            self.thread.join(10)


class FleetProcess:
    """A ``FleetServer`` in a child process, so that its answers do not wait on the measured process's threads
    (one interpreter lock: a slow answer would be the bench's, not the server's) and its sockets and threads are
    not counted as the measured process's. The same calls as ``FleetServer``; commands go over the child's stdin
    as JSON lines, so the connections it counts are only the clients'."""

    def __init__(self, drip_seconds: float = 0.5, hold_seconds: float = 60.0) -> None:
        self.args = [f"{drip_seconds!r}", f"{hold_seconds!r}"]
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0

    def _ask(self, command: dict[str, Any]) -> Any:
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the fleet server's process ended")
        return json.loads(line)["answer"]

    def add(self, name: str, kind: str) -> str:
        return str(self._ask({"add": [name, kind]}))

    def rewind(self, name: str) -> None:
        self._ask({"rewind": name})

    @property
    def most_concurrent(self) -> int:
        return int(self._ask({"most": None}))

    @property
    def open_now(self) -> int:
        return int(self._ask({"now": None}))

    @property
    def most_in_flight(self) -> int:
        return int(self._ask({"most_in_flight": None}))

    def reset_most(self) -> None:
        self._ask({"reset_most": None})

    @property
    def open_paths(self) -> list[str]:
        return list(self._ask({"open_paths": None}))

    @property
    def requests(self) -> dict[str, int]:
        return dict(self._ask({"requests": None}))

    def __enter__(self) -> FleetProcess:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, *self.args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        self.port = int(self._ask({"port": None}))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # the child stops at the end of its input
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def serve(drip_seconds: float, hold_seconds: float) -> None:
    """The child's side of ``FleetProcess``: one JSON answer a command line, until stdin ends."""
    with FleetServer(drip_seconds, hold_seconds) as server:
        for line in sys.stdin:
            command, value = next(iter(json.loads(line).items()))
            if command == "add":
                answer: Any = server.add(*value)
            elif command == "rewind":
                answer = server.rewind(value)
            elif command == "reset_most":
                answer = server.reset_most()
            else:
                answer = {
                    "port": server.port,
                    "most": server.most_concurrent,
                    "most_in_flight": server.most_in_flight,
                    "now": server.open_now,
                    "open_paths": server.open_paths,
                    "requests": server.requests,
                }[command]
            sys.stdout.write(json.dumps({"answer": answer}) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    serve(float(sys.argv[1]), float(sys.argv[2]))
