"""`llmdiag capacity`: how many users one deployment serves, how fast each one is, and what runs out first."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from llmdiag.api.capacity import capacity_question, run_capacity
from llmdiag.cli.options import HtmlOpt, flag_groups
from llmdiag.cli.output import fail, print_json, stderr, stdout, write_page
from llmdiag.engine.capacity import CapacityQuestion
from llmdiag.errors import LlmdiagError, UsageError
from llmdiag.physics.hardware import GPUS, MODELS
from llmdiag.render.capacity import render_capacity, render_capacity_json

app = typer.Typer(add_completion=False)
# the lists come from probes/tables/ (gpus.toml, models.toml), so a new entry shows here by itself
GPU_HELP = f"{', '.join(GPUS)} (H100 and A100 are the SXM parts)."
MODEL_HELP = f"{', '.join(MODELS)}."


@dataclass(frozen=True, kw_only=True)
class CapacityDeploymentFlags:
    """The deployment: GPU, model (known, or a config.json), TP, interconnect, and vLLM's memory and batch caps."""

    gpu: Annotated[str | None, typer.Option("--gpu", help=GPU_HELP)] = None
    model: Annotated[str | None, typer.Option("--model", help=MODEL_HELP)] = None
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel size (GPUs per model replica).")] = 1
    model_config: Annotated[
        Path | None, typer.Option("--model-config", help="A Hugging Face config.json instead of --model.")
    ] = None
    interconnect: Annotated[
        str | None, typer.Option("--interconnect", help="nvlink, pcie4 or pcie5 (default: NVLink where there is one).")
    ] = None
    gpu_memory_utilization: Annotated[
        float | None, typer.Option("--gpu-memory-utilization", help="vLLM's share of GPU memory (default 0.92).")
    ] = None
    max_num_seqs: Annotated[
        int | None, typer.Option("--max-num-seqs", help="vLLM's batch cap (default: vLLM's for that GPU).")
    ] = None
    max_num_batched_tokens: Annotated[
        int | None, typer.Option("--max-num-batched-tokens", help="vLLM's tokens per step (default: vLLM's).")
    ] = None

    def question(self, users: int, prompt_tokens: int, output_tokens: int) -> CapacityQuestion:
        return capacity_question(
            self.gpu,
            self.model,
            self.model_config,
            users=users,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            tp=self.tp,
            interconnect=self.interconnect,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
        )


@app.command()
@flag_groups
def capacity(
    users: Annotated[int, typer.Option("--users", help="Users with a request in flight at once.")],
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", help="Prompt length of each request.")],
    output_tokens: Annotated[int, typer.Option("--output-tokens", help="Output length of each request.")],
    *,
    deployment: CapacityDeploymentFlags,
    simulate: Annotated[
        bool, typer.Option("--simulate", help="Also run the built-in simulator for this case and print it.")
    ] = False,
    simulate_seconds: Annotated[
        float, typer.Option("--simulate-seconds", help="Wall time of the --simulate run.", min=2.0)
    ] = 15.0,
    compare: Annotated[
        str | None,
        typer.Option(
            "--compare",
            help="Run the classic comparisons on this workload, physics beside the simulator: batching, kv, "
            "precision, priority, disagg, users (comma-separated), or all.",
        ),
    ] = None,
    html: HtmlOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the capacity report as JSON.")] = False,
) -> None:
    """How many users one deployment serves, how fast each one is, and what runs out first (a roofline)."""
    try:
        question = deployment.question(users, prompt_tokens, output_tokens)
        if compare is not None:
            if simulate:
                raise UsageError("--simulate and --compare together", "drop --simulate: --compare runs the simulator")
            _compare(question, compare, html, as_json)
            return
        if html is not None:
            raise UsageError("--html goes with --compare here", "add --compare all, or drop --html")
        say = None if as_json else lambda seconds: stderr.print(f"simulating for {seconds:g} s …")
        report = run_capacity(question, simulate_seconds if simulate else None, on_simulate=say)
    except LlmdiagError as error:
        fail(error)
    if as_json:
        print_json(render_capacity_json(report))
    else:
        stdout.print(render_capacity(report))


def _compare(question: CapacityQuestion, names: str, html: Path | None, as_json: bool) -> None:
    """``--compare``: the comparisons' tables (or JSON), and the HTML page with their charts."""
    from llmdiag.api.compare import parse_compare, run_compare
    from llmdiag.render.compare import render_compare, render_compare_html, render_compare_json

    wanted = parse_compare(names)
    say = None if as_json else lambda name: stderr.print(f"[dim]comparing: {name} …[/]")
    report = run_compare(question, wanted, on_comparison=say)
    if html is not None:
        write_page(html, render_compare_html(report), quiet=as_json)
    if as_json:
        print_json(render_compare_json(report))
    else:
        stdout.print(render_compare(report))
