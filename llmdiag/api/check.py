"""`llmdiag check`: diagnose each target over a short window and turn the verdicts into Nagios states.

States follow the Nagios plugin conventions: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN. For one target:

- a critical finding → CRITICAL; a warning finding → WARNING (sanity findings, which are about the numbers
  rather than the server, count at most as WARNING); muted rules produce no finding and never count;
- no finding and a ``healthy`` or ``idle`` verdict → OK; an ``unknown`` verdict (too little evidence) → UNKNOWN;
- a target that could not be diagnosed at all (unreachable, refused, not a metrics page) → UNKNOWN.

Deadlines: each target ends by its own (its window + its timeout + the scan's margin + a second for the verdict),
and the whole run by ``deadline_seconds`` (``[check] deadline_seconds``; by default every wave of ``concurrency``
targets at the longest target's deadline, plus a margin: ``default_deadline_seconds``). A target not done by
either is UNKNOWN, saying it did not finish in time: never a hang.

Several targets give the worst state, ranked CRITICAL > WARNING > UNKNOWN > OK (the usual order of Nagios
aggregating checks: a real problem somewhere outranks "could not look" elsewhere).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from llmdiag._version import __version__
from llmdiag.api.runner import run_bounded
from llmdiag.api.scan import diagnose
from llmdiag.api.targets import connection_for
from llmdiag.client.deadline import Deadline, within
from llmdiag.client.endpoint import Connection, redact_url
from llmdiag.collect.live import SCAN_MARGIN_SECONDS, TelemetryOptions, window_cut_at
from llmdiag.collect.prometheus.api import PrometheusSource
from llmdiag.config import Settings, Target
from llmdiag.errors import LlmdiagError, ProbeTimeout, option
from llmdiag.history import CheckRow, History
from llmdiag.model import Severity
from llmdiag.model.check import CheckReport, State, TargetResult, state_of, worst


def check_target(
    target: Target,
    settings: Settings,
    window_seconds: float,
    history: History | None,
    now: float,
    connection: Connection | None = None,
) -> TargetResult:
    """Diagnose one target; any llmdiag error makes it UNKNOWN with the message and hint, never an exception.

    ``connection``: how to reach it when the command line said so (its --header may carry credentials, which a
    config file may not), instead of the target's own settings."""
    url = redact_url(target.url)
    muted = [f"{m.code.upper()}: {m.reason}" for m in settings.mute]
    try:
        connection = connection or connection_for(target)
        baseline = None
        if history is not None:
            baseline = history.baseline(
                target.name, settings.check.baseline_days, settings.check.baseline_min_checks, now=now
            )
        verdict = diagnose(
            connection,
            target.window_seconds or window_seconds,
            settings,
            telemetry=TelemetryOptions(
                dcgm_url=target.dcgm_url, nvml="auto" if target.nvml else "off", pids=list(target.pids)
            ),
            canary=target.probe if target.probe is not None else target.metrics_url is None,
            canary_off_reason="probe = false" if target.probe is False else "metrics_url given",
            baseline=baseline,
        )
    except LlmdiagError as error:
        # a read past its timeout or past a deadline: said the same way as a target the run gave up on
        message = f"did not finish in time: {error.message}" if isinstance(error, ProbeTimeout) else error.message
        return TargetResult(name=target.name, url=url, state=State.UNKNOWN, error=message, hint=error.hint, muted=muted)
    verdict.target = f"{target.name} ({verdict.target})"
    return TargetResult(
        name=target.name,
        url=url,
        state=state_of(verdict),
        verdict=verdict,
        baseline=baseline.describe() if baseline is not None else f"baseline: none ({option('no_history')})",
        muted=muted,
    )


def history_row(result: TargetResult, at_unix: float) -> CheckRow:
    row = CheckRow(
        at_unix=at_unix,
        target=result.name,
        url=result.url,
        state=result.state.name,
        error=result.error,
        tool_version=__version__,
    )
    verdict = result.verdict
    if verdict is not None:
        ex = verdict.experience
        row.bottleneck = verdict.bottleneck.value
        row.confidence = verdict.confidence
        row.window_seconds = verdict.window.duration_seconds
        row.ttft_p95_seconds = ex.ttft_p95_seconds
        row.tpot_p95_seconds = ex.tpot_p95_seconds
        row.itl_p50_seconds = ex.itl_p50_seconds
        row.generation_tokens_per_second = ex.generation_tokens_per_second
        row.requests_running_mean = ex.requests_running_mean
        row.requests_waiting_mean = ex.requests_waiting_mean
        row.findings = " ".join(f"{f.code}:{f.severity.value}" for f in verdict.findings)
    return row


# what a target may take beyond its scan's own deadline: the verdict, the baseline, the history's read (on a
# starved 2-core machine the rules alone can take seconds)
TARGET_MARGIN_SECONDS = 5.0
# what the whole run may take beyond its waves of targets: starting the workers, writing the history
RUN_MARGIN_SECONDS = 5.0


def target_deadline_seconds(target: Target, window_seconds: float, connection: Connection | None = None) -> float:
    """One target's deadline: its window + its timeout + the scan's margin + TARGET_MARGIN_SECONDS."""
    timeout = connection.timeout_seconds if connection is not None else target.timeout_seconds
    return (target.window_seconds or window_seconds) + timeout + SCAN_MARGIN_SECONDS + TARGET_MARGIN_SECONDS


def default_deadline_seconds(
    targets: list[Target], settings: Settings, window_seconds: float, connections: dict[str, Connection] | None = None
) -> float:
    """The run's default total: ceil(targets / concurrency) waves, each as long as the longest target's deadline,
    plus RUN_MARGIN_SECONDS."""
    connections = connections or {}
    if not targets:
        return RUN_MARGIN_SECONDS
    longest = max(target_deadline_seconds(t, window_seconds, connections.get(t.name)) for t in targets)
    waves = math.ceil(len(targets) / settings.check.concurrency)
    return waves * longest + RUN_MARGIN_SECONDS


def run_check(
    targets: list[Target],
    settings: Settings,
    window_seconds: float,
    history: History | None = None,
    connections: dict[str, Connection] | None = None,
    clock: Callable[[], float] = time.time,
    deadline_seconds: float | None = None,
) -> CheckReport:
    """Check every target (``settings.check.concurrency`` at once); one failing target is UNKNOWN, the others
    are still checked. Each result is appended to the history when there is one.

    The run ends by ``deadline_seconds`` (else ``settings.check.deadline_seconds``, else
    ``default_deadline_seconds``) and each target by its own deadline; a target past either is UNKNOWN."""
    now = clock()
    connections = connections or {}
    total_seconds = deadline_seconds or settings.check.deadline_seconds
    if total_seconds is None:
        total_seconds = default_deadline_seconds(targets, settings, window_seconds, connections)
    total = Deadline.after(total_seconds, "the check's deadline")
    muted = [f"{m.code.upper()}: {m.reason}" for m in settings.mute]

    def one(target: Target) -> TargetResult:
        own = Deadline.after(target_deadline_seconds(target, window_seconds, connections.get(target.name)))
        with within(Deadline(own.end, own.seconds, "its deadline").sooner(total)):
            result = check_target(target, settings, window_seconds, history, now, connections.get(target.name))
        # the run's deadline cut its window short: a part of the window asked for is not judged as the whole
        cut = result.verdict is not None and any(window_cut_at(total) in note for note in result.verdict.notes)
        return late(target, -1.0) if cut else result

    def late(target: Target, seconds: float) -> TargetResult:
        """UNKNOWN for a target the deadlines ended (``seconds`` < 0: the run's cut its window short)."""
        own = target_deadline_seconds(target, window_seconds, connections.get(target.name))
        if seconds < 0:
            why = f"did not finish in time: {total.describe()} cut its window short"
        elif seconds == 0:
            why = f"not checked: {total.describe()} passed before its turn"
        elif total.expired():
            why = f"did not finish in time: {total.describe()} passed while it was checked"
        else:
            why = f"did not finish in time: its deadline ({own:g} s: window, timeout and margins) passed"
        return TargetResult(
            name=target.name,
            url=redact_url(target.url),
            state=State.UNKNOWN,
            error=why,
            hint=f"check that the server answers quickly, or raise {option('deadline_seconds')} "
            "([check] deadline_seconds in llmdiag.toml)",
            muted=muted,
        )

    results = run_bounded(
        targets,
        one,
        settings.check.concurrency,
        # a backstop: the scan's own deadline ends the target first, in its own words
        timeout_seconds=max(target_deadline_seconds(t, window_seconds, connections.get(t.name)) for t in targets)
        + TARGET_MARGIN_SECONDS
        if targets
        else None,
        on_timeout=late,
        name="llmdiag-check",
        deadline=total,
    )
    report = CheckReport(
        state=worst([r.state for r in results]),
        at_unix=now,
        targets=results,
        history=str(history.path) if history is not None else None,
    )
    return record_history(report, history, now)


def run_prometheus_check(
    source: PrometheusSource,
    selector: str | None,
    settings: Settings,
    window_seconds: float | None = None,
    history: History | None = None,
    clock: Callable[[], float] = time.time,
    deadline_seconds: float | None = None,
) -> CheckReport:
    """`check --prometheus`: every instance of the selector over the last window, read from PromQL, one target
    each (named by its instance key, which is also its history key), plus the fleet rules across them.

    An instance Prometheus lists but holds no server data for is UNKNOWN with the reason; the fleet rules'
    findings count like a target's (critical → CRITICAL). Prometheus unreachable or refusing raises, and the CLI
    makes that UNKNOWN; so do queries still unanswered at ``deadline_seconds`` (each query also ends by the
    source's timeout)."""
    from llmdiag.api.fleet import fleet_from_prometheus
    from llmdiag.collect.prometheus.build import collect_prometheus
    from llmdiag.engine.baseline import add_baseline_signals

    now = clock()
    total_seconds = deadline_seconds or settings.check.deadline_seconds
    with within(Deadline.after(total_seconds, "the check's deadline") if total_seconds else None):
        result = collect_prometheus(source, selector, now, window_seconds)
    muted = [f"{m.code.upper()}: {m.reason}" for m in settings.mute]
    baselines: dict[str, str] = {}
    if history is not None:
        for key, signals in result.instances.items():
            baseline = history.baseline(key, settings.check.baseline_days, settings.check.baseline_min_checks, now=now)
            add_baseline_signals(signals, baseline)
            baselines[key] = baseline.describe()
    fleet = fleet_from_prometheus(result, settings, selector)
    results = []
    for target in sorted(fleet.targets, key=lambda t: t.name):
        if target.verdict is None:
            results.append(
                TargetResult(
                    name=target.name,
                    url=target.name,
                    state=State.UNKNOWN,
                    error=target.error,
                    hint="check that this instance serves its metrics and that Prometheus "
                    "scrapes it (its 'up' series and /targets page)",
                    muted=muted,
                )
            )
            continue
        verdict = target.verdict
        verdict.target = f"{target.name} ({source.display_url})"
        results.append(
            TargetResult(
                name=target.name,
                url=target.name,
                state=state_of(verdict),
                verdict=verdict,
                baseline=baselines.get(target.name, f"baseline: none ({option('no_history')})"),
                muted=muted,
            )
        )
    fleet_states = [
        State.CRITICAL if f.finding.severity is Severity.critical else State.WARNING for f in fleet.imbalance
    ]
    report = CheckReport(
        state=worst([r.state for r in results] + fleet_states),
        at_unix=now,
        targets=results,
        history=str(history.path) if history is not None else None,
        source=f"{fleet.source} ({result.queries} queries, window {result.window_seconds:g} s)",
        fleet_findings=fleet.imbalance,
        fleet_signals={
            name: signal.stat("value")
            for name, signal in fleet.fleet_signals.items()
            if name.endswith("_over_peers_ratio")
        },
    )
    return record_history(report, history, now)


def record_history(report: CheckReport, history: History | None, now: float) -> CheckReport:
    """Append every target's row to the history; a history that cannot be written is an output error, UNKNOWN."""
    if history is not None:
        try:
            history.record([history_row(r, now) for r in report.targets])
        except LlmdiagError as error:
            report.output_errors.append(f"history not written: {error.message}")
            report.state = worst([report.state, State.UNKNOWN])
    return report
