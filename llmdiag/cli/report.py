"""`llmdiag report`: a saved result (a verdict, a fleet or a load report, as JSON) as an HTML report or Markdown."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from llmdiag.cli.output import EXIT_OK, fail, write_html
from llmdiag.errors import LlmdiagError, UsageError
from llmdiag.model import FleetReport
from llmdiag.model.io import load_result
from llmdiag.render.markdown import render_markdown

app = typer.Typer(add_completion=False)


@app.command()
def report(
    result: Annotated[Path, typer.Argument(help="A saved result: scan/analyze --json, demo -o, or load -o/--json.")],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the self-contained HTML report to this file.")
    ] = None,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the Markdown summary to stdout.")] = False,
) -> None:
    """Turn a saved result (a verdict or a load report, as JSON) into an HTML report or Markdown."""
    try:
        if output is None and not markdown:
            raise UsageError("nothing to write", f"llmdiag report {result} -o report.html (or --markdown)")
        loaded = load_result(result)
        summary = None
        if markdown:
            if isinstance(loaded, FleetReport):
                raise UsageError("no Markdown summary for a fleet report yet", f"llmdiag report {result} -o fleet.html")
            summary = render_markdown(loaded)
        if output is not None:
            write_html(output, loaded, flag="--output")
    except LlmdiagError as error:
        fail(error)
    if summary is not None:
        sys.stdout.write(summary)
    raise typer.Exit(EXIT_OK)
