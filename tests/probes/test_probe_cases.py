"""Probe specs tested as data: tests/probes/<probe>.toml holds cases, each a window of scrapes and what the probe's
spec (probes/<probe>.toml) must make of them.

A case is two or more pages of Prometheus text with their times (``[[case.page]]``: ``at``, ``text``), written as a
server generation or version names its metrics, and what is expected:

* ``[case.expect.SIGNAL]``: ``kind``; ``source``, the wire name the signal must be read from, or
  ``source_contains``, words of a derived signal's source; ``by_series``; every other key is a stat (``mean``,
  ``rate``, ``p90`` …) with its value computed by hand from the pages (the case's comments show the sums);
* ``[case.unavailable]``: SIGNAL = words (or a list of them) its reason must contain;
* ``models`` / ``engines``: what the source info lists; ``anomaly_contains`` / ``no_anomaly_contains``: words some
  anomaly holds, or none may;
* ``xfail = "reason"``: a known mapping bug, kept in the data; the case must fail (strict).

The meta-tests hold the data to the specs: every name of every alias list is the ``source`` of some case's
expectation, and dropping it from a copy of the spec (or a unit's scale) makes that case fail.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from llmdiag.collect.exposition import parse_exposition
from llmdiag.collect.servers.pages import build_server_signals
from llmdiag.collect.signals import build_signal_set
from llmdiag.model import SignalSet
from llmdiag.schema.base import tomllib
from llmdiag.schema.loader import load_probe, probe_names
from llmdiag.schema.probes import STAT_NAMES, ProbeSpec

CASES_DIR = Path(__file__).parent
# what a case may say (a typo is an error, not a check silently skipped)
CASE_KEYS = {"name", "page", "expect", "unavailable", "models", "engines", "xfail"}
CASE_KEYS |= {"anomaly_contains", "no_anomaly_contains"}
EXPECT_KEYS = {"kind", "source", "source_contains", "by_series"}
WHERE = "test case"


def case_files() -> list[Path]:
    return sorted(CASES_DIR.glob("*.toml"))


def all_cases() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in case_files():
        for case in tomllib.loads(path.read_text(encoding="utf-8"))["case"]:
            out.append((path.stem, case))
    return out


def build(spec: ProbeSpec, case: dict[str, Any]) -> SignalSet:
    """The case's pages parsed and turned into signals as a scan does: servers through their own module."""
    scrapes = [
        parse_exposition(page["text"], float(page["at"]), origin=f"{case['name']}, page {i}")
        for i, page in enumerate(case["page"], 1)
    ]
    if spec.role == "server":
        return build_server_signals(spec, scrapes, WHERE)
    return build_signal_set(spec, scrapes, WHERE)


def wire_name(spec: ProbeSpec, source: str) -> str | None:
    """The wire name a signal was read from: its source is 'probe path: NAME' (' / DIVISOR' for divided gauges)."""
    prefix = f"{spec.name} {spec.metrics_path}: "
    if not source.startswith(prefix):
        return None
    return source.removeprefix(prefix).split(" / ")[0]


def close(got: float | None, want: float) -> bool:
    return got is not None and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)


def words(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def stats_of(expected: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in expected.items() if k not in EXPECT_KEYS}


def problems(spec: ProbeSpec, case: dict[str, Any]) -> list[str]:
    """What the signals built from the case's pages get wrong; empty when they are as the case expects."""
    signals = build(spec, case)
    found: list[str] = []
    for name, expected in case.get("expect", {}).items():
        signal = signals.get(name)
        if signal is None:
            found.append(f"{name}: not built")
            continue
        if signal.unavailable is not None:
            found.append(f"{name}: unavailable ({signal.unavailable}), expected {stats_of(expected)}")
            continue
        if signal.kind != expected["kind"]:
            found.append(f"{name}: kind {signal.kind}, expected {expected['kind']}")
        if "source" in expected and wire_name(spec, signal.source) != expected["source"]:
            found.append(f"{name}: read from '{signal.source}', expected {expected['source']}")
        if "source_contains" in expected and expected["source_contains"] not in signal.source:
            found.append(f"{name}: source '{signal.source}' lacks '{expected['source_contains']}'")
        for stat, want in stats_of(expected).items():
            if not close(signal.stats.get(stat), want):
                found.append(f"{name}.{stat}: {signal.stats.get(stat)}, expected {want}")
        for series, want in expected.get("by_series", {}).items():
            if not close(signal.by_series.get(series), float(want)):
                found.append(f"{name} by_series: {signal.by_series}, expected {series} = {want}")
    for name, reason_words in case.get("unavailable", {}).items():
        signal = signals.get(name)
        if signal is None:
            found.append(f"{name}: not built, expected unavailable")
        elif signal.unavailable is None:
            found.append(f"{name}: available ({signal.stats}, {signal.source}), expected unavailable")
        else:
            missing = [w for w in words(reason_words) if w not in signal.unavailable]
            found += [f"{name}: reason '{signal.unavailable}' lacks '{w}'" for w in missing]
    for word in case.get("anomaly_contains", []):
        if not any(word in a for a in signals.anomalies):
            found.append(f"no anomaly says '{word}': {signals.anomalies}")
    for word in case.get("no_anomaly_contains", []):
        found += [f"anomaly says '{word}': {a}" for a in signals.anomalies if word in a]
    source = signals.sources[0] if signals.sources else None
    for key in ("models", "engines"):
        if key in case and (source is None or getattr(source, key) != case[key]):
            found.append(f"source {key}: {getattr(source, key, None)}, expected {case[key]}")
    return found


def case_params() -> list[Any]:
    params = []
    for probe, case in all_cases():
        marks = [pytest.mark.xfail(reason=case["xfail"], strict=True)] if "xfail" in case else []
        params.append(pytest.param(probe, case, marks=marks, id=f"{probe}: {case['name']}"))
    return params


@pytest.mark.parametrize(("probe", "case"), case_params())
def test_probe_case(probe: str, case: dict[str, Any]):
    found = problems(load_probe(probe), case)
    assert not found, "\n".join(found)


# ---------------------------------------------------------------------------------------------
# the data held to the specs


def alias_lists(spec: ProbeSpec) -> dict[str, list[str]]:
    """Signal name → its wire names, for every signal that may come from more than one name."""
    return {s.name: s.metrics for s in spec.signal if len(s.metrics) > 1}


def read_from(probe: str) -> set[tuple[str, str]]:
    """(signal, wire name) pairs that some case of the probe expects a signal to be read from."""
    return {
        (name, expected["source"])
        for p, case in all_cases()
        if p == probe
        for name, expected in case.get("expect", {}).items()
        if "source" in expected
    }


def test_case_files_are_well_formed():
    probes = set(probe_names())
    for probe, case in all_cases():
        where = f"tests/probes/{probe}.toml, case '{case.get('name')}'"
        assert probe in probes, f"{where}: no probe spec probes/{probe}.toml"
        assert not set(case) - CASE_KEYS, f"{where}: unknown keys {sorted(set(case) - CASE_KEYS)}"
        times = [float(page["at"]) for page in case["page"]]
        assert len(times) >= 2 and times == sorted(set(times)), f"{where}: two or more pages, in time order"
        for name, expected in case.get("expect", {}).items():
            assert expected.get("kind") in STAT_NAMES, f"{where}: {name} needs a kind ({sorted(STAT_NAMES)})"
            allowed = STAT_NAMES[expected["kind"]]
            assert set(stats_of(expected)) <= allowed, f"{where}: {name} has stats outside {sorted(allowed)}"
            assert stats_of(expected) or "source" in expected, f"{where}: {name} expects nothing"


@pytest.mark.parametrize("probe", probe_names())
def test_every_name_of_an_alias_list_has_a_case(probe: str):
    """A new alias in probes/<probe>.toml needs a case that reads it (and one that reads each name it stands for)."""
    covered = read_from(probe)
    lacking = [
        f"{signal}: {name}"
        for signal, names in alias_lists(load_probe(probe)).items()
        for name in names
        if (signal, name) not in covered
    ]
    assert not lacking, f"tests/probes/{probe}.toml has no case reading {lacking}"


def _without(spec: ProbeSpec, signal: str, name: str) -> ProbeSpec:
    """A copy of the spec whose ``signal`` no longer lists the wire name ``name``."""
    broken = spec.model_copy(deep=True)
    for s in broken.signal:
        if s.name == signal:
            s.metrics = [m for m in s.metrics if m != name] or ["(dropped)"]
    return broken


def _scaled(spec: ProbeSpec, signal: str) -> ProbeSpec:
    """A copy of the spec whose ``signal`` is scaled ten times too much (a wrong unit divisor)."""
    broken = spec.model_copy(deep=True)
    for s in broken.signal:
        if s.name == signal:
            s.scale *= 10.0
    return broken


def _passing_cases() -> list[tuple[str, dict[str, Any]]]:
    return [(probe, case) for probe, case in all_cases() if "xfail" not in case]


def test_dropping_a_name_from_the_spec_fails_the_cases_that_read_it():
    """The runner really checks the mapping: without the wire name a case reads, that case fails."""
    unnoticed = []
    for probe, case in _passing_cases():
        spec = load_probe(probe)
        for signal, expected in case.get("expect", {}).items():
            if signal not in alias_lists(spec) or "source" not in expected:
                continue
            if not problems(_without(spec, signal, expected["source"]), case):
                unnoticed.append(f"{probe}: {case['name']}: {signal} without {expected['source']}")
    assert not unnoticed, unnoticed


def test_changing_a_unit_fails_the_cases_that_check_it():
    """A scaled signal (µs → s, MiB → bytes, % → ratio) whose values a case checks fails with the wrong scale."""
    unnoticed = []
    checked = 0
    for probe, case in _passing_cases():
        spec = load_probe(probe)
        scales = {s.name: s.scale for s in spec.signal}
        for signal, expected in case.get("expect", {}).items():
            scaled_stats = {k: v for k, v in stats_of(expected).items() if k != "count" and v != 0}
            if scales.get(signal, 1.0) != 1.0 and scaled_stats:
                checked += 1
                if not problems(_scaled(spec, signal), case):
                    unnoticed.append(f"{probe}: {case['name']}: {signal} × 10")
    assert checked, "no case checks a scaled signal"
    assert not unnoticed, unnoticed
