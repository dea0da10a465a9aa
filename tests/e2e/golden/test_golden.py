"""Outputs pinned by the golden set (see cases.py): a change here is either a bug or an intended change that
regenerates the set in the same commit (`python -m tests.e2e.golden.record`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.golden.cases import FIXTURES, SHARED_TRACES, all_cases, golden_path, pinned_fixtures, run_in_process
from tests.e2e.golden.static import EXAMPLES, RULE_DOCS, RULES_LIST, example_report, rule_docs, rules_list
from tests.support.required import require_traces

REGENERATE = "an intended change regenerates the set: python -m tests.e2e.golden.record"


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pinned_fixtures(tmp_path_factory.mktemp("golden"))


CASES = all_cases(FIXTURES)  # the names; each case runs on the pinned copy


def test_the_set_covers_every_trace_set():
    require_traces(SHARED_TRACES)
    assert sum(1 for c in CASES if c.name.startswith("trace/")) >= 2 * 9


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_golden(name: str, fixtures: Path):
    [case] = [c for c in all_cases(fixtures) if c.name == name]
    expected = json.loads(golden_path(case).read_text())
    got = json.loads(run_in_process(case.args, fixtures).as_json())
    assert got["exit_code"] == expected["exit_code"], REGENERATE
    assert got["stderr"] == expected["stderr"], REGENERATE
    assert got["stdout"] == expected["stdout"], REGENERATE


def test_rules_list():
    assert rules_list() == RULES_LIST.read_text(), REGENERATE


def test_rule_docs_are_what_the_rules_make(tmp_path: Path):
    made = rule_docs(tmp_path)
    committed = {p.name: p.read_text() for p in sorted(RULE_DOCS.glob("*.md"))}
    assert made == committed, "regenerate docs/rules with `llmdiag rules docs`"


def test_example_report_is_what_the_report_command_makes(tmp_path: Path):
    made = example_report(tmp_path)
    for name, text in made.items():
        assert (EXAMPLES / name).read_text() == text, f"reports/examples/{name}: regenerate it (README 'Reports')"
