"""Where and how to reach one server (Connection: its URLs, headers and secrets), and the small pieces around it: a
base URL normalised, a URL shown (never with a password), a --header parsed, a byte limit written as typed."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import urlsplit

# redact_url lives with the errors (messages on every floor show URLs); imported from here as before
from llmdiag.errors import UsageError, option, redact_url

API_KEY_ENV = "LLMDIAG_API_KEY"
# a metrics page larger than this is not read whole (a misrouted URL serving a file, a runaway label)
DEFAULT_MAX_METRICS_BYTES = 16 * 1024 * 1024


def normalise_base_url(url: str) -> str:
    if "://" not in url:
        url = f"http://{url}"
    hint = "give the server as http://HOST:PORT"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError on a port that is not a number in 0-65535)
    except ValueError as exc:
        raise UsageError(f"'{redact_url(url)}' is not a valid URL: {exc}", hint) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"'{redact_url(url)}' is not an http(s) URL", hint)
    return url.rstrip("/")


def format_bytes(n: int) -> str:
    """A byte count as the user would have typed it: '16 MiB', '64 KiB', or '100000 bytes'."""
    for unit, size in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


@dataclass
class Connection:
    """Where and how to reach one server. Secrets live here and nowhere else."""

    base_url: str
    metrics_url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    api_key: str | None = None
    timeout_seconds: float = 5.0
    insecure: bool = False
    max_metrics_bytes: int = DEFAULT_MAX_METRICS_BYTES

    def __post_init__(self) -> None:
        self.base_url = normalise_base_url(self.base_url)
        if self.metrics_url:
            self.metrics_url = normalise_base_url(self.metrics_url)
        if self.api_key is None:
            self.api_key = os.environ.get(API_KEY_ENV) or None

    def resolved_metrics_url(self, metrics_path: str = "/metrics") -> str:
        return self.metrics_url or f"{self.base_url}{metrics_path}"


def parse_header(raw: str) -> tuple[str, str]:
    name, sep, value = raw.partition(":")
    if not sep or not name.strip():
        header = option("headers")
        raise UsageError(f"{header} '{name.strip() or raw}' is not 'Name: value'", f"e.g. {header} 'X-Tenant: team-a'")
    return name.strip(), value.strip()
