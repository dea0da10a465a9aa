"""Stage 1: turn sources (live servers, saved metrics pages, logs, profiler traces) into measured signals.

The package itself holds only the defaults the CLI shows in its help, so a command that needs one collector
(`llmdiag trace`) loads only that one.
"""

from llmdiag.client.endpoint import DEFAULT_MAX_METRICS_BYTES

DEFAULT_DURATION_SECONDS = 20.0

__all__ = ["DEFAULT_DURATION_SECONDS", "DEFAULT_MAX_METRICS_BYTES"]
