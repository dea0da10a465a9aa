"""The metrics page's HTTP session, set up in-process (fetching a page from a live server is tests/e2e): the URL it
reads, credentials sent but never shown, TLS checked unless --insecure, and connection failures in plain words."""

from __future__ import annotations

import pytest
import requests

from llmdiag.client.endpoint import API_KEY_ENV, Connection
from llmdiag.collect.http import HttpMetricsSource, _connection_reason


@pytest.fixture(autouse=True)
def no_ambient_key(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)


def test_the_page_is_the_servers_metrics_path_unless_a_metrics_url_is_given():
    assert HttpMetricsSource(Connection("http://h:8000/")).url == "http://h:8000/metrics"
    assert HttpMetricsSource(Connection("http://h:8000"), metrics_path="/prometheus/metrics").url == (
        "http://h:8000/prometheus/metrics"
    )
    source = HttpMetricsSource(Connection("http://h:8000", metrics_url="http://h:9090/custom"))
    assert source.url == "http://h:9090/custom"


def test_credentials_are_sent_and_never_shown():
    connection = Connection("http://user:pw@h:8000", headers={"X-Tenant": "team-a"}, api_key="k-123")
    source = HttpMetricsSource(connection)
    headers = source._session.headers
    assert headers["Authorization"] == "Bearer k-123" and headers["X-Tenant"] == "team-a"
    assert headers["User-Agent"] == "llmdiag" and headers["Accept"].startswith("text/plain")
    assert "pw" not in source.display_url and source.display_url.endswith("h:8000/metrics")
    assert "Authorization" not in HttpMetricsSource(Connection("http://h:8000"))._session.headers


def test_tls_is_verified_unless_insecure():
    assert HttpMetricsSource(Connection("https://h"))._session.verify is True
    assert HttpMetricsSource(Connection("https://h", insecure=True))._session.verify is False


@pytest.mark.parametrize(
    "text, words",
    [
        ("HTTPConnectionPool: NameResolutionError(...)", "DNS"),
        ("[Errno -2] Name or service not known", "DNS"),
        ("[Errno 111] Connection refused", "refused"),
        ("connect timed out", "timed out"),
        ("something else entirely", "failed"),
    ],
)
def test_connection_failures_are_said_in_words(text: str, words: str):
    reason = _connection_reason(requests.exceptions.ConnectionError(text))
    assert words in reason and "Errno" not in reason  # the meaning, not the library's text
