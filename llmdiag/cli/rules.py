"""`llmdiag rules list | show | docs`: the rule catalogue, what llmdiag checks and why."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from llmdiag.cli.output import fail, stdout
from llmdiag.errors import LlmdiagError, UsageError
from llmdiag.render.docs import render_rule_markdown, write_rule_docs
from llmdiag.schema.loader import find_rule, load_rules

app = typer.Typer(
    name="rules", help="The rule catalogue: what llmdiag checks and why.", no_args_is_help=True, add_completion=False
)


@app.command("list")
def rules_list() -> None:
    """Every rule: code, class, status and what it catches."""
    try:
        rules = load_rules()
    except LlmdiagError as error:
        fail(error)
    table = Table(box=None, header_style="bold")
    for column in ("code", "class", "status", "slug", "title"):
        table.add_column(column)
    for rule in rules:
        table.add_row(rule.code, rule.category.value, rule.status, rule.slug, rule.title)
    stdout.print(table)


@app.command("show")
def rules_show(code: Annotated[str, typer.Argument(help="A rule code, e.g. MEM001")]) -> None:
    """One rule in full: what, why, thresholds, and the fixes per engine."""
    try:
        rule = find_rule(code)
        if rule is None:
            raise UsageError(f"no rule '{code}'", "`llmdiag rules list` shows every code")
    except LlmdiagError as error:
        fail(error)
    sys.stdout.write(render_rule_markdown(rule))


@app.command("docs")
def rules_docs(
    out: Annotated[Path, typer.Option("--out", help="Folder for one Markdown page per rule.")] = Path("docs/rules"),
) -> None:
    """Write the rule reference pages (docs/rules/*.md) from the rule files."""
    try:
        written = write_rule_docs(load_rules(), out)
    except LlmdiagError as error:
        fail(error)
    except OSError as exc:
        fail(LlmdiagError(f"cannot write {out}: {exc.strerror}", "check the folder and its permissions"))
    stdout.print(f"wrote {len(written)} pages to {out}")
