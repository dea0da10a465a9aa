"""`llmdiag analyze`: judge saved /metrics dumps or server logs (bug reports, past incidents)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from llmdiag.api.scan import diagnose_files, diagnose_logs
from llmdiag.cli.options import OutputFlags, PagesFlags, flag_groups
from llmdiag.cli.output import emit, exit_code, fail, write_html
from llmdiag.client.endpoint import DEFAULT_MAX_METRICS_BYTES
from llmdiag.collect.logs import looks_like_log
from llmdiag.config import Settings
from llmdiag.errors import LlmdiagError, UsageError
from llmdiag.model import Verdict

app = typer.Typer(add_completion=False)


@app.command()
@flag_groups
def analyze(
    files: Annotated[
        list[Path],
        typer.Argument(
            help="Saved /metrics dumps (one: lifetime averages; 2+: a window) or server logs (vLLM, SGLang, "
            "TensorRT-LLM), told apart by their first lines."
        ),
    ],
    *,
    pages: PagesFlags,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            help="Logs: judge lines from this time on (2026-11-30T06:40:00, 06:40, or 30m before the last line).",
        ),
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="Logs: judge lines up to this time (same forms as --since).")
    ] = None,
    output: OutputFlags,
) -> None:
    """Diagnose from saved /metrics dumps or server logs (bug reports, past incidents)."""
    try:
        output.check()
        verdict = judge_files(files, pages, since, until, output.settings())
        if output.html is not None:
            write_html(output.html, verdict, quiet=output.as_json or output.markdown)
    except LlmdiagError as error:
        fail(error)
    emit(verdict, output.as_json, output.verbose, output.markdown)
    raise typer.Exit(exit_code(verdict, output.fail_on))


def judge_files(
    files: list[Path], pages: PagesFlags, since: str | None, until: str | None, settings: Settings
) -> Verdict:
    """Logs or dumps, told apart by their first lines; a mix of both is refused."""
    logs = [looks_like_log(path) for path in files]
    if any(logs) and not all(logs):
        pairs = zip(files, logs, strict=True)
        kinds = ", ".join(f"{p} ({'log' if is_log else '/metrics dump'})" for p, is_log in pairs)
        raise UsageError(f"a mix of logs and /metrics dumps: {kinds}", "analyze the logs and the dumps apart")
    if all(logs) and files:
        cap = None if pages.max_metrics_bytes == DEFAULT_MAX_METRICS_BYTES else pages.max_metrics_bytes
        return diagnose_logs(files, settings, since=since, until=until, max_bytes=cap)
    if since is not None or until is not None:
        raise UsageError("--since/--until apply to server logs, not /metrics dumps", "leave them out for dumps")
    return diagnose_files(files, settings, max_bytes=pages.max_metrics_bytes, server=pages.server)
