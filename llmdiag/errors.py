"""Every error llmdiag raises on purpose. The CLI turns each into one ERROR line, one HINT line and exit 2
(`llmdiag check`: exit 3, UNKNOWN, as the Nagios conventions want).

    LlmdiagError
    ├── UsageError                 bad command-line input
    │   └── BenchUsageError        a bad argument to the NCCL benchmark (sizes, ops, link …)
    ├── ConfigError                llmdiag.toml is wrong
    │   └── RuleSpecError          a rule or probe file is wrong (path, field, reason)
    ├── InputFileError             a file to analyze is missing or unreadable
    │   └── TraceFileError         a profiler trace is truncated, corrupt, or not a Kineto trace
    ├── HistoryError               the check history (SQLite) cannot be opened or written
    ├── TorchMissingError          the NCCL benchmark needs PyTorch, which is not installed
    ├── BenchFailedError           the NCCL benchmark's torchrun job failed or did not finish
    └── ProbeError                 a source could not be read
        ├── ConnectError           refused, DNS failure, TLS failure
        ├── ProbeTimeout           no answer in --timeout
        ├── HTTPStatusError        401, 403, 404, 5xx …
        ├── NotMetricsError        the page is HTML, JSON, or not a known server's metrics
        │   └── UnsupportedServerError  no server probe recognises what the URL answers
        ├── ExpositionParseError   truncated or garbage Prometheus text
        ├── ResponseTooLargeError  the page is larger than the read cap
        └── EmptyWindowError       no usable pair of scrapes (e.g. the server restarted mid-scan)
"""

from __future__ import annotations


class LlmdiagError(Exception):
    """Base class. ``message`` is one line; ``hint`` says what to do about it."""

    hint: str = ""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if hint is not None:
            self.hint = hint


class UsageError(LlmdiagError):
    hint = "run `llmdiag --help` for the options"


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
    hint = "check the --history path and its folder's permissions, or pass --no-history"


class ProbeError(LlmdiagError):
    hint = "check the URL and that the server is up"


class ConnectError(ProbeError):
    hint = "is the server running and listening on that host and port? try `curl -v URL/health`"


class ProbeTimeout(ProbeError):
    hint = "the server did not answer in time; raise --timeout or check that it is not hung"


class HTTPStatusError(ProbeError):
    def __init__(self, url: str, status: int, reason: str = "") -> None:
        hints = {
            401: "the server wants credentials: pass --api-key (or LLMDIAG_API_KEY) or --header 'Authorization: …'",
            403: "the credentials were refused: check --api-key / --header",
            404: "no metrics page there: point at the server's base URL, or give --metrics-url",
        }
        hint = hints.get(status, "the server failed to answer; check its log")
        super().__init__(f"{url} answered HTTP {status}{(' ' + reason) if reason else ''}", hint)
        self.status = status


class NotMetricsError(ProbeError):
    hint = "point llmdiag at the inference server's base URL, or its metrics page with --metrics-url"


class ExpositionParseError(ProbeError):
    hint = "the page is not valid Prometheus text; check it with `curl -s URL/metrics | head`"


class ResponseTooLargeError(ProbeError):
    hint = "raise the cap with --max-metrics-bytes if the page really is that large"


class EmptyWindowError(ProbeError):
    hint = "scan again; a server that restarts during the window leaves nothing to compare"


class PrometheusQueryError(ProbeError):
    """A Prometheus (or Mimir/Thanos) query API answered with an error: HTTP status, ``status: error``, a limit."""

    hint = "check the query by hand with the curl line in the message's signal, or narrow --selector / the window"


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

    hint = (
        "supported: {servers}; if it is one of them, name it with --server NAME (and --metrics-url if its page is "
        "elsewhere)"
    )
