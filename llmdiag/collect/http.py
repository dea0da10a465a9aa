"""HTTP access to a server's metrics page: auth, TLS, timeouts, a read cap, and errors in plain words."""

from __future__ import annotations

import time

import requests

from llmdiag.client.endpoint import Connection, format_bytes, redact_url
from llmdiag.collect.exposition import Scrape, parse_exposition
from llmdiag.collect.tape import taped_fetch
from llmdiag.errors import (
    ConnectError,
    HTTPStatusError,
    NotMetricsError,
    ProbeTimeout,
    ResponseTooLargeError,
    option,
)


class HttpMetricsSource:
    """Fetches and parses one metrics page per call. The session is reused across the window."""

    def __init__(self, connection: Connection, metrics_path: str = "/metrics") -> None:
        self.connection = connection
        self.url = connection.resolved_metrics_url(metrics_path)
        self.display_url = redact_url(self.url)
        self._session = requests.Session()
        self._session.headers.update({"User-Agent": "llmdiag", "Accept": "text/plain;version=0.0.4, */*;q=0.1"})
        self._session.headers.update(connection.headers)
        if connection.api_key:
            self._session.headers["Authorization"] = f"Bearer {connection.api_key}"
        self._session.verify = not connection.insecure

    def close(self) -> None:
        self._session.close()

    @taped_fetch  # recorded into a bundle, or replayed from one (llmdiag.collect.tape)
    def fetch_text(self) -> tuple[str, float]:
        """The page body and the wall-clock time it was read."""
        conn = self.connection
        try:
            resp = self._session.get(self.url, stream=True, timeout=conn.timeout_seconds)
        except requests.exceptions.SSLError:
            raise ConnectError(
                f"TLS handshake with {self.display_url} failed",
                f"for a self-signed certificate pass {option('insecure')}",
            ) from None
        except requests.exceptions.Timeout:
            raise ProbeTimeout(f"{self.display_url} did not answer within {conn.timeout_seconds:g} s") from None
        except requests.exceptions.ConnectionError as exc:
            raise ConnectError(f"cannot connect to {self.display_url}: {_connection_reason(exc)}") from None
        except requests.exceptions.RequestException as exc:
            raise ConnectError(f"request to {self.display_url} failed: {type(exc).__name__}") from None
        with resp:
            if resp.status_code >= 400:
                raise HTTPStatusError(self.display_url, resp.status_code, resp.reason or "")
            content_type = resp.headers.get("Content-Type", "")
            if "html" in content_type:
                raise NotMetricsError(f"{self.display_url} returned an HTML page ({content_type}), not metrics")
            body = self._read_capped(resp)
        return body.decode("utf-8", errors="replace"), time.time()

    def _read_capped(self, resp: requests.Response) -> bytes:
        cap = self.connection.max_metrics_bytes
        chunks: list[bytes] = []
        size = 0
        try:
            for chunk in resp.iter_content(chunk_size=256 * 1024):
                size += len(chunk)
                if size > cap:
                    raise ResponseTooLargeError(
                        f"{self.display_url} is larger than {format_bytes(cap)}; stopped reading there"
                    )
                chunks.append(chunk)
        except requests.exceptions.ContentDecodingError:
            raise ConnectError(
                f"{self.display_url} sent a page that cannot be decoded "
                f"(Content-Encoding '{resp.headers.get('Content-Encoding', '')}')",
                "check the page with `curl -s --compressed URL/metrics | head`",
            ) from None
        except requests.exceptions.RequestException as exc:
            # requests reports a read timeout inside the body as a ConnectionError wrapping urllib3's ReadTimeoutError
            if isinstance(exc, requests.exceptions.Timeout) or "timed out" in str(exc).lower():
                raise ProbeTimeout(
                    f"{self.display_url} stopped sending mid-page: no data for {self.connection.timeout_seconds:g} s"
                ) from None
            # ChunkedEncodingError (IncompleteRead, connection reset) and other ConnectionErrors
            raise ConnectError(
                f"{self.display_url} closed the connection mid-page ({type(exc).__name__})",
                "the server dropped the answer: check its log for a crash or restart, then scan again",
            ) from None
        return b"".join(chunks)

    def scrape(self) -> Scrape:
        text, at = self.fetch_text()
        return parse_exposition(text, at, origin=self.display_url)


def _connection_reason(exc: Exception) -> str:
    text = str(exc)
    if "Name or service not known" in text or "nodename nor servname" in text or "NameResolutionError" in text:
        return "the host name does not resolve (DNS)"
    if "Connection refused" in text:
        return "connection refused (nothing listens on that port)"
    if "timed out" in text:
        return "connection timed out"
    return "the connection failed"
