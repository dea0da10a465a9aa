"""`llmdiag check`: a health check for cron and monitoring, Nagios style.

One status line with perfdata on stdout and exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (bad arguments and
unreachable targets included); optionally a node_exporter textfile, a Pushgateway push, and a row per target in the
SQLite history that the next checks' baselines read.
"""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from llmdiag.api.check import run_check, run_prometheus_check
from llmdiag.api.targets import check_targets
from llmdiag.cli.options import (
    CheckPrometheusFlags,
    ConfigOpt,
    ConnectionFlags,
    RecordOpt,
    SloTpotOpt,
    TelemetryFlags,
    check_writable,
    flag_groups,
    flags_json,
    refuse,
    with_slo,
)
from llmdiag.cli.output import EXIT_NAGIOS_UNKNOWN, print_error, print_json, recording
from llmdiag.client.endpoint import Connection, redact_url
from llmdiag.collect.prometheus.api import PrometheusSource
from llmdiag.config import Settings, Target, load_settings
from llmdiag.errors import LlmdiagError, UsageError
from llmdiag.history import History, default_history_path
from llmdiag.model.check import CheckReport, State
from llmdiag.render.nagios import clean, render_nagios
from llmdiag.render.textfile import push, write_textfile

app = typer.Typer(add_completion=False)


@dataclass(frozen=True, kw_only=True)
class CheckOutputFlags:
    """Where a check's result goes besides the status line: a textfile, a Pushgateway, the history; or JSON."""

    textfile: Annotated[
        Path | None,
        typer.Option("--textfile", help="Write DIR/llmdiag.prom atomically for node_exporter's textfile collector."),
    ] = None
    pushgateway: Annotated[
        str | None, typer.Option("--pushgateway", help="Also push the metrics to this Prometheus Pushgateway.")
    ] = None
    history: Annotated[
        Path | None,
        typer.Option(
            "--history",
            help="The SQLite history (default: \\[check] history, or $XDG_STATE_HOME/llmdiag/history.sqlite).",
        ),
    ] = None
    no_history: Annotated[bool, typer.Option("--no-history", help="Neither read a baseline nor record this check.")] = (
        False
    )
    as_json: Annotated[bool, typer.Option("--json", help="Print the check report as JSON instead.")] = False
    config: ConfigOpt = None
    slo_tpot: SloTpotOpt = None
    record: RecordOpt = None

    def textfile_folder(self, settings: Settings) -> Path | None:
        textfile = self.textfile or settings.check.textfile
        if textfile is not None and not textfile.is_dir():
            raise UsageError(
                f"--textfile {textfile}: not a folder",
                "give node_exporter's --collector.textfile.directory, e.g. /var/lib/node_exporter/textfile_collector",
            )
        return textfile

    def history_store(self, settings: Settings) -> History | None:
        if self.no_history:
            return None
        return History.open(self.history or settings.check.history or default_history_path())


@app.command()
@flag_groups
def check(
    urls: Annotated[
        list[str] | None, typer.Argument(help="Servers' base URLs. None: every \\[\\[targets]] entry of llmdiag.toml.")
    ] = None,
    target: Annotated[
        list[str] | None, typer.Option("--target", "-t", help="Only this target of the config (repeatable).")
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option(
            "--duration", "-d", help="Seconds to watch each target (default: \\[check] window_seconds, 10).", min=1.0
        ),
    ] = None,
    deadline: Annotated[
        float | None,
        typer.Option(
            "--deadline",
            help="Seconds the whole check may take; a target not done by then is UNKNOWN (default: \\[check] "
            "deadline_seconds, or each wave of targets at window + timeout + 7 s, plus 5 s).",
            min=1.0,
        ),
    ] = None,
    *,
    connection: ConnectionFlags,
    telemetry: TelemetryFlags,
    output: CheckOutputFlags,
    prometheus: CheckPrometheusFlags,
) -> None:
    """Health check for cron and monitoring, Nagios style: one status line with perfdata, exit 0/1/2/3."""
    try:
        settings = with_slo(load_settings(output.config), output.slo_tpot)
        source, targets, connections = watched(settings, urls, target, connection, telemetry, prometheus)
        textfile = output.textfile_folder(settings)
        store = output.history_store(settings)
        if source is not None:
            refuse({"--record": output.record}, "records live scans; --prometheus reads no server", "leave it out")
            report = run_prometheus_check(
                source, prometheus.selector, settings, duration, store, deadline_seconds=deadline
            )
        else:
            window = duration or settings.check.window_seconds
            check_writable(output.record, "--record")
            options = flags_json(urls=urls or [], target=target, duration=window, connection=connection)
            with recording(output.record, "check", options):
                report = run_check(targets, settings, window, store, connections=connections, deadline_seconds=deadline)
    except LlmdiagError as error:
        check_unknown(error.message, error.hint)
    publish(report, textfile, output.pushgateway or settings.check.pushgateway)
    if report.output_errors:
        report.state = max((report.state, State.UNKNOWN), key=lambda s: s.rank)
    if output.as_json:
        print_json(report.model_dump_json(indent=2))
    else:
        sys.stdout.write(render_nagios(report, settings))
    raise typer.Exit(int(report.state))


def watched(
    settings: Settings,
    urls: list[str] | None,
    target: list[str] | None,
    connection: ConnectionFlags,
    telemetry: TelemetryFlags,
    prometheus: CheckPrometheusFlags,
) -> tuple[PrometheusSource | None, list[Target], dict[str, Connection]]:
    """What the check watches: Prometheus's servers (--prometheus), or the URLs, or the config's targets."""
    if prometheus.url is None:
        targets, connections = check_targets(
            settings,
            urls,
            target,
            connect=connection.connection,
            metrics_url=connection.metrics_url,
            dcgm_url=telemetry.dcgm_url,
            nvml=telemetry.nvml,
            probe=telemetry.probe,
        )
        return None, targets, connections
    refuse(
        {"URL": urls, "--target": target, "--metrics-url": connection.metrics_url, "--dcgm-url": telemetry.dcgm_url},
        "cannot go with --prometheus, which reads every server from Prometheus",
        "narrow the servers with --selector '{job=\"vllm\"}'",
    )
    return prometheus.auth.source(prometheus.url, connection), [], {}


def publish(report: CheckReport, textfile: Path | None, pushgateway: str | None) -> None:
    """The textfile and the Pushgateway: a failure is the report's output error (UNKNOWN), not the check's end."""
    if textfile is not None:
        try:
            write_textfile(report, textfile)
        except OSError as exc:
            report.output_errors.append(f"textfile not written to {textfile}: {exc.strerror or exc}")
    if pushgateway:
        try:
            push(report, pushgateway, instance=socket.gethostname())
        except OSError as exc:
            report.output_errors.append(f"push to {redact_url(pushgateway)} failed: {exc}")


def check_unknown(message: str, hint: str) -> NoReturn:
    """A check that could not run: the status line on stdout (what Nagios reads), ERROR and HINT on stderr."""
    sys.stdout.write(f"LLMDIAG UNKNOWN - {clean(message)}\n")
    print_error(message, hint)
    raise typer.Exit(EXIT_NAGIOS_UNKNOWN)
