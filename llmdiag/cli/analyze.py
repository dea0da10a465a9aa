"""`llmdiag analyze`: judge the saved files of an incident (bug reports, past incidents): server logs, /metrics dumps,
DCGM pages, together, pasted text around them and all."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from llmdiag.api.scan import diagnose_files
from llmdiag.cli.options import OutputFlags, PagesFlags, flag_groups
from llmdiag.cli.output import emit, exit_code, fail, write_html
from llmdiag.client.endpoint import DEFAULT_MAX_METRICS_BYTES
from llmdiag.config import Settings
from llmdiag.errors import LlmdiagError
from llmdiag.model import Verdict

app = typer.Typer(add_completion=False)


@app.command()
@flag_groups
def analyze(
    files: Annotated[
        list[Path],
        typer.Argument(
            help="The incident's files, any mix: server logs (vLLM, SGLang, TensorRT-LLM), saved /metrics dumps "
            "(one: lifetime averages or a snapshot; 2+: a window), DCGM exporter pages; told apart by what they hold, "
            "with pasted prose, fences and quotes around the data."
        ),
    ],
    *,
    pages: PagesFlags,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            help="Logs only (dumps are taken whole): judge lines from this time on (2026-11-30T06:40:00, 06:40, "
            "or 30m before the last line).",
        ),
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="Logs: judge lines up to this time (same forms as --since).")
    ] = None,
    output: OutputFlags,
) -> None:
    """Diagnose from the saved files of an incident: logs, /metrics dumps and DCGM pages, read together."""
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
    """Every file read by what it holds and judged together (llmdiag.collect.evidence)."""
    cap = None if pages.max_metrics_bytes == DEFAULT_MAX_METRICS_BYTES else pages.max_metrics_bytes
    return diagnose_files(files, settings, max_bytes=cap, server=pages.server, since=since, until=until)
