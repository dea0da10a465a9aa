"""A trace report as the signals the network rules judge, alone or joined to a scan's."""

from __future__ import annotations

import statistics

from llmdiag.collect.trace.analysis import LARGE_MESSAGE_BYTES
from llmdiag.errors import option
from llmdiag.model import (
    Signal,
    SignalSet,
    SourceInfo,
    TraceReport,
    Window,
)

TRACE_SOURCE = "torch profiler trace"
# the signals made here are declared, with their meaning, in probes/signals.toml (producer "trace")


# ---------------------------------------------------------------------------------------------
# signals for the rules


def _derived(name: str, unit: str, value: float | None, reason: str, by_series: dict[str, float] | None = None):
    if value is None:
        return Signal.missing(name, "derived", unit, reason, source=TRACE_SOURCE)
    return Signal(
        name=name,
        kind="derived",
        unit=unit,
        stats={"value": value},
        source=TRACE_SOURCE,
        verify="llmdiag trace PATH…  # per-rank table; open the files in https://ui.perfetto.dev to see the streams",
        by_series=by_series or {},
    )


def trace_signals(report: TraceReport) -> SignalSet:
    """The report as signals: worst rank for shares and bandwidth, per-rank values in by_series."""
    signals = SignalSet(window=Window(kind="window", note="profiler trace capture"))
    # the GPU shares come from GPU timelines only; a CPU-only (gloo) rank's CPU shares are in the report, not here
    ranks = [r for r in report.ranks if r.busy_seconds and r.timeline == "gpu"]
    label = {id(r): f"rank {r.rank}" if r.rank is not None else r.path for r in ranks}

    def worst(attr: str, pick=max) -> tuple[float | None, dict[str, float]]:
        values = {label[id(r)]: getattr(r, attr) for r in ranks if getattr(r, attr) is not None}
        return (pick(values.values()) if values else None), values

    no_gpu = "the trace has no GPU activity"
    if any(r.timeline == "cpu" for r in report.ranks) and not ranks:
        no_gpu = "a CPU-only trace (gloo): no GPU time; its CPU shares are in `llmdiag trace`'s per-rank table"
    value, series = worst("busy_ratio", min)
    signals.add(_derived("trace_gpu_busy_ratio", "ratio", value, no_gpu, series))
    value, series = worst("comm_share_ratio")
    signals.add(_derived("comm_share_of_gpu_time_ratio", "ratio", value, no_gpu, series))
    value, series = worst("exposed_comm_share_ratio")
    signals.add(_derived("exposed_comm_share_of_step_ratio", "ratio", value, no_gpu, series))
    value, series = worst("overlap_ratio", min)
    no_comm = no_gpu if not ranks else "no communication kernels"
    signals.add(_derived("comm_compute_overlap_ratio", "ratio", value, no_comm, series))
    s = report.straggler
    why = report.cross_rank or "one rank"
    signals.add(_derived("straggler_rank", "rank", float(s.rank) if s else None, why))
    signals.add(_derived("straggler_skew_seconds", "seconds", s.skew_seconds if s else None, why))
    spans = [r.span_seconds for r in report.ranks if r.span_seconds]
    share = s.skew_seconds / statistics.median(spans) if s and spans else None
    signals.add(_derived("straggler_skew_share_of_step_ratio", "ratio", share, why))
    value, series = worst("large_message_busbw_bytes_per_second", min)
    no_large = f"no collective of {LARGE_MESSAGE_BYTES >> 20} MiB or more with a known size"
    signals.add(_derived("collective_bus_bandwidth_bytes_per_second", "bytes_per_second", value, no_large, series))
    expected = report.expected_busbw_bytes_per_second
    no_link = f"the link is unknown: pass {option('link')} (nvlink4, pcie4x16, ib-ndr …)"
    signals.add(_derived("expected_link_bus_bandwidth_bytes_per_second", "bytes_per_second", expected, no_link))
    ratio = value / expected if value is not None and expected else None
    signals.add(_derived("collective_bus_bandwidth_vs_link_ratio", "ratio", ratio, no_large if expected else no_link))
    signals.sources.append(
        SourceInfo(probe="torch_trace", url=", ".join(report.paths), note=f"{len(report.ranks)} rank trace(s)")
    )
    return signals


def merge_trace_signals(signals: SignalSet, report: TraceReport) -> None:
    """`llmdiag scan --trace DIR`: the trace's signals join the scan's before it is judged (the scan's own win)."""
    extra = trace_signals(report)
    for name, signal in extra.signals.items():
        signals.signals.setdefault(name, signal)
    signals.sources += extra.sources
