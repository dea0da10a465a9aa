"""The command line: a thin typer shell over ``llmdiag.api``. The only module that prints.

Exit codes (scan, analyze): 0 nothing at or above --fail-on; 1 something is; 2 usage, configuration
or probe error (including "could not probe anything"). `check` follows the Nagios plugin conventions
instead: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (bad arguments and unreachable targets included).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from llmdiag._version import __version__
from llmdiag.collect import DEFAULT_DURATION_SECONDS, DEFAULT_MAX_METRICS_BYTES
from llmdiag.config import load_settings  # pydantic only, which typer's option parsing loads anyway
from llmdiag.errors import LlmdiagError, UsageError

if TYPE_CHECKING:
    from llmdiag.client.endpoint import Connection
    from llmdiag.model import FleetReport, LoadReport, Verdict

# Each command imports what it uses: `llmdiag trace --json` then loads neither rich, the HTTP stack nor the other
# commands' code (a third of its run on a small trace went on imports).

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2

app = typer.Typer(
    name="llmdiag",
    help="Tells you why your LLM inference server is slow: KV-cache memory, compute, scheduling or network.",
    pretty_exceptions_show_locals=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    add_completion=False,
)
rules_app = typer.Typer(help="The rule catalogue: what llmdiag checks and why.", no_args_is_help=True)
app.add_typer(rules_app, name="rules")
sim_app = typer.Typer(help="The built-in simulated inference server.", no_args_is_help=True)
app.add_typer(sim_app, name="sim")

DEFAULT_DEMO_PRESET = "scheduling"


class _LazyConsole:
    """A rich Console made on first use (rich.console is a third of a fast command's imports)."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return getattr(self._console, name)


stdout = _LazyConsole(highlight=False, soft_wrap=False)
stderr = _LazyConsole(stderr=True, highlight=False)


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)


class FailOn(str, Enum):
    warning = "warning"
    critical = "critical"
    never = "never"


def print_error(message: str, hint: str) -> None:
    # messages carry server text and user paths: escape them so '[...]' is shown, not parsed as markup
    stderr.print(f"[bold red]ERROR:[/] {escape(message)}", highlight=False, soft_wrap=True)
    if hint:
        stderr.print(f"[bold]HINT:[/] {escape(hint)}", highlight=False, soft_wrap=True)


def fail(error: LlmdiagError) -> NoReturn:
    print_error(error.message, error.hint)
    raise typer.Exit(EXIT_ERROR)


def exit_code(verdict: Verdict, fail_on: FailOn) -> int:
    from llmdiag.model import Severity

    worst = verdict.worst_severity()
    if fail_on is FailOn.never or worst is None:
        return EXIT_OK
    threshold = Severity(fail_on.value)
    return EXIT_FINDINGS if worst.rank >= threshold.rank else EXIT_OK


def emit(verdict: Verdict, as_json: bool, verbose: bool, markdown: bool = False) -> None:
    from llmdiag.render.json import render_json
    from llmdiag.render.terminal import render_terminal

    if as_json:
        sys.stdout.write(render_json(verdict) + "\n")
    elif markdown:
        from llmdiag.render.markdown import render_markdown

        sys.stdout.write(render_markdown(verdict))
    else:
        stdout.print(render_terminal(verdict, verbose=verbose))


def check_outputs(as_json: bool, markdown: bool) -> None:
    """--json and --markdown both replace what is printed: one of them at a time."""
    if as_json and markdown:
        raise UsageError("--json and --markdown both print to stdout", "pick one (--html PATH writes a file)")


def write_html(path: Path, result: Verdict | LoadReport | FleetReport, quiet: bool = False) -> None:
    """The self-contained HTML report, written atomically; says where and how big on stderr."""
    from llmdiag.model import FleetReport
    from llmdiag.render.files import write_atomic
    from llmdiag.render.fleet_html import render_fleet_html
    from llmdiag.render.html import render_html

    text = render_fleet_html(result) if isinstance(result, FleetReport) else render_html(result)
    try:
        write_atomic(path, text)
    except OSError as exc:
        raise LlmdiagError(f"cannot write {path}: {exc.strerror}", "pick another --html path") from None
    if not quiet:
        stderr.print(f"[dim]HTML report written to {escape(str(path))} ({len(text.encode()) / 1024:.0f} KB)[/]")


JsonOpt = Annotated[bool, typer.Option("--json", help="Print the verdict as JSON (schema_version inside).")]
FailOnOpt = Annotated[FailOn, typer.Option("--fail-on", help="Exit 1 when a finding is at or above this severity.")]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="Settings file (default: ./llmdiag.toml when present).")
]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Also print every signal.")]
HtmlOpt = Annotated[
    Path | None,
    typer.Option("--html", help="Also write a self-contained HTML report (charts inline, no network) to this file."),
]
MarkdownOpt = Annotated[
    bool, typer.Option("--markdown", help="Print a compact Markdown summary (for an issue or a chat) instead.")
]
MaxBytesOpt = Annotated[
    int, typer.Option("--max-metrics-bytes", help="Refuse metrics pages larger than this.", min=1024)
]
# how to reach a server and its telemetry: the same flags for `scan` and `load`
MetricsUrlOpt = Annotated[
    str | None, typer.Option("--metrics-url", help="Where /metrics lives, if not at URL/metrics.")
]
HeaderOpt = Annotated[
    list[str] | None, typer.Option("--header", "-H", help="Extra HTTP header 'Name: value' (repeatable).")
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option("--api-key", help="Bearer token (or set LLMDIAG_API_KEY). Never printed.", show_default=False),
]
InsecureOpt = Annotated[bool, typer.Option("--insecure", help="Accept self-signed TLS certificates.")]
DcgmUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--dcgm-url",
        help="dcgm-exporter's page for the server's GPUs (e.g. http://HOST:9400/metrics): GPU telemetry "
        "for the compute and network rules. Sent no credentials.",
    ),
]
NvmlOpt = Annotated[
    bool, typer.Option("--nvml/--no-nvml", help="Read this machine's GPUs through NVML when a driver is present.")
]
PidOpt = Annotated[
    list[int] | None,
    typer.Option(
        "--pid",
        help="The server's process (repeatable; children included). Default: the process "
        "listening on URL's port, when the server runs on this machine.",
    ),
]
ServerOpt = Annotated[
    str | None,
    typer.Option(
        "--server",
        help="The server: vllm, sglang, tgi, llamacpp, trtllm, triton. Default: worked out from "
        "its metric names, headers and endpoints (the verdict says which and why).",
    ),
]
HttpTimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds to wait for each HTTP answer.")]
SelectorOpt = Annotated[
    str | None,
    typer.Option(
        "--selector",
        help="With --prometheus: a label matcher list, e.g. '{job=\"vllm\"}'.",
        rich_help_panel="Prometheus",
    ),
]
PrometheusTokenEnvOpt = Annotated[
    str | None,
    typer.Option(
        "--prometheus-token-env",
        help="Bearer token for Prometheus from this environment variable.",
        rich_help_panel="Prometheus",
    ),
]
PrometheusTokenFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--prometheus-token-file", help="Bearer token for Prometheus from this file.", rich_help_panel="Prometheus"
    ),
]
PrometheusUserOpt = Annotated[
    str | None,
    typer.Option(
        "--prometheus-user",
        help="Basic-auth user for Prometheus (with --prometheus-password-env).",
        rich_help_panel="Prometheus",
    ),
]
PrometheusPasswordEnvOpt = Annotated[
    str | None,
    typer.Option(
        "--prometheus-password-env",
        help="Basic-auth password from this environment variable.",
        rich_help_panel="Prometheus",
    ),
]
PrometheusCaOpt = Annotated[
    Path | None,
    typer.Option(
        "--prometheus-ca", help="CA bundle (PEM) for Prometheus's TLS certificate.", rich_help_panel="Prometheus"
    ),
]
ProbeOpt = Annotated[
    bool | None,
    typer.Option(
        "--probe/--no-probe",
        help="Send a few small streaming canary requests through the server's "
        "API during the window (default: yes, unless --metrics-url says only metrics are reachable).",
    ),
]


def connection_from_options(
    url: str,
    metrics_url: str | None,
    header: list[str] | None,
    api_key: str | None,
    timeout: float,
    insecure: bool,
    max_metrics_bytes: int = DEFAULT_MAX_METRICS_BYTES,
) -> Connection:
    from llmdiag.client.endpoint import Connection, parse_header

    if timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {timeout:g}")
    return Connection(
        base_url=url,
        metrics_url=metrics_url,
        headers=dict(parse_header(h) for h in header or []),
        api_key=api_key,
        timeout_seconds=timeout,
        insecure=insecure,
        max_metrics_bytes=max_metrics_bytes,
    )


@app.command()
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
        float, typer.Option("--duration", "-d", help="Seconds to watch the server (at least 3 scrapes).")
    ] = DEFAULT_DURATION_SECONDS,
    metrics_url: MetricsUrlOpt = None,
    header: HeaderOpt = None,
    api_key: ApiKeyOpt = None,
    timeout: HttpTimeoutOpt = 5.0,
    insecure: InsecureOpt = False,
    dcgm_url: DcgmUrlOpt = None,
    nvml: NvmlOpt = True,
    nvml_replay: Annotated[
        Path | None,
        typer.Option(
            "--nvml-replay",
            hidden=True,
            help="Play back an NVML recording (bench/gpu_check.py --record) instead of the local driver.",
        ),
    ] = None,
    probe: ProbeOpt = None,
    pid: PidOpt = None,
    max_metrics_bytes: MaxBytesOpt = DEFAULT_MAX_METRICS_BYTES,
    server: ServerOpt = None,
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="The server's GPU (H100, H200, A100, L4): adds the roofline context.")
    ] = None,
    model_shape: Annotated[
        str | None,
        typer.Option("--model-shape", help="The served model's shape (e.g. llama-3-8b), with --gpu."),
    ] = None,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel size, with --gpu.", min=1)] = 1,
    as_json: JsonOpt = False,
    fail_on: Annotated[
        FailOn | None,
        typer.Option(
            "--fail-on",
            help="Exit 1 when a finding is at or above this severity (default critical; "
            "never for the demo, which is bottlenecked on purpose).",
        ),
    ] = None,
    config: ConfigOpt = None,
    verbose: VerboseOpt = False,
    html: HtmlOpt = None,
    markdown: MarkdownOpt = False,
    trace: Annotated[
        Path | None,
        typer.Option(
            "--trace",
            help="A folder (or file) of PyTorch profiler traces of this server: their "
            "communication signals join the scan's and the network rules judge them.",
        ),
    ] = None,
    targets_file: Annotated[
        Path | None,
        typer.Option(
            "--targets",
            help="A file of targets to scan as a fleet: one URL a line (NAME=URL allowed, "
            "'#' comments), or a .toml with [[targets]] as for check.",
        ),
    ] = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", help="Fleet scans: targets scanned at once.", min=1, max=256)
    ] = 8,
    target_timeout: Annotated[
        float | None,
        typer.Option(
            "--target-timeout",
            help="Fleet scans: give up on a target after this many seconds (default: --duration + 30).",
            min=1.0,
        ),
    ] = None,
    prometheus: Annotated[
        str | None,
        typer.Option(
            "--prometheus",
            help="Read the servers from this Prometheus (or Mimir/Thanos) query API instead "
            "of scraping them: every instance the --selector holds, each judged on its own.",
            rich_help_panel="Prometheus",
        ),
    ] = None,
    selector: SelectorOpt = None,
    at: Annotated[
        str | None,
        typer.Option(
            "--at",
            help="With --prometheus: judge the window ending at this time (unix seconds, ISO time, "
            "or a span ago like 30m); the window is 60 s or 4 scrape intervals.",
            rich_help_panel="Prometheus",
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            help="With --prometheus: judge the span before now (e.g. 1h) as one window.",
            rich_help_panel="Prometheus",
        ),
    ] = None,
    time_from: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="With --prometheus and --to: judge [--from, --to] as one window (a timeline with --step).",
            rich_help_panel="Prometheus",
        ),
    ] = None,
    time_to: Annotated[
        str | None, typer.Option("--to", help="End of the --from range.", rich_help_panel="Prometheus")
    ] = None,
    step: Annotated[
        str | None,
        typer.Option(
            "--step",
            help="With --prometheus and --from/--to (or --since): a verdict timeline, one per "
            "step (e.g. 1m); 'auto' for ~30 steps.",
            rich_help_panel="Prometheus",
        ),
    ] = None,
    prometheus_token_env: PrometheusTokenEnvOpt = None,
    prometheus_token_file: PrometheusTokenFileOpt = None,
    prometheus_user: PrometheusUserOpt = None,
    prometheus_password_env: PrometheusPasswordEnvOpt = None,
    prometheus_ca: PrometheusCaOpt = None,
) -> None:
    """Watch a live server for a window and say what limits it; several servers are compared as a fleet."""
    from llmdiag.api.scan import diagnose
    from llmdiag.collect.live import TelemetryOptions

    if prometheus is not None:
        scan_prometheus(
            PrometheusOptions(
                prometheus,
                selector,
                at,
                since,
                time_from,
                time_to,
                step,
                prometheus_token_env,
                prometheus_token_file,
                prometheus_user,
                prometheus_password_env,
                prometheus_ca,
            ),
            header,
            timeout,
            insecure,
            as_json,
            verbose,
            fail_on or FailOn.critical,
            config,
            html,
            unsupported={
                "URL": " ".join(urls or []) or None,
                "--targets": targets_file,
                "--markdown": markdown or None,
                "--metrics-url": metrics_url,
                "--dcgm-url": dcgm_url,
                "--trace": trace,
                "--verbose": verbose or None,
            },
        )
    if urls and len(urls) > 1 or targets_file is not None:
        scan_fleet(
            urls or [],
            targets_file,
            duration,
            concurrency,
            target_timeout,
            header,
            api_key,
            timeout,
            insecure,
            probe,
            max_metrics_bytes,
            server,
            as_json,
            fail_on or FailOn.critical,
            config,
            html,
            unsupported={
                "--metrics-url": metrics_url,
                "--dcgm-url": dcgm_url,
                "--pid": pid,
                "--gpu": gpu,
                "--model-shape": model_shape,
                "--trace": trace,
                "--nvml-replay": nvml_replay,
                "--markdown": markdown or None,
                "--verbose": verbose or None,
            },
        )
    url = urls[0] if urls else None
    if url is None:
        stderr.print("[dim]no server given: scanning the built-in demo server (`llmdiag demo --help`)[/]")
        demo(
            preset=DEFAULT_DEMO_PRESET,
            duration=duration,
            output=None,
            as_json=as_json,
            fail_on=fail_on or FailOn.never,
            config=config,
            verbose=verbose,
            html=html,
            markdown=markdown,
        )
    try:
        check_outputs(as_json, markdown)
        connection = connection_from_options(url, metrics_url, header, api_key, timeout, insecure, max_metrics_bytes)
        settings = load_settings(config)
        trace_report = read_scan_trace(trace) if trace is not None else None
        with scan_progress(connection.base_url, quiet=as_json) as tick:
            verdict = diagnose(
                connection,
                duration,
                settings,
                on_progress=tick,
                telemetry=TelemetryOptions(
                    dcgm_url=dcgm_url,
                    nvml="auto" if nvml or nvml_replay else "off",
                    nvml_library=load_nvml_replay(nvml_replay) if nvml_replay else None,
                    pids=pid or [],
                ),
                deployment=deployment_from_options(gpu, model_shape, tp),
                # with only a metrics URL given, the API may be another service or not ours to call
                canary=probe if probe is not None else metrics_url is None,
                canary_off_reason="--no-probe" if probe is False else "--metrics-url given: pass --probe to send them",
                trace=trace_report,
                server=server,
            )
        if html is not None:
            write_html(html, verdict, quiet=as_json or markdown)
    except LlmdiagError as error:
        fail(error)
    emit(verdict, as_json, verbose, markdown)
    raise typer.Exit(exit_code(verdict, fail_on or FailOn.critical))


def scan_fleet(
    urls: list[str],
    targets_file: Path | None,
    duration: float,
    concurrency: int,
    target_timeout: float | None,
    header: list[str] | None,
    api_key: str | None,
    timeout: float,
    insecure: bool,
    probe: bool | None,
    max_metrics_bytes: int,
    server: str | None,
    as_json: bool,
    fail_on: FailOn,
    config: Path | None,
    html: Path | None,
    unsupported: dict[str, object],
) -> NoReturn:
    """Several targets at once: the fleet view. Exit 2 only when no target could be probed; otherwise by the worst
    finding (a replica's or the fleet's) against --fail-on."""
    from llmdiag.api.check import connection_for
    from llmdiag.api.fleet import diagnose_fleet
    from llmdiag.model import Severity
    from llmdiag.render.fleet import render_fleet
    from llmdiag.targets import read_targets_file, url_targets

    try:
        given = [name for name, value in unsupported.items() if value]
        if given:
            raise UsageError(
                f"{', '.join(given)} belong(s) to a one-server scan, and several targets were given",
                "name each server in a targets .toml with its own metrics_url and dcgm_url, or scan one URL",
            )
        settings = load_settings(config)
        targets = read_targets_file(targets_file) if targets_file is not None else []
        targets += url_targets(urls, taken={t.name for t in targets})
        names = [t.name for t in targets]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise UsageError(f"target names repeat: {', '.join(dupes)}", "give each target its own name")
        # a .toml's targets carry their own connection settings (secrets from the environment, as for check);
        # plain URLs (command line or a plain list) get --header, --api-key, --timeout, --insecure
        from_toml = targets_file is not None and targets_file.suffix == ".toml"
        connections = [
            (
                t.name,
                connection_for(t, max_metrics_bytes)
                if from_toml and i < len(targets) - len(urls)
                else connection_from_options(t.url, None, header, api_key, timeout, insecure, max_metrics_bytes),
            )
            for i, t in enumerate(targets)
        ]
        if not as_json:
            stderr.print(
                f"[dim]scanning {len(targets)} targets, {min(concurrency, len(targets))} at a time, "
                f"{duration:g} s each[/]"
            )
        report = diagnose_fleet(
            connections,
            duration,
            settings,
            concurrency=concurrency,
            target_timeout_seconds=target_timeout or duration + 30,
            canary=probe if probe is not None else True,
            canary_off_reason="--no-probe",
            server=server,
        )
        if html is not None:
            write_html(html, report, quiet=as_json)
    except LlmdiagError as error:
        fail(error)
    if as_json:
        sys.stdout.write(report.model_dump_json(indent=2) + "\n")
    else:
        stdout.print(render_fleet(report))
    if report.probed() == 0:
        fail(
            UsageError(
                f"none of the {len(report.targets)} targets could be probed",
                "see each row's error; check the URLs and that the servers are up",
            )
        )
    unreachable = len(report.targets) - report.probed()
    if unreachable and not as_json:
        stderr.print(
            f"[yellow]WARNING:[/] {unreachable} of {len(report.targets)} targets could not be probed "
            "(class unknown, left out of the comparison)"
        )
    worst = report.worst_severity()
    failing = fail_on is not FailOn.never and worst is not None and worst.rank >= Severity(fail_on.value).rank
    raise typer.Exit(EXIT_FINDINGS if failing else EXIT_OK)


@dataclass
class PrometheusOptions:
    url: str
    selector: str | None = None
    at: str | None = None
    since: str | None = None
    time_from: str | None = None
    time_to: str | None = None
    step: str | None = None
    token_env: str | None = None
    token_file: Path | None = None
    user: str | None = None
    password_env: str | None = None
    ca: Path | None = None


def scan_prometheus(
    opts: PrometheusOptions,
    header: list[str] | None,
    timeout: float,
    insecure: bool,
    as_json: bool,
    verbose: bool,
    fail_on: FailOn,
    config: Path | None,
    html: Path | None = None,
    unsupported: dict[str, object] | None = None,
) -> NoReturn:
    """`scan --prometheus URL`: every instance of the selector judged from PromQL as a fleet (the same view as a
    multi-target scan), or with --step a fleet timeline. Exit as for a fleet scan: by the worst finding shown (the
    worst step's, for a timeline) against --fail-on; 2 when Prometheus cannot be read or the arguments are wrong."""
    from llmdiag.api.fleet import diagnose_prometheus_fleet, diagnose_prometheus_fleet_timeline
    from llmdiag.collect.prometheus.api import PrometheusSource
    from llmdiag.collect.prometheus.plan import parse_duration, parse_time
    from llmdiag.model import Severity
    from llmdiag.render.fleet import render_fleet

    try:
        given = [name for name, value in (unsupported or {}).items() if value]
        if given:
            raise UsageError(
                f"{', '.join(given)} cannot go with --prometheus, which reads every server from Prometheus",
                "narrow the servers with --selector '{job=\"vllm\"}', or scan URLs without --prometheus",
            )
        settings = load_settings(config)
        source = PrometheusSource.from_options(
            opts.url,
            header,
            opts.token_env,
            opts.token_file,
            opts.user,
            opts.password_env,
            opts.ca,
            insecure,
            timeout_seconds=max(timeout, 30.0),
        )
        given = [n for n, v in (("--at", opts.at), ("--since", opts.since), ("--from", opts.time_from)) if v]
        if len(given) > 1:
            raise UsageError(f"{' and '.join(given)} both pick the time range", "give one of --at, --since, --from")
        if (opts.time_from is None) != (opts.time_to is None):
            raise UsageError("--from and --to go together", "e.g. --from 2025-01-31T14:00:00 --to 2025-01-31T15:00:00")
        now = time.time()
        start = end = None
        if opts.since:
            start, end = now - parse_duration(opts.since, "--since"), now
        elif opts.time_from and opts.time_to:
            start, end = parse_time(opts.time_from, "--from", now), parse_time(opts.time_to, "--to", now)
            if end <= start:
                raise UsageError("--to must be after --from")
        if opts.step is not None:
            if start is None or end is None:
                raise UsageError("--step draws a timeline over a range", "give --since 1h or --from T1 --to T2")
            step = None if opts.step == "auto" else parse_duration(opts.step, "--step")
            report = diagnose_prometheus_fleet_timeline(source, opts.selector, start, end, step, settings)
        else:
            at_unix = parse_time(opts.at, "--at", now) if opts.at else end
            window = (end - start) if start is not None and end is not None else None
            report = diagnose_prometheus_fleet(source, opts.selector, at_unix, window, settings)
        if html is not None:
            write_html(html, report, quiet=as_json)
    except LlmdiagError as error:
        fail(error)
    if as_json:
        sys.stdout.write(report.model_dump_json(indent=2) + "\n")
    else:
        stdout.print(render_fleet(report))
    if report.probed() == 0:
        fail(
            UsageError(
                f"Prometheus holds no inference-server data for any of the {len(report.targets)} "
                "instance(s) in this range",
                "see each row's reason; check --selector and the time range",
            )
        )
    worst = report.worst_severity()
    failing = fail_on is not FailOn.never and worst is not None and worst.rank >= Severity(fail_on.value).rank
    raise typer.Exit(EXIT_FINDINGS if failing else EXIT_OK)


def load_nvml_replay(path: Path):
    from llmdiag.collect.telemetry.nvml_record import ReplayNvml

    try:
        return ReplayNvml.from_file(path)
    except (OSError, ValueError) as exc:
        hint = "give a recording written by bench/gpu_check.py --record"
        raise UsageError(f"--nvml-replay {path}: {exc}", hint) from None


def deployment_from_options(gpu: str | None, model_shape: str | None, tp: int):
    """--gpu and --model-shape together name a deployment for the roofline context; one alone is a mistake."""
    if gpu is None and model_shape is None:
        return None
    if gpu is None or model_shape is None:
        raise UsageError("--gpu and --model-shape go together", "e.g. --gpu H100 --model-shape llama-3-8b --tp 1")
    from llmdiag.physics.hardware import find_gpu, find_model
    from llmdiag.physics.step import Deployment

    return Deployment(find_gpu(gpu), find_model(model_shape), tp=tp)


@contextmanager
def scan_progress(what: str, quiet: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr while scraping, when a person is watching."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    if quiet or not stderr.is_terminal:
        yield None
        return
    with Progress(
        TextColumn("[dim]watching {task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} scrapes"),
        TimeRemainingColumn(),
        console=stderr,
        transient=True,
    ) as progress:
        task = progress.add_task(what, total=None)
        yield lambda done, total: progress.update(task, completed=done, total=total)


@contextmanager
def load_progress(total_seconds: float, quiet: bool) -> Iterator[Callable[[str], None]]:
    """A progress bar over the whole sweep on stderr when a person is watching; plain lines otherwise."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    if quiet:
        yield lambda _: None
        return
    if not stderr.is_terminal:
        yield lambda line: stderr.print(f"[dim]{escape(line)}[/]")
        return
    with Progress(
        TextColumn("[dim]{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=stderr,
        transient=True,
    ) as progress:
        task = progress.add_task("starting", total=total_seconds)
        started, done = time.monotonic(), threading.Event()

        def tick() -> None:
            while not done.wait(0.5):
                progress.update(task, completed=min(total_seconds, time.monotonic() - started))

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            yield lambda line: progress.update(task, description=escape(line))
        finally:
            done.set()
            ticker.join()


@app.command()
def demo(
    preset: Annotated[
        str, typer.Option("--preset", help="healthy, memory, compute, scheduling or network.")
    ] = DEFAULT_DEMO_PRESET,
    duration: Annotated[float, typer.Option("--duration", "-d", help="Seconds to watch the server.")] = 15.0,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Also write the verdict as JSON to this file.")
    ] = Path("llmdiag-demo.json"),
    as_json: JsonOpt = False,
    fail_on: FailOnOpt = FailOn.never,
    config: ConfigOpt = None,
    verbose: VerboseOpt = False,
    html: HtmlOpt = None,
    markdown: MarkdownOpt = False,
) -> None:
    """Start the built-in simulated vLLM in a known state, load it, scan it and print the verdict."""
    from llmdiag.api.scan import run_demo
    from llmdiag.render.files import write_atomic
    from llmdiag.render.json import render_json

    try:
        check_outputs(as_json, markdown)
        settings = load_settings(config)
        with scan_progress(f"the simulated server ({preset})", quiet=as_json) as tick:
            verdict = run_demo(
                preset,
                duration,
                settings,
                on_progress=tick,
                on_phase=None if as_json else lambda line: stderr.print(f"[dim]{escape(line)}[/]"),
            )
        if output is not None:
            write_atomic(output, render_json(verdict) + "\n")
        if html is not None:
            write_html(html, verdict, quiet=as_json)
    except LlmdiagError as error:
        fail(error)
    except OSError as exc:
        fail(LlmdiagError(f"cannot write {output}: {exc.strerror}", "pick another --output path"))
    emit(verdict, as_json, verbose, markdown)
    if output is not None and not as_json:
        stderr.print(f"[dim]verdict written to {escape(str(output))}[/]")
    raise typer.Exit(exit_code(verdict, fail_on))


@sim_app.command("serve")
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
    from llmdiag.sim.load import ClosedLoopLoad
    from llmdiag.sim.presets import get_preset
    from llmdiag.sim.server import SimServer

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
        driver = ClosedLoopLoad(f"http://127.0.0.1:{server.port}", server.model, spec, max_seconds=7 * 24 * 3600)
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


def read_scan_trace(path: Path):
    """scan --trace: the traces are read before the window; a trace problem is a warning here, not the scan's end."""
    from llmdiag.collect.trace.analysis import analyze as analyze_trace_files

    try:
        report = analyze_trace_files([path])
    except UsageError as error:  # say which option the path came from
        raise UsageError(f"--trace: {error.message}", error.hint) from None
    for problem in report.problems:
        stderr.print(f"[yellow]WARNING:[/] trace: {escape(problem.message)}", soft_wrap=True)
    if not report.ranks:
        raise UsageError(f"--trace {path}: no readable trace", "give a folder of torch.profiler JSON files")
    return report


@app.command()
def trace(
    paths: Annotated[
        list[Path], typer.Argument(help="Trace files (.json, .json.gz), one per rank, or folders holding them.")
    ],
    link: Annotated[
        str | None,
        typer.Option(
            "--link",
            help="The link the collectives ran over (nvlink2..nvlink5, pcie4x16, ib-ndr …); "
            "default: from the trace's GPU model where it implies one (SXM boards).",
        ),
    ] = None,
    hta_compat: Annotated[
        bool,
        typer.Option(
            "--hta-compat",
            help="Count as HolisticTraceAnalysis does: µs-rounded timestamps, the last "
            "ProfilerStep dropped, only nccl…Kernel names as communication.",
        ),
    ] = False,
    as_json: JsonOpt = False,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Also write the JSON report here.")] = None,
    fail_on: FailOnOpt = FailOn.critical,
    config: ConfigOpt = None,
) -> None:
    """Analyse PyTorch profiler (Kineto) traces: GPU busy, communication share, exposed communication, collectives
    with their bandwidth, and the straggler rank. Exit 2 when a trace could not be used (after the rest is shown)."""
    from llmdiag.api.trace import analyze_traces
    from llmdiag.collect.trace.analysis import problems_as_error
    from llmdiag.render.files import write_atomic

    try:
        settings = load_settings(config)
        report = analyze_traces(paths, link=link, hta_compat=hta_compat, settings=settings)
        if output is not None:
            write_atomic(output, report.model_dump_json(indent=2) + "\n")
    except LlmdiagError as error:
        fail(error)
    except OSError as exc:
        fail(LlmdiagError(f"cannot write {output}: {exc.strerror}", "pick another --output path"))
    if as_json:
        sys.stdout.write(report.model_dump_json(indent=2) + "\n")
    elif report.ranks:
        from llmdiag.render.trace import render_trace

        stdout.print(render_trace(report))
        if output is not None:
            stderr.print(f"[dim]report written to {escape(str(output))}[/]")
    error = problems_as_error(report)
    if error is not None:
        fail(error)
    if not report.ranks:
        fail(UsageError("no trace could be analysed", "give torch.profiler JSON files, one per rank"))
    raise typer.Exit(exit_code(report.verdict, fail_on) if report.verdict else EXIT_OK)


@app.command()
def analyze(
    files: Annotated[
        list[Path],
        typer.Argument(
            help="Saved /metrics dumps (one: lifetime averages; 2+: a window) or server logs (vLLM, SGLang, "
            "TensorRT-LLM), told apart by their first lines."
        ),
    ],
    max_metrics_bytes: MaxBytesOpt = DEFAULT_MAX_METRICS_BYTES,
    server: ServerOpt = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            help="Logs: judge lines from this time on (2026-11-30T06:40:00, 06:40, or 30m before the last line).",
        ),
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="Logs: judge lines up to this time (same forms as --since).")
    ] = None,
    as_json: JsonOpt = False,
    fail_on: FailOnOpt = FailOn.critical,
    config: ConfigOpt = None,
    verbose: VerboseOpt = False,
    html: HtmlOpt = None,
    markdown: MarkdownOpt = False,
) -> None:
    """Diagnose from saved /metrics dumps or server logs (bug reports, past incidents)."""
    from llmdiag.api.scan import diagnose_files, diagnose_logs
    from llmdiag.collect.logs import looks_like_log

    try:
        check_outputs(as_json, markdown)
        settings = load_settings(config)
        logs = [looks_like_log(path) for path in files]
        if any(logs) and not all(logs):
            pairs = zip(files, logs, strict=True)
            kinds = ", ".join(f"{p} ({'log' if is_log else '/metrics dump'})" for p, is_log in pairs)
            raise UsageError(f"a mix of logs and /metrics dumps: {kinds}", "analyze the logs and the dumps apart")
        if all(logs) and files:
            cap = None if max_metrics_bytes == DEFAULT_MAX_METRICS_BYTES else max_metrics_bytes
            verdict = diagnose_logs(files, settings, since=since, until=until, max_bytes=cap)
        elif since is not None or until is not None:
            raise UsageError("--since/--until apply to server logs, not /metrics dumps", "leave them out for dumps")
        else:
            verdict = diagnose_files(files, settings, max_bytes=max_metrics_bytes, server=server)
        if html is not None:
            write_html(html, verdict, quiet=as_json or markdown)
    except LlmdiagError as error:
        fail(error)
    emit(verdict, as_json, verbose, markdown)
    raise typer.Exit(exit_code(verdict, fail_on))


def parse_levels(text: str, what: str) -> list[float]:
    try:
        levels = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{what} {text!r} is not a number or a comma-separated list", "e.g. 1,8,32,128") from None
    if not levels:
        raise UsageError(f"{what} is empty", "e.g. 1,8,32,128")
    return levels


@app.command()
def load(
    url: Annotated[
        str | None, typer.Argument(help="The server's base URL. None: the built-in simulator (--preset).")
    ] = None,
    users: Annotated[
        str | None, typer.Option("--users", "-u", help="Closed-loop users: N, or a sweep like 1,8,32.")
    ] = None,
    sweep: Annotated[str | None, typer.Option("--sweep", help="The same as --users with a list: 1,8,32,128.")] = None,
    rate: Annotated[
        str | None, typer.Option("--rate", help="Open-loop Poisson arrivals per second: R, or a list 1,2,4.")
    ] = None,
    duration: Annotated[float, typer.Option("--duration", "-d", help="Measured seconds per level.")] = 20.0,
    warmup: Annotated[float, typer.Option("--warmup", help="Seconds of load before each level's window.")] = 3.0,
    requests_cap: Annotated[int, typer.Option("--requests", help="At most this many requests per level.")] = 20_000,
    prompt_tokens: Annotated[
        str, typer.Option("--prompt-tokens", help="Prompt length: 256, 128:512 (uniform) or normal:256,64.")
    ] = "256",
    output_tokens: Annotated[
        str, typer.Option("--output-tokens", help="Output length (ignore_eos): 128, 64:256 or normal:128,32.")
    ] = "128",
    model: Annotated[str | None, typer.Option("--model", help="Model name (default: the server's first).")] = None,
    chat: Annotated[bool, typer.Option("--chat", help="Use /v1/chat/completions.")] = False,
    think_time: Annotated[float, typer.Option("--think-time", help="Seconds a user waits between requests.")] = 0.0,
    slo_ttft: Annotated[float | None, typer.Option("--slo-ttft", help="Goodput: TTFT at most this (s).")] = None,
    slo_tpot: Annotated[float | None, typer.Option("--slo-tpot", help="Goodput: TPOT at most this (s).")] = None,
    allow_remote: Annotated[
        bool, typer.Option("--allow-remote", help="Allow a server that is not on this machine.")
    ] = False,
    preset: Annotated[str, typer.Option("--preset", help="Simulator state when no URL is given.")] = "healthy",
    metrics_url: MetricsUrlOpt = None,
    dcgm_url: DcgmUrlOpt = None,
    nvml: NvmlOpt = True,
    pid: PidOpt = None,
    header: HeaderOpt = None,
    api_key: ApiKeyOpt = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds without a byte before a request fails.")] = 60.0,
    insecure: InsecureOpt = False,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Also write the report as JSON.")] = None,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    html: HtmlOpt = None,
    markdown: MarkdownOpt = False,
) -> None:
    """Drive a bounded load (closed-loop users or open-loop arrivals), level by level, and diagnose each level."""
    from llmdiag.api.load import run_load
    from llmdiag.client.endpoint import Connection
    from llmdiag.collect.live import TelemetryOptions
    from llmdiag.collect.load import LoadPlan, TokenLengths
    from llmdiag.render.files import write_atomic
    from llmdiag.render.load import render_load

    try:
        check_outputs(as_json, markdown)
        if (users or sweep) and rate:
            raise UsageError("give users (--users/--sweep) or --rate, not both")
        closed = rate is None
        levels = parse_levels(rate, "--rate") if rate else parse_levels(users or sweep or "8", "--users")
        plan = LoadPlan(
            levels=levels,
            mode="closed" if closed else "open",
            duration_seconds=duration,
            warmup_seconds=warmup,
            max_requests=requests_cap,
            prompt_tokens=TokenLengths.parse(prompt_tokens, "--prompt-tokens"),
            output_tokens=TokenLengths.parse(output_tokens, "--output-tokens"),
            model=model,
            chat=chat,
            think_time_seconds=think_time,
            allow_remote=allow_remote,
            timeout_seconds=timeout,
        )
        plan.validate_levels()  # before a simulator is started for nothing
        settings = load_settings(config)

        def go(connection: Connection, telemetry: TelemetryOptions):
            seconds = len(levels) * (warmup + duration + 1.0)
            with load_progress(seconds, quiet=as_json) as show:

                def say(index: int, total: int, level: float) -> None:
                    what = (f"{level:g} user" + ("s" if level != 1 else "")) if closed else f"{level:g} requests/s"
                    show(f"level {index + 1}/{total}: {what} for {warmup + duration:g} s")

                return run_load(connection, plan, telemetry, settings, slo_ttft, slo_tpot, on_level=say)

        if url is None:
            from llmdiag.sim.presets import get_preset
            from llmdiag.sim.server import SimServer

            with SimServer(get_preset(preset)) as sim:
                if not as_json:
                    stderr.print(f"[dim]no server given: loading the built-in simulator ({preset}) at {sim.url}[/]")
                report = go(
                    Connection(base_url=sim.url), TelemetryOptions(dcgm_url=sim.dcgm_url, nvml="off", host=False)
                )
        else:
            # the scrapes keep scan's short timeout; the load's requests wait up to --timeout for each byte
            connection = connection_from_options(url, metrics_url, header, api_key, min(timeout, 10.0), insecure)
            report = go(connection, TelemetryOptions(dcgm_url=dcgm_url, nvml="auto" if nvml else "off", pids=pid or []))
        if output is not None:
            write_atomic(output, report.model_dump_json(indent=2) + "\n")
        if html is not None:
            write_html(html, report, quiet=as_json or markdown)
    except LlmdiagError as error:
        fail(error)
    except OSError as exc:
        fail(LlmdiagError(f"cannot write {output}: {exc.strerror}", "pick another --output path"))
    if as_json:
        sys.stdout.write(report.model_dump_json(indent=2) + "\n")
    elif markdown:
        from llmdiag.render.markdown import render_markdown

        sys.stdout.write(render_markdown(report))
    else:
        stdout.print(render_load(report))
    raise typer.Exit(EXIT_OK)


@app.command()
def report(
    result: Annotated[Path, typer.Argument(help="A saved result: scan/analyze --json, demo -o, or load -o/--json.")],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the self-contained HTML report to this file.")
    ] = None,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the Markdown summary to stdout.")] = False,
) -> None:
    """Turn a saved result (a verdict or a load report, as JSON) into an HTML report or Markdown."""
    from llmdiag.model import FleetReport
    from llmdiag.model.io import load_result
    from llmdiag.render.markdown import render_markdown

    try:
        if output is None and not markdown:
            raise UsageError("nothing to write", f"llmdiag report {result} -o report.html (or --markdown)")
        loaded = load_result(result)
        if markdown and isinstance(loaded, FleetReport):
            raise UsageError("no Markdown summary for a fleet report yet", f"llmdiag report {result} -o fleet.html")
        if output is not None:
            write_html(output, loaded)
    except LlmdiagError as error:
        fail(error)
    if markdown:
        sys.stdout.write(render_markdown(loaded))
    raise typer.Exit(EXIT_OK)


@app.command()
def capacity(
    users: Annotated[int, typer.Option("--users", help="Users with a request in flight at once.")],
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", help="Prompt length of each request.")],
    output_tokens: Annotated[int, typer.Option("--output-tokens", help="Output length of each request.")],
    gpu: Annotated[str | None, typer.Option("--gpu", help="H100, H200, A100 or L4 (SXM parts).")] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="llama-3-8b, llama-3-70b, qwen2.5-7b, qwen2.5-72b, mistral-7b, mixtral-8x7b."),
    ] = None,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel size (GPUs per model replica).")] = 1,
    model_config: Annotated[
        Path | None, typer.Option("--model-config", help="A Hugging Face config.json instead of --model.")
    ] = None,
    interconnect: Annotated[
        str | None, typer.Option("--interconnect", help="nvlink, pcie4 or pcie5 (default: NVLink where there is one).")
    ] = None,
    gpu_memory_utilization: Annotated[
        float | None, typer.Option("--gpu-memory-utilization", help="vLLM's share of GPU memory (default 0.92).")
    ] = None,
    max_num_seqs: Annotated[
        int | None, typer.Option("--max-num-seqs", help="vLLM's batch cap (default: vLLM's for that GPU).")
    ] = None,
    max_num_batched_tokens: Annotated[
        int | None, typer.Option("--max-num-batched-tokens", help="vLLM's tokens per step (default: vLLM's).")
    ] = None,
    simulate: Annotated[
        bool, typer.Option("--simulate", help="Also run the built-in simulator for this case and print it.")
    ] = False,
    simulate_seconds: Annotated[
        float, typer.Option("--simulate-seconds", help="Wall time of the --simulate run.", min=2.0)
    ] = 15.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the capacity report as JSON.")] = False,
) -> None:
    """How many users one deployment serves, how fast each one is, and what runs out first (a roofline)."""
    from llmdiag.engine.capacity import plan_capacity
    from llmdiag.physics.hardware import GPUS, MODELS, find_gpu, find_model, load_model_config
    from llmdiag.physics.step import DEFAULT_GPU_MEMORY_UTILIZATION
    from llmdiag.render.capacity import render_capacity, render_capacity_json

    try:
        if gpu is None:
            raise UsageError("no GPU given", f"--gpu NAME; known GPUs: {', '.join(GPUS)}")
        if model is not None and model_config is not None:
            raise UsageError("both --model and --model-config given", "pass one of them")
        if model is None and model_config is None:
            raise UsageError(
                "no model given", f"--model NAME (known: {', '.join(MODELS)}) or --model-config PATH/config.json"
            )
        gpu_spec = find_gpu(gpu)
        model_spec = load_model_config(model_config) if model_config is not None else find_model(str(model))
        report = plan_capacity(
            gpu_spec,
            model_spec,
            tp=tp,
            users=users,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            interconnect=interconnect,
            gpu_memory_utilization=gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
        )
        if simulate:
            from llmdiag.planning import simulate_capacity

            if not as_json:
                stderr.print(f"simulating for {simulate_seconds:g} s …")
            report.simulated = simulate_capacity(
                report, gpu_spec, model_spec, interconnect=interconnect, seconds=simulate_seconds
            )
    except LlmdiagError as error:
        fail(error)
    if as_json:
        sys.stdout.write(render_capacity_json(report) + "\n")
    else:
        stdout.print(render_capacity(report))


# ---------------------------------------------------------------------------------------------
# llmdiag check: Nagios plugin conventions (exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN), textfile, history

EXIT_NAGIOS_UNKNOWN = 3


def check_unknown(message: str, hint: str) -> NoReturn:
    """A check that could not run: the status line on stdout (what Nagios reads), ERROR and HINT on stderr."""
    from llmdiag.render.nagios import clean

    sys.stdout.write(f"LLMDIAG UNKNOWN - {clean(message)}\n")
    print_error(message, hint)
    raise typer.Exit(EXIT_NAGIOS_UNKNOWN)


@app.command()
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
    metrics_url: MetricsUrlOpt = None,
    header: HeaderOpt = None,
    api_key: ApiKeyOpt = None,
    timeout: HttpTimeoutOpt = 5.0,
    insecure: InsecureOpt = False,
    dcgm_url: DcgmUrlOpt = None,
    nvml: NvmlOpt = True,
    probe: ProbeOpt = None,
    textfile: Annotated[
        Path | None,
        typer.Option("--textfile", help="Write DIR/llmdiag.prom atomically for node_exporter's textfile collector."),
    ] = None,
    pushgateway: Annotated[
        str | None, typer.Option("--pushgateway", help="Also push the metrics to this Prometheus Pushgateway.")
    ] = None,
    history: Annotated[
        Path | None,
        typer.Option(
            "--history",
            help="The SQLite history (default: \\[check] history, or $XDG_STATE_HOME/llmdiag/history.sqlite).",
        ),
    ] = None,
    no_history: Annotated[
        bool, typer.Option("--no-history", help="Neither read a baseline nor record this check.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the check report as JSON instead.")] = False,
    config: ConfigOpt = None,
    prometheus: Annotated[
        str | None,
        typer.Option(
            "--prometheus",
            help="Check every server this Prometheus (or Mimir/Thanos) holds under "
            "--selector, over its last minute (or --duration), plus the fleet rules across them: one "
            "target per instance.",
            rich_help_panel="Prometheus",
        ),
    ] = None,
    selector: SelectorOpt = None,
    prometheus_token_env: PrometheusTokenEnvOpt = None,
    prometheus_token_file: PrometheusTokenFileOpt = None,
    prometheus_user: PrometheusUserOpt = None,
    prometheus_password_env: PrometheusPasswordEnvOpt = None,
    prometheus_ca: PrometheusCaOpt = None,
) -> None:
    """Health check for cron and monitoring, Nagios style: one status line with perfdata, exit 0/1/2/3."""
    import socket

    from llmdiag.api.check import run_check, run_prometheus_check
    from llmdiag.history import History, default_history_path
    from llmdiag.model.check import CheckReport, State
    from llmdiag.render.nagios import render_nagios
    from llmdiag.render.textfile import push, write_textfile

    try:
        settings = load_settings(config)
        connections: dict[str, Connection] = {}
        source = None
        if prometheus is not None:
            given = [
                n
                for n, v in (
                    ("URL", urls),
                    ("--target", target),
                    ("--metrics-url", metrics_url),
                    ("--dcgm-url", dcgm_url),
                )
                if v
            ]
            if given:
                raise UsageError(
                    f"{', '.join(given)} cannot go with --prometheus, which reads every server from Prometheus",
                    "narrow the servers with --selector '{job=\"vllm\"}'",
                )
            from llmdiag.collect.prometheus.api import PrometheusSource

            source = PrometheusSource.from_options(
                prometheus,
                header,
                prometheus_token_env,
                prometheus_token_file,
                prometheus_user,
                prometheus_password_env,
                prometheus_ca,
                insecure,
                timeout_seconds=max(timeout, 30.0),
            )
        elif urls:
            if target:
                raise UsageError(
                    "--target names a config target; with URLs on the command line it has no meaning",
                    "give URLs, or --target NAME for the [[targets]] of llmdiag.toml",
                )
            if len(urls) > 1 and (metrics_url or dcgm_url):
                raise UsageError(
                    "--metrics-url and --dcgm-url belong to one server, and several URLs were given",
                    "name each server in llmdiag.toml's [[targets]] with its own metrics_url and dcgm_url",
                )
            from llmdiag.targets import url_targets

            targets = url_targets(urls)
            for t in targets:
                connections[t.name] = connection_from_options(t.url, metrics_url, header, api_key, timeout, insecure)
                t.dcgm_url, t.nvml, t.probe, t.metrics_url = dcgm_url, nvml, probe, metrics_url
        else:
            if not settings.targets:
                raise UsageError(
                    "no target: give a URL, or name targets in llmdiag.toml",
                    "llmdiag check http://HOST:8000, or [[targets]] name = … url = … in llmdiag.toml",
                )
            known = {t.name: t for t in settings.targets}
            unknown = [name for name in target or [] if name not in known]
            if unknown:
                raise UsageError(f"no target '{unknown[0]}' in the config", f"known: {', '.join(known)}")
            targets = [known[name] for name in target] if target else list(settings.targets)
        textfile = textfile or settings.check.textfile
        if textfile is not None and not textfile.is_dir():
            raise UsageError(
                f"--textfile {textfile}: not a folder",
                "give node_exporter's --collector.textfile.directory, e.g. /var/lib/node_exporter/textfile_collector",
            )
        store = None
        if not no_history:
            store = History.open(history or settings.check.history or default_history_path())
        if source is not None:
            report: CheckReport = run_prometheus_check(source, selector, settings, duration, store)
        else:
            report = run_check(
                targets, settings, duration or settings.check.window_seconds, store, connections=connections
            )
    except LlmdiagError as error:
        check_unknown(error.message, error.hint)
    if textfile is not None:
        try:
            write_textfile(report, textfile)
        except OSError as exc:
            report.output_errors.append(f"textfile not written to {textfile}: {exc.strerror or exc}")
    gateway = pushgateway or settings.check.pushgateway
    if gateway:
        try:
            push(report, gateway, instance=socket.gethostname())
        except OSError as exc:
            from llmdiag.client.endpoint import redact_url

            report.output_errors.append(f"push to {redact_url(gateway)} failed: {exc}")
    if report.output_errors:
        report.state = max((report.state, State.UNKNOWN), key=lambda s: s.rank)
    if as_json:
        sys.stdout.write(report.model_dump_json(indent=2) + "\n")
    else:
        sys.stdout.write(render_nagios(report, settings))
    raise typer.Exit(int(report.state))


def parse_since(text: str) -> float:
    """'7d', '12h', '30m', '90s', '2w' → seconds."""
    import re

    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if not match:
        raise UsageError(f"--since {text!r} is not a duration", "e.g. 30m, 12h, 7d, 2w")
    return float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[match.group(2)]


@app.command("history")
def history_cmd(
    target: Annotated[str | None, typer.Option("--target", "-t", help="Only this target.")] = None,
    since: Annotated[str, typer.Option("--since", help="How far back: 30m, 12h, 7d, 2w.")] = "7d",
    limit: Annotated[int, typer.Option("--limit", help="At most this many rows per target (newest).", min=1)] = 20,
    history: Annotated[Path | None, typer.Option("--history", help="The SQLite history (as for check).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
    config: ConfigOpt = None,
) -> None:
    """The trend of past `llmdiag check` runs: per target, its states, class, TTFT/TPOT p95 and throughput."""
    import dataclasses
    import json

    from llmdiag.history import History, default_history_path
    from llmdiag.render.history import render_history

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


@app.command("nccl-bench")
def nccl_bench_cmd(
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
    from llmdiag.api.nccl import run_nccl_bench
    from llmdiag.model import Severity
    from llmdiag.render.files import write_atomic
    from llmdiag.render.nccl import render_nccl_bench

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
    worst = max((finding.severity.rank for finding in report.findings), default=None)
    failing = fail_on is not FailOn.never and worst is not None and worst >= Severity(fail_on.value).rank
    raise typer.Exit(EXIT_FINDINGS if failing else EXIT_OK)


@rules_app.command("list")
def rules_list() -> None:
    """Every rule: code, class, status and what it catches."""
    from rich.table import Table

    from llmdiag.schema.loader import load_rules

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


@rules_app.command("show")
def rules_show(code: Annotated[str, typer.Argument(help="A rule code, e.g. MEM001")]) -> None:
    """One rule in full: what, why, thresholds, and the fixes per engine."""
    from llmdiag.render.docs import render_rule_markdown
    from llmdiag.schema.loader import find_rule

    try:
        rule = find_rule(code)
        if rule is None:
            raise UsageError(f"no rule '{code}'", "`llmdiag rules list` shows every code")
    except LlmdiagError as error:
        fail(error)
    sys.stdout.write(render_rule_markdown(rule))


@rules_app.command("docs")
def rules_docs(
    out: Annotated[Path, typer.Option("--out", help="Folder for one Markdown page per rule.")] = Path("docs/rules"),
) -> None:
    """Write the rule reference pages (docs/rules/*.md) from the rule files."""
    from llmdiag.render.docs import write_rule_docs
    from llmdiag.schema.loader import load_rules

    try:
        written = write_rule_docs(load_rules(), out)
    except LlmdiagError as error:
        fail(error)
    except OSError as exc:
        fail(LlmdiagError(f"cannot write {out}: {exc.strerror}", "check the folder and its permissions"))
    stdout.print(f"wrote {len(written)} pages to {out}")


def version_callback(value: bool) -> None:
    if value:
        stdout.print(f"llmdiag {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=version_callback, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """llmdiag: why is my LLM server slow?"""


def main() -> None:
    try:
        code = app(standalone_mode=False)
    except typer.TyperException as exc:  # typer's own usage errors: same one-line contract as ours
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
            stdout.print(ctx.get_help())
            code = EXIT_OK
        else:
            command = ctx.command_path if ctx is not None else "llmdiag"
            hint = f"run `{command} --help` for the options"
            if ctx is not None and ctx.info_name == "check":  # a Nagios plugin's bad arguments are UNKNOWN
                sys.stdout.write(f"LLMDIAG UNKNOWN - {' '.join(exc.format_message().split())}\n")
                print_error(exc.format_message(), hint)
                code = EXIT_NAGIOS_UNKNOWN
            else:
                print_error(exc.format_message(), hint)
                code = EXIT_ERROR
    except (KeyboardInterrupt, typer.Abort):
        stderr.print("interrupted")
        code = 130
    except Exception as exc:  # a bug: still one line, with a way to get the traceback
        if os.environ.get("LLMDIAG_DEBUG"):
            raise
        print_error(
            f"internal error: {type(exc).__name__}: {exc}",
            "this is a bug in llmdiag; rerun with LLMDIAG_DEBUG=1 for the traceback",
        )
        code = EXIT_ERROR
    sys.exit(code if isinstance(code, int) else EXIT_OK)
