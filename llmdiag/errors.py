"""Every error llmdiag raises on purpose. The CLI turns each into one ERROR line, one HINT line and exit 2
(`llmdiag check`: exit 3, UNKNOWN, as the Nagios conventions want).

    LlmdiagError
    ├── UsageError                 bad command-line input
    │   ├── BenchUsageError        a bad argument to the NCCL benchmark (sizes, ops, link …)
    │   └── WorkloadMismatchError  an A/B of runs whose workload, model or server version differ
    ├── ConfigError                llmdiag.toml is wrong
    │   └── RuleSpecError          a rule or probe file is wrong (path, field, reason)
    ├── InputFileError             a file to analyze is missing or unreadable
    │   └── TraceFileError         a profiler trace is truncated, corrupt, or not a Kineto trace
    ├── HistoryError               the check history (SQLite) cannot be opened or written
    ├── TorchMissingError          the NCCL benchmark needs PyTorch, which is not installed
    ├── BenchFailedError           the NCCL benchmark's torchrun job failed or did not finish
    └── ProbeError                 a source could not be read
        ├── ConnectError           refused, DNS failure, TLS failure
        ├── ProbeTimeout           no answer in the timeout
        ├── HTTPStatusError        401, 403, 404, 5xx …
        ├── NotMetricsError        the page is HTML, JSON, or not a known server's metrics
        │   └── UnsupportedServerError  no server probe recognises what the URL answers
        ├── ExpositionParseError   truncated or garbage Prometheus text
        ├── ResponseTooLargeError  the page is larger than the read cap, or holds more series than a page can
        └── EmptyWindowError       no usable pair of scrapes (e.g. the server restarted mid-scan)

Naming an option in a message: ``option(key)``. The code below the CLI never spells a command-line flag: a
message or hint that tells the user to change a setting names it by the library's parameter name (the keyword
of the entry point or model that takes it, e.g. ``timeout_seconds``) through ``option()``, which returns how the
caller names it. A library caller sees the keyword (``raise timeout_seconds``); the CLI installs its spelling at
startup (``use_option_spelling``) and the same call gives the flag (``raise --timeout``). The spelling is looked
up when ``option()`` is called, so it must never be called at import time (a module-level string, a class
attribute, a default argument): build the message when the error is raised. A class's default hint that names an
option is therefore built when it is read: ``hint = OptionHint(lambda: f"… {option('timeout_seconds')} …")``.

The key is the parameter the user would change, as the library spells it (``timeout_seconds``, ``headers``,
``metrics_url``); where the library has no keyword of its own for a flag, the key is the flag's name in snake case
(``no_history``: a library caller passes ``history=None``). The CLI spells a key by its table
(``llmdiag.cli.options.FLAG_NAMES``: ``timeout_seconds`` → ``--timeout``), else as ``--`` and the key with '-' for
'_' (``metrics_url`` → ``--metrics-url``); a new key whose flag is spelled otherwise goes into that table.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit


def library_spelling(key: str) -> str:
    """The library's name for an option: its keyword, as given."""
    return key


_spelling: Callable[[str], str] = library_spelling


def option(key: str) -> str:
    """How the caller names the option whose library parameter is ``key`` (``--timeout`` on the command line,
    ``timeout_seconds`` for a library caller). Call it when the message is built, never at import time."""
    return _spelling(key)


def use_option_spelling(spell: Callable[[str], str] | None) -> Callable[[str], str]:
    """Install how options are named in messages from now on (process-wide; None: the library's). Returns the
    spelling it replaces, for a caller that puts it back when done."""
    global _spelling
    previous, _spelling = _spelling, spell or library_spelling
    return previous


USERINFO_RE = re.compile(r"^([^:/?#]*://)[^/?#]*@")


def redact_url(url: str) -> str:
    """Drop user:password from a URL before it is shown anywhere. Never raises, even on a malformed URL.

    It lives here, on the floor every other module stands on, because messages at every floor show URLs."""
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unclosed IPv6 bracket: strip the user-info by hand
        return USERINFO_RE.sub(r"\1***@", url)
    if "@" in parts.netloc:
        parts = parts._replace(netloc=f"***@{parts.netloc.rpartition('@')[2]}")
    return urlunsplit(parts)


class OptionHint:
    """A class's default hint that names options: built each time it is read (on the class or on an error without
    a hint of its own), so the options are spelled as the caller spells them at that moment."""

    def __init__(self, build: Callable[[], str]) -> None:
        self._build = build

    def __get__(self, instance: object, owner: type | None = None) -> str:
        return self._build()


class LlmdiagError(Exception):
    """Base class. ``message`` is one line; ``hint`` says what to do about it (default: the class's ``hint``)."""

    hint: str = ""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if hint is not None:
            self.hint = hint


class UsageError(LlmdiagError):
    hint = "run `llmdiag --help` for the options"


class WorkloadMismatchError(UsageError):
    """`load --workload W --baseline B`: the two runs measured different things (the message names which)."""


class ConfigError(LlmdiagError):
    hint = "check llmdiag.toml against the README section 'Configuration'"


class RuleSpecError(ConfigError):
    def __init__(self, path: str, field: str, reason: str) -> None:
        super().__init__(f"{path}: field '{field}': {reason}", "fix the file; `llmdiag rules list` loads them all")
        self.path = path
        self.field = field
        self.reason = reason


class InputFileError(LlmdiagError):
    hint = "check the path; save a dump with `curl -s http://HOST:PORT/metrics > metrics.prom`"


class TraceFileError(InputFileError):
    hint = "give the JSON (or .json.gz) files torch.profiler wrote; the other ranks are still analysed"


class HistoryError(LlmdiagError):
    hint = OptionHint(
        lambda: f"check the {option('history')} path and its folder's permissions, or pass {option('no_history')}"
    )


class ProbeError(LlmdiagError):
    hint = "check the URL and that the server is up"


class ConnectError(ProbeError):
    hint = "is the server running and listening on that host and port? try `curl -v URL/health`"


class ProbeTimeout(ProbeError):
    hint = OptionHint(
        lambda: f"the server did not answer in time; raise {option('timeout_seconds')} or check that it is not hung"
    )


class HTTPStatusError(ProbeError):
    def __init__(self, url: str, status: int, reason: str = "") -> None:
        api_key, header = option("api_key"), option("headers")
        hints = {
            401: f"the server wants credentials: pass {api_key} (or LLMDIAG_API_KEY) or {header} 'Authorization: …'",
            403: f"the credentials were refused: check {api_key} / {header}",
            404: f"no metrics page there: point at the server's base URL, or give {option('metrics_url')}",
        }
        hint = hints.get(status, "the server failed to answer; check its log")
        super().__init__(f"{url} answered HTTP {status}{(' ' + reason) if reason else ''}", hint)
        self.status = status


class NotMetricsError(ProbeError):
    hint = OptionHint(
        lambda: f"point llmdiag at the inference server's base URL, or its metrics page with {option('metrics_url')}"
    )


class ExpositionParseError(ProbeError):
    hint = "the page is not valid Prometheus text; check it with `curl -s URL/metrics | head`"


class ResponseTooLargeError(ProbeError):
    hint = OptionHint(lambda: f"raise the cap with {option('max_metrics_bytes')} if the page really is that large")


class EmptyWindowError(ProbeError):
    hint = "scan again; a server that restarts during the window leaves nothing to compare"


class PrometheusQueryError(ProbeError):
    """A Prometheus (or Mimir/Thanos) query API answered with an error: HTTP status, ``status: error``, a limit."""

    hint = OptionHint(
        lambda: (
            "check the query by hand with the curl line in the message's signal, or narrow "
            f"{option('selector')} / the window"
        )
    )


class BenchUsageError(UsageError):
    """A bad argument to the NCCL benchmark, found before torchrun starts (or by the ranks under torchrun)."""

    hint = "run `python -m llmdiag.nccl_bench --help` for the options"


class TorchMissingError(LlmdiagError):
    hint = "pip install 'llmdiag[torch]'  (on a CPU-only machine: torch==2.13.0's CPU wheel)"


class BenchFailedError(LlmdiagError):
    """The torchrun job of the NCCL benchmark failed or timed out; the message names the cause, the hint the log."""

    hint = "rerun with NCCL_DEBUG=INFO to see which transport NCCL chose"


class UnsupportedServerError(NotMetricsError):
    """No server probe recognises what the URL answers. ``hint`` is a template: ``{servers}`` becomes the list of
    supported servers (llmdiag.collect.detect.unsupported fills it in)."""

    hint = OptionHint(
        lambda: (
            f"supported: {{servers}}; if it is one of them, name it with {option('server')} NAME (and "
            f"{option('metrics_url')} if its page is elsewhere)"
        )
    )
