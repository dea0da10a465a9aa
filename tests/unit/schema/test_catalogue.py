"""The catalogue (probes/, rules/, reports/) is data: valid, documented, self-consistent and shipped in the wheel."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from llmdiag.errors import RuleSpecError
from llmdiag.render.docs import DOC_SECTIONS, render_rule_index, render_rule_markdown
from llmdiag.schema.loader import DATA_TABLES, load_rules, parse_rule, probe_names
from llmdiag.schema.rules import ENGINES
from tests.conftest import REPO_ROOT

MEM001 = "rules/memory/MEM001-kv-cache-saturated.toml"


def test_every_probes_file_is_a_probe_spec_or_a_named_data_table():
    """A TOML file in probes/ that is neither would be loaded as a probe spec and fail: name it in DATA_TABLES."""
    assert {p.stem for p in (REPO_ROOT / "probes").glob("*.toml")} == set(probe_names()) | DATA_TABLES


@pytest.mark.parametrize("folder", ["probes", "rules", "reports"])
def test_data_folders_hold_no_code(folder: str):
    code = [p for p in (REPO_ROOT / folder).rglob("*.py") if p.name != "__init__.py"]
    assert not code, f"{folder}/ is data only; move {code} into llmdiag/"
    init = (REPO_ROOT / folder / "__init__.py").read_text().strip().splitlines()
    assert len(init) == 1, f"{folder}/__init__.py is a one-line marker"


@pytest.mark.parametrize(
    ("old", "new", "field", "reason"),
    [
        (
            'signal = "preemptions_per_finished_request"',
            'signal = "preemptions_per_finnished_request"',
            "severity",
            "no signal named 'preemptions_per_finnished_request'",
        ),
        (
            'signal = "requests_waiting_avg"\nstat = "value"',
            'signal = "requests_waiting_avg"\nstat = "p99"',
            "gate.0",
            "requests_waiting_avg is a derived signal, whose stats are value; not 'p99'",
        ),
        (
            'signal = "kv_cache_usage_ratio"\nstat = "max"',
            'signal = "kv_cache_usage_ratio"\nstat = "rate"',
            "evidence.1",
            "a gauge signal",
        ),
        ("{kv_cache_usage_ratio.max:.0%}", "{kv_cache_usage.max:.0%}", "summary", "{kv_cache_usage.max}: no signal"),
    ],
)
def test_a_rule_reading_an_unknown_signal_or_stat_is_refused_at_load(old: str, new: str, field: str, reason: str):
    """The loader checks every input against the signal registry (llmdiag.schema.registry), so a typo in a rule is
    an error when the catalogue loads, never a rule that is silently always skipped."""
    good = (REPO_ROOT / MEM001).read_text()
    assert old in good
    with pytest.raises(RuleSpecError) as info:
        parse_rule(MEM001, good.replace(old, new, 1))
    assert info.value.field == field
    assert reason in info.value.reason


def test_codes_are_unique_and_files_are_named_after_them():
    rules = load_rules()
    assert len({r.code for r in rules}) == len(rules)
    for rule in rules:
        path = REPO_ROOT / "rules" / rule.category.value / f"{rule.code}-{rule.slug}.toml"
        assert path.is_file()


@pytest.mark.parametrize("rule", load_rules(), ids=lambda r: r.code)
def test_rule_docs_have_every_section(rule):
    page = render_rule_markdown(rule)
    for section in DOC_SECTIONS:
        header = f"## {section}\n\n"
        assert header in page, f"{rule.code}: missing section {section}"
        body = page.split(header, 1)[1].split("\n## ", 1)[0].strip()
        assert body, f"{rule.code}: section '{section}' is empty"
    assert rule.fix.vllm or rule.category.value == "sanity" or "vllm" not in rule.fix.applies_to, (
        f"{rule.code} names no vLLM flag to change"
    )


def test_committed_rule_docs_are_up_to_date():
    docs = REPO_ROOT / "docs" / "rules"
    for rule in load_rules():
        page = docs / f"{rule.code}-{rule.slug}.md"
        assert page.is_file() and page.read_text() == render_rule_markdown(rule), (
            f"{page.name} is stale: run `llmdiag rules docs`"
        )
    assert (docs / "README.md").read_text() == render_rule_index(load_rules())


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('code = "XYZ001"', "code"),
        ("this is = = not toml", "(file)"),
    ],
)
def test_bad_rule_files_name_the_path_and_field(text: str, field: str):
    good = (REPO_ROOT / MEM001).read_text()
    broken = good.replace('code = "MEM001"', text) if field != "(file)" else text
    with pytest.raises(RuleSpecError) as info:
        parse_rule("rules/memory/MEM001-kv-cache-saturated.toml", broken)
    assert info.value.field == field
    assert "rules/memory/MEM001-kv-cache-saturated.toml" in str(info.value)


def test_rule_file_name_must_match_code_and_slug():
    good = (REPO_ROOT / MEM001).read_text()
    with pytest.raises(RuleSpecError, match="must be named MEM001-kv-cache-saturated.toml"):
        parse_rule("rules/memory/MEM009-other.toml", good)


def test_wheel_ships_the_catalogue(tmp_path: Path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(tmp_path), str(REPO_ROOT)],
        check=True,
        capture_output=True,
    )
    wheel = next(tmp_path.glob("llmdiag-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "llmdiag/probes/vllm.toml" in names
    assert {f"llmdiag/probes/tables/{t}.toml" for t in ("gpus", "interconnects", "models")} <= names
    assert "llmdiag/probes/signals.toml" in names and "llmdiag/probes/logs.toml" in names
    assert "llmdiag/rules/memory/MEM001-kv-cache-saturated.toml" in names
    assert "llmdiag/py.typed" in names
    assert "llmdiag/reports/report.html.j2" in names and "llmdiag/reports/vendor/uplot/uPlot.iife.min.js" in names
    assert not any(n.startswith("llmdiag/reports/examples/") for n in names)
    code_packages = {p.parent.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "llmdiag").rglob("__init__.py")}
    for package in code_packages:
        assert f"{package}/__init__.py" in names, f"{package} is not in the wheel: list it in pyproject.toml"
    assert not any(n.startswith(("probes/", "rules/", "tests/")) for n in names)


@pytest.mark.parametrize("rule", load_rules(), ids=lambda r: r.code)
def test_rule_fixes_cover_every_engine_it_applies_to(rule):
    """Each engine in ``applies_to`` (default: all five) gets its own flags; an engine the rule cannot judge or has
    no knob for is left out of ``applies_to``, with a comment in the rule file saying why."""
    fix = rule.fix
    assert fix.text.strip(), f"{rule.code}: empty fix text"
    named = [engine for engine in ENGINES if fix.for_engine(engine)]
    if rule.category.value == "sanity" and not named:
        return  # sanity fixes are about the exporter's data: one text, the same for every engine
    assert fix.applies_to, f"{rule.code}: applies to no engine"
    for engine in fix.applies_to:
        flags = fix.for_engine(engine)
        assert flags, f"{rule.code} applies to {engine} but names none of its flags (or leave it out of applies_to)"
        assert all(flag.strip() for flag in flags), f"{rule.code}: an empty {engine} fix"
    assert set(named) <= set(fix.applies_to)


@pytest.mark.parametrize(
    ("fix", "reason"),
    [
        ('vlmm = ["--max-num-seqs higher"]', "Extra inputs are not permitted"),  # an unknown engine key
        ('applies_to = ["vllm", "ollama"]', "applies_to"),
        ('applies_to = ["vllm"]', "fixes for sglang, trtllm, which applies_to leaves out"),
        ('tgi = [" "]', "an empty fix for tgi"),
    ],
)
def test_fix_schema_rejects_unknown_engines_and_stray_fixes(fix: str, reason: str):
    good = (REPO_ROOT / MEM001).read_text()
    broken = good.replace("[fix]\n", f"[fix]\n{fix}\n", 1).replace('applies_to = ["vllm", "sglang", "trtllm"]', "")
    with pytest.raises(RuleSpecError, match=reason) as info:
        parse_rule("rules/memory/MEM001-kv-cache-saturated.toml", broken)
    assert info.value.field.startswith("fix")
