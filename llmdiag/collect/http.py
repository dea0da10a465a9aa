"""HTTP access to a server's metrics page: auth, TLS, timeouts, a total deadline, a read cap, redirects only within
the same host, and errors in plain words."""

from __future__ import annotations

import time
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import requests

from llmdiag.client.deadline import Deadline, call_within, deadline_session, late_error, request_deadline
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

MAX_REDIRECTS = 5


def same_host_redirect(first_url: str, url: str, location: str, status: int) -> str:
    """Where a redirect from ``url`` leads, when it stays on the host first asked (vLLM's /metrics → /metrics/);
    a redirect to another host, or from https down to http, is refused in words: the request's credentials
    (Authorization, the headers given) must not go anywhere the user did not name."""
    target = urljoin(url, location)
    here, there = urlsplit(url), urlsplit(target)
    if not location:
        raise ConnectError(f"{redact_url(url)} answered HTTP {status} (a redirect) without saying where to")
    if there.hostname != urlsplit(first_url).hostname or (here.scheme == "https" and there.scheme != "https"):
        raise ConnectError(
            f"{redact_url(first_url)} redirects (HTTP {status}) to {redact_url(target)}, another host or an "
            "unencrypted URL; not followed, so that no credentials go there",
            f"if that is the server, give its URL directly ({option('metrics_url')} or the server URL)",
        )
    return target


def status_error(display: str, resp: requests.Response) -> HTTPStatusError:
    """The HTTPStatusError of an answer >= 400; an overloaded or rate-limiting server's Retry-After is said."""
    error = HTTPStatusError(display, resp.status_code, resp.reason or "")
    retry_after = resp.headers.get("Retry-After", "").strip()
    if resp.status_code in (429, 503):
        busy = "rate-limits this client" if resp.status_code == 429 else "is overloaded or starting up"
        wait = (
            f"; it asks to wait {retry_after}{' s' if retry_after.isdigit() else ''} before asking again"
            if retry_after
            else ""
        )
        error.hint = f"the server {busy} (HTTP {resp.status_code}){wait}: scan again later, or check its log"
    return error


class HttpMetricsSource:
    """Fetches and parses one metrics page per call. The session is reused across the window."""

    def __init__(self, connection: Connection, metrics_path: str = "/metrics") -> None:
        self.connection = connection
        self.url = connection.resolved_metrics_url(metrics_path)
        self.display_url = redact_url(self.url)
        self._session = deadline_session()
        self._session.headers.update({"User-Agent": "llmdiag", "Accept": "text/plain;version=0.0.4, */*;q=0.1"})
        self._session.headers.update(connection.headers)
        if connection.api_key:
            self._session.headers["Authorization"] = f"Bearer {connection.api_key}"
        self._session.verify = not connection.insecure

    def close(self) -> None:
        self._session.close()

    @taped_fetch  # recorded into a bundle, or replayed from one (llmdiag.collect.tape)
    def fetch_text(self) -> tuple[str, float]:
        """The page body and the wall-clock time it was read. The whole request (name resolution, connecting, the
        head, the body) ends within ``timeout_seconds``, or by the run's deadline when that comes first."""
        deadline = request_deadline(self.connection.timeout_seconds)
        body = call_within(deadline, lambda: self._fetch(deadline), lambda: late_error(self.display_url, deadline))
        return body.decode("utf-8", errors="replace"), time.time()

    def _fetch(self, deadline: Deadline) -> bytes:
        url = self.url
        for _hop in range(MAX_REDIRECTS + 1):
            resp = self._get(url, deadline)
            with resp:
                if resp.is_redirect:
                    url = same_host_redirect(self.url, url, resp.headers.get("Location", ""), resp.status_code)
                    continue
                if resp.status_code >= 400:
                    raise status_error(self.display_url, resp)
                content_type = resp.headers.get("Content-Type", "")
                if "html" in content_type:
                    raise NotMetricsError(f"{self.display_url} returned an HTML page ({content_type}), not metrics")
                return self._read_capped(resp)
        raise ConnectError(
            f"{self.display_url} redirected more than {MAX_REDIRECTS} times",
            f"give the final URL ({option('metrics_url')})",
        )

    def _get(self, url: str, deadline: Deadline) -> requests.Response:
        conn = self.connection
        try:
            return self._session.get(
                url,
                stream=True,
                timeout=deadline.cap(conn.timeout_seconds),
                allow_redirects=False,
                # given per request: requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override the session's False
                verify=self._session.verify,
            )
        except requests.exceptions.SSLError as exc:
            raise ConnectError(
                f"TLS handshake with {self.display_url} failed{_tls_reason(exc)}",
                f"for a self-signed certificate pass {option('insecure')}",
            ) from None
        except requests.exceptions.Timeout:
            raise ProbeTimeout(f"{self.display_url} did not answer within {conn.timeout_seconds:g} s") from None
        except requests.exceptions.ConnectionError as exc:
            raise ConnectError(f"cannot connect to {self.display_url}: {_connection_reason(exc)}") from None
        except requests.exceptions.RequestException as exc:
            raise ConnectError(f"request to {self.display_url} failed: {type(exc).__name__}") from None

    def _read_capped(self, resp: requests.Response) -> bytes:
        cap = self.connection.max_metrics_bytes
        try:
            body = read_up_to(resp, cap, chunk_bytes=256 * 1024)
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
        if body is None:
            raise ResponseTooLargeError(f"{self.display_url} is larger than {format_bytes(cap)}; stopped reading there")
        return body

    def scrape(self) -> Scrape:
        text, at = self.fetch_text()
        return parse_exposition(text, at, origin=self.display_url)


def _tls_reason(exc: Exception) -> str:
    text = str(exc)
    for needle, reason in (
        ("certificate has expired", "the certificate has expired"),
        ("self-signed certificate", "the certificate is self-signed"),
        ("self signed certificate", "the certificate is self-signed"),
        ("unable to get local issuer certificate", "the certificate's issuer is not trusted"),
        ("Hostname mismatch", "the certificate is for another host name"),
    ):
        if needle in text:
            return f": {reason}"
    return ""


def _connection_reason(exc: Exception) -> str:
    text = str(exc)
    if "Name or service not known" in text or "nodename nor servname" in text or "NameResolutionError" in text:
        return "the host name does not resolve (DNS)"
    if "Connection refused" in text:
        return "connection refused (nothing listens on that port)"
    if "timed out" in text:
        return "connection timed out"
    return "the connection failed"


@dataclass
class SmallAnswer:
    """A small answer read whole: its status, headers and body (``too_large``: cut at the cap, body empty)."""

    status: int
    headers: dict[str, str]
    body: bytes
    too_large: bool = False


def get_small(session: requests.Session, url: str, timeout_seconds: float, max_bytes: int) -> SmallAnswer:
    """One GET of a small answer (/props, /info, /v1/models, /version), head and body within ``timeout_seconds``
    in all (or the run's deadline); redirects followed on the same host only. Raises ConnectError or ProbeTimeout
    when no answer came."""
    display = redact_url(url)
    deadline = request_deadline(timeout_seconds)

    def fetch() -> SmallAnswer:
        target = url
        for _hop in range(MAX_REDIRECTS + 1):
            try:
                resp = session.get(
                    target,
                    stream=True,
                    timeout=deadline.cap(timeout_seconds),
                    allow_redirects=False,
                    verify=session.verify,  # per request: see HttpMetricsSource._get
                )
            except requests.exceptions.Timeout:
                raise ProbeTimeout(f"{display} did not answer within {timeout_seconds:g} s") from None
            except requests.exceptions.RequestException as exc:
                raise ConnectError(f"request to {display} failed: {type(exc).__name__}") from None
            with resp:
                if resp.is_redirect:
                    target = same_host_redirect(url, target, resp.headers.get("Location", ""), resp.status_code)
                    continue
                return _read_small(resp, display, max_bytes)
        raise ConnectError(f"{display} redirected more than {MAX_REDIRECTS} times")

    return call_within(deadline, fetch, lambda: late_error(display, deadline))


def _read_small(resp: requests.Response, display: str, max_bytes: int) -> SmallAnswer:
    headers = dict(resp.headers.items())
    try:
        body = read_up_to(resp, max_bytes, chunk_bytes=64 * 1024)
    except requests.exceptions.RequestException as exc:
        raise ConnectError(f"{display} closed the connection mid-answer ({type(exc).__name__})") from None
    if body is None:
        return SmallAnswer(resp.status_code, headers, b"", too_large=True)
    return SmallAnswer(resp.status_code, headers, body)


def read_up_to(resp: requests.Response, max_bytes: int, chunk_bytes: int) -> bytes | None:
    """The whole body, or None once it passes ``max_bytes`` (reading stops there); requests' errors go up."""
    chunks: list[bytes] = []
    size = 0
    for chunk in resp.iter_content(chunk_size=chunk_bytes):
        size += len(chunk)
        if size > max_bytes:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
