"""`llmdiag rules list | show | docs | export`: the rule catalogue, what llmdiag checks and why, and the catalogue as
Prometheus alerting rules."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from llmdiag.api.alerting import DEFAULT_FOR, DEFAULT_RUNBOOK_URL, DEFAULT_WINDOW, FORMATS, SERVERS, export_rules
from llmdiag.cli.options import ConfigOpt, SloTpotOpt
from llmdiag.cli.output import cannot_write, fail, stderr, stdout
from llmdiag.config import load_settings
from llmdiag.errors import LlmdiagError, UsageError
from llmdiag.render.docs import render_rule_markdown, write_rule_docs
from llmdiag.render.files import write_atomic
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


@app.command("export")
def rules_export(
    format: Annotated[
        str, typer.Option("--format", help=f"{' | '.join(FORMATS)} (a prometheus-operator PrometheusRule resource)")
    ] = "prometheus",
    server: Annotated[
        str | None,
        typer.Option("--server", help=f"One server dialect ({', '.join(SERVERS)}); default: each, two groups apiece"),
    ] = None,
    selector: Annotated[
        str | None,
        typer.Option("--selector", help="Label matchers every raw series must carry, e.g. '{job=\"vllm\"}'"),
    ] = None,
    window: Annotated[
        str, typer.Option("--window", help="Window of rates, *_over_time and histogram quantiles (e.g. 5m)")
    ] = DEFAULT_WINDOW,
    for_duration: Annotated[
        str, typer.Option("--for", help="How long a condition must hold before the alert fires (e.g. 2m)")
    ] = DEFAULT_FOR,
    runbook_url: Annotated[
        str, typer.Option("--runbook-url", help="Each alert's runbook link; {code} and {slug} are filled in")
    ] = DEFAULT_RUNBOOK_URL,
    slo_tpot: SloTpotOpt = None,
    config: ConfigOpt = None,
    out: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the YAML here (atomically), not to stdout")
    ] = None,
) -> None:
    """The rules as Prometheus recording and alerting rules (load with `rule_files:`): alerts say when, a scan why."""
    try:
        text = export_rules(
            format=format,
            server=server,
            selector=selector,
            window=window,
            for_duration=for_duration,
            runbook_url=runbook_url,
            settings=load_settings(config),
            slo_tpot_seconds=slo_tpot,
        )
    except LlmdiagError as error:
        fail(error)
    if out is None:
        sys.stdout.write(text)
        return
    try:
        write_atomic(out, text)
    except OSError as exc:
        fail(cannot_write(out, exc, "--output"))
    stderr.print(f"[dim]rules written to {escape(str(out))}[/]")
