"""`llmdiag whatif`: what a change would buy, predicted on a saved verdict's window."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from llmdiag.cli.output import EXIT_OK, fail, print_json, stdout, write_page
from llmdiag.errors import LlmdiagError

app = typer.Typer(add_completion=False)


@app.command()
def whatif(
    result: Annotated[Path, typer.Argument(help="A verdict saved by scan/analyze --json, or a load -o sweep.")],
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="NAME=VALUE",
            help="NAME=VALUE, repeatable: max_num_seqs, max_num_batched_tokens, gpu_memory_utilization, "
            "kv_cache_dtype, num_gpu_blocks, max_model_len, tensor_parallel_size, enable_prefix_caching, "
            "enforce_eager, replicas.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the prediction as JSON.")] = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the prediction as Markdown.")] = False,
    html: Annotated[Path | None, typer.Option("--html", help="Write a before/after HTML page to this file.")] = None,
) -> None:
    """What a change would buy: the measured window re-predicted with vLLM flags changed (a closed-loop model)."""
    from llmdiag.api.whatif import whatif_file

    try:
        prediction = whatif_file(result, set_ or [])
        if html is not None:
            from llmdiag.render.html import render_whatif_html

            write_page(html, render_whatif_html(prediction), what="HTML")
    except LlmdiagError as error:
        fail(error)
    from llmdiag.render.whatif import render_whatif, render_whatif_json, render_whatif_markdown

    if as_json:
        print_json(render_whatif_json(prediction))
    elif markdown:
        sys.stdout.write(render_whatif_markdown(prediction))
    elif html is None:
        stdout.print(render_whatif(prediction))
    raise typer.Exit(EXIT_OK)
