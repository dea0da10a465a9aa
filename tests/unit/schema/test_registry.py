"""The signal registry (probes/signals.toml + the probe specs + probes/logs.toml) against the code that makes signals.

Each producer is run here and what it makes is compared with what it declares: a signal made but not declared (or
made with another kind or unit) fails, and so does one declared but no longer made.
"""

from __future__ import annotations

import importlib

import pytest

from llmdiag.client.endpoint import Connection
from llmdiag.client.result import RequestResult
from llmdiag.collect.canary import Canary
from llmdiag.collect.files import collect_files
from llmdiag.collect.logs import collect_logs
from llmdiag.collect.servers.llamacpp import finish_llamacpp_signals
from llmdiag.collect.trace.signals import trace_signals
from llmdiag.config import Settings
from llmdiag.engine.baseline import BASELINE_SIGNALS, Baseline, add_baseline_signals
from llmdiag.engine.capacity import roofline_signal
from llmdiag.engine.derived import REGISTRY as DERIVED
from llmdiag.engine.derived import add_derived
from llmdiag.engine.fleet import FLEET_SIGNALS, fleet_signal_set
from llmdiag.engine.slo import SLO_SIGNALS, add_slo_signals
from llmdiag.errors import LlmdiagError, RuleSpecError
from llmdiag.model import Roofline, Signal, SignalSet, TraceReport
from llmdiag.schema.base import parse_toml
from llmdiag.schema.loader import (
    load_code_signals,
    load_log_spec,
    load_probe,
    load_rules,
    load_signal_registry,
    probe_names,
)
from llmdiag.schema.registry import SignalCatalogue, build_registry
from tests.e2e.golden.cases import _analyze_inputs, pinned_fixtures

REGISTRY = load_signal_registry()


def _names(signals: SignalSet) -> set[str]:
    return set(signals.signals)


def _exactly_declared(signals: SignalSet, producer: str) -> None:
    assert REGISTRY.produced_problems(signals.signals.values(), producer) == []
    assert _names(signals) == set(REGISTRY.produced_by(producer)), f"{producer} makes other signals than it declares"


# ---------------------------------------------------------------------------------------------
# the catalogue itself


def test_every_producer_names_its_module_and_declares_signals():
    for producer in REGISTRY.producers:
        importlib.import_module(producer.module)
        assert REGISTRY.produced_by(producer.name), f"{producer.name} declares no signal"


def test_probe_specs_and_log_fields_are_in_the_registry():
    for name in probe_names():
        spec = load_probe(name)
        declared = REGISTRY.produced_by(f"probe:{name}")
        assert {s.name for s in spec.signal} | {b.name for b in spec.by_design} == set(declared)
    assert {f.signal for f in load_log_spec().field} <= set(REGISTRY.produced_by("logs"))


def test_one_name_has_one_unit():
    code = load_code_signals().model_copy(deep=True)
    index = next(i for i, s in enumerate(code.signal) if s.name == "itl_seconds")  # a server's is in seconds too
    code.signal[index] = code.signal[index].model_copy(update={"unit": "furlongs"})
    probes = [load_probe(n) for n in probe_names()]
    with pytest.raises(RuleSpecError, match="one unit per name"):
        build_registry(code, probes, load_log_spec())


PRODUCER_A = '[[producer]]\nname = "a"\nmodule = "llmdiag.a"\nhelp = "a"\n'


def _signal(name: str, kind: str, producer: str) -> str:
    return f'[[signal]]\nname = "{name}"\nkind = "{kind}"\nunit = "s"\nproducer = "{producer}"\nhelp = "h"\n'


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (PRODUCER_A + _signal("x", "derived", "b"), "no [[producer]] named 'b'"),
        (PRODUCER_A + _signal("x_total", "counter", "a"), "their name must end in _per_second"),
        (PRODUCER_A + _signal("x", "derived", "a") * 2, "x is declared twice by a"),
    ],
)
def test_signal_catalogue_refuses_inconsistent_declarations(text: str, reason: str):
    with pytest.raises(RuleSpecError) as info:
        parse_toml(SignalCatalogue, "probes/signals.toml", text)
    assert reason in info.value.reason


def _with_form(name: str, **update: object) -> None:
    """Build the registry with one derived signal's PromQL form replaced."""
    code = load_code_signals().model_copy(deep=True)
    index = next(i for i, s in enumerate(code.signal) if s.name == name and s.producer == "derived")
    code.signal[index] = code.signal[index].model_copy(update=update)
    build_registry(code, [load_probe(n) for n in probe_names()], load_log_spec())


@pytest.mark.parametrize(
    ("update", "reason"),
    [
        ({"promql": "{queue_time_seconds.p42} / {window_seconds}"}, "not 'p42'"),
        ({"promql": ["{no_such_signal.value}", "{requests_waiting.mean}"]}, "no signal named 'no_such_signal'"),
        ({"promql": 'sum({requests_waiting.mean}{job="x"})'}, "a brace that is not a {signal.stat}"),
        ({"promql": "", "promql_unavailable": ""}, "needs promql, or promql_unavailable"),
    ],
)
def test_a_derived_signals_promql_form_is_checked_against_the_registry(update: dict, reason: str):
    _with_form("requests_waiting_avg")  # the catalogue's own form builds
    with pytest.raises(RuleSpecError) as info:
        _with_form("requests_waiting_avg", **{"promql": "", "promql_unavailable": "", **update})
    assert reason in info.value.reason


def test_a_probes_estimate_is_checked_against_the_registry():
    probes = [load_probe(n) for n in probe_names()]
    trtllm = next(p for p in probes if p.name == "trtllm")
    estimate = trtllm.estimate[0]
    broken = estimate.model_copy(update={"promql": {"rate": "{requests_paused.p99}"}})
    probes[probes.index(trtllm)] = trtllm.model_copy(update={"estimate": [broken]})
    with pytest.raises(RuleSpecError) as info:
        build_registry(load_code_signals(), probes, load_log_spec())
    assert info.value.path == "probes/trtllm.toml" and "p99" in info.value.reason


def test_every_derived_signal_says_its_promql_form_or_why_not():
    for declared in REGISTRY.declared:
        if declared.producer == "derived":
            assert bool(declared.promql) != bool(declared.promql_unavailable), declared.name
    assert {d.name for d in DERIVED} <= {d.name for d in REGISTRY.declared if d.producer == "derived"}


def test_a_sanity_rules_doubts_name_signals_or_kinds():
    rule = next(r for r in load_rules() if r.code == "SAN002")
    assert REGISTRY.rule_problems(rule) == []
    doubting = rule.model_copy(update={"doubts": ["counter", "no_such_signal"]})
    assert [field for field, _ in REGISTRY.rule_problems(doubting)] == ["doubts"]


def test_a_rule_may_read_any_stat_of_any_kind_its_signal_is_made_as():
    assert REGISTRY.kinds("itl_seconds") == {"histogram", "gauge"}  # a server's histogram, a log's estimate
    assert REGISTRY.ref_problem("itl_seconds", "p99") is None and REGISTRY.ref_problem("itl_seconds", "last") is None
    assert REGISTRY.ref_problem("max_active_requests", "last") is None  # llama.cpp's info carries last too
    assert "not 'rate'" in (REGISTRY.ref_problem("kv_cache_usage_ratio", "rate") or "")


# ---------------------------------------------------------------------------------------------
# producers in code, run


def test_derived_signals_take_their_declaration():
    signals = SignalSet()
    add_derived(signals)
    _exactly_declared(signals, "derived")
    declared = REGISTRY.produced_by("derived")
    assert all(d.unit == declared[d.name].unit and d.help == declared[d.name].help for d in DERIVED)


def test_trace_signals_are_declared():
    _exactly_declared(trace_signals(TraceReport()), "trace")


def test_fleet_signals_are_declared():
    signals, _ = fleet_signal_set([], None)
    _exactly_declared(signals, "fleet")
    assert set(FLEET_SIGNALS) == _names(signals)


def test_baseline_signals_are_declared():
    signals = SignalSet()
    add_baseline_signals(signals, Baseline(target="t", since_unix=0.0, days=7.0, min_checks=3))
    _exactly_declared(signals, "baseline")
    assert {name for name, _ in BASELINE_SIGNALS.values()} == _names(signals)


def test_slo_signals_are_declared():
    signals = SignalSet()
    add_slo_signals(signals, Settings(slo_tpot_seconds=0.08))
    _exactly_declared(signals, "slo")
    assert set(SLO_SIGNALS) == _names(signals)


def test_canary_signals_are_declared():
    done = RequestResult(request_id="1", started_at=0.0, first_token_at=0.1, token_times=[0.1, 0.2], ended_at=0.3)
    done.output_tokens, done.prompt_tokens, done.status = 2, 64, 200
    canary = Canary(Connection(base_url="http://127.0.0.1:9"), duration_seconds=10.0)
    _exactly_declared(canary._signals([done], [], [done]), "canary")


def test_llamacpp_signals_are_declared():
    signals = SignalSet()
    finish_llamacpp_signals(signals)
    _exactly_declared(signals, "llamacpp")


def test_the_roofline_is_made_as_its_derived_declaration():
    roofline = Roofline(
        gpu="H100",
        model="llama-3-8b",
        tp=1,
        batch_sequences=8.0,
        context_tokens=1000.0,
        ceiling_tokens_per_second=2000.0,
        measured_tokens_per_second=1000.0,
        fraction_of_ceiling_ratio=0.5,
        bound_by="hbm_bandwidth",
    )
    assert REGISTRY.produced_problems([roofline_signal(roofline)], "derived") == []


@pytest.fixture(scope="module")
def fixture_signals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Signal]]:
    """Every dump, log and record under tests/fixtures collected (as `llmdiag analyze` does), with the derived ones."""
    made: dict[str, list[Signal]] = {}
    for name, paths in _analyze_inputs(pinned_fixtures(tmp_path_factory.mktemp("fixtures"))):
        try:
            signals = collect_logs(paths) if paths[0].suffix == ".log" else collect_files(paths, probe=None)
        except LlmdiagError:  # the bad-input fixtures: their errors are pinned by the golden set
            continue
        add_derived(signals)
        made[name] = list(signals.signals.values())
    return made


def test_every_signal_the_fixtures_give_is_declared(fixture_signals: dict[str, list[Signal]]):
    for name, signals in fixture_signals.items():
        assert REGISTRY.produced_problems(signals) == [], name


@pytest.mark.parametrize("producer", ["collector", "logs", "trtllm-records"])
def test_what_sources_declare_they_make(producer: str, fixture_signals: dict[str, list[Signal]]):
    """Declared (kind included) and made by some fixture: a declaration the code no longer honours fails."""
    made = {(s.name, s.kind) for signals in fixture_signals.values() for s in signals}
    for declared in REGISTRY.produced_by(producer).values():
        assert (declared.name, declared.kind) in made, f"{producer} declares {declared.name}, no fixture makes it"


def test_trtllm_records_add_only_what_they_declare(fixture_signals: dict[str, list[Signal]]):
    known = set(REGISTRY.produced_by("probe:trtllm")) | set(REGISTRY.produced_by("derived"))
    known |= set(REGISTRY.produced_by("collector"))
    made = {s.name for name, signals in fixture_signals.items() if name.startswith("trtllm/") for s in signals}
    assert made - known == set(REGISTRY.produced_by("trtllm-records"))
