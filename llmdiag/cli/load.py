"""`llmdiag load`: drive a bounded load, level by level, and diagnose each level (a URL, or the built-in simulator)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from llmdiag.api.load import AB, run_load
from llmdiag.cli.options import (
    ApiKeyOpt,
    ConfigOpt,
    ConnectionFlags,
    DcgmUrlOpt,
    HeaderOpt,
    HtmlOpt,
    InsecureOpt,
    JsonOpt,
    MarkdownOpt,
    MetricsUrlOpt,
    NvmlOpt,
    PidOpt,
    RecordOpt,
    check_outputs,
    check_writable,
    flag_groups,
    flags_json,
    telemetry_options,
    with_slo,
)
from llmdiag.cli.output import (
    EXIT_OK,
    cannot_write,
    fail,
    fail_if,
    load_progress,
    note,
    print_json,
    recording,
    stdout,
    write_html,
    write_output,
    written,
)
from llmdiag.client.endpoint import Connection
from llmdiag.collect.live import TelemetryOptions
from llmdiag.collect.load import LoadPlan, TokenLengths, plan_of, workload_of
from llmdiag.config import Settings, load_settings
from llmdiag.errors import LlmdiagError, UsageError
from llmdiag.model import LoadReport
from llmdiag.model.abtest import read_prediction
from llmdiag.model.io import load_result
from llmdiag.model.workload import Workload, read_workload
from llmdiag.render.files import write_atomic
from llmdiag.render.load import render_load
from llmdiag.render.markdown import render_markdown
from llmdiag.sim.presets import get_preset
from llmdiag.sim.server import SimServer

app = typer.Typer(add_completion=False)


def parse_levels(text: str, what: str) -> list[float]:
    try:
        levels = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{what} {text!r} is not a number or a comma-separated list", "e.g. 1,8,32,128") from None
    if not levels:
        raise UsageError(f"{what} is empty", "e.g. 1,8,32,128")
    return levels


@dataclass(frozen=True, kw_only=True)
class LoadFlags:
    """The load: its levels (users or arrival rates), each level's window, the requests, the SLOs."""

    users: Annotated[
        str | None, typer.Option("--users", "-u", help="Closed-loop users: N, or a sweep like 1,8,32.")
    ] = None
    sweep: Annotated[str | None, typer.Option("--sweep", help="The same as --users with a list: 1,8,32,128.")] = None
    rate: Annotated[
        str | None, typer.Option("--rate", help="Open-loop Poisson arrivals per second: R, or a list 1,2,4.")
    ] = None
    duration: Annotated[float, typer.Option("--duration", "-d", help="Measured seconds per level.")] = 20.0
    warmup: Annotated[float, typer.Option("--warmup", help="Seconds of load before each level's window.")] = 3.0
    requests_cap: Annotated[int, typer.Option("--requests", help="At most this many requests per level.")] = 20_000
    prompt_tokens: Annotated[
        str, typer.Option("--prompt-tokens", help="Prompt length: 256, 128:512 (uniform) or normal:256,64.")
    ] = "256"
    output_tokens: Annotated[
        str, typer.Option("--output-tokens", help="Output length (ignore_eos): 128, 64:256 or normal:128,32.")
    ] = "128"
    model: Annotated[str | None, typer.Option("--model", help="Model name (default: the server's first).")] = None
    chat: Annotated[bool, typer.Option("--chat", help="Use /v1/chat/completions.")] = False
    think_time: Annotated[float, typer.Option("--think-time", help="Seconds a user waits between requests.")] = 0.0
    slo_ttft: Annotated[float | None, typer.Option("--slo-ttft", help="Goodput: TTFT at most this (s).")] = None
    slo_tpot: Annotated[float | None, typer.Option("--slo-tpot", help="Goodput: TPOT at most this (s).")] = None
    allow_remote: Annotated[
        bool, typer.Option("--allow-remote", help="Allow a server that is not on this machine.")
    ] = False
    seed: Annotated[int, typer.Option("--seed", help="Seed of the lengths, prompts and arrival times.")] = 0

    def given(self) -> list[str]:
        """The flags that shape a load, where given: a replayed workload brings its own."""
        defaults = LoadFlags()
        shaping = {
            "--users": self.users is not None,
            "--sweep": self.sweep is not None,
            "--rate": self.rate is not None,
            "--duration": self.duration != defaults.duration,
            "--warmup": self.warmup != defaults.warmup,
            "--requests": self.requests_cap != defaults.requests_cap,
            "--prompt-tokens": self.prompt_tokens != defaults.prompt_tokens,
            "--output-tokens": self.output_tokens != defaults.output_tokens,
            "--chat": self.chat,
            "--think-time": self.think_time != defaults.think_time,
            "--seed": self.seed != defaults.seed,
            "--slo-ttft": self.slo_ttft is not None,
            "--slo-tpot": self.slo_tpot is not None,
        }
        return [flag for flag, on in shaping.items() if on]

    def plan(self, timeout_seconds: float) -> LoadPlan:
        if (self.users or self.sweep) and self.rate:
            raise UsageError("give users (--users/--sweep) or --rate, not both")
        closed = self.rate is None
        levels = (
            parse_levels(self.rate, "--rate") if self.rate else parse_levels(self.users or self.sweep or "8", "--users")
        )
        return LoadPlan(
            levels=levels,
            mode="closed" if closed else "open",
            duration_seconds=self.duration,
            warmup_seconds=self.warmup,
            max_requests=self.requests_cap,
            prompt_tokens=TokenLengths.parse(self.prompt_tokens, "--prompt-tokens"),
            output_tokens=TokenLengths.parse(self.output_tokens, "--output-tokens"),
            model=self.model,
            chat=self.chat,
            think_time_seconds=self.think_time,
            allow_remote=self.allow_remote,
            seed=self.seed,
            timeout_seconds=timeout_seconds,
        )


@dataclass(frozen=True, kw_only=True)
class ReplayFlags:
    """A recorded workload: save this run's, or replay one and compare it with a baseline run of it."""

    save_workload: Annotated[
        Path | None, typer.Option("--save-workload", help="Record this load (with its seed) to replay later.")
    ] = None
    workload_file: Annotated[
        Path | None, typer.Option("--workload", help="Replay a recorded workload exactly (same seed).")
    ] = None
    baseline: Annotated[
        Path | None,
        typer.Option("--baseline", help="A saved `load --json` run of the same workload: report every difference."),
    ] = None
    prediction: Annotated[
        Path | None, typer.Option("--prediction", help="`whatif --json` output: print it beside the measurement.")
    ] = None


@dataclass(frozen=True, kw_only=True)
class LoadTargetFlags:
    """The server under load: how to reach it and its telemetry (scan's flags, with a request's timeout)."""

    metrics_url: MetricsUrlOpt = None
    dcgm_url: DcgmUrlOpt = None
    nvml: NvmlOpt = True
    pid: PidOpt = None
    header: HeaderOpt = None
    api_key: ApiKeyOpt = None
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds without a byte before a request fails.")] = 60.0
    insecure: InsecureOpt = False

    def connection(self, url: str) -> Connection:
        # the scrapes keep scan's short timeout; the load's requests wait up to --timeout for each byte
        scrapes = ConnectionFlags(
            metrics_url=self.metrics_url,
            header=self.header,
            api_key=self.api_key,
            timeout=min(self.timeout, 10.0),
            insecure=self.insecure,
        )
        return scrapes.connection(url)


@dataclass(frozen=True, kw_only=True)
class LoadOutputFlags:
    """What the load report becomes."""

    output: Annotated[Path | None, typer.Option("--output", "-o", help="Also write the report as JSON.")] = None
    as_json: JsonOpt = False
    config: ConfigOpt = None
    html: HtmlOpt = None
    markdown: MarkdownOpt = False
    record: RecordOpt = None


@app.command()
@flag_groups
def load(
    url: Annotated[
        str | None, typer.Argument(help="The server's base URL. None: the built-in simulator (--preset).")
    ] = None,
    *,
    workload: LoadFlags,
    preset: Annotated[str, typer.Option("--preset", help="Simulator state when no URL is given.")] = "healthy",
    target: LoadTargetFlags,
    replay: ReplayFlags,
    output: LoadOutputFlags,
) -> None:
    """Drive a bounded load (closed-loop users or open-loop arrivals), level by level, and diagnose each level."""
    try:
        check_outputs(output.as_json, output.markdown)
        for path, flag in (
            (replay.save_workload, "--save-workload"),
            (output.output, "--output"),
            (output.html, "--html"),
            (output.record, "--record"),
        ):
            check_writable(path, flag)
        run = prepare(workload, replay, target.timeout, load_settings(output.config))
        options = flags_json(url=url, preset=None if url else preset, workload=workload, target=target)
        with recording(output.record, "load", options):  # each level's scan is one run of the bundle
            if url is None:
                report = load_simulator(preset, run, output.as_json)
            else:
                connection = target.connection(url)
                telemetry = telemetry_options(target.dcgm_url, target.nvml, target.pid)
                report = drive(connection, telemetry, run, output.as_json)
    except LlmdiagError as error:
        fail(error)
    # a sweep takes minutes: a file that cannot be written is reported after the report is printed, not instead
    saved, out, html, workload_ = replay.save_workload, output.output, output.html, report.workload
    unwritten = (
        None if saved is None or workload_ is None else written(lambda: save_workload(saved, workload_)),
        None if out is None else written(lambda: write_output(out, report.model_dump_json(indent=2))),
        None if html is None else written(lambda: write_html(html, report, quiet=output.as_json or output.markdown)),
    )
    if output.as_json:
        print_json(report.model_dump_json(indent=2))
    elif output.markdown:
        sys.stdout.write(render_markdown(report))
    else:
        stdout.print(render_load(report))
    fail_if(*unwritten)
    raise typer.Exit(EXIT_OK)


@dataclass
class Run:
    """What one `load` runs: the plan, its SLOs and settings, the workload it records or replays, the A/B."""

    plan: LoadPlan
    settings: Settings
    slo_ttft: float | None
    slo_tpot: float | None
    workload: Workload | None = None
    ab: AB | None = None


def prepare(flags: LoadFlags, replay: ReplayFlags, timeout: float, settings: Settings) -> Run:
    """The plan from the flags, or from a recorded workload (which then brings its own shape and SLOs)."""
    if replay.baseline is not None and replay.workload_file is None:
        raise UsageError("--baseline compares a replay: give the workload it ran", "add --workload W.json")
    if replay.prediction is not None and replay.baseline is None:
        raise UsageError("--prediction is shown beside an A/B", "add --baseline BEFORE.json (and --workload W.json)")
    if replay.workload_file is None:
        plan = flags.plan(timeout)
        plan.validate_levels()  # before a simulator is started for nothing
        slo_tpot = flags.slo_tpot
        recorded = None
        if replay.save_workload is not None:
            # goodput of a recorded workload is always judged: under the TPOT SLO the verdicts use
            slo_tpot = slo_tpot if slo_tpot is not None else settings.slo_tpot_seconds
            recorded = workload_of(plan, flags.slo_ttft, slo_tpot)
        # the goodput SLO is also the one each level's verdict judges slow decode against
        return Run(plan, with_slo(settings, flags.slo_tpot), flags.slo_ttft, slo_tpot, recorded)
    given = flags.given()
    if given:
        raise UsageError(
            f"{given[0]} with --workload: a replay sends exactly the recorded load",
            "leave the load's flags out, or record a new workload with --save-workload",
        )
    recorded = read_workload(replay.workload_file)
    plan = plan_of(recorded, timeout_seconds=timeout, allow_remote=flags.allow_remote)
    plan.model = flags.model or plan.model  # a server that serves several: the one to compare
    plan.validate_levels()
    ab = None
    if replay.baseline is not None:
        baseline = load_result(replay.baseline)
        if not isinstance(baseline, LoadReport):
            raise UsageError(f"{replay.baseline} is not a `load` result", "give the --json (or -o) of a load run")
        prediction = read_prediction(replay.prediction) if replay.prediction is not None else None
        ab = AB(baseline, str(replay.baseline), prediction, str(replay.prediction or ""))
    settings = with_slo(settings, recorded.slo_tpot_seconds)
    return Run(plan, settings, recorded.slo_ttft_seconds, recorded.slo_tpot_seconds, recorded, ab)


def save_workload(path: Path, workload: Workload) -> None:
    try:
        write_atomic(path, workload.model_dump_json(indent=2) + "\n")
    except OSError as exc:
        raise cannot_write(path, exc, "--save-workload") from None


def load_simulator(preset: str, run: Run, quiet: bool) -> LoadReport:
    """No URL: the load runs against the built-in simulator in the preset's state."""
    with SimServer(get_preset(preset)) as sim:
        if not quiet:
            note(f"no server given: loading the built-in simulator ({preset}) at {sim.url}")
        telemetry = TelemetryOptions(dcgm_url=sim.dcgm_url, nvml="off", host=False)
        return drive(Connection(base_url=sim.url), telemetry, run, quiet)


def drive(connection: Connection, telemetry: TelemetryOptions, run: Run, quiet: bool) -> LoadReport:
    """Run the load's levels with a progress bar (or a line per level) on stderr."""
    plan = run.plan
    level_seconds = plan.warmup_seconds + plan.duration_seconds
    with load_progress(len(plan.levels) * (level_seconds + 1.0), quiet=quiet) as show:

        def say(index: int, total: int, level: float) -> None:
            users = f"{level:g} user" + ("s" if level != 1 else "")
            what = users if plan.mode == "closed" else f"{level:g} requests/s"
            show(f"level {index + 1}/{total}: {what} for {level_seconds:g} s")

        return run_load(
            connection,
            plan,
            telemetry,
            run.settings,
            run.slo_ttft,
            run.slo_tpot,
            on_level=say,
            workload=run.workload,
            ab=run.ab,
        )
