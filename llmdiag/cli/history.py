"""`llmdiag history`: the trend of past `llmdiag check` runs, per target."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from llmdiag.cli.options import ConfigOpt
from llmdiag.cli.output import EXIT_OK, fail, stdout
from llmdiag.config import load_settings
from llmdiag.errors import LlmdiagError, UsageError
from llmdiag.history import History, default_history_path
from llmdiag.render.history import render_history

app = typer.Typer(add_completion=False)


def parse_since(text: str) -> float:
    """'7d', '12h', '30m', '90s', '2w' → seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if not match:
        raise UsageError(f"--since {text!r} is not a duration", "e.g. 30m, 12h, 7d, 2w")
    return float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[match.group(2)]


@app.command("history")
def history_command(
    target: Annotated[str | None, typer.Option("--target", "-t", help="Only this target.")] = None,
    since: Annotated[str, typer.Option("--since", help="How far back: 30m, 12h, 7d, 2w.")] = "7d",
    limit: Annotated[int, typer.Option("--limit", help="At most this many rows per target (newest).", min=1)] = 20,
    history: Annotated[Path | None, typer.Option("--history", help="The SQLite history (as for check).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
    config: ConfigOpt = None,
) -> None:
    """The trend of past `llmdiag check` runs: per target, its states, class, TTFT/TPOT p95 and throughput."""
    try:
        settings = load_settings(config)
        path = history or settings.check.history or default_history_path()
        if not path.is_file():
            raise UsageError(f"no history at {path}", "run `llmdiag check` first, or give --history PATH")
        window = parse_since(since)
        rows = History.open(path).rows(target, time.time() - window)
    except LlmdiagError as error:
        fail(error)
    if as_json:
        sys.stdout.write(json.dumps([dataclasses.asdict(r) for r in rows], indent=2) + "\n")
    else:
        stdout.print(render_history(rows, since, limit, str(path)))
    raise typer.Exit(EXIT_OK)
