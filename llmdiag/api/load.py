"""`llmdiag load` as a library call: drive bounded load level by level and judge each level."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from llmdiag.api.trace import analyze_traces as analyze_traces
from llmdiag.client.endpoint import Connection, redact_url
from llmdiag.collect.live import TelemetryOptions
from llmdiag.collect.load import LoadPlan, preflight, run_level
from llmdiag.config import Settings
from llmdiag.engine.evaluate import build_verdict
from llmdiag.engine.load import find_knee, summarise
from llmdiag.model import LoadReport


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
        else:
            report.notes.append(f"at {level:g}: no server-side diagnosis ({run.scan_error})")
        report.points.append(point)
    report.knee = find_knee(report.points, slo_given=slo_ttft_seconds is not None or slo_tpot_seconds is not None)
    return report
