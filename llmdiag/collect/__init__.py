"""Stage 1: turn sources (live servers, saved metrics pages, logs, profiler traces) into measured signals.

The package itself holds only the defaults the CLI shows in its help, so a command that needs one collector
(`llmdiag trace`) loads only that one.
"""

DEFAULT_DURATION_SECONDS = 20.0
# a metrics page larger than this is not read whole (a misrouted URL serving a file, a runaway label)
DEFAULT_MAX_METRICS_BYTES = 16 * 1024 * 1024
