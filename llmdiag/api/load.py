"""`llmdiag load` as a library call: drive bounded load level by level and judge each level."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from llmdiag.api.record import ScanCall, active_recorder
from llmdiag.api.trace import analyze_traces as analyze_traces
from llmdiag.client.endpoint import Connection, redact_url
from llmdiag.collect.live import TelemetryOptions
from llmdiag.collect.load import LoadPlan, preflight, run_level, server_facts
from llmdiag.config import Settings
from llmdiag.engine.abtest import check_comparable, compare
from llmdiag.engine.evaluate import build_verdict
from llmdiag.engine.load import find_knee, summarise
from llmdiag.errors import UsageError, option
from llmdiag.model import LoadReport
from llmdiag.model.whatif import WhatIf
from llmdiag.model.workload import Workload


class AB:
    """A replay's comparison: the baseline run (a saved LoadReport of the same workload) and, optionally,
    whatif's prediction to print beside the measurement; the names are the files they came from."""

    def __init__(
        self, baseline: LoadReport, baseline_name: str, prediction: WhatIf | None = None, prediction_name: str = ""
    ) -> None:
        self.baseline, self.baseline_name = baseline, baseline_name
        self.prediction, self.prediction_name = prediction, prediction_name


def run_load(
    connection: Connection,
    plan: LoadPlan,
    telemetry: TelemetryOptions | None = None,
    settings: Settings | None = None,
    slo_ttft_seconds: float | None = None,
    slo_tpot_seconds: float | None = None,
    on_level: Callable[[int, int, float], None] | None = None,
    workload: Workload | None = None,
    ab: AB | None = None,
) -> LoadReport:
    """Drive each load level in turn, scanning the server while it runs; the report has every level and the knee.

    A level whose scan fails (metrics unreachable) keeps its client-side numbers and says why in the notes. With
    ``workload`` (recorded, or to replay: ``plan`` is then its plan) the report carries it, stamped with the served
    model and the server's version, and every level keeps its requests; with ``ab`` as well the run is compared
    with the baseline (refused before any load when the workload, model or server version differ).
    """
    plan.validate(connection.base_url)
    stamped = None
    if workload is None:
        plan.model = asyncio.run(preflight(connection, plan))
    else:
        stamped = stamp(connection, plan, workload, ab)
    report = LoadReport(
        workload=stamped,
        target=redact_url(connection.base_url),
        mode="closed" if plan.mode == "closed" else "open",
        prompt_tokens=plan.prompt_tokens.text,
        output_tokens=plan.output_tokens.text,
        slo_ttft_seconds=slo_ttft_seconds,
        slo_tpot_seconds=slo_tpot_seconds,
    )
    recorder = active_recorder()
    for index, level in enumerate(plan.levels):
        if on_level:
            on_level(index, len(plan.levels), level)
        call = ScanCall(connection, plan.duration_seconds, settings, telemetry, kind="collect")
        taping = recorder.tape(f"level {level:g}", call) if recorder is not None else None
        with taping or contextlib.nullcontext():
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
            keep_samples=workload is not None,
        )
        if run.signals is not None:
            point.verdict = build_verdict(run.signals, settings, target=report.target)
        else:
            report.notes.append(f"at {level:g}: no server-side diagnosis ({run.scan_error})")
        if taping is not None:  # the level's scan is one run of the bundle, kept as it was judged
            taping.verdict, taping.error = point.verdict, run.scan_error
        report.points.append(point)
    report.knee = find_knee(report.points, slo_given=slo_ttft_seconds is not None or slo_tpot_seconds is not None)
    if ab is not None:
        report.comparison = compare(ab.baseline, report, ab.baseline_name, ab.prediction, ab.prediction_name)
    return report


def stamp(connection: Connection, plan: LoadPlan, workload: Workload, ab: AB | None) -> Workload:
    """The workload with what serves it now (model, server version); a baseline that differs is refused here,
    before any load. The workload's model is used where it is served; otherwise the server's first."""
    if ab is not None and ab.prediction is not None and len(workload.levels) != 1:
        raise UsageError(
            f"a prediction is for one load, and the workload has {len(workload.levels)} levels",
            f"record a one-level workload ({option('users')} N or {option('rate')} R) to check a prediction",
        )
    served, version, source = asyncio.run(server_facts(connection, plan))
    if not served:
        raise UsageError(f"{redact_url(connection.base_url)}/v1/models lists no model", "is the model loaded yet?")
    model = plan.model if plan.model in served else served[0]
    stamped = workload.model_copy(
        update={
            "model": model,
            "server_version": version,
            "server_version_source": source,
            "target": redact_url(connection.base_url),
        }
    )
    if ab is not None:
        check_comparable(ab.baseline, stamped, ab.baseline_name)
    if plan.model is not None and plan.model not in served:
        raise UsageError(
            f"the workload's model {plan.model!r} is not served there (it serves {', '.join(served)})",
            f"replay it where that model is served, or record a new workload ({option('save_workload')})",
        )
    plan.model = model
    return stamped
