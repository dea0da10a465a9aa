"""Terminal rendering of a TraceReport (`llmdiag trace`): per-rank table, per-collective table, straggler, findings."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from llmdiag.model import TraceReport
from llmdiag.render.format import milliseconds

NOT_MEASURED = "n/a"  # the trace table's word for a value the trace does not give


def _pct(value: float | None) -> str:
    return NOT_MEASURED if value is None else f"{value * 100:.1f}"


def _bytes(value: float | None) -> str:
    if value is None:
        return NOT_MEASURED
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B"


def _gbps(value: float | None) -> str:
    return NOT_MEASURED if value is None else f"{value / 1e9:.1f}"


def render_trace(report: TraceReport) -> RenderableType:
    parts: list[RenderableType] = []
    mode = "HTA's way (µs-rounded, last ProfilerStep dropped, only nccl…Kernel is communication)"
    head = f"{len(report.ranks)} rank trace(s)"
    if report.world_size:
        head += f" of world size {report.world_size}"
    if report.parse_seconds:
        head += f", {report.bytes_read / 1e6:.1f} MB read in {report.parse_seconds:.2f} s"
    parts.append(Text(head + (f"; counted {mode}" if report.hta_compat else ""), style="bold"))

    on_cpu = any(r.timeline == "cpu" for r in report.ranks)
    title = "Per rank (GPU time)"
    if on_cpu:
        title = "Per rank (CPU time: no GPU activity; comm = gloo:* ranges, compute = cpu_ops)"
        if any(r.timeline == "gpu" for r in report.ranks):
            title = "Per rank (GPU time; CPU time where the device says CPU)"
    ranks = Table(title=title, title_justify="left", show_edge=False)
    for column in ("rank", "device", "span ms", "busy %", "comm %", "exposed %", "overlap %"):
        ranks.add_column(column, justify="left" if column in ("rank", "device") else "right")
    for r in report.ranks:
        label = str(r.rank) if r.rank is not None else escape(r.path)
        device = escape(r.device or ("CPU" if r.timeline == "cpu" else ""))
        ranks.add_row(
            label,
            device,
            milliseconds(r.span_seconds, 2, NOT_MEASURED),
            _pct(r.busy_ratio),
            _pct(r.comm_share_ratio),
            _pct(r.exposed_comm_share_ratio),
            _pct(r.overlap_ratio),
        )
    parts.append(ranks)

    waits = "gloo range" if on_cpu else "kernel"
    colls = Table(title=f"Collectives ({waits} time includes waiting for peers)", title_justify="left", show_edge=False)
    columns = ("rank", "collective", "family", "count", "total ms", "message sizes", "n", "algbw GB/s", "busbw GB/s")
    for column in columns:
        right = column in ("count", "total ms", "n") or "GB/s" in column
        colls.add_column(column, justify="right" if right else "left")
    for r in report.ranks:
        for c in r.collectives:
            sizes = (
                "unknown"
                if c.message_bytes_min is None
                else _bytes(c.message_bytes_min)
                if c.message_bytes_min == c.message_bytes_max
                else f"{_bytes(c.message_bytes_min)}–{_bytes(c.message_bytes_max)}"
            )
            colls.add_row(
                str(r.rank) if r.rank is not None else "?",
                c.collective,
                c.family,
                str(c.count),
                milliseconds(c.total_seconds, 2, NOT_MEASURED),
                sizes,
                str(c.group_size or "?"),
                _gbps(c.algbw_bytes_per_second),
                _gbps(c.busbw_bytes_per_second),
            )
    parts.append(colls)

    s = report.straggler
    if s is not None:
        late = ", ".join(f"{rank}: {v * 1e3:.2f}" for rank, v in s.lateness_seconds.items())
        parts.append(
            Text(
                f"Straggler: rank {s.rank}: it started {s.latest_count} of {s.matched} matched collectives last, "
                f"{s.skew_seconds * 1e3:.2f} ms after the other ranks' median on average (widest spread "
                f"{s.max_skew_seconds * 1e3:.2f} ms); next latest: rank {s.runner_up}. Mean start after the earliest "
                f"rank, ms: {late}"
            )
        )
    elif report.cross_rank:
        parts.append(Text(f"Straggler: none named ({report.cross_rank})"))
    if report.link:
        expected = _gbps(report.expected_busbw_bytes_per_second)
        parts.append(Text(f"Link: {report.link} (from {report.link_source}), expected busbw {expected} GB/s"))
    for p in report.problems:
        style = "red" if p.kind == "error" else "yellow"
        parts.append(Text(f"{p.kind.upper()}: {p.message}", style=style))
    notes: dict[str, list[str]] = {}
    for r in report.ranks:
        for note in r.notes:
            notes.setdefault(note, []).append(str(r.rank))
    for note, which in notes.items():  # a note every rank shares is said once
        who = "every rank" if len(which) == len(report.ranks) > 1 else "rank " + ", ".join(which)
        parts.append(Text(f"{who}: {note}", style="dim"))

    verdict = report.verdict
    if verdict is not None:
        parts.append(Text("\nFindings", style="bold underline"))
        if not verdict.findings:
            parts.append(Text("none: " + verdict.summary))
        for f in verdict.findings:
            colour = "red" if f.severity.value == "critical" else "yellow"
            parts.append(Text.assemble((f"{f.severity.value.upper()} {f.code} ", colour), (f.title, "bold")))
            parts.append(Text(f"  {f.summary}"))
            if f.fixes:
                parts.append(Text(f"  fix: {f.fixes[0]}", style="dim"))
    return Group(*parts)
