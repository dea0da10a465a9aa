"""`llmdiag demo`: the built-in simulated vLLM in a known state, loaded, scanned and judged like any server
(also what `llmdiag scan` without a URL runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer

from llmdiag.api.scan import run_demo
from llmdiag.cli.options import DemoOutputFlags, OutputFlags, check_writable, flag_groups, flags_json
from llmdiag.cli.output import (
    emit,
    exit_code,
    fail,
    fail_if,
    note,
    recording,
    scan_progress,
    write_html,
    write_output,
    written,
)
from llmdiag.errors import LlmdiagError
from llmdiag.render.json import render_json

DEFAULT_DEMO_PRESET = "scheduling"

app = typer.Typer(add_completion=False)


@app.command()
@flag_groups
def demo(
    preset: Annotated[
        str, typer.Option("--preset", help="healthy, memory, compute, scheduling or network.")
    ] = DEFAULT_DEMO_PRESET,
    duration: Annotated[float, typer.Option("--duration", "-d", help="Seconds to watch the server.")] = 15.0,
    output_path: Annotated[
        Path | None, typer.Option("--output", "-o", help="Also write the verdict as JSON to this file.")
    ] = Path("llmdiag-demo.json"),
    *,
    output: DemoOutputFlags,
) -> None:
    """Start the built-in simulated vLLM in a known state, load it, scan it and print the verdict."""
    show_demo(preset, duration, output_path, output)


def show_demo(
    preset: str, duration: float, output_path: Path | None, output: OutputFlags, auto_duration: bool = False
) -> NoReturn:
    """Run the demo and show its verdict; exit by its worst finding against --fail-on. With ``auto_duration``
    (scan --duration auto), ``duration`` is the longest window."""
    try:
        output.check()
        check_writable(output_path, "--output")
        settings = output.settings()
        record = getattr(output, "record", None)
        check_writable(record, "--record")
        options = flags_json(preset=preset, duration=duration, auto_duration=auto_duration)
        with (
            recording(record, "demo", options),
            scan_progress(f"the simulated server ({preset})", quiet=output.as_json) as tick,
        ):
            verdict = run_demo(
                preset,
                duration,
                settings,
                on_progress=tick,
                on_phase=None if output.as_json else note,
                auto_duration=auto_duration,
            )
    except LlmdiagError as error:
        fail(error)
    html = output.html
    unwritten = (
        None if output_path is None else written(lambda: write_output(output_path, render_json(verdict))),
        None if html is None else written(lambda: write_html(html, verdict, output.as_json)),
    )
    emit(verdict, output.as_json, output.verbose, output.markdown)
    fail_if(*unwritten)
    if output_path is not None and not output.as_json:
        note(f"verdict written to {output_path}")
    raise typer.Exit(exit_code(verdict, output.fail_on))
