"""Interval arithmetic on sorted, merged lists of (start, end)."""

from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[float, float]


# ---------------------------------------------------------------------------------------------
# interval arithmetic on sorted, merged lists


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union as sorted, disjoint intervals. Empty and negative ones are dropped."""
    out: list[list[float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1][1] = end
        else:
            out.append([start, end])
    return [(s, e) for s, e in out]


def total(merged: list[Interval]) -> float:
    return sum(e - s for s, e in merged)


def intersection_total(a: list[Interval], b: list[Interval]) -> float:
    """Length of the overlap of two merged lists, in one pass."""
    i = j = 0
    covered = 0.0
    while i < len(a) and j < len(b):
        start = max(a[i][0], b[j][0])
        end = min(a[i][1], b[j][1])
        if end > start:
            covered += end - start
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return covered
