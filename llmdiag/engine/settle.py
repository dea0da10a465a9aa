"""When a live window has said enough: an automatic scan length ends the window once its verdict holds still.

A verdict is judged on the window so far after each scrape. The window ends when the last ``AGREEING_VERDICTS`` of
those agree (the same class, the same leading finding at the same severity, and its measured value within
``KEY_EVIDENCE_TOLERANCE_RATIO`` of the latest) and at least ``AUTO_MIN_SECONDS`` have passed; otherwise it runs to
its full length. A class that flips, or a key number still moving, keeps the scan going: a short window is only
taken where a longer one would have said the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmdiag.model import BOTTLENECK_CATEGORIES, Bottleneck, Verdict

# the shortest window an automatic scan ends at: rates over fewer seconds swing with single requests
AUTO_MIN_SECONDS = 5.0
# consecutive interim verdicts (one per scrape, a second apart) that must agree before the window ends
AGREEING_VERDICTS = 4
# how far the leading finding's measured value may still move between those verdicts
KEY_EVIDENCE_TOLERANCE_RATIO = 0.2
# healthy and idle have no leading finding: they must hold with no finding at warning or above coming and going
QUIET_CLASSES = (Bottleneck.healthy, Bottleneck.idle)


@dataclass(frozen=True)
class InterimReading:
    """What one interim verdict says, reduced to what must hold still."""

    bottleneck: Bottleneck
    leading_code: str | None
    leading_severity: str | None
    key_value: float | None
    finding_codes: frozenset[str]

    @classmethod
    def of(cls, verdict: Verdict) -> InterimReading:
        classed = [f for f in verdict.findings if f.category in BOTTLENECK_CATEGORIES and not f.advisory]
        leading = classed[0] if classed else None
        key = leading.evidence[0].value if leading is not None and leading.evidence else None
        return cls(
            bottleneck=verdict.bottleneck,
            leading_code=leading.code if leading else None,
            leading_severity=leading.severity.value if leading else None,
            key_value=key,
            finding_codes=frozenset(f.code for f in classed),
        )

    def agrees_with(self, latest: InterimReading) -> bool:
        same = (self.bottleneck, self.leading_code, self.leading_severity) == (
            latest.bottleneck,
            latest.leading_code,
            latest.leading_severity,
        )
        if not same:
            return False
        if latest.bottleneck in QUIET_CLASSES and self.finding_codes != latest.finding_codes:
            return False
        if self.key_value is None or latest.key_value is None:
            return self.key_value is None and latest.key_value is None
        scale = max(abs(latest.key_value), 1e-12)
        return abs(self.key_value - latest.key_value) <= KEY_EVIDENCE_TOLERANCE_RATIO * scale


@dataclass
class VerdictSettler:
    """Fed each interim verdict with the seconds the window has run; says when the window may end."""

    min_seconds: float = AUTO_MIN_SECONDS
    agreeing: int = AGREEING_VERDICTS
    readings: list[InterimReading] = field(default_factory=list)
    settled_at_seconds: float | None = None

    def observe(self, verdict: Verdict, elapsed_seconds: float) -> bool:
        self.readings.append(InterimReading.of(verdict))
        if elapsed_seconds + 1e-6 < self.min_seconds or len(self.readings) < self.agreeing:
            return False
        latest = self.readings[-1]
        if latest.bottleneck is Bottleneck.unknown:  # nothing judged yet: more data, not an early end
            return False
        if all(r.agrees_with(latest) for r in self.readings[-self.agreeing :]):
            self.settled_at_seconds = elapsed_seconds
            return True
        return False

    def describe(self, longest_seconds: float) -> str:
        """One line for the verdict's notes: where the automatic window ended, and why there."""
        if self.settled_at_seconds is not None:
            return (
                f"automatic window: ended after {self.settled_at_seconds:.0f} s, once {self.agreeing} verdicts in a "
                "row agreed on the class and its key number"
            )
        return f"automatic window: the verdict did not hold still, so the scan ran its full {longest_seconds:g} s"
