"""A benchmark report as the signals the network rules judge (NET009 reads the ratio to the link, as for a trace)."""

from __future__ import annotations

from llmdiag.collect.nccl.busbw import largest_per_op
from llmdiag.model import NcclBenchReport, Signal, SignalSet, SourceInfo, Window

# busbw reaches its plateau only with large messages (NVLink ~64-256 MiB): below this no ratio to the link is given,
# so a short --sizes run cannot read as a slow link
RATIO_MIN_BYTES = 64 * 1024**2
VERIFY = "torchrun --nproc-per-node N -m llmdiag.nccl_bench --ops all_reduce --sizes 256M:1G  # or nccl-tests"


def bench_signals(report: NcclBenchReport) -> SignalSet:
    """The benchmark as a SignalSet: busbw at the largest size (all_reduce, else the first op measured), per op in
    ``by_series``; its ratio to the link's expected busbw; the message size it was measured at; the memory probe."""
    ranks = report.world_size
    source = f"llmdiag nccl-bench ({report.backend}, {ranks} rank{'s' if ranks != 1 else ''})"
    signals = SignalSet(
        window=Window(kind="window", duration_seconds=report.elapsed_seconds, note="active benchmark"),
        sources=[SourceInfo(probe="nccl_bench", server=source, note=report.link.how or "")],
    )
    best = largest_per_op(report.results)
    head = best.get("all_reduce") or (next(iter(best.values())) if best else None)

    def derived(name: str, unit: str, value: float | None, why: str, by: dict[str, float] | None = None) -> None:
        if value is None:
            signals.add(Signal.missing(name, "derived", unit, why, source))
        else:
            signals.add(
                Signal(
                    name=name,
                    kind="derived",
                    unit=unit,
                    stats={"value": value},
                    source=source,
                    verify=VERIFY,
                    by_series=by or {},
                )
            )

    no_run = "unavailable: no collective measured" + (" (one rank)" if ranks == 1 else "")
    derived(
        "collective_bus_bandwidth_bytes_per_second",
        "bytes_per_second",
        head.busbw_bytes_per_second if head else None,
        no_run,
        {op: m.busbw_bytes_per_second for op, m in best.items()},
    )
    derived("collective_message_bytes", "bytes", float(head.size_bytes) if head else None, no_run)
    expected = report.link.expected_bus_bandwidth_bytes_per_second
    link_why = report.link.unavailable or "no link class"
    derived("expected_link_bus_bandwidth_bytes_per_second", "bytes_per_second", expected, f"unavailable: {link_why}")
    if head and expected and head.size_bytes < RATIO_MIN_BYTES:
        why = f"the largest message ({head.size_bytes} bytes) is below {RATIO_MIN_BYTES >> 20} MiB: latency-bound"
        derived("collective_bus_bandwidth_vs_link_ratio", "ratio", None, f"unavailable: {why}")
    elif head and expected:
        derived(
            "collective_bus_bandwidth_vs_link_ratio",
            "ratio",
            head.busbw_bytes_per_second / expected,
            "",
            {op: m.busbw_bytes_per_second / expected for op, m in best.items()},
        )
    else:
        why = report.link.unavailable or no_run
        derived("collective_bus_bandwidth_vs_link_ratio", "ratio", None, f"unavailable: {why}")
    memory = report.memory_probe
    derived(
        "device_memory_copy_bandwidth_bytes_per_second",
        "bytes_per_second",
        memory.copy_bandwidth_bytes_per_second if memory else None,
        "unavailable: the memory probe runs with one rank",
    )
    derived(
        "device_memory_copy_vs_peak_ratio",
        "ratio",
        memory.copy_vs_peak_ratio if memory else None,
        f"unavailable: {memory.peak_how if memory else 'the memory probe runs with one rank'}",
    )
    return signals
