"""One window, several sources: merging their SignalSets."""

from __future__ import annotations

from llmdiag.model import SignalSet

COLLECTOR_COUNTS = ("counter_resets", "implausible_samples")


def merge_signal_sets(into: SignalSet, other: SignalSet) -> SignalSet:
    """Add another source's signals to a set: one window, several sources. The first source of a signal wins,
    except that a measured value replaces one the first source could not give. Collector counts add up."""
    for name, signal in other.signals.items():
        mine = into.signals.get(name)
        if name in COLLECTOR_COUNTS and mine is not None:
            mine.stats["value"] = mine.stats.get("value", 0.0) + signal.stats.get("value", 0.0)
        elif mine is None or (mine.unavailable is not None and signal.unavailable is None):
            into.add(signal)
    into.sources += other.sources
    into.anomalies += other.anomalies
    return into
