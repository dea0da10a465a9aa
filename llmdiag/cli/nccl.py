"""`llmdiag nccl-bench`: collective bandwidth under torchrun (``llmdiag.api.nccl``), against the link's expected bus
bandwidth."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from llmdiag.api.nccl import run_nccl_bench
from llmdiag.cli.options import FailOn, FailOnOpt
from llmdiag.cli.output import exit_for, fail
from llmdiag.errors import LlmdiagError
from llmdiag.render.files import write_atomic
from llmdiag.render.nccl import render_nccl_bench

app = typer.Typer(add_completion=False)


@app.command("nccl-bench")
def nccl_bench(
    nproc_per_node: Annotated[
        int | None, typer.Option("--nproc-per-node", help="Ranks on this host (default: one per GPU, else 2 on CPU).")
    ] = None,
    sizes: Annotated[str, typer.Option("--sizes", help="LOW:HIGH in powers of two (1K:1G), or a comma list.")] = (
        "1K:1G"
    ),
    ops: Annotated[
        str, typer.Option("--ops", help="Comma list of all_reduce, all_gather, reduce_scatter, all_to_all.")
    ] = "all_reduce,all_gather,reduce_scatter,all_to_all",
    iters: Annotated[int, typer.Option("--iters", help="Timed collectives per trial.")] = 20,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed collectives before each size.")] = 5,
    trials: Annotated[int, typer.Option("--trials", help="Timed batches per size; the median is kept.")] = 3,
    max_size: Annotated[
        str | None, typer.Option("--max-size", help="Cap on the message size (default: memory; 64M with gloo).")
    ] = None,
    link: Annotated[
        str | None, typer.Option("--link", help="Link class to compare with (nvlink4, pcie5x16, ib-ndr …).")
    ] = None,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the report as JSON here ('-': stdout).")] = None,
    fail_on: FailOnOpt = FailOn.critical,
    timeout: Annotated[float, typer.Option("--timeout", help="Give up after this many seconds.")] = 3600.0,
) -> None:
    """Collective bandwidth (nccl-tests' algbw/busbw) under torchrun, against the link's expected busbw."""
    try:
        report = run_nccl_bench(
            nproc_per_node,
            sizes=sizes,
            ops=ops,
            iters=iters,
            warmup=warmup,
            trials=trials,
            max_size=max_size,
            link=link,
            timeout_seconds=timeout,
        )
        if json_out and json_out != "-":
            write_atomic(Path(json_out), report.model_dump_json(indent=2) + "\n")
    except LlmdiagError as error:
        fail(error)
    except OSError as exc:
        fail(LlmdiagError(f"cannot write {json_out}: {exc.strerror}", "pick another --json path"))
    sys.stdout.write((report.model_dump_json(indent=2) if json_out == "-" else render_nccl_bench(report)) + "\n")
    worst = max((finding.severity for finding in report.findings), key=lambda severity: severity.rank, default=None)
    raise typer.Exit(exit_for(worst, fail_on))
