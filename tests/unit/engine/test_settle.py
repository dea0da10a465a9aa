"""`scan --duration auto`: when the interim verdicts let a window end early, and when they must not."""

from __future__ import annotations

from llmdiag.engine.settle import AGREEING_VERDICTS, AUTO_MIN_SECONDS, VerdictSettler
from llmdiag.model import Bottleneck, Verdict, Window
from llmdiag.model.verdict import Category, Evidence, Finding, Severity


def verdict(bottleneck: str, code: str | None = None, value: float = 0.0, severity: str = "critical") -> Verdict:
    findings = []
    if code is not None:
        findings.append(
            Finding(
                code=code,
                slug="x",
                title="x",
                category=Category(bottleneck),
                severity=Severity(severity),
                summary="",
                evidence=[Evidence(signal="requests_waiting_avg", stat="value", value=value, unit="requests")],
            )
        )
    return Verdict(
        bottleneck=Bottleneck(bottleneck),
        confidence=0.8,
        confidence_label="high",
        summary="",
        window=Window(kind="window"),
        findings=findings,
    )


def first_stop(sequence: list[Verdict], start_seconds: float = 2.0) -> float | None:
    """Feed one verdict a second from ``start_seconds``: the elapsed seconds at which the settler ends the window."""
    settler = VerdictSettler()
    for index, interim in enumerate(sequence):
        elapsed = start_seconds + index
        if settler.observe(interim, elapsed):
            assert settler.settled_at_seconds == elapsed
            return elapsed
    return None


def test_a_steady_verdict_ends_the_window_once_enough_agree_and_not_before_the_minimum():
    steady = [verdict("scheduling", "SCH001", 30.0 + 0.5 * i) for i in range(15)]
    stop = first_stop(steady)
    assert stop is not None
    assert stop >= AUTO_MIN_SECONDS
    # the readings that agreed all came after the first: not a single reading taken as settled
    assert stop >= 2.0 + AGREEING_VERDICTS - 1


def test_a_class_that_flips_keeps_the_window_going_until_it_holds():
    flipping = [verdict("scheduling", "SCH001", 30.0) if i % 2 else verdict("healthy") for i in range(10)]
    assert first_stop(flipping) is None
    then_steady = flipping + [verdict("memory", "MEM001", 1.0)] * AGREEING_VERDICTS
    assert first_stop(then_steady) == 2.0 + len(then_steady) - 1


def test_a_key_number_still_moving_keeps_the_window_going():
    # the same class and finding, but the queue doubling every second: not yet the number the window will show
    growing = [verdict("scheduling", "SCH001", 2.0 * 2**i) for i in range(10)]
    assert first_stop(growing) is None


def test_a_change_of_severity_is_a_change():
    mixed = [verdict("memory", "MEM001", 1.0, "critical" if i % 2 else "warning") for i in range(10)]
    assert first_stop(mixed) is None


def test_unknown_never_ends_the_window_early():
    assert first_stop([verdict("unknown")] * 15) is None


def test_the_note_says_where_the_window_ended_or_that_it_ran_in_full():
    settler = VerdictSettler()
    for i in range(8):
        settler.observe(verdict("healthy"), 1.0 + i)
    assert "ended after" in settler.describe(20.0) and f"{settler.settled_at_seconds:.0f} s" in settler.describe(20.0)
    restless = VerdictSettler()
    for i in range(8):
        restless.observe(verdict("healthy" if i % 2 else "idle"), 1.0 + i)
    assert "full 20 s" in restless.describe(20.0)
