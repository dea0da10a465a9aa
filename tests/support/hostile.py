"""Scripted hostile HTTP servers on 127.0.0.1, written on raw sockets so that they can misbehave in ways an HTTP
library would not let them: drip the head or the body one byte at a time, accept and never answer, reset the
connection mid-body, answer an error status with Retry-After, redirect to another host, or speak TLS with a
self-signed or an expired certificate.

    with HostileServer(drip_body(interval_seconds=2)) as server:
        run_cli("scan", server.url, "--duration", "3", "--timeout", "5")

Every request's head is kept (``server.requests``: path and lower-cased headers), so a test can tell what a client
sent (credentials after a redirect). Each connection is served in its own daemon thread; a dripping handler stops
when the client hangs up or the server is closed.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

PAGE = (
    b"# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    b"# TYPE vllm:num_requests_running gauge\n"
    b'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n'
)


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)


class Conn:
    """One accepted connection as a handler sees it."""

    def __init__(self, sock: socket.socket, stop: threading.Event) -> None:
        self.sock = sock
        self.stop = stop

    def send(self, data: bytes) -> bool:
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def drip(self, data: bytes, interval_seconds: float) -> None:
        """One byte every ``interval_seconds``, until the data ends, the client hangs up or the server stops."""
        for i in range(len(data)):
            if self.stop.wait(interval_seconds) or not self.send(data[i : i + 1]):
                return

    def hold(self) -> None:
        """Say nothing until the client hangs up or the server stops."""
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                if not self.sock.recv(4096):
                    return
            except TimeoutError:
                continue
            except OSError:
                return

    def reset(self) -> None:
        """Close with a TCP RST (SO_LINGER 0), not a FIN: the client sees 'connection reset by peer'."""
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


Handler = Callable[[Conn, Request], None]


def head(status: int = 200, headers: dict[str, str] | None = None, reason: str = "X") -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# --- behaviours ---------------------------------------------------------------------------------------------------


def drip_head(interval_seconds: float = 2.0) -> Handler:
    """The status line and headers, one byte every ``interval_seconds`` (a long header: it never ends in time)."""

    def handle(conn: Conn, request: Request) -> None:
        conn.drip(head(200, {"Content-Type": "text/plain", "X-Pad": "p" * 4000}), interval_seconds)

    return handle


def drip_body(interval_seconds: float = 2.0, content_type: str = "text/plain; version=0.0.4") -> Handler:
    """A whole head at once, then a metrics page one byte every ``interval_seconds``."""

    def handle(conn: Conn, request: Request) -> None:
        body = PAGE * 50
        conn.send(head(200, {"Content-Type": content_type, "Content-Length": str(len(body))}))
        conn.drip(body, interval_seconds)

    return handle


def silent() -> Handler:
    """Accepts and reads the request, never answers."""

    def handle(conn: Conn, request: Request) -> None:
        conn.hold()

    return handle


def reset_mid_body(after_bytes: int = 60) -> Handler:
    """A head promising the whole page, ``after_bytes`` of it, then a TCP reset."""

    def handle(conn: Conn, request: Request) -> None:
        body = PAGE * 20
        conn.send(head(200, {"Content-Type": "text/plain; version=0.0.4", "Content-Length": str(len(body))}))
        conn.send(body[:after_bytes])
        conn.reset()

    return handle


def status(code: int, retry_after: str | None = None, body: bytes = b"nope\n") -> Handler:
    """Every path answers ``code`` (with Retry-After when given)."""

    def handle(conn: Conn, request: Request) -> None:
        headers = {"Content-Type": "text/plain", "Content-Length": str(len(body)), "Connection": "close"}
        if retry_after is not None:
            headers["Retry-After"] = retry_after
        conn.send(head(code, headers) + body)

    return handle


def redirect(to_url: str, code: int = 302) -> Handler:
    """Every path redirects to ``to_url`` + the same path."""

    def handle(conn: Conn, request: Request) -> None:
        headers = {"Location": to_url.rstrip("/") + request.path, "Content-Length": "0", "Connection": "close"}
        conn.send(head(code, headers))

    return handle


def serve_page(body: bytes = PAGE * 3) -> Handler:
    """A plain good vLLM-looking page on every path (the far side of a redirect, a TLS server)."""

    def handle(conn: Conn, request: Request) -> None:
        headers = {"Content-Type": "text/plain; version=0.0.4", "Content-Length": str(len(body)), "Connection": "close"}
        conn.send(head(200, headers) + body)

    return handle


def replay(dumps: list[Path]) -> Handler:
    """Recorded /metrics dumps one per request, then the last one again (a well-behaved server)."""
    bodies = [
        "".join(
            line for line in p.read_text().splitlines(True) if not line.startswith("# llmdiag-scraped-at:")
        ).encode()
        for p in dumps
    ]
    served = [0]
    lock = threading.Lock()

    def handle(conn: Conn, request: Request) -> None:
        with lock:
            body = bodies[min(served[0], len(bodies) - 1)]
            served[0] += 1
        serve_page(body)(conn, request)

    return handle


def first_then(count: int, first: Handler, then: Handler) -> Handler:
    """The first ``count`` requests as ``first``, every later one as ``then`` (a server that turns slow)."""
    seen = [0]
    lock = threading.Lock()

    def handle(conn: Conn, request: Request) -> None:
        with lock:
            seen[0] += 1
            n = seen[0]
        (first if n <= count else then)(conn, request)

    return handle


def routes(by_prefix: dict[str, Handler], default: Handler) -> Handler:
    """The handler of the longest path prefix that matches, else ``default``."""

    def handle(conn: Conn, request: Request) -> None:
        matches = [p for p in by_prefix if request.path.startswith(p)]
        (by_prefix[max(matches, key=len)] if matches else default)(conn, request)

    return handle


# --- the server ---------------------------------------------------------------------------------------------------


class HostileServer:
    """Serves every connection with ``handler``; ``tls``: an ssl context to wrap accepted sockets with."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None, host: str = "127.0.0.1") -> None:
        self.handler = handler
        self.tls = tls
        self.requests: list[Request] = []
        self.connections = 0
        self._stop = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, 0))
        self._listener.listen(64)
        self._listener.settimeout(0.2)
        self.host = host
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, name="hostile-server", daemon=True)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def __enter__(self) -> HostileServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        try:
            sock.settimeout(10)
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_side=True)
            request = _read_request(sock)
            if request is None:
                return
            self.requests.append(request)
            self.handler(Conn(sock, self._stop), request)
        except (OSError, ssl.SSLError):
            pass  # a client that hangs up or refuses the certificate is what these tests want
        finally:
            with contextlib.suppress(OSError):
                sock.close()


def _read_request(sock: socket.socket) -> Request | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return None
        data += chunk
        if len(data) > 65536:
            return None
    text = data.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    lines = text.split("\r\n")
    method, path = (lines[0].split(" ") + ["", ""])[:2]
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length") or 0)
    rest = data.split(b"\r\n\r\n", 1)[1]
    while len(rest) < length:
        chunk = sock.recv(4096)
        if not chunk:
            break
        rest += chunk
    return Request(method, path, headers)


# --- certificates -------------------------------------------------------------------------------------------------


def make_certificate(folder: Path, expired: bool = False) -> ssl.SSLContext:
    """A server TLS context with a self-signed certificate for 127.0.0.1/localhost made by the openssl CLI; with
    ``expired``, one that ended a day before it began (``x509 -days -1``: OpenSSL 3.0's req has no date options)."""
    key, csr, cert, ext = (folder / name for name in ("key.pem", "req.csr", "cert.pem", "san.ext"))
    ext.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run = lambda *args: subprocess.run(["openssl", *args], check=True, capture_output=True)  # noqa: E731
    run("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", "/CN=localhost")
    days = "-1" if expired else "2"
    run("x509", "-req", "-in", str(csr), "-signkey", str(key), "-out", str(cert), "-days", days, "-extfile", str(ext))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context
