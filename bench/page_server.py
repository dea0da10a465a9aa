"""A /metrics server on 127.0.0.1 for bench/run.py: serves given pages, one per request, in a thread."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def recorded_page(path: Path) -> bytes:
    """A recorded /metrics page as the server sent it: without the ``# llmdiag-scraped-at:`` line the recorder adds."""
    lines = path.read_text().splitlines()
    return ("\n".join(line for line in lines if not line.startswith("# llmdiag-scraped-at:")) + "\n").encode()


class PageServer:
    """Answers GET (and POST, its body read and dropped) on ``path`` with ``pages`` in order, one per request, then
    the last one again; 404 on other paths. With ``path=None`` every path gets the pages (the oversized-page bench:
    whatever the scan asks for, it gets the huge page). A context manager; ``url`` is its base URL."""

    def __init__(self, pages: list[bytes], path: str | None = "/metrics") -> None:
        self.pages = pages
        self.path = path
        self.served = 0
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda request, address: None  # a client hanging up at its read cap is expected

    def next_page(self, path: str) -> bytes | None:
        if self.path is not None and not path.startswith(self.path):
            return None
        with self.lock:
            page = self.pages[min(self.served, len(self.pages) - 1)]
            self.served += 1
        return page

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                page = server.next_page(self.path)
                body = b"not found" if page is None else page
                self.send_response(404 if page is None else 200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.do_GET()

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> PageServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
