"""The NCCL benchmark's table (`llmdiag nccl-bench`, and rank 0 of `torchrun -m llmdiag.nccl_bench`): plain text,
one row per op and message size as nccl-tests prints, then the link comparison and the findings."""

from __future__ import annotations

from llmdiag.model import NcclBenchReport


def _gb(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e9:.3f}"


def _head(report: NcclBenchReport) -> list[str]:
    lines = [
        f"llmdiag nccl-bench: {report.backend}, {report.world_size} rank(s) on {report.nodes} node(s), "
        f"{report.device}, torch {report.torch_version}, {report.dtype}, {report.iters} iters x "
        f"{report.trials} trials",
    ]
    link = report.link
    if link.name:
        lines.append(
            f"link: {link.name} ({link.title}; {link.how}), expected busbw "
            f"{_gb(link.expected_bus_bandwidth_bytes_per_second)} GB/s"
        )
    else:
        lines.append(f"link: unavailable ({link.unavailable})")
    return lines


def _memory_line(report: NcclBenchReport) -> list[str]:
    memory = report.memory_probe
    if memory is None:
        return []
    ratio = memory.copy_vs_peak_ratio
    against = (
        f", {ratio:.0%} of the {_gb(memory.peak_bytes_per_second)} GB/s peak ({memory.peak_how})"
        if ratio
        else f" ({memory.peak_how})"
    )
    return [
        "one rank: no inter-GPU link to measure; memory-copy bandwidth probe instead",
        f"memory copy ({memory.device}, {memory.size_bytes} bytes): "
        f"{_gb(memory.copy_bandwidth_bytes_per_second)} GB/s read+write{against}, check {memory.check}",
    ]


def render_nccl_bench(report: NcclBenchReport) -> str:
    lines = _head(report)
    if report.results:
        lines.append(f"{'op':<15}{'size':>12}{'time us':>12}{'algbw GB/s':>12}{'busbw GB/s':>12}")
        for m in report.results:
            lines.append(
                f"{m.op:<15}{m.size_bytes:>12}{m.time_seconds * 1e6:>12.1f}"
                f"{_gb(m.algbw_bytes_per_second):>12}{_gb(m.busbw_bytes_per_second):>12}"
            )
    for op, why in report.failed_ops.items():
        lines.append(f"{op}: FAILED: {why}")
    if report.skipped_sizes_bytes:
        lines.append(f"sizes above the cap ({report.size_cap_reason}) skipped: {report.skipped_sizes_bytes}")
    lines += _memory_line(report)
    ratio_signal = report.signals.get("collective_bus_bandwidth_vs_link_ratio")
    if ratio_signal is not None and ratio_signal.unavailable:
        lines.append(f"busbw vs link: {ratio_signal.unavailable}")
    elif ratio_signal is not None:
        lines.append(
            f"busbw vs link: {ratio_signal.stats['value']:.0%} of the expected busbw (all ops: "
            + ", ".join(f"{k} {v:.0%}" for k, v in ratio_signal.by_series.items())
            + ")"
        )
    for finding in report.findings:
        lines.append(f"{finding.severity.value.upper()} {finding.code}: {finding.summary}")
    return "\n".join(lines)
