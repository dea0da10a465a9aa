"""A real HTTP server on 127.0.0.1 for tests: serves scripted responses, e.g. recorded /metrics dumps in order."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; version=0.0.4; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)
    delay_seconds: float = 0.0
    # close the connection after sending this many body bytes (simulates a dropped response)
    cut_after_bytes: int | None = None


Responder = Callable[[str, dict[str, str]], Reply]


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that hangs up mid-body (the read cap, a timeout) is what several tests do on purpose


class ScriptedServer:
    """Answers each request with ``responder(path, headers)``. Records every request it saw."""

    def __init__(self, responder: Responder) -> None:
        self.responder = responder
        self.requests: list[tuple[str, dict[str, str]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                headers = {k.lower(): v for k, v in self.headers.items()}
                outer.requests.append((self.path, headers))
                reply = outer.responder(self.path, headers)
                if reply.delay_seconds:
                    threading.Event().wait(reply.delay_seconds)
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                self.send_header("Content-Length", str(len(reply.body)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                body = reply.body if reply.cut_after_bytes is None else reply.body[: reply.cut_after_bytes]
                try:
                    self.wfile.write(body)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass
                if reply.cut_after_bytes is not None:
                    self.close_connection = True

            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                # the body is read and dropped: answers depend on the path only
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.do_GET()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> ScriptedServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def strip_scraped_at(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("# llmdiag-scraped-at:")) + "\n"


class ReplayResponder:
    """Serves recorded /metrics dumps one per request, then keeps serving the last one."""

    def __init__(self, dumps: list[Path]) -> None:
        self.bodies = [strip_scraped_at(p.read_text()).encode() for p in dumps]
        self.index = 0
        self.lock = threading.Lock()

    def __call__(self, path: str, headers: dict[str, str]) -> Reply:
        if not path.startswith("/metrics"):
            return Reply(status=404, body=b"not found")
        with self.lock:
            body = self.bodies[min(self.index, len(self.bodies) - 1)]
            self.index += 1
        return Reply(body=body)
