"""Fleets: several replicas scanned at once, or a Prometheus selector's instances, judged side by side."""

from __future__ import annotations

import time

from llmdiag.api.scan import diagnose
from llmdiag.api.trace import analyze_traces as analyze_traces
from llmdiag.client.endpoint import Connection, redact_url
from llmdiag.collect import DEFAULT_DURATION_SECONDS
from llmdiag.collect.live import TelemetryOptions
from llmdiag.collect.prometheus.api import PrometheusSource
from llmdiag.collect.prometheus.plan import PrometheusResult
from llmdiag.config import Settings
from llmdiag.engine.evaluate import build_verdict
from llmdiag.model import FleetReport, SignalSet, Verdict


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
    from llmdiag.api.runner import run_bounded
    from llmdiag.engine.fleet import build_fleet, target_from_error, target_from_verdict
    from llmdiag.errors import LlmdiagError, option

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
            f"raise {option('target_timeout_seconds')}, or check that the server answers /metrics quickly",
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
    """Judge every instance a Prometheus selector holds, over [at - W, at], from PromQL
    (``llmdiag.collect.prometheus``): a verdict per instance (key: 'job/instance', or 'namespace/pod'), and the
    collection's result (queries, notes).
    An instance without data has every signal unavailable, so its verdict is ``unknown``."""
    from llmdiag.collect.prometheus.build import collect_prometheus

    result = collect_prometheus(source, selector, at_unix, window_seconds)
    return _judge_instances(result, settings), result


def _judge_instances(result: PrometheusResult, settings: Settings | None) -> dict[str, Verdict]:
    verdicts: dict[str, Verdict] = {}
    for key, signals in result.instances.items():
        verdict = build_verdict(signals, settings, target=f"{key} (prometheus {result.prometheus_url})")
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
    from llmdiag.collect.prometheus.build import collect_prometheus

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
    from llmdiag.collect.prometheus.build import collect_prometheus_timeline
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
        severity = sum((worst_found.rank if (worst_found := v.worst_severity()) else 0) for v in verdicts.values())
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
