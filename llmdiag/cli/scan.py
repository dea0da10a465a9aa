"""`llmdiag scan`: watch a live server for a window and say what limits it.

Four modes, one function each: one server (a URL), the demo (no URL), a fleet (several URLs, or --targets), and
Prometheus (--prometheus: its servers as a fleet, or a fleet timeline with --step). Each mode refuses the options
that belong to another.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from llmdiag.api.fleet import diagnose_fleet, diagnose_prometheus_fleet, diagnose_prometheus_fleet_timeline
from llmdiag.api.scan import diagnose
from llmdiag.api.targets import fleet_targets
from llmdiag.cli.demo import DEFAULT_DEMO_PRESET, show_demo
from llmdiag.cli.options import (
    ConnectionFlags,
    FailOn,
    FleetFlags,
    PagesFlags,
    PrometheusWindowFlags,
    ScanOutputFlags,
    ScanPrometheusFlags,
    ScanTelemetryFlags,
    check_writable,
    flag_groups,
    flags_json,
    refuse,
)
from llmdiag.cli.output import (
    emit,
    exit_code,
    exit_for,
    fail,
    fail_if,
    note,
    print_json,
    recording,
    scan_progress,
    stderr,
    stdout,
    warn,
    write_html,
    written,
)
from llmdiag.collect import DEFAULT_DURATION_SECONDS
from llmdiag.collect.prometheus.api import PrometheusSource
from llmdiag.collect.prometheus.plan import parse_duration, parse_time
from llmdiag.collect.trace.analysis import analyze as analyze_trace_files
from llmdiag.config import Settings
from llmdiag.engine.settle import AUTO_MIN_SECONDS
from llmdiag.errors import LlmdiagError, UsageError
from llmdiag.model import FleetReport, TraceReport
from llmdiag.physics.hardware import GPUS, find_gpu, find_model, load_model_config
from llmdiag.physics.step import Deployment
from llmdiag.render.fleet import render_fleet

app = typer.Typer(add_completion=False)


@dataclass(frozen=True, kw_only=True)
class DeploymentFlags:
    """The server's GPU and model, for the roofline context (scan)."""

    gpu: Annotated[
        str | None,
        typer.Option("--gpu", help=f"The server's GPU ({', '.join(GPUS)}): adds the roofline context."),
    ] = None
    model_shape: Annotated[
        str | None,
        typer.Option("--model-shape", help="The served model's shape (e.g. llama-3-8b), with --gpu."),
    ] = None
    model_config: Annotated[
        Path | None,
        typer.Option(
            "--model-config",
            help="The served model's Hugging Face config.json, instead of --model-shape (a model not in the table).",
        ),
    ] = None
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel size, with --gpu.", min=1)] = 1

    def deployment(self) -> Deployment | None:
        """--gpu and the model's shape (--model-shape or --model-config) together name a deployment; one alone is a
        mistake."""
        if self.model_shape is not None and self.model_config is not None:
            raise UsageError("--model-shape and --model-config name the model twice", "give one of them")
        model = self.model_shape or self.model_config
        if self.gpu is None and model is None:
            return None
        if self.gpu is None or model is None:
            raise UsageError(
                "--gpu and --model-shape (or --model-config) go together",
                "e.g. --gpu H100 --model-shape llama-3-8b --tp 1",
            )
        spec = load_model_config(self.model_config) if self.model_config is not None else find_model(str(model))
        return Deployment(find_gpu(self.gpu), spec, tp=self.tp)


@app.command()
@flag_groups
def scan(
    urls: Annotated[
        list[str] | None,
        typer.Argument(
            help="The server's base URL, e.g. http://127.0.0.1:8000; several URLs (or --targets) scan "
            "them at once and compare them as a fleet.",
            metavar="URL",
        ),
    ] = None,
    duration: Annotated[
        str,
        typer.Option(
            "--duration",
            "-d",
            help="Seconds to watch the server (at least 3 scrapes), or auto: stop once the verdict holds still "
            f"(at least {AUTO_MIN_SECONDS:g} s, at most {DEFAULT_DURATION_SECONDS:g} s; one server).",
        ),
    ] = f"{DEFAULT_DURATION_SECONDS:g}",
    *,
    connection: ConnectionFlags,
    telemetry: ScanTelemetryFlags,
    pages: PagesFlags,
    deployment: DeploymentFlags,
    output: ScanOutputFlags,
    trace: Annotated[
        Path | None,
        typer.Option(
            "--trace",
            help="A folder (or file) of PyTorch profiler traces of this server: their "
            "communication signals join the scan's and the network rules judge them.",
        ),
    ] = None,
    fleet: FleetFlags,
    prometheus: ScanPrometheusFlags,
) -> None:
    """Watch a live server for a window and say what limits it; several servers are compared as a fleet."""
    try:
        length = scan_length(duration)
        if length.auto and (urls and len(urls) > 1 or fleet.targets_file is not None):
            raise UsageError("--duration auto scans one server", "give the fleet a length in seconds, e.g. -d 20")
    except LlmdiagError as error:
        fail(error)
    if prometheus.url is not None:
        only_prometheus = {
            "URL": " ".join(urls or []) or None,
            "--targets": fleet.targets_file,
            "--markdown": output.markdown or None,
            "--metrics-url": connection.metrics_url,
            "--dcgm-url": telemetry.dcgm_url,
            "--trace": trace,
            "--verbose": output.verbose or None,
            "--record": output.record,
        }
        scan_prometheus(prometheus, connection, output, only_prometheus)
    if urls and len(urls) > 1 or fleet.targets_file is not None:
        one_server_only = {
            "--metrics-url": connection.metrics_url,
            "--dcgm-url": telemetry.dcgm_url,
            "--pid": telemetry.pid,
            "--gpu": deployment.gpu,
            "--model-shape": deployment.model_shape,
            "--model-config": deployment.model_config,
            "--trace": trace,
            "--nvml-replay": telemetry.nvml_replay,
            "--markdown": output.markdown or None,
            "--verbose": output.verbose or None,
            "--record": output.record,
        }
        scan_fleet(urls or [], length.seconds, fleet, connection, telemetry.probe, pages, output, one_server_only)
    if not urls:
        note("no server given: scanning the built-in demo server (`llmdiag demo --help`)")
        demo_output = dataclasses.replace(output, fail_on=output.fail_on or FailOn.never)
        show_demo(DEFAULT_DEMO_PRESET, length.seconds, None, demo_output, auto_duration=length.auto)
    scan_server(urls[0], length, connection, telemetry, pages, deployment, output, trace)


@dataclass(frozen=True)
class ScanLength:
    """--duration: the window's seconds; with ``auto``, the longest it runs."""

    seconds: float
    auto: bool = False


def scan_length(text: str) -> ScanLength:
    """--duration's value: seconds, or auto (the default window as the longest)."""
    if text.strip().lower() == "auto":
        return ScanLength(DEFAULT_DURATION_SECONDS, auto=True)
    try:
        seconds = float(text)
    except ValueError:
        raise UsageError(
            f"--duration {text!r} is neither seconds nor auto", "e.g. --duration 20, or --duration auto"
        ) from None
    if not seconds > 0 or math.isinf(seconds):
        raise UsageError(f"--duration must be positive, got {text}", "e.g. --duration 20")
    return ScanLength(seconds)


def scan_server(
    url: str,
    duration: ScanLength,
    connection: ConnectionFlags,
    telemetry: ScanTelemetryFlags,
    pages: PagesFlags,
    deployment: DeploymentFlags,
    output: ScanOutputFlags,
    trace: Path | None,
) -> NoReturn:
    """One server over one window: its verdict, exit 1 on a finding at or above --fail-on (default critical)."""
    try:
        output.check()
        server = connection.connection(url, pages.max_metrics_bytes)
        settings = output.settings()
        trace_report = read_scan_trace(trace) if trace is not None else None
        telemetry_options, deployment_ = telemetry.telemetry(), deployment.deployment()
        # with only a metrics URL given, the API may be another service or not ours to call
        canary = telemetry.probe if telemetry.probe is not None else connection.metrics_url is None
        why_not = "--no-probe" if telemetry.probe is False else "--metrics-url given: pass --probe to send them"
        check_writable(output.record, "--record")
        options = flags_json(
            url=url,
            duration=duration.seconds,
            auto_duration=duration.auto,
            connection=connection,
            telemetry=telemetry,
            pages=pages,
            deployment=deployment,
            trace=trace,
        )
        with (
            recording(output.record, "scan", options),
            scan_progress(server.base_url, quiet=output.as_json) as tick,
        ):
            verdict = diagnose(
                server,
                duration.seconds,
                settings,
                on_progress=tick,
                telemetry=telemetry_options,
                deployment=deployment_,
                canary=canary,
                canary_off_reason=why_not,
                trace=trace_report,
                server=pages.server,
                auto_duration=duration.auto,
            )
    except LlmdiagError as error:
        fail(error)
    html = output.html
    unwritten = (
        None if html is None else written(lambda: write_html(html, verdict, quiet=output.as_json or output.markdown))
    )
    emit(verdict, output.as_json, output.verbose, output.markdown)
    fail_if(unwritten)
    raise typer.Exit(exit_code(verdict, output.fail_on or FailOn.critical))


def read_scan_trace(path: Path) -> TraceReport:
    """scan --trace: the traces are read before the window; a trace problem is a warning here, not the scan's end."""
    try:
        report = analyze_trace_files([path])
    except UsageError as error:  # say which option the path came from
        raise UsageError(f"--trace: {error.message}", error.hint) from None
    for problem in report.problems:
        warn(f"trace: {problem.message}")
    if not report.ranks:
        raise UsageError(f"--trace {path}: no readable trace", "give a folder of torch.profiler JSON files")
    return report


def scan_fleet(
    urls: list[str],
    duration: float,
    fleet: FleetFlags,
    connection: ConnectionFlags,
    probe: bool | None,
    pages: PagesFlags,
    output: ScanOutputFlags,
    one_server_only: Mapping[str, object],
) -> NoReturn:
    """Several targets at once: the fleet view. Exit 2 only when no target could be probed; otherwise by the worst
    finding (a replica's or the fleet's) against --fail-on."""
    try:
        refuse(
            one_server_only,
            "belong(s) to a one-server scan, and several targets were given",
            "name each server in a targets .toml with its own metrics_url and dcgm_url, or scan one URL",
        )
        settings = output.settings()
        max_bytes = pages.max_metrics_bytes
        targets = fleet_targets(urls, fleet.targets_file, lambda url: connection.connection(url, max_bytes), max_bytes)
        if not output.as_json:
            at_once = min(fleet.concurrency, len(targets))
            stderr.print(f"[dim]scanning {len(targets)} targets, {at_once} at a time, {duration:g} s each[/]")
        report = diagnose_fleet(
            targets,
            duration,
            settings,
            concurrency=fleet.concurrency,
            target_timeout_seconds=fleet.target_timeout or duration + 30,
            canary=probe if probe is not None else True,
            canary_off_reason="--no-probe",
            server=pages.server,
        )
    except LlmdiagError as error:
        fail(error)
    html = output.html
    unwritten = None if html is None else written(lambda: write_html(html, report, quiet=output.as_json))
    show_fleet(
        report,
        output,
        UsageError(
            f"none of the {len(report.targets)} targets could be probed",
            "see each row's error; check the URLs and that the servers are up",
        ),
    )
    fail_if(unwritten)
    unreachable = len(report.targets) - report.probed()
    if unreachable and not output.as_json:
        stderr.print(
            f"[yellow]WARNING:[/] {unreachable} of {len(report.targets)} targets could not be probed "
            "(class unknown, left out of the comparison)"
        )
    raise typer.Exit(exit_for(report.worst_severity(), output.fail_on or FailOn.critical))


def scan_prometheus(
    prometheus: ScanPrometheusFlags,
    connection: ConnectionFlags,
    output: ScanOutputFlags,
    only_prometheus: Mapping[str, object],
) -> NoReturn:
    """`scan --prometheus URL`: every instance of the selector judged from PromQL as a fleet (the same view as a
    multi-target scan), or with --step a fleet timeline. Exit as for a fleet scan: by the worst finding shown (the
    worst step's, for a timeline) against --fail-on; 2 when Prometheus cannot be read or the arguments are wrong."""
    assert prometheus.url is not None
    try:
        refuse(
            only_prometheus,
            "cannot go with --prometheus, which reads every server from Prometheus",
            "narrow the servers with --selector '{job=\"vllm\"}', or scan URLs without --prometheus",
        )
        settings = output.settings()
        source = prometheus.auth.source(prometheus.url, connection)
        report = prometheus_fleet(source, prometheus.selector, prometheus.window, settings)
    except LlmdiagError as error:
        fail(error)
    html = output.html
    unwritten = None if html is None else written(lambda: write_html(html, report, quiet=output.as_json))
    show_fleet(
        report,
        output,
        UsageError(
            f"Prometheus holds no inference-server data for any of the {len(report.targets)} instance(s) in this range",
            "see each row's reason; check --selector and the time range",
        ),
    )
    fail_if(unwritten)
    raise typer.Exit(exit_for(report.worst_severity(), output.fail_on or FailOn.critical))


def prometheus_fleet(
    source: PrometheusSource, selector: str | None, window: PrometheusWindowFlags, settings: Settings
) -> FleetReport:
    """The fleet over the window the flags pick: ending --at a time (default now), over --since or [--from, --to],
    or a timeline of --step steps over that range."""
    given = [n for n, v in (("--at", window.at), ("--since", window.since), ("--from", window.time_from)) if v]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)} both pick the time range", "give one of --at, --since, --from")
    if (window.time_from is None) != (window.time_to is None):
        raise UsageError("--from and --to go together", "e.g. --from 2025-01-31T14:00:00 --to 2025-01-31T15:00:00")
    now = time.time()
    start = end = None
    if window.since:
        start, end = now - parse_duration(window.since, "--since"), now
    elif window.time_from and window.time_to:
        start, end = parse_time(window.time_from, "--from", now), parse_time(window.time_to, "--to", now)
        if end <= start:
            raise UsageError("--to must be after --from")
    if window.step is not None:
        if start is None or end is None:
            raise UsageError("--step draws a timeline over a range", "give --since 1h or --from T1 --to T2")
        step = None if window.step == "auto" else parse_duration(window.step, "--step")
        return diagnose_prometheus_fleet_timeline(source, selector, start, end, step, settings)
    at_unix = parse_time(window.at, "--at", now) if window.at else end
    seconds = (end - start) if start is not None and end is not None else None
    return diagnose_prometheus_fleet(source, selector, at_unix, seconds, settings)


def show_fleet(report: FleetReport, output: ScanOutputFlags, none_probed: UsageError) -> None:
    """The fleet table (or its JSON); then ``none_probed`` (exit 2) when no target could be judged at all."""
    if output.as_json:
        print_json(report.model_dump_json(indent=2))
    else:
        stdout.print(render_fleet(report))
    if report.probed() == 0:
        fail(none_probed)
