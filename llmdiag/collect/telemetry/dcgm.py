"""A dcgm-exporter page as a telemetry source: the server's GPUs, read with the server's timeouts, never its
credentials."""

from __future__ import annotations

from urllib.parse import urlsplit

from llmdiag.client.endpoint import Connection, normalise_base_url
from llmdiag.collect.http import HttpMetricsSource
from llmdiag.collect.source import Source
from llmdiag.errors import option
from llmdiag.schema.loader import load_probe


def dcgm_hint() -> str:
    return (
        "is dcgm-exporter running there? its page is usually http://HOST:9400/metrics; or leave out "
        f"{option('dcgm_url')}"
    )


def dcgm_connection(url: str, like: Connection) -> Connection:
    """The DCGM page's own connection: the server's timeouts and TLS choice, never its credentials.

    A bare ``http://HOST:9400`` means dcgm-exporter's page at ``/metrics``.
    """
    url = normalise_base_url(url)
    if urlsplit(url).path in ("", "/"):
        url += "/metrics"
    return Connection(
        base_url=url,
        metrics_url=url,
        api_key="",
        timeout_seconds=like.timeout_seconds,
        insecure=like.insecure,
        max_metrics_bytes=like.max_metrics_bytes,
    )


def dcgm_source(url: str, like: Connection) -> Source:
    page = HttpMetricsSource(dcgm_connection(url, like))
    return Source(
        spec=load_probe("dcgm"),
        display_url=page.display_url,
        read=page.scrape,
        close=page.close,
        label="DCGM exporter",
        hint=dcgm_hint(),
    )
