"""The library entry point: ``diagnose(...) -> Verdict``. The CLI is a thin shell around it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from llmdiag._version import __version__
from llmdiag.client.endpoint import Connection, redact_url
from llmdiag.collect.canary import LABEL as CANARY_LABEL
from llmdiag.collect.load import LoadPlan, preflight, run_level
from llmdiag.collect.metrics import (
    DEFAULT_DURATION_SECONDS,
    ProgressCallback,
    TelemetryOptions,
    collect_files,
    collect_live,
)
from llmdiag.collect.promql import PrometheusResult, PrometheusSource
from llmdiag.collect.source import unavailable_source
from llmdiag.config import Settings
from llmdiag.engine.baseline import Baseline, add_baseline_signals
from llmdiag.engine.capacity import roofline_for_window, roofline_signal
from llmdiag.engine.derived import add_derived
from llmdiag.engine.evaluate import build_verdict
from llmdiag.engine.load import find_knee, summarise
from llmdiag.engine.trace import analyze_traces as analyze_traces  # the library API for traces
from llmdiag.engine.trace import merge_trace_signals
from llmdiag.model import FleetReport, LoadReport, SignalSet, TraceReport, Verdict
from llmdiag.physics.step import Deployment


def diagnose(
    connection: Connection,
    duration_seconds: float = DEFAULT_DURATION_SECONDS,
    settings: Settings | None = None,
    on_progress: ProgressCallback | None = None,
    telemetry: TelemetryOptions | None = None,
    deployment: Deployment | None = None,
    canary: bool = False,
    canary_off_reason: str = "",
    baseline: Baseline | None = None,
    trace: TraceReport | None = None,
    server: str | None = None,
) -> Verdict:
    """Scan a live server and its telemetry (NVML, a DCGM exporter page, the host) over a window and judge it.

    ``server`` names the server's probe (vllm, sglang, tgi, llamacpp …); None works it out from what the server
    answers (``llmdiag.collect.detect``), and the coverage says which was picked and why.

    With the ``deployment`` (GPU, model, TP) known, the verdict also places the measured decode rate under the
    physics ceiling, which tells a compute verdict whether math or HBM bandwidth is the wall. With a ``baseline``
    (medians of the target's past checks, from `llmdiag check`'s history), the regression rules compare against it.
    """
    from llmdiag.collect.detect import check_server_name, note_server_choice

    probe = check_server_name(server) if server is not None else None  # None: detected by collect_live
    signals = collect_live(
        connection, duration_seconds, probe=probe, on_progress=on_progress, telemetry=telemetry, canary=canary
    )
    if probe is not None:
        note_server_choice(signals, probe, f"--server {probe} given")
    if not canary and canary_off_reason:
        note = f"{CANARY_LABEL}: not sent ({canary_off_reason})"
        signals.sources.append(unavailable_source("canary", CANARY_LABEL, note))
    if baseline is not None:
        add_baseline_signals(signals, baseline)
    if trace is not None:
        merge_trace_signals(signals, trace)
    roofline = None
    if deployment is not None:
        add_derived(signals)  # the roofline reads the window's batch; the rules may then cite the roofline
        roofline = roofline_for_window(deployment, signals)
        if roofline is not None:
            signals.add(roofline_signal(roofline))
    verdict = build_verdict(signals, settings, target=redact_url(connection.base_url))
    verdict.tool_version = __version__
    verdict.roofline = roofline
    return verdict


DEMO_WARMUP_SECONDS = 3.0


def run_demo(
    preset_name: str,
    duration_seconds: float = DEFAULT_DURATION_SECONDS,
    settings: Settings | None = None,
    on_progress: ProgressCallback | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> Verdict:
    """Start the simulator in a preset state, drive its bounded load, and scan it like any server.

    The scan is the same code path as ``diagnose``: the simulator speaks vLLM on the wire, and its DCGM page is
    read as a dcgm-exporter's would be with ``--dcgm-url``.
    """
    from llmdiag.sim.presets import get_preset
    from llmdiag.sim.server import ClosedLoopLoad, SimServer

    preset = get_preset(preset_name)
    say = on_phase or (lambda _: None)
    with SimServer(preset) as server:
        say(f"simulated vLLM at {server.url}: {preset.summary}")
        max_seconds = DEMO_WARMUP_SECONDS + duration_seconds + 30
        with ClosedLoopLoad(server.url, server.model, preset.load, max_seconds=max_seconds):
            say(f"driving {preset.load.users} users for {DEMO_WARMUP_SECONDS:.0f} s before the scan")
            time.sleep(DEMO_WARMUP_SECONDS)
            verdict = diagnose(
                Connection(base_url=server.url),
                duration_seconds,
                settings,
                on_progress,
                # the simulator's GPUs are on its DCGM page; this machine's GPUs and CPU are not the server's
                telemetry=TelemetryOptions(dcgm_url=server.dcgm_url, nvml="off", host=False),
                canary=True,
                deployment=preset.deployment,
            )
    verdict.target = f"llmdiag demo --preset {preset.name} ({verdict.target})"
    return verdict


def diagnose_files(
    paths: list[Path], settings: Settings | None = None, max_bytes: int | None = None, server: str | None = None
) -> Verdict:
    """Judge saved /metrics dumps: one gives lifetime averages, two or more a window between them. ``server``
    names the server's probe; None works it out from the dumps' metric prefixes."""
    kwargs = {"max_bytes": max_bytes} if max_bytes else {}
    signals = collect_files(paths, probe=server, **kwargs)
    target = str(paths[0]) if len(paths) == 1 else f"{len(paths)} dumps: {paths[0]} … {paths[-1]}"
    verdict = build_verdict(signals, settings, target=target)
    verdict.tool_version = __version__
    return verdict


def diagnose_logs(
    paths: list[Path],
    settings: Settings | None = None,
    since: str | None = None,
    until: str | None = None,
    max_bytes: int | None = None,
) -> Verdict:
    """Judge server logs (vLLM stat-logger lines, SGLang batch lines, TensorRT-LLM iteration JSON) over the time they
    cover, or the part of it between ``since`` and ``until`` (ISO times, or spans like ``30m`` before the last line)."""
    from llmdiag.collect.logs import collect_logs

    kwargs = {"max_bytes": max_bytes} if max_bytes else {}
    signals = collect_logs(paths, since=since, until=until, **kwargs)
    target = str(paths[0]) if len(paths) == 1 else f"{len(paths)} logs: {paths[0]} … {paths[-1]}"
    verdict = build_verdict(signals, settings, target=target)
    verdict.tool_version = __version__
    return verdict


def run_load(
    connection: Connection,
    plan: LoadPlan,
    telemetry: TelemetryOptions | None = None,
    settings: Settings | None = None,
    slo_ttft_seconds: float | None = None,
    slo_tpot_seconds: float | None = None,
    on_level: Callable[[int, int, float], None] | None = None,
) -> LoadReport:
    """Drive each load level in turn, scanning the server while it runs; the report has every level and the knee.

    A level whose scan fails (metrics unreachable) keeps its client-side numbers and says why in the notes.
    """
    plan.validate(connection.base_url)
    plan.model = asyncio.run(preflight(connection, plan))
    report = LoadReport(
        tool_version=__version__,
        target=redact_url(connection.base_url),
        mode="closed" if plan.mode == "closed" else "open",
        prompt_tokens=plan.prompt_tokens.text,
        output_tokens=plan.output_tokens.text,
        slo_ttft_seconds=slo_ttft_seconds,
        slo_tpot_seconds=slo_tpot_seconds,
    )
    for index, level in enumerate(plan.levels):
        if on_level:
            on_level(index, len(plan.levels), level)
        run = asyncio.run(run_level(connection, plan, level, telemetry))
        report.model = report.model or run.model
        point = summarise(
            run.results,
            run.window_start,
            run.window_end,
            users=int(level) if plan.mode == "closed" else None,
            rate_per_second=level if plan.mode == "open" else None,
            slo_ttft_seconds=slo_ttft_seconds,
            slo_tpot_seconds=slo_tpot_seconds,
        )
        if run.signals is not None:
            point.verdict = build_verdict(run.signals, settings, target=report.target)
            point.verdict.tool_version = __version__
        else:
            report.notes.append(f"at {level:g}: no server-side diagnosis ({run.scan_error})")
        report.points.append(point)
    report.knee = find_knee(report.points, slo_given=slo_ttft_seconds is not None or slo_tpot_seconds is not None)
    return report


def diagnose_fleet(
    targets: list[tuple[str, Connection]],
    duration_seconds: float = DEFAULT_DURATION_SECONDS,
    settings: Settings | None = None,
    concurrency: int = 8,
    target_timeout_seconds: float | None = None,
    canary: bool = True,
    canary_off_reason: str = "",
    telemetry: TelemetryOptions | None = None,
    server: str | None = None,
) -> FleetReport:
    """Scan several replicas of one service at once (``concurrency`` at a time, each in its own worker, each over
    its own window) and judge them side by side: per-replica verdicts, class counts, imbalance, worst first.

    A target that cannot be scanned (unreachable, not a metrics page, past ``target_timeout_seconds``) is a row
    with its error and class ``unknown``; the others are still judged and compared without it.
    """
    from llmdiag.engine.fleet import build_fleet, target_from_error, target_from_verdict
    from llmdiag.errors import LlmdiagError
    from llmdiag.runner import run_bounded

    settings = settings or Settings()
    telemetry = telemetry or TelemetryOptions(nvml="off", host=False)

    def one(item: tuple[str, Connection]):
        name, connection = item
        verdict = diagnose(
            connection,
            duration_seconds,
            settings,
            telemetry=telemetry,
            canary=canary,
            canary_off_reason=canary_off_reason,
            server=server,
        )
        return target_from_verdict(name, redact_url(connection.base_url), verdict)

    def failed(item: tuple[str, Connection], error: BaseException):
        name, connection = item
        if isinstance(error, LlmdiagError):
            return target_from_error(name, redact_url(connection.base_url), error.message, error.hint)
        return target_from_error(
            name,
            redact_url(connection.base_url),
            f"internal error: {type(error).__name__}: {error}",
            "this is a bug in llmdiag; rerun with LLMDIAG_DEBUG=1",
        )

    def timed_out(item: tuple[str, Connection], seconds: float):
        name, connection = item
        return target_from_error(
            name,
            redact_url(connection.base_url),
            f"no verdict within {seconds:g} s",
            "raise --target-timeout, or check that the server answers /metrics quickly",
        )

    started = time.time()
    results = run_bounded(
        targets,
        one,
        concurrency,
        timeout_seconds=target_timeout_seconds,
        on_timeout=timed_out,
        on_error=failed,
        name="llmdiag-fleet",
    )
    return build_fleet(
        results, settings, source=f"{len(targets)} direct targets", window_seconds=duration_seconds, at_unix=started
    )


def fleet_from_signal_sets(
    instances: dict[str, SignalSet],
    settings: Settings | None = None,
    source: str = "",
    window_seconds: float | None = None,
    at_unix: float | None = None,
    errors: dict[str, str] | None = None,
) -> FleetReport:
    """Judge per-instance SignalSets (e.g. a Prometheus selector's instances) as a fleet."""
    from llmdiag.engine.fleet import build_fleet, target_from_error, target_from_verdict

    targets = []
    for name, signals in sorted(instances.items()):
        verdict = build_verdict(signals, settings, target=name)
        verdict.tool_version = __version__
        targets.append(target_from_verdict(name, "", verdict))
    targets += [target_from_error(name, "", message) for name, message in sorted((errors or {}).items())]
    return build_fleet(targets, settings, source=source, window_seconds=window_seconds, at_unix=at_unix)


def diagnose_prometheus(
    source: PrometheusSource,
    selector: str | None = None,
    at_unix: float | None = None,
    window_seconds: float | None = None,
    settings: Settings | None = None,
) -> tuple[dict[str, Verdict], PrometheusResult]:
    """Judge every instance a Prometheus selector holds, over [at - W, at], from PromQL (``llmdiag.collect.promql``):
    a verdict per instance (key: 'job/instance', or 'namespace/pod'), and the collection's result (queries, notes).
    An instance without data has every signal unavailable, so its verdict is ``unknown``."""
    from llmdiag.collect.promql import collect_prometheus

    result = collect_prometheus(source, selector, at_unix, window_seconds)
    return _judge_instances(result, settings), result


def diagnose_prometheus_timeline(
    source: PrometheusSource,
    selector: str | None,
    start_unix: float,
    end_unix: float,
    step_seconds: float | None = None,
    settings: Settings | None = None,
) -> list[tuple[float, dict[str, Verdict], PrometheusResult]]:
    """Each instance's verdict at each step of [start, end] (over the step before it): when a class changed."""
    from llmdiag.collect.promql import collect_prometheus_timeline

    steps = collect_prometheus_timeline(source, selector, start_unix, end_unix, step_seconds)
    return [(t, _judge_instances(result, settings), result) for t, result in steps]


def _judge_instances(result: PrometheusResult, settings: Settings | None) -> dict[str, Verdict]:
    verdicts: dict[str, Verdict] = {}
    for key, signals in result.instances.items():
        verdict = build_verdict(signals, settings, target=f"{key} (prometheus {result.prometheus_url})")
        verdict.tool_version = __version__
        verdicts[key] = verdict
    return verdicts


def _no_data(signals: SignalSet) -> str | None:
    """Why Prometheus holds nothing to judge for this instance (it is up, but no server series), or None."""
    for info in signals.sources:
        if info.probe == "prometheus" and not info.ok:
            return info.note or "no inference-server series in the window"
    return None


def fleet_from_prometheus(
    result: PrometheusResult, settings: Settings | None = None, selector: str | None = None
) -> FleetReport:
    """One Prometheus evaluation judged as a fleet: an instance without data is a row saying so (class unknown,
    left out of the comparisons), never a healthy one."""
    instances, errors = {}, {}
    for key, signals in result.instances.items():
        reason = _no_data(signals)
        if reason is None:
            instances[key] = signals
        else:
            errors[key] = reason
    where = f"prometheus {result.prometheus_url}" + (f" {selector}" if selector else "")
    report = fleet_from_signal_sets(
        instances, settings, source=where, window_seconds=result.window_seconds, at_unix=result.end_unix, errors=errors
    )
    report.queries, report.scrape_interval_seconds = result.queries, result.scrape_interval_seconds
    report.notes += result.notes
    return report


def diagnose_prometheus_fleet(
    source: PrometheusSource,
    selector: str | None = None,
    at_unix: float | None = None,
    window_seconds: float | None = None,
    settings: Settings | None = None,
) -> FleetReport:
    """Every instance of a Prometheus selector over [at - W, at], judged side by side as a direct multi-target scan
    is: per-replica classes and numbers, class counts, imbalance (SCH008/SCH009), worst first."""
    from llmdiag.collect.promql import collect_prometheus

    return fleet_from_prometheus(collect_prometheus(source, selector, at_unix, window_seconds), settings, selector)


def diagnose_prometheus_fleet_timeline(
    source: PrometheusSource,
    selector: str | None,
    start_unix: float,
    end_unix: float,
    step_seconds: float | None = None,
    settings: Settings | None = None,
) -> FleetReport:
    """The fleet over [start, end], one verdict per instance per step (over the step before it): the timeline's
    transitions and the first replica to go (``llmdiag.engine.fleet.build_timeline``), and the replicas table at
    the worst step (the most replicas in a bottleneck class; the latest such step on a tie). An instance without data
    at a step is absent from that step (a gap), never healthy."""
    from llmdiag.collect.promql import collect_prometheus_timeline
    from llmdiag.engine.fleet import BAD_CLASSES, build_timeline
    from llmdiag.model import FleetStep

    steps = collect_prometheus_timeline(source, selector, start_unix, end_unix, step_seconds)
    fleet_steps: list[FleetStep] = []
    worst: tuple[tuple[int, int, float], PrometheusResult] | None = None
    for t, result in steps:
        verdicts = {
            key: v for key, v in _judge_instances(result, settings).items() if _no_data(result.instances[key]) is None
        }
        fleet_steps.append(FleetStep(at_unix=t, classes={key: v.bottleneck for key, v in verdicts.items()}))
        bad = sum(1 for v in verdicts.values() if v.bottleneck in BAD_CLASSES)
        severity = sum((v.worst_severity().rank if v.worst_severity() else 0) for v in verdicts.values())
        rank = (bad, severity, t)
        if worst is None or rank >= worst[0]:
            worst = (rank, result)
    step = steps[0][1].window_seconds if steps else step_seconds
    assert worst is not None  # collect_prometheus_timeline gives at least one step or raises
    report = fleet_from_prometheus(worst[1], settings, selector)
    report.timeline = build_timeline(fleet_steps, step)
    report.notes.insert(
        0,
        f"a timeline of {len(steps)} steps of {step:g} s; the replicas table shows the step ending "
        f"at {_utc(worst[1].end_unix)}, the worst (most replicas in a bottleneck class)",
    )
    return report


def _utc(unix: float | None) -> str:
    from datetime import datetime, timezone

    if unix is None:
        return "?"
    return datetime.fromtimestamp(unix, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
