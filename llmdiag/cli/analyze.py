"""`llmdiag analyze`: judge the saved files of an incident (bug reports, past incidents): server logs, /metrics dumps,
DCGM pages, together, pasted text around them and all."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from llmdiag.api.scan import diagnose_files
from llmdiag.cli.options import OutputFlags, PagesFlags, flag_groups, refuse
from llmdiag.cli.output import EXIT_ERROR, emit, exit_code, fail, note, print_error, print_json, write_html
from llmdiag.client.endpoint import DEFAULT_MAX_METRICS_BYTES
from llmdiag.collect.bundle import is_bundle
from llmdiag.config import Settings
from llmdiag.errors import LlmdiagError, UsageError
from llmdiag.model import Verdict
from llmdiag.render.json import render_json

app = typer.Typer(add_completion=False)


@app.command()
@flag_groups
def analyze(
    files: Annotated[
        list[Path],
        typer.Argument(
            help="The incident's files, any mix: server logs (vLLM, SGLang, TensorRT-LLM), saved /metrics dumps "
            "(one: lifetime averages or a snapshot; 2+: a window), DCGM exporter pages; told apart by what they hold, "
            "with pasted prose, fences and quotes around the data. Or one bundle that --record wrote: replayed."
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
    """Diagnose from the saved files of an incident: logs, /metrics dumps and DCGM pages, read together; or replay a
    bundle that --record wrote."""
    try:
        output.check()
        if any(is_bundle(path) for path in files):
            replay(files, output, pages, since, until)
        verdict = judge_files(files, pages, since, until, output.settings())
        if output.html is not None:
            write_html(output.html, verdict, quiet=output.as_json or output.markdown)
    except LlmdiagError as error:
        fail(error)
    emit(verdict, output.as_json, output.verbose, output.markdown)
    raise typer.Exit(exit_code(verdict, output.fail_on))


def replay(files: list[Path], output: OutputFlags, pages: PagesFlags, since: str | None, until: str | None) -> NoReturn:
    """A bundle (--record): each run replayed through the live collect path and judged as it was, with the recorded
    settings unless --config or --slo-tpot says otherwise. Several runs (check's targets, load's levels): each in
    turn (a run that failed live shows its error again); --json prints them as a list of {"run", "verdict"} or
    {"run", "error", "hint"}. Exit by the worst finding; 2 when no run gives a verdict."""
    from llmdiag.api.scan import replay_bundle

    refuse(
        {"--server": pages.server, "--since": since, "--until": until},
        "apply to saved files; a bundle replays the run as it was recorded",
        "leave them out to replay the bundle",
    )
    if len(files) > 1:
        raise UsageError("a bundle is replayed on its own", "give the bundle alone: llmdiag analyze bundle.tar.gz")
    settings = output.settings() if output.config is not None or output.slo_tpot is not None else None
    _, runs = replay_bundle(files[0], settings)
    verdicts = [run.verdict for run in runs if run.verdict is not None]
    if output.html is not None and verdicts:
        write_html(output.html, verdicts[-1], quiet=output.as_json or output.markdown)
    if len(runs) == 1 and verdicts:
        emit(verdicts[0], output.as_json, output.verbose, output.markdown)
    elif output.as_json:
        parts = [
            f'{{"run": {json.dumps(run.name)}, "verdict": {render_json(run.verdict)}}}'
            if run.verdict is not None
            else json.dumps(
                {
                    "run": run.name,
                    "error": run.error.message if run.error else "",
                    "hint": run.error.hint if run.error else "",
                }
            )
            for run in runs
        ]
        print_json("[\n" + ",\n".join(parts) + "\n]")
    else:
        for run in runs:
            note(f"run {run.name}:")
            if run.verdict is not None:
                emit(run.verdict, False, output.verbose, output.markdown)
            elif run.error is not None:
                print_error(run.error.message, run.error.hint)
    if not verdicts:
        raise typer.Exit(EXIT_ERROR)
    raise typer.Exit(max(exit_code(v, output.fail_on) for v in verdicts))


def judge_files(
    files: list[Path], pages: PagesFlags, since: str | None, until: str | None, settings: Settings
) -> Verdict:
    """Every file read by what it holds and judged together (llmdiag.collect.evidence)."""
    cap = None if pages.max_metrics_bytes == DEFAULT_MAX_METRICS_BYTES else pages.max_metrics_bytes
    return diagnose_files(files, settings, max_bytes=cap, server=pages.server, since=since, until=until)
