"""nccl-tests' arithmetic (doc/PERFORMANCE.md), pure:

    algbw = size / time            busbw = algbw x factor
    all_reduce 2(n-1)/n    all_gather (n-1)/n    reduce_scatter (n-1)/n    all_to_all (n-1)/n

with ``size`` in nccl-tests' convention: all_reduce the buffer; all_gather the gathered output; reduce_scatter the
input; all_to_all the bytes each rank sends (its whole buffer). busbw is per GPU and per direction, comparable with
the link's expected figure from probes/links.toml.
"""

from __future__ import annotations

from llmdiag.model import CollectiveMeasurement

ELEMENT_BYTES = 4  # float32, as nccl-tests' default


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' busbw / algbw factor for ``op`` on ``world_size`` ranks."""
    n = world_size
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    raise ValueError(op)


def element_count(op: str, size_bytes: int, world_size: int) -> int:
    """Elements of the op's nccl-tests-sized buffer, rounded down so that every rank's share is whole."""
    count = size_bytes // ELEMENT_BYTES
    if op != "all_reduce":
        count -= count % world_size
    return count


def measurement(
    op: str, size_bytes: int, count: int, world: int, trial_means: list[tuple[float, float]]
) -> CollectiveMeasurement:
    """From each trial's (mean over ranks, max over ranks) seconds per collective: the median trial's figures."""
    ordered = sorted(trial_means)
    mean, slowest = ordered[(len(ordered) - 1) // 2]
    real_bytes = count * ELEMENT_BYTES
    algbw = real_bytes / mean
    factor = bus_factor(op, world)
    return CollectiveMeasurement(
        op=op,
        size_bytes=real_bytes,
        count=count,
        time_seconds=mean,
        time_max_rank_seconds=slowest,
        algbw_bytes_per_second=algbw,
        busbw_bytes_per_second=algbw * factor,
        bus_factor=factor,
        trials_seconds=[m for m, _ in trial_means],
    )


def largest_per_op(results: list[CollectiveMeasurement]) -> dict[str, CollectiveMeasurement]:
    """Each op's measurement at its largest message: where busbw is nearest its plateau."""
    best: dict[str, CollectiveMeasurement] = {}
    for m in results:
        if m.op not in best or m.size_bytes > best[m.op].size_bytes:
            best[m.op] = m
    return best
