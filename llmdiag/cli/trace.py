"""`llmdiag trace`: PyTorch profiler (Kineto) traces analysed and judged.

`trace --json` is the fast path (bench/bench_trace.py): this module loads neither rich nor the HTTP stack for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from llmdiag.api.trace import analyze_traces
from llmdiag.cli.options import ConfigOpt, FailOn, FailOnOpt, JsonOpt
from llmdiag.cli.output import EXIT_OK, exit_code, fail, note, print_json, stdout, write_output
from llmdiag.collect.trace.analysis import problems_as_error
from llmdiag.config import load_settings
from llmdiag.errors import LlmdiagError, UsageError

app = typer.Typer(add_completion=False)


@app.command()
def trace(
    paths: Annotated[
        list[Path], typer.Argument(help="Trace files (.json, .json.gz), one per rank, or folders holding them.")
    ],
    link: Annotated[
        str | None,
        typer.Option(
            "--link",
            help="The link the collectives ran over (nvlink2..nvlink5, pcie4x16, ib-ndr …); "
            "default: from the trace's GPU model where it implies one (SXM boards).",
        ),
    ] = None,
    hta_compat: Annotated[
        bool,
        typer.Option(
            "--hta-compat",
            help="Count as HolisticTraceAnalysis does: µs-rounded timestamps, the last "
            "ProfilerStep dropped, only nccl…Kernel names as communication.",
        ),
    ] = False,
    as_json: JsonOpt = False,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Also write the JSON report here.")] = None,
    fail_on: FailOnOpt = FailOn.critical,
    config: ConfigOpt = None,
) -> None:
    """Analyse PyTorch profiler (Kineto) traces: GPU busy, communication share, exposed communication, collectives
    with their bandwidth, and the straggler rank. Exit 2 when a trace could not be used (after the rest is shown)."""
    try:
        settings = load_settings(config)
        report = analyze_traces(paths, link=link, hta_compat=hta_compat, settings=settings)
        if output is not None:
            write_output(output, report.model_dump_json(indent=2))
    except LlmdiagError as error:
        fail(error)
    if as_json:
        print_json(report.model_dump_json(indent=2))
    elif report.ranks:
        from llmdiag.render.trace import render_trace  # loads rich, which `trace --json` does without

        stdout.print(render_trace(report))
        if output is not None:
            note(f"report written to {output}")
    problem = problems_as_error(report)
    if problem is not None:
        fail(problem)
    if not report.ranks:
        fail(UsageError("no trace could be analysed", "give torch.profiler JSON files, one per rank"))
    raise typer.Exit(exit_code(report.verdict, fail_on) if report.verdict else EXIT_OK)
