"""Rule tests as data: tests/rules/<CODE>.toml lists fail (fired), pass and skipped cases for each rule.

A case gives signal stats; signals it does not list are missing, and a stat set to the string
"unavailable" makes that signal unavailable. The meta-test requires one case of each outcome per rule.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmdiag.config import Mute, RuleOverride, Settings
from llmdiag.engine.evaluate import evaluate_rule
from llmdiag.model import Signal, SignalSet
from llmdiag.schema.base import tomllib
from llmdiag.schema.loader import load_rules

CASES_DIR = Path(__file__).parent
RULES = {r.code: r for r in load_rules()}


def case_files() -> list[Path]:
    return sorted(CASES_DIR.glob("*.toml"))


def signal_set(spec: dict[str, dict[str, float | str]]) -> SignalSet:
    signals = SignalSet()
    for name, stats in spec.items():
        if stats == "unavailable" or stats.get("unavailable"):  # type: ignore[union-attr]
            signals.add(Signal.missing(name, "gauge", "", "not exposed by this server (test case)"))
        else:
            signals.add(Signal(name=name, kind="gauge", unit="", stats={k: float(v) for k, v in stats.items()}))
    return signals


def all_cases() -> list[tuple[str, dict]]:
    out = []
    for path in case_files():
        data = tomllib.loads(path.read_text())
        for case in data["case"]:
            out.append((path.stem, case))
    return out


@pytest.mark.parametrize(("code", "case"), all_cases(), ids=lambda v: v if isinstance(v, str) else v["name"])
def test_rule_case(code: str, case: dict):
    rule = RULES[code]
    settings = Settings()
    if "override" in case:
        settings.rules[code] = RuleOverride(**case["override"])
    if case.get("muted"):
        settings.mute.append(Mute(code=code, reason="muted in a test case"))
    outcome, finding = evaluate_rule(rule, signal_set(case["signals"]), settings)
    assert outcome.status == case["expect"], outcome.reason
    if case["expect"] == "fired":
        assert finding is not None
        assert finding.severity.value == case["severity"]
        # the evidence carries the numbers that prove it: the ladder signal first, with its threshold
        first = finding.evidence[0]
        assert first.signal == rule.severity.signal
        assert first.value == pytest.approx(float(case["signals"][first.signal][first.stat]))
        assert first.threshold is not None
        assert "unavailable" not in finding.summary or case.get("summary_may_lack_values")
        assert finding.fixes and finding.fixes[0] == rule.fix.text
    else:
        assert finding is None
        assert outcome.reason, "a rule that does not fire still says why"
    if "reason_contains" in case:
        assert case["reason_contains"] in outcome.reason


def test_every_rule_has_a_fail_a_pass_and_a_skipped_case():
    have: dict[str, set[str]] = {code: set() for code in RULES}
    for code, case in all_cases():
        assert code in RULES, f"tests/rules/{code}.toml names no rule"
        have[code].add(case["expect"])
    for code, outcomes in have.items():
        missing = {"fired", "passed", "skipped"} - outcomes
        assert not missing, f"tests/rules/{code}.toml lacks cases: {sorted(missing)}"
