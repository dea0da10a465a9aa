"""The HTTP-layer faults of the fault matrix, against scripted hostile servers (tests/support/hostile.py): error
statuses (with Retry-After), a redirect to another host, TLS with a self-signed and an expired certificate, a name
that does not resolve (and one whose resolver hangs), a connection reset mid-body. Each ends a scan with exit 2 and
exactly one ERROR and one HINT line, no traceback; `check` says UNKNOWN (exit 3). The scans run the console
script's entry point in this process (a subprocess costs seconds of start-up each on a busy machine); the check
runs as a subprocess, as cron runs it."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from llmdiag.client.endpoint import Connection
from llmdiag.collect.http import HttpMetricsSource
from llmdiag.errors import ConnectError, ProbeTimeout
from tests.conftest import CliResult, run_cli, run_cli_in_process
from tests.support.hostile import (
    PAGE,
    HostileServer,
    make_certificate,
    redirect,
    reset_mid_body,
    routes,
    serve_page,
    status,
)

FAST = ("--duration", "2", "--timeout", "3")


def cli(*args: str) -> CliResult:
    """``llmdiag ARGS`` in this process (as the golden set runs it)."""
    return run_cli_in_process(*args)


def one_error(result: CliResult, exit_code: int = 2) -> tuple[str, str]:
    everything = result.stdout + result.stderr
    assert "Traceback" not in everything, everything
    assert result.returncode == exit_code, everything
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 2 and lines[0].startswith("ERROR: ") and lines[1].startswith("HINT: "), result.stderr
    return lines[0], lines[1]


@pytest.mark.parametrize(
    ("code", "retry_after", "hint_says"),
    [
        (401, None, "--api-key"),
        (403, None, "credentials were refused"),
        (404, None, "--metrics-url"),
        (429, "30", "wait 30 s"),
        (500, None, "check its log"),
        (503, "120", "wait 120 s"),
    ],
)
def test_error_status(code, retry_after, hint_says):
    with HostileServer(status(code, retry_after)) as server:
        error, hint = one_error(cli("scan", server.url, *FAST))
    assert f"HTTP {code}" in error
    assert hint_says in hint


def test_a_redirect_to_another_host_is_refused_and_carries_no_credentials():
    elsewhere = HostileServer(serve_page())
    # the same machine under another name: another host as far as credentials go
    with elsewhere, HostileServer(redirect(f"http://localhost:{elsewhere.port}")) as server:
        result = cli(
            "scan", server.url, *FAST, "--server", "vllm", "--header", "X-Tenant-Token: s3cret",
            "--api-key", "sk-never-leaves",
        )  # fmt: skip
    error, hint = one_error(result)
    assert "redirects" in error and f"localhost:{elsewhere.port}" in error and "not followed" in error
    assert elsewhere.requests == []  # nothing, credentials least of all, went there
    assert server.requests and server.requests[0].headers.get("x-tenant-token") == "s3cret"
    assert "sk-never-leaves" not in result.stdout + result.stderr and "s3cret" not in result.stdout + result.stderr


def test_a_redirect_on_the_same_host_is_followed():
    """vLLM's mounted metrics app answers /metrics with a redirect to /metrics/."""

    def to_slash(conn, request):
        # the scripted server serves one exchange per connection, so it says so (as every handler in hostile.py does):
        # without it the client may reuse the closing connection for the next hop, a race of the test's own making
        conn.send(
            b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /metrics/\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )

    with HostileServer(routes({"/metrics/": serve_page(), "/metrics": to_slash}, status(404))) as server:
        page = HttpMetricsSource(Connection(base_url=server.url, timeout_seconds=3))
        text, _ = page.fetch_text()
        page.close()
    assert text == (PAGE * 3).decode()
    assert [r.path for r in server.requests] == ["/metrics", "/metrics/"]


def test_tls_self_signed_without_insecure_then_with_it(tmp_path):
    with HostileServer(serve_page(), tls=make_certificate(tmp_path)) as server:
        error, hint = one_error(cli("scan", server.url, *FAST, "--server", "vllm"))
        page = HttpMetricsSource(Connection(base_url=server.url, timeout_seconds=3, insecure=True))
        text, _ = page.fetch_text()
        page.close()
    assert "TLS" in error and "self-signed" in error
    assert "--insecure" in hint
    assert text == (PAGE * 3).decode()


def test_tls_expired_certificate(tmp_path, monkeypatch):
    """An expired certificate from a CA this machine trusts (REQUESTS_CA_BUNDLE names it, as for a private CA):
    the expiry is what is said."""
    context = make_certificate(tmp_path, expired=True)
    with HostileServer(serve_page(), tls=context) as server:
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "cert.pem"))
        result = cli("scan", server.url, *FAST, "--server", "vllm")
    error, _hint = one_error(result)
    assert "TLS" in error and "expired" in error


def test_a_connection_reset_mid_body():
    with HostileServer(reset_mid_body()) as server:
        error, hint = one_error(cli("scan", server.url, *FAST, "--server", "vllm"))
    assert "closed the connection mid-page" in error


def test_a_resolver_that_hangs_is_bounded_by_the_timeout(monkeypatch):
    """Name resolution runs under the request's deadline: a resolver that does not answer ends the read at the
    timeout (getaddrinfo cannot be interrupted; its worker is left to it)."""
    release = threading.Event()
    real = socket.getaddrinfo

    def hanging(host, *args, **kwargs):
        if host == "slow-dns.invalid":
            release.wait(30)
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", hanging)
    page = HttpMetricsSource(Connection(base_url="http://slow-dns.invalid:8000", timeout_seconds=1))
    started = time.monotonic()
    try:
        with pytest.raises(ProbeTimeout):
            page.fetch_text()
        assert time.monotonic() - started < 1 + 2
    finally:
        release.set()
        page.close()


def test_a_name_that_does_not_resolve():
    page = HttpMetricsSource(Connection(base_url="http://no-such-host.invalid:8000", timeout_seconds=3))
    with pytest.raises(ConnectError, match="DNS"):
        page.fetch_text()
    page.close()


def test_check_says_unknown_for_a_refusing_and_an_unreachable_target():
    with HostileServer(status(503, "60")) as busy:
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            dead = f"http://127.0.0.1:{free.getsockname()[1]}"
        result = run_cli("check", busy.url, dead, *FAST, "--no-history", "--json")
    assert result.returncode == 3, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    report = json.loads(result.stdout)
    errors = sorted(t["error"] for t in report["targets"])
    assert len(errors) == 2
    assert any("HTTP 503" in e for e in errors) and any("refused" in e for e in errors), errors
