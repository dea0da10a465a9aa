"""A verdict's confidence: the probability that its class is right, from a small fitted model.

The engine reads a few factors at verdict time (``factors``: the verdict's severity, core-signal coverage, margin past
the threshold, rival classes, independent support, preview rules, window length, one dump, few scrapes, sanity
findings) and states σ(Σ weightᵢ·factorᵢ), with the weights from rules/confidence.toml (fitted by
``bench/calibration.py --fit --write``, which records how and on what; llmdiag.schema.confidence). The rules below
are decisions, not estimates, and hold whatever the fit says: one snapshot stays below 0.5, a verdict of unknown names
no class, a class that lost is at most half of the verdict's, and beside a stall every capacity class stays below
0.5. What a preview rule is worth beside a stable one is an estimate: the ``preview`` factor, fitted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from llmdiag.engine.causes import STALL, Choice, is_preview, why
from llmdiag.model import BOTTLENECK_CATEGORIES, Bottleneck, Category, ConfidenceFactor, Finding, Severity, SignalSet
from llmdiag.schema.confidence import FACTORS, load_confidence_model

# one moment (no rates, no trend) cannot tell a lasting limit from a passing state or a hang that began after it:
# its class is named, below the 0.5 from which a verdict counts as confident (the standard: windows, not samples)
SNAPSHOT_CONFIDENCE_CAP = 0.45
# beside a stall, no capacity class is the cause: each stays below this (a hang is a bug, not a limit)
STALL_CAPACITY_CAP = 0.45
# a class that fired but lost to the verdict's class: at most this share of the verdict's confidence
RIVAL_SHARE = 0.5
# unknown names no class (an abstention, left out of the fit): its confidence stays low
UNKNOWN_CONFIDENCE_CAP = 0.3
# no core serving signal at all (a profiler trace, an NCCL log, a GPU snapshot alone): no labelled case is like it,
# so the fit is not extrapolated there; such a verdict is stated no higher than even odds
UNFITTED_CONFIDENCE_CAP = 0.5
# a server log is read by a probe whose name ends so (vllm-log, sglang-log, …)
LOG_PROBE_SUFFIX = "-log"
# the fit saw no server log: a verdict read from one is stated no higher than the share of the field corpus's log
# cases that llmdiag names right (measured by bench/calibration.py --fit --write, provenance.measured.field_logs)
FIELD_LOGS = "field_logs"
# never certain, never nothing
CONFIDENCE_FLOOR, CONFIDENCE_CEILING = 0.05, 0.99
FEW_SCRAPES = 5  # a window of fewer scrapes has few points for a mean or a trend
LONGEST_WINDOW_SECONDS = 600.0  # longer windows count as this long: the fit saw none longer
MARGIN_CLIP = 2.0  # past-threshold ratio less 1: further past says nothing more
# a finding alone in a clean window (every core signal, a minute, many scrapes): where a rival's confidence starts
CLEAN_WINDOW = {"coverage": 1.0, "log_window": math.log1p(60.0)}


@dataclass
class Judged:
    score: float
    notes: list[str] = field(default_factory=list)
    factors: dict[str, float] = field(default_factory=dict)


def sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z)) if z >= 0 else math.exp(z) / (1 + math.exp(z))


def probability(values: dict[str, float], weights: dict[str, float] | None = None) -> float:
    """σ(Σ weightᵢ·factorᵢ): the fitted model alone, before the decided caps."""
    w = weights if weights is not None else load_confidence_model().weights
    return sigmoid(sum(w[name] * values.get(name, 0.0) for name in FACTORS))


def _finding_factors(finding: Finding) -> dict[str, float]:
    return {
        "critical": float(finding.severity is Severity.critical),
        "warning": float(finding.severity is Severity.warning),
        "margin": min(MARGIN_CLIP, max(0.0, finding.margin - 1.0)),
    }


def factors(bottleneck: Bottleneck, choice: Choice, signals: SignalSet, core: Sequence[str]) -> dict[str, float]:
    """Every factor's value for this verdict (FACTORS names them; absent ones are 0)."""
    out = dict.fromkeys(FACTORS, 0.0)
    primary = choice.primary
    if primary is None:
        out["no_finding"] = 1.0
        out["idle"] = float(bottleneck is Bottleneck.idle)
    else:
        out.update(_finding_factors(primary))
        same = [f for f in choice.findings if f.category is primary.category and not f.advisory]
        # CMP003/CMP004 read CMP001's inter-token mean again: support counts only on a signal of its own
        out["second_signal"] = float(len({f.evidence[0].signal if f.evidence else f.code for f in same}) > 1)
        out["rivals"] = float(len({f.category for f in choice.rivals}))
        out["preview"] = float(all(is_preview(f) for f in same))
    available = [n for n in core if (s := signals.get(n)) is not None and s.unavailable is None]
    out["coverage"] = len(available) / len(core) if core else 0.0
    window = signals.window
    if window.kind in ("lifetime", "snapshot"):
        out["single_dump"] = 1.0
    else:
        out["log_window"] = math.log1p(min(LONGEST_WINDOW_SECONDS, max(0.0, window.duration_seconds or 0.0)))
        # a window read from a trace or a benchmark has no scrapes: few scrapes says nothing of it
        out["few_scrapes"] = float(0 < window.scrapes < FEW_SCRAPES)
    out["sanity"] = float(any(f.category is Category.sanity for f in choice.findings))
    return out


def _notes(choice: Choice, signals: SignalSet, values: dict[str, float]) -> list[str]:
    """What the verdict's class stands beside, and what lowered its confidence, in words."""
    notes: list[str] = []
    primary = choice.primary
    for symptom, cause in choice.symptoms:
        notes.append(
            f"{symptom.code} ({symptom.category.value}) beside a stall: a symptom of the hang, not a limit"
            if cause == STALL
            else f"{symptom.code} ({symptom.category.value}) is a symptom of {cause}: "
            f"{why(Category(cause), symptom.category)}"
        )
    if primary is not None and choice.rivals:
        strongest = max(choice.rivals, key=lambda f: f.severity.rank)
        notes.append(
            f"{strongest.code} ({strongest.category.value}, {strongest.severity.value}) fired too, and "
            f"{primary.category.value} does not explain it: {strongest.category.value} may share the blame"
        )
    if primary is not None and is_preview(primary):
        notes.append(
            f"{primary.code} is a preview rule, not yet proven on field data: it weighs less than a stable rule"
        )
    if values["sanity"]:
        notes.append("metric sanity findings: some numbers are not trustworthy")
    if signals.window.kind == "lifetime":
        notes.append("judged from lifetime averages of one dump, not a live window")
    elif signals.window.kind == "snapshot":
        notes.append("judged from one snapshot: gauges at one moment, no rates and no trend")
    elif values["few_scrapes"]:
        notes.append(f"only {signals.window.scrapes} scrapes in the window")
    return notes


def from_logs(signals: SignalSet) -> bool:
    """Judged from a server log's stat lines, not from metrics pages."""
    return bool(signals.sources) and signals.sources[0].probe.endswith(LOG_PROBE_SUFFIX)


def _log_cap() -> tuple[float, int] | None:
    measured = load_confidence_model().provenance.measured.get(FIELD_LOGS)
    return (measured.accuracy, measured.cases) if measured is not None and measured.cases else None


def judge(bottleneck: Bottleneck, choice: Choice, signals: SignalSet, core: Sequence[str]) -> Judged:
    """The verdict's confidence (the fitted model, then the decided caps), its notes and its factors."""
    values = factors(bottleneck, choice, signals, core)
    score = probability(values)
    notes = _notes(choice, signals, values)
    if bottleneck is Bottleneck.unknown:
        score = min(score, UNKNOWN_CONFIDENCE_CAP)
    elif not values["coverage"] and score > UNFITTED_CONFIDENCE_CAP:
        score = UNFITTED_CONFIDENCE_CAP
        notes.append(
            "no serving metric was read (no running, waiting, KV or token signal): the confidence is fitted on "
            f"verdicts that had them, so it is stated no higher than {UNFITTED_CONFIDENCE_CAP:.1f}"
        )
    elif from_logs(signals) and (cap := _log_cap()) is not None and score > cap[0]:
        score = cap[0]
        notes.append(
            f"read from a server log: the confidence is fitted on metrics pages, and llmdiag names the class right in "
            f"{cap[0]:.0%} of the {cap[1]} field log cases it is measured on, so it is stated no higher"
        )
    if choice.primary is not None and choice.rivals:
        # the verdict's class and a rival are exclusive causes: their confidences share one probability
        rival = max(rival_alone(f, values) for f in choice.rivals)
        score = min(score, 1.0 - RIVAL_SHARE * min(rival, score))
    if signals.window.kind == "snapshot":
        score = min(score, SNAPSHOT_CONFIDENCE_CAP)
    score = max(CONFIDENCE_FLOOR, min(CONFIDENCE_CEILING, score))
    return Judged(score, notes, values)


def rival_alone(finding: Finding, base: dict[str, float] | None = None) -> float:
    """What the model would give a finding as the verdict in this window (``base``: the verdict's factors; a clean
    window without)."""
    window = {**CLEAN_WINDOW, **(base or {}), "no_finding": 0.0, "idle": 0.0, "second_signal": 0.0, "rivals": 0.0}
    return probability({**window, **_finding_factors(finding), "preview": float(is_preview(finding))})


def terms(values: dict[str, float]) -> dict[str, ConfidenceFactor]:
    """Each factor's value and weight, for the report: what the stated confidence is made of."""
    weights = load_confidence_model().weights
    return {name: ConfidenceFactor(value=round(values[name], 4), weight=weights[name]) for name in FACTORS}


def class_confidence(
    bottleneck: Bottleneck, confidence: float, findings: list[Finding], base: dict[str, float] | None = None
) -> dict[str, float]:
    """How far each class that fired can be trusted as the cause: the verdict's class at the verdict's confidence; a
    rival at most RIVAL_SHARE of what the model gives it as the verdict in this window (``base``: the verdict's
    factors; a clean window without), and of the verdict's; every capacity class below 0.5 beside a stall."""
    out: dict[str, float] = {}
    if bottleneck is Bottleneck.stalled:
        out[Bottleneck.stalled.value] = round(confidence, 2)
    for finding in findings:
        name = finding.category.value
        if finding.category not in BOTTLENECK_CATEGORIES or finding.advisory or finding.stall or name in out:
            continue
        if name == bottleneck.value:
            out[name] = round(confidence, 2)
            continue
        score = min(rival_alone(finding, base), confidence) * RIVAL_SHARE
        if bottleneck is Bottleneck.stalled:
            score = min(score, STALL_CAPACITY_CAP)
        out[name] = round(score, 2)
    return out
