"""`llmdiag sim serve`: the built-in simulated inference server, served until Ctrl-C."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from llmdiag.cli.output import EXIT_OK, fail, stdout
from llmdiag.errors import LlmdiagError
from llmdiag.sim.load import ClosedLoopLoad
from llmdiag.sim.presets import get_preset
from llmdiag.sim.server import SimServer

app = typer.Typer(
    name="sim", help="The built-in simulated inference server.", no_args_is_help=True, add_completion=False
)

A_WEEK_SECONDS = 7 * 24 * 3600


@app.command("serve")
def sim_serve(
    preset: Annotated[
        str, typer.Option("--preset", help="healthy, memory, compute, scheduling or network.")
    ] = "healthy",
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on (0: any free one).", min=0, max=65535)] = 8000,
    time_scale: Annotated[
        float, typer.Option("--time-scale", help="Simulated seconds per real second.", min=0.001)
    ] = 1.0,
    load: Annotated[bool, typer.Option("--load", help="Also drive the preset's own bounded load.")] = False,
    dialect: Annotated[
        str,
        typer.Option(
            "--dialect",
            help="The server whose metrics pages it serves: vllm, sglang, tgi, llamacpp, "
            "trtllm, triton (the same simulated engine behind each).",
        ),
    ] = "vllm",
) -> None:
    """Serve a simulated vLLM, or another server's dialect (OpenAI API, metrics, /dcgm/metrics) until Ctrl-C."""
    try:
        chosen = get_preset(preset)
        server = SimServer(chosen, host=host, port=port, time_scale=time_scale, dialect=dialect).start()
    except LlmdiagError as error:
        fail(error)
    stdout.print(f"simulated {server.dialect.summary}, preset {chosen.name}: {chosen.summary}")
    stdout.print(f"  {server.url}  (metrics {server.metrics_url}, DCGM {server.dcgm_url}, model {server.model})")
    driver = None
    if load:
        spec = chosen.load
        driver = ClosedLoopLoad(f"http://127.0.0.1:{server.port}", server.model, spec, max_seconds=A_WEEK_SECONDS)
        driver.start()
        stdout.print(f"  driving {spec.users} users × ({spec.prompt_tokens} + ~{spec.output_tokens}) tokens")
    stdout.print("  Ctrl-C stops it")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        if driver is not None:
            driver.stop()
        server.stop()
    raise typer.Exit(EXIT_OK)
