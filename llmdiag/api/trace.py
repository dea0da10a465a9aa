"""`llmdiag trace` as a library call: read profiler traces, analyse them, and judge their communication."""

from __future__ import annotations

from pathlib import Path

from llmdiag.collect.trace.analysis import analyze
from llmdiag.collect.trace.signals import trace_signals
from llmdiag.config import Settings
from llmdiag.engine.evaluate import build_verdict
from llmdiag.model import TraceReport


def analyze_traces(
    paths: list[Path], link: str | None = None, hta_compat: bool = False, settings: Settings | None = None
) -> TraceReport:
    """Read PyTorch profiler (Kineto) traces, one file per rank (files, or folders of *.json / *.json.gz), and judge
    their communication: per-rank shares, collectives, the straggler, and the network rules on those signals.

    Files that cannot be read are listed in ``report.problems`` (kind "error") and the other ranks are still analysed.
    """
    report = analyze(paths, link=link, hta_compat=hta_compat)
    if report.ranks:
        verdict = build_verdict(trace_signals(report), settings, target=", ".join(report.paths))
        if not verdict.findings:
            verdict.summary = (
                "No communication finding in the trace. A trace shows GPU time and collectives only; memory, "
                "scheduling and what users see need a scan of the server."
            )
        report.verdict = verdict
    return report
