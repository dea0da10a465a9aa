"""The fitted confidence (llmdiag.engine.confidence over rules/confidence.toml): the weights file loads and says where
it came from; the model pulls each way physics and logic demand, whatever the fit found; the decided caps hold; and
the verdict carries the factors it was computed from."""

from __future__ import annotations

import itertools
import math

import pytest

from llmdiag.engine.causes import choose
from llmdiag.engine.confidence import (
    SNAPSHOT_CONFIDENCE_CAP,
    STALL_CAPACITY_CAP,
    UNFITTED_CONFIDENCE_CAP,
    UNKNOWN_CONFIDENCE_CAP,
    class_confidence,
    judge,
    probability,
)
from llmdiag.engine.evaluate import CORE_SIGNALS, build_verdict
from llmdiag.errors import RuleSpecError
from llmdiag.model import Bottleneck, Category, Finding, Severity, Window
from llmdiag.schema.base import parse_toml
from llmdiag.schema.confidence import FACTORS, ConfidenceModel, load_confidence_model
from tests.conftest import REPO_ROOT
from tests.unit.engine.test_cause_graph import finding as cause_graph_finding
from tests.unit.engine.test_verdict import HEALTHY, make

MODEL_FILE = REPO_ROOT / "rules" / "confidence.toml"


def finding(code: str, category: Category, severity: Severity, margin: float = 1.3, stall: bool = False) -> Finding:
    made = cause_graph_finding(code, category, severity, f"{code}_ladder", margin)
    return made.model_copy(update={"stall": stall})


# --- the file ---------------------------------------------------------------------------------------------------


def test_the_weights_file_loads_with_its_provenance():
    model = load_confidence_model()
    assert set(model.weights) == set(FACTORS)
    p = model.provenance
    assert "bench/calibration.py --fit --write" in p.command
    assert p.real_cases > 0 and p.sim_cases > 0
    assert p.held_out_presets and p.held_out_dialects  # whole presets and dialects held out, not seeds
    assert {"real", "sim", "sim_held_out", "field"} <= set(p.measured)
    held = p.measured["sim_held_out"]
    assert held.cases > 0 and 0 < held.accuracy <= 1


def test_a_weight_of_the_wrong_sign_or_a_missing_factor_is_refused():
    text = MODEL_FILE.read_text(encoding="utf-8")
    model = parse_toml(ConfidenceModel, "rules/confidence.toml", text)
    assert model.weights == load_confidence_model().weights
    wrong = text.replace(f"rivals = {model.weights['rivals']!r}", "rivals = 0.5")
    assert wrong != text
    with pytest.raises(RuleSpecError, match="rivals must not be positive"):
        parse_toml(ConfidenceModel, "rules/confidence.toml", wrong)
    missing = "\n".join(line for line in text.splitlines() if not line.startswith("sanity ="))
    with pytest.raises(RuleSpecError, match="missing \\['sanity'\\]"):
        parse_toml(ConfidenceModel, "rules/confidence.toml", missing)


# --- which way each factor pulls -------------------------------------------------------------------------------

BASES = [
    {"critical": 1.0, "coverage": c, "margin": m, "log_window": math.log1p(w), "single_dump": 0.0}
    for c, m, w in itertools.product((0.4, 1.0), (0.0, 1.0), (5.0, 60.0))
]


@pytest.mark.parametrize("base", BASES)
def test_the_fitted_model_pulls_each_way_physics_and_logic_demand(base: dict[str, float]):
    p = probability(base)
    warning = {**base, "critical": 0.0, "warning": 1.0}
    assert probability(warning) <= p  # critical ≥ warning at equal other factors
    for lowers in ("rivals", "single_dump", "sanity", "preview", "few_scrapes"):
        assert probability({**base, lowers: 1.0}) <= p, lowers
    for raises in ("margin", "second_signal", "log_window"):
        assert probability({**base, raises: base.get(raises, 0.0) + 0.5}) >= p, raises
    assert probability({**base, "coverage": base["coverage"] - 0.2}) <= p  # more coverage does not lower


def test_the_signs_hold_in_the_weights_themselves():
    weights = load_confidence_model().weights
    assert weights["critical"] >= weights["warning"]
    for name, (_, sign) in FACTORS.items():
        assert sign * weights[name] >= 0, name


# --- the decided caps ------------------------------------------------------------------------------------------


def test_one_snapshot_stays_below_half_however_strong_the_finding():
    signals = make(**HEALTHY)
    signals.window = Window(kind="snapshot", scrapes=1)
    choice = choose([finding("MEM001", Category.memory, Severity.critical, margin=50.0)])
    judged = judge(Bottleneck.memory, choice, signals, CORE_SIGNALS)
    assert judged.score <= SNAPSHOT_CONFIDENCE_CAP
    assert judged.factors["single_dump"] == 1.0 and judged.factors["log_window"] == 0.0
    assert any("one snapshot" in note for note in judged.notes)


def test_unknown_stays_under_its_cap_and_a_preview_only_class_is_named_and_no_higher():
    signals = make(**HEALTHY)
    unknown = judge(Bottleneck.unknown, choose([]), signals, CORE_SIGNALS)
    assert unknown.score <= UNKNOWN_CONFIDENCE_CAP
    # NET004 is a preview rule: a class that preview rules alone found; NET999 is no rule, so not a preview one
    link = judge(
        Bottleneck.network, choose([finding("NET004", Category.network, Severity.critical)]), signals, CORE_SIGNALS
    )
    stable = judge(
        Bottleneck.network, choose([finding("NET999", Category.network, Severity.critical)]), signals, CORE_SIGNALS
    )
    assert (link.factors["preview"], stable.factors["preview"]) == (1.0, 0.0)
    assert link.score <= stable.score
    assert any("NET004 is a preview rule" in note for note in link.notes)


def test_beside_a_stall_every_capacity_class_stays_below_half_in_any_window():
    stall = finding("SCH003", Category.scheduling, Severity.critical, stall=True)
    rivals = [
        finding(f"{c.value[:3].upper()}999", c, Severity.critical, margin=9.0)
        for c in Category
        if c.value in ("memory", "compute", "network")
    ]
    base = {"coverage": 1.0, "log_window": math.log1p(600.0)}
    out = class_confidence(Bottleneck.stalled, 0.99, [stall, *rivals], base)
    assert out["stalled"] == 0.99
    assert {"memory", "compute", "network"} <= set(out)
    assert all(out[c] <= STALL_CAPACITY_CAP < 0.5 for c in ("memory", "compute", "network"))


def test_a_rival_class_takes_its_share_of_one_probability():
    # memory does not explain compute (engine/causes.py): both stand unexplained, and both cannot be the cause
    signals = make(**HEALTHY)
    memory = finding("MEM999", Category.memory, Severity.critical, margin=3.0)
    compute = finding("CMP999", Category.compute, Severity.critical, margin=3.0)
    alone = judge(Bottleneck.memory, choose([memory]), signals, CORE_SIGNALS)
    both = choose([memory, compute])
    assert [f.code for f in both.rivals] == ["CMP999"]
    shared = judge(Bottleneck.memory, both, signals, CORE_SIGNALS)
    assert shared.score < alone.score
    rival = class_confidence(Bottleneck.memory, shared.score, [memory, compute], shared.factors)["compute"]
    assert rival > 0 and shared.score + rival <= 1.0
    assert any("CMP999 (compute, critical) fired too" in note for note in shared.notes)


def test_a_verdict_without_any_serving_metric_is_not_extrapolated_to():
    # a profiler trace or an NCCL log alone: none of the core signals the fit was made on
    signals = make(**HEALTHY)
    link = finding("NET999", Category.network, Severity.critical, margin=9.0)
    read = judge(Bottleneck.network, choose([link]), signals, CORE_SIGNALS)
    unread = judge(Bottleneck.network, choose([link]), signals, ["no_such_signal"])
    assert unread.factors["coverage"] == 0.0 and read.factors["coverage"] == 1.0
    assert read.score > UNFITTED_CONFIDENCE_CAP >= unread.score
    assert any("no serving metric was read" in note for note in unread.notes)


def test_a_verdict_read_from_a_log_is_stated_no_higher_than_the_field_logs_measured(monkeypatch):
    # the fit saw no server log; the field corpus's log cases say how often a log verdict is right
    import llmdiag.engine.confidence as confidence_module
    from llmdiag.model import SourceInfo
    from llmdiag.schema.confidence import Measured

    real = load_confidence_model()
    measured = {**real.provenance.measured, "field_logs": Measured(cases=12, accuracy=0.75, brier=0.2)}
    model = real.model_copy(update={"provenance": real.provenance.model_copy(update={"measured": measured})})
    monkeypatch.setattr(confidence_module, "load_confidence_model", lambda: model)
    memory = finding("MEM999", Category.memory, Severity.critical, margin=3.0)
    pages = make(**HEALTHY)
    log = make(**HEALTHY)
    log.sources = [SourceInfo(probe="vllm-log")]
    from_pages = judge(Bottleneck.memory, choose([memory]), pages, CORE_SIGNALS)
    from_log = judge(Bottleneck.memory, choose([memory]), log, CORE_SIGNALS)
    assert from_pages.score > 0.75 and from_log.score == 0.75
    assert any("75% of the 12 field log cases" in note for note in from_log.notes)


# --- the verdict carries its factors ---------------------------------------------------------------------------


def test_the_verdict_states_the_model_of_its_own_factors():
    verdict = build_verdict(make(**HEALTHY))
    assert verdict.bottleneck is Bottleneck.healthy
    values = {name: term.value for name, term in verdict.confidence_factors.items()}
    assert set(values) == set(FACTORS)
    # what the input shows: no finding, every core signal, a 20 s window of 21 scrapes
    assert values["no_finding"] == 1.0 and values["coverage"] == 1.0
    assert values["log_window"] == pytest.approx(math.log1p(20.0), abs=1e-4)
    assert values["single_dump"] == 0.0 and values["few_scrapes"] == 0.0
    z = sum(term.value * term.weight for term in verdict.confidence_factors.values())
    assert verdict.confidence == round(min(0.99, max(0.05, 1 / (1 + math.exp(-z)))), 2)
    few = make(window_scrapes=3, **HEALTHY)
    fewer = build_verdict(few)
    assert fewer.confidence_factors["few_scrapes"].value == 1.0
    assert "only 3 scrapes in the window" in fewer.notes
