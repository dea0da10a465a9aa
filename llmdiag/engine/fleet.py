"""Judge several replicas of one service side by side: per-replica verdicts → a FleetReport, and per-step classes →
a FleetTimeline.

The fleet's own findings are data-driven rules like any other (``scope = "fleet"`` in rules/scheduling): this module
only computes the fleet-level signals they read, from each replica's verdict:

    fleet_replicas_judged                          replicas with a verdict (an unreachable one is not compared)
    replica_request_rate_max_per_second            the highest finished-requests/s of any replica
    replica_request_rate_max_over_peers_ratio      that replica's rate / the median of the OTHER replicas' rates
    replica_requests_in_system_max_over_peers_ratio  the same for the mean running + waiting requests
    replica_busiest_in_system_over_peers_ratio     the running + waiting of the replica that finishes the most
                                                   requests / the median of the others': above 1 it is given more
                                                   work, not merely faster than slow peers
    replica_ttft_p90_max_seconds                   the worst replica's TTFT p90
    replica_ttft_p90_max_over_peers_ratio          that p90 / the median of the other replicas' p90

"Over peers" compares the extreme replica with the upper median of the others (``statistics.median_high``), not
the median of all: with two replicas the median of all would be their mean and the ratio could never pass 2; and
the upper median keeps one slow replica (which finishes fewer requests because it is slow) from making a healthy
peer look over-served in a fleet of three. A peer median of zero (the others idle) gives
the ratio ``PEER_ZERO_RATIO`` (said in the signal's source) rather than infinity. Each signal's ``by_series`` holds
the per-replica values it compared, so the report can show them.

Order: worst first, by `llmdiag check`'s state (CRITICAL > WARNING > UNKNOWN > OK), then by the margin of the
replica's primary finding, then by its TTFT p90.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Iterable

from llmdiag.config import Settings
from llmdiag.engine.evaluate import evaluate_rule
from llmdiag.model import (
    Bottleneck,
    FleetFinding,
    FleetReport,
    FleetStep,
    FleetTarget,
    FleetTimeline,
    ReplicaNumbers,
    Signal,
    SignalSet,
    State,
    Transition,
    Verdict,
    state_of,
)
from llmdiag.schema.loader import load_rules

PEER_ZERO_RATIO = 1000.0
MAX_RATIO = 1e6
# fleet signal → (unit, what the per-replica values are); each is declared in probes/signals.toml ("fleet")
FLEET_SIGNALS: dict[str, tuple[str, str]] = {
    "fleet_replicas_judged": ("count", "replicas with a verdict"),
    "replica_request_rate_max_per_second": ("requests/s", "finished requests/s"),
    "replica_request_rate_max_over_peers_ratio": ("ratio", "finished requests/s"),
    "replica_requests_in_system_max_over_peers_ratio": ("ratio", "mean requests running + waiting"),
    "replica_busiest_in_system_over_peers_ratio": ("ratio", "mean requests running + waiting"),
    "replica_ttft_p90_max_seconds": ("seconds", "TTFT p90 (seconds)"),
    "replica_ttft_p90_max_over_peers_ratio": ("ratio", "TTFT p90 (seconds)"),
}
# a replica in trouble: a bottleneck class, or stalled (a hang is worse than any limit)
BAD_CLASSES = (Bottleneck.memory, Bottleneck.compute, Bottleneck.scheduling, Bottleneck.network, Bottleneck.stalled)
GOOD_CLASSES = (Bottleneck.healthy, Bottleneck.idle)


def _stat(verdict: Verdict, name: str, stat: str) -> float | None:
    signal = verdict.signals.get(name)
    return signal.stat(stat) if signal is not None else None


def replica_numbers(verdict: Verdict) -> ReplicaNumbers:
    ex = verdict.experience
    running, waiting = ex.requests_running_mean, ex.requests_waiting_mean
    return ReplicaNumbers(
        request_rate_per_second=_stat(verdict, "requests_finished_per_second", "rate"),
        requests_running_mean=running,
        requests_waiting_mean=waiting,
        requests_in_system_mean=running + waiting if running is not None and waiting is not None else None,
        kv_cache_usage_max_ratio=_stat(verdict, "kv_cache_usage_ratio", "max"),
        ttft_p90_seconds=ex.ttft_p90_seconds,
        generation_tokens_per_second=ex.generation_tokens_per_second,
    )


def target_from_verdict(name: str, url: str, verdict: Verdict, keep_verdict: bool = True) -> FleetTarget:
    classed = [
        f
        for f in verdict.findings
        if (f.stall if verdict.bottleneck is Bottleneck.stalled else f.category.value == verdict.bottleneck.value)
        and not f.advisory
    ]
    worst = verdict.worst_severity()
    waiting = verdict.signals.get("requests_waiting")
    return FleetTarget(
        name=name,
        url=url,
        bottleneck=verdict.bottleneck,
        confidence=verdict.confidence,
        state=state_of(verdict).name,
        worst_severity=worst,
        primary=classed[0].code if classed else "",
        summary=verdict.summary,
        numbers=replica_numbers(verdict),
        waiting_samples=list(waiting.samples) if waiting is not None and waiting.unavailable is None else [],
        verdict=verdict if keep_verdict else None,
    )


def target_from_error(name: str, url: str, message: str, hint: str = "") -> FleetTarget:
    return FleetTarget(
        name=name,
        url=url,
        bottleneck=Bottleneck.unknown,
        state=State.UNKNOWN.name,
        error=message,
        hint=hint,
        summary=f"not judged: {message}",
    )


def _max_over_peers(values: dict[str, float]) -> tuple[str, float, bool]:
    """(the replica with the highest value, its value / the median of the others', whether the peers were all 0)."""
    top = max(sorted(values), key=lambda k: values[k])
    peers = [v for k, v in values.items() if k != top]
    median = statistics.median_high(peers)
    if median <= 0:
        return top, (PEER_ZERO_RATIO if values[top] > 0 else 1.0), values[top] > 0
    return top, min(values[top] / median, MAX_RATIO), False


def _ratio_signal(name: str, values: dict[str, float], window: float | None) -> tuple[Signal, str | None]:
    unit, what = FLEET_SIGNALS[name]
    if len(values) < 2:
        reason = f"{what} known for {len(values)} replica(s); a comparison needs 2"
        return Signal.missing(name, "derived", unit, reason, source="fleet"), None
    top, ratio, peers_zero = _max_over_peers(values)
    source = f"fleet: {top}'s {what} / the upper median of the other {len(values) - 1} replicas'"
    if peers_zero:
        source += f" (the others are all 0: shown as {PEER_ZERO_RATIO:g})"
    signal = Signal(
        name=name,
        kind="derived",
        unit=unit,
        stats={"value": round(ratio, 4)},
        source=source,
        window_seconds=window,
        by_series=dict(values),
    )
    return signal, top


def fleet_signal_set(
    targets: list[FleetTarget], window_seconds: float | None = None
) -> tuple[SignalSet, dict[str, str]]:
    """The fleet-level signals, and which replica each ratio's extreme is (signal name → replica)."""
    judged = [t for t in targets if t.error is None]
    signals = SignalSet()
    signals.add(
        Signal(
            name="fleet_replicas_judged",
            kind="derived",
            unit="count",
            stats={"value": float(len(judged))},
            source="fleet: replicas with a verdict",
        )
    )
    extremes: dict[str, str] = {}

    def per_replica(attribute: str) -> dict[str, float]:
        out = {}
        for t in judged:
            value = getattr(t.numbers, attribute)
            if value is not None:
                out[t.name] = value
        return out

    rates = per_replica("request_rate_per_second")
    in_system = per_replica("requests_in_system_mean")
    ttft = per_replica("ttft_p90_seconds")
    for name, values in (
        ("replica_request_rate_max_over_peers_ratio", rates),
        ("replica_requests_in_system_max_over_peers_ratio", in_system),
        ("replica_ttft_p90_max_over_peers_ratio", ttft),
    ):
        signal, top = _ratio_signal(name, values, window_seconds)
        signals.add(signal)
        if top is not None:
            extremes[name] = top
    busiest = extremes.get("replica_request_rate_max_over_peers_ratio")
    name = "replica_busiest_in_system_over_peers_ratio"
    if busiest is not None and busiest in in_system and len(in_system) >= 2:
        # the same replica's load against its peers': a healthy replica among slow ones finishes the most requests
        # while holding the fewest, and is not over-served
        ordered = {busiest: in_system[busiest], **{k: v for k, v in in_system.items() if k != busiest}}
        peers = [v for k, v in ordered.items() if k != busiest]
        median = statistics.median_high(peers)
        ratio = ordered[busiest] / median if median > 0 else (PEER_ZERO_RATIO if ordered[busiest] > 0 else 1.0)
        signals.add(
            Signal(
                name=name,
                kind="derived",
                unit="ratio",
                stats={"value": round(min(ratio, MAX_RATIO), 4)},
                source=f"fleet: {busiest}'s mean requests running + waiting / the upper median of the "
                f"other {len(peers)} replicas'",
                window_seconds=window_seconds,
                by_series=dict(in_system),
            )
        )
        extremes[name] = busiest
    else:
        signals.add(
            Signal.missing(
                name,
                "derived",
                "ratio",
                "running + waiting not known for the busiest replica and a peer",
                source="fleet",
            )
        )
    for name, values in (("replica_request_rate_max_per_second", rates), ("replica_ttft_p90_max_seconds", ttft)):
        unit, what = FLEET_SIGNALS[name]
        if values:
            top = max(sorted(values), key=lambda k: values[k])
            signals.add(
                Signal(
                    name=name,
                    kind="derived",
                    unit=unit,
                    stats={"value": values[top]},
                    source=f"fleet: {top}'s {what}",
                    window_seconds=window_seconds,
                    by_series=dict(values),
                )
            )
            extremes[name] = top
        else:
            signals.add(Signal.missing(name, "derived", unit, f"no replica exposes its {what}", source="fleet"))
    return signals, extremes


def _order_key(target: FleetTarget, flagged: dict[str, int]) -> tuple[int, int, float, float, str]:
    """A replica that a fleet rule names counts as at least that rule's severity (warning 2, critical 3)."""
    rank = max(State[target.state].rank, flagged.get(target.name, 0))
    margin = 0.0
    if target.verdict is not None and target.verdict.findings:
        margin = max(f.margin for f in target.verdict.findings)
    ttft = target.numbers.ttft_p90_seconds or 0.0
    return (-rank, -(target.worst_severity.rank if target.worst_severity else 0), -margin, -ttft, target.name)


def build_fleet(
    targets: Iterable[FleetTarget],
    settings: Settings | None = None,
    source: str = "",
    window_seconds: float | None = None,
    at_unix: float | None = None,
) -> FleetReport:
    """Count the classes, run the fleet rules on the fleet signals, and order the replicas worst first."""
    settings = settings or Settings()
    targets = list(targets)
    signals, extremes = fleet_signal_set(targets, window_seconds)
    report = FleetReport(
        source=source,
        window_seconds=window_seconds,
        at_unix=at_unix if at_unix is not None else time.time(),
    )
    counts = Counter(t.bottleneck.value for t in targets)
    report.class_counts = {b.value: counts[b.value] for b in Bottleneck if counts[b.value]}
    for rule in (r for r in load_rules() if r.scope == "fleet"):
        outcome, finding = evaluate_rule(rule, signals, settings)
        report.fleet_rules.append(outcome)
        if finding is None:
            continue
        ladder = rule.severity.signal
        replica = extremes.get(ladder, "")
        compared = signals.signals[ladder]
        values = compared.by_series
        finding.summary = f"{replica}: {finding.summary}" if replica else finding.summary
        report.imbalance.append(
            FleetFinding(finding=finding, replica=replica, values=values, compared=FLEET_SIGNALS[ladder][1])
        )
        for t in targets:
            if t.name == replica:
                t.flagged_by.append(rule.code)
    report.imbalance.sort(key=lambda f: (f.finding.severity.rank, f.finding.margin), reverse=True)
    flagged: dict[str, int] = {}
    for item in report.imbalance:
        flagged[item.replica] = max(flagged.get(item.replica, 0), item.finding.severity.rank + 1)
    report.targets = sorted(targets, key=lambda t: _order_key(t, flagged))
    report.fleet_signals = signals.signals
    failed = [t for t in targets if t.error is not None]
    if failed:
        report.notes.append(
            f"{len(failed)} of {len(targets)} target(s) could not be judged and are left out of the "
            f"comparisons: {', '.join(t.name for t in failed)}"
        )
    return report


# ---------------------------------------------------------------------------------------------
# timelines: one class per replica per step


def majority_class(classes: dict[str, Bottleneck]) -> Bottleneck:
    """The fleet's class at a step: the most common class among the replicas with data; ties go to the worse one
    (a bottleneck class over healthy/idle over unknown)."""
    if not classes:
        return Bottleneck.unknown
    counts = Counter(classes.values())
    rank = {b: (2 if b in BAD_CLASSES else 1 if b in GOOD_CLASSES else 0) for b in Bottleneck}
    return max(counts, key=lambda b: (counts[b], rank[b], b.value))


def build_timeline(steps: Iterable[FleetStep], step_seconds: float | None = None) -> FleetTimeline:
    """Transitions per replica (a change of class between consecutive steps where the replica had data), the first
    replica(s) to go from healthy/idle to a bottleneck class, and the fleet majority's transitions."""
    ordered = sorted(steps, key=lambda s: s.at_unix)
    timeline = FleetTimeline(step_seconds=step_seconds, steps=ordered)
    last: dict[str, tuple[float, Bottleneck]] = {}
    for step in ordered:
        for replica in sorted(step.classes):
            now = step.classes[replica]
            if replica in last and last[replica][1] is not now:
                before_at, before = last[replica]
                timeline.transitions.append(
                    Transition(
                        replica=replica,
                        at_unix=step.at_unix,
                        previous_at_unix=before_at,
                        from_class=before,
                        to_class=now,
                    )
                )
            last[replica] = (step.at_unix, now)
    went = [t for t in timeline.transitions if t.from_class in GOOD_CLASSES and t.to_class in BAD_CLASSES]
    if went:
        first_at = min(t.at_unix for t in went)
        firsts = sorted({t.replica for t in went if t.at_unix == first_at})
        timeline.first_to_go, timeline.first_to_go_at_unix = firsts, first_at
        timeline.first_to_go_class = next(t.to_class for t in went if t.at_unix == first_at and t.replica == firsts[0])
    else:
        bad_from_start = sorted(r for r, c in (ordered[0].classes.items() if ordered else []) if c in BAD_CLASSES)
        if bad_from_start:
            timeline.notes.append(
                f"already in a bottleneck class at the first step: {', '.join(bad_from_start)}; "
                "start earlier to see who went first"
            )
    previous: tuple[float, Bottleneck] | None = None
    for step in ordered:
        fleet = majority_class(step.classes)
        if previous is not None and previous[1] is not fleet:
            timeline.fleet_transitions.append(
                Transition(
                    replica="fleet",
                    at_unix=step.at_unix,
                    previous_at_unix=previous[0],
                    from_class=previous[1],
                    to_class=fleet,
                )
            )
        previous = (step.at_unix, fleet)
    missing = [s.at_unix for s in ordered if not s.classes]
    if missing:
        timeline.notes.append(f"{len(missing)} step(s) with no replica's data (shown as gaps, not as healthy)")
    return timeline
