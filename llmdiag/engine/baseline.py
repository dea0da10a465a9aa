"""A target's usual: medians of its own past checks, put into the SignalSet as ``baseline_*`` signals.

The regression rules (rules/regression/REG*.toml) compare the window with them through the derived
``*_vs_baseline_ratio`` signals. Only `llmdiag check`, which keeps a history, supplies a baseline; a scan
has none, and those rules are skipped with the reason.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from llmdiag.model import Signal, SignalSet

# history column → (baseline signal, unit); each is declared in probes/signals.toml (producer "baseline")
BASELINE_SIGNALS: dict[str, tuple[str, str]] = {
    "ttft_p95_seconds": ("baseline_ttft_p95_seconds", "seconds"),
    "tpot_p95_seconds": ("baseline_tpot_p95_seconds", "seconds"),
    "generation_tokens_per_second": ("baseline_generation_tokens_per_second", "tokens/s"),
    "requests_running_mean": ("baseline_requests_running_avg", "requests"),
}


@dataclass
class Baseline:
    """Medians of one target's past checks since ``since_unix``; a column with fewer than ``min_checks``
    measured values has no median (None) and says so."""

    target: str
    since_unix: float
    days: float
    min_checks: int
    checks: int = 0  # past checks in the period that count (not idle, not failed)
    medians: dict[str, float | None] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        if self.checks < self.min_checks:
            return (
                f"baseline: not enough history ({self.checks} of {self.min_checks} checks needed in {self.days:g} days)"
            )
        return f"baseline: median of {self.checks} checks in {self.days:g} days"


def add_baseline_signals(signals: SignalSet, baseline: Baseline) -> None:
    since = time.strftime("%Y-%m-%d %H:%M", time.localtime(baseline.since_unix))
    for column, (name, unit) in BASELINE_SIGNALS.items():
        count = baseline.counts.get(column, 0)
        median = baseline.medians.get(column)
        source = f"history: median of {count} checks of '{baseline.target}' since {since}"
        verify = f"llmdiag history --target {baseline.target} --since {baseline.days:g}d"
        if median is None or count < baseline.min_checks:
            reason = (
                f"not enough history: {count} past checks of '{baseline.target}' in {baseline.days:g} days "
                f"measured it, {baseline.min_checks} needed"
            )
            signals.add(Signal(name=name, kind="derived", unit=unit, unavailable=reason, source=source, verify=verify))
        else:
            signals.add(
                Signal(name=name, kind="derived", unit=unit, stats={"value": median}, source=source, verify=verify)
            )
