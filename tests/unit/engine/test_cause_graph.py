"""Which class is the cause when two fire: the cause graph, then severity, then margin.

A class another firing class explains (a full KV cache makes requests queue; a slow link makes steps slow and
requests queue; slow steps make requests queue) is a symptom, whatever its severity: the verdict is the class that
explains it, and a note says so. Two classes neither explains are rivals: the more severe wins, and the confidence
does not rise (the fitted model: llmdiag.engine.confidence). Preview rules (``status = "preview"``) weigh no more
than stable ones, and a second finding can add to the confidence only when it reads a different signal.

Every pair of classes is judged from findings made the way ``evaluate_rule`` makes them (the ladder's evidence
first, each rule's real code and ladder signal), against a window with every core signal; two real shapes are
judged end to end from their signals.
"""

from __future__ import annotations

import itertools

import pytest

from llmdiag.engine.causes import CAUSES, choose
from llmdiag.engine.confidence import class_confidence as _class_confidence
from llmdiag.engine.evaluate import build_verdict, confidence
from llmdiag.model import Bottleneck, Category, Evidence, Finding, Severity, Signal
from tests.unit.engine.test_verdict import HEALTHY, make

CLASSES = (Category.memory, Category.compute, Category.scheduling, Category.network)
# what each class's cause explains, as this test expects it (written out here, not read from the engine's table)
EXPLAINS = {
    Category.memory: {Category.scheduling},
    Category.network: {Category.compute, Category.scheduling},
    Category.compute: {Category.scheduling},
    Category.scheduling: set(),
}
# one real stable rule per class with its ladder signal (network's are all preview; CMP001, the SLO breach, is
# advisory and never a class)
RULE = {
    Category.memory: ("MEM001", "preemptions_per_finished_request"),
    Category.compute: ("CMP002", "prefill_time_seconds"),
    Category.scheduling: ("SCH001", "requests_waiting_avg"),
    Category.network: ("NET004", "link_utilization_ratio"),
}
WINDOW = make(**HEALTHY)  # every core signal, 21 scrapes: nothing but the findings moves the confidence


def finding(code: str, category: Category, severity: Severity, ladder: str, margin: float = 1.3) -> Finding:
    return Finding(
        code=code,
        slug="made-for-the-test",
        title=code,
        category=category,
        severity=severity,
        summary=f"{code} fired",
        evidence=[Evidence(signal=ladder, stat="value", value=1.0, unit="", threshold=0.8, op=">=")],
        margin=margin,
    )


def of(category: Category, severity: Severity) -> Finding:
    code, ladder = RULE[category]
    return finding(code, category, severity, ladder)


def judged(findings: list[Finding]) -> tuple[Bottleneck, float, list[str]]:
    choice = choose(findings)
    assert choice.primary is not None
    bottleneck = Bottleneck(choice.primary.category.value)
    score, notes = confidence(bottleneck, choice, WINDOW)
    return bottleneck, score, notes


def test_the_table_says_what_this_test_expects_with_a_reason_per_edge_and_no_cycle():
    assert {cause: set(symptoms) for cause, symptoms in CAUSES.items()} == EXPLAINS
    assert all(reason.strip() for symptoms in CAUSES.values() for reason in symptoms.values())

    def reaches(start: Category, seen: frozenset[Category]) -> bool:
        return any(nxt in seen or reaches(nxt, seen | {nxt}) for nxt in CAUSES[start])

    assert not any(reaches(c, frozenset({c})) for c in CLASSES)


PAIRS = [
    (a, b, severity_a)
    for a, b in itertools.combinations(CLASSES, 2)
    for severity_a in (Severity.critical, Severity.warning)
]


@pytest.mark.parametrize(("a", "b", "severity_a"), PAIRS, ids=[f"{a.value}-{s.value}+{b.value}" for a, b, s in PAIRS])
def test_every_pair_of_classes_in_both_severity_orders(a: Category, b: Category, severity_a: Severity):
    severity_b = Severity.warning if severity_a is Severity.critical else Severity.critical
    first, second = of(a, severity_a), of(b, severity_b)
    bottleneck, score, notes = judged([first, second])
    said = " | ".join(notes)
    if b in EXPLAINS[a] or a in EXPLAINS[b]:
        cause, symptom = (first, second) if b in EXPLAINS[a] else (second, first)
        assert bottleneck.value == cause.category.value, said
        assert f"{symptom.code} ({symptom.category.value}) is a symptom of {cause.category.value}" in said
        # a symptom is no rival: the cause stands as it would alone
        assert score == judged([cause])[1]
        assert "does not explain" not in said
    else:
        winner, rival = (first, second) if severity_a is Severity.critical else (second, first)
        assert bottleneck.value == winner.category.value, said
        assert f"{rival.code} ({rival.category.value}, {rival.severity.value}) fired too" in said
        assert f"{winner.category.value} does not explain it" in said
        assert score <= judged([winner])[1]
        assert "symptom" not in said
    loser = b.value if bottleneck.value == a.value else a.value
    out = _class_confidence(bottleneck, round(score, 2), choose([first, second]).findings)
    assert out[bottleneck.value] == round(score, 2) and out[loser] < out[bottleneck.value]


def test_the_verdicts_finding_heads_the_list_even_when_a_symptom_is_more_severe():
    choice = choose([of(Category.scheduling, Severity.critical), of(Category.memory, Severity.warning)])
    assert [f.code for f in choice.findings] == ["MEM001", "SCH001"]


def test_a_rival_at_either_severity_never_raises_the_confidence_and_is_named():
    memory = of(Category.memory, Severity.critical)
    same = judged([memory, of(Category.compute, Severity.critical)])
    lower = judged([memory, of(Category.compute, Severity.warning)])
    alone = judged([memory])
    assert same[0] is lower[0] is Bottleneck.memory
    assert same[1] < alone[1] and lower[1] < alone[1]  # both cannot be the cause: they share one probability
    assert any("CMP002 (compute, critical) fired too" in note for note in same[2])


def test_a_symptom_of_a_rival_is_named_as_such_and_costs_nothing_more():
    # memory and the link both fire, neither explains the other (rivals); the slow steps, critical as they are, are
    # the link's symptom: the verdict is chosen among the unexplained classes (memory critical, network warning)
    memory = of(Category.memory, Severity.critical)
    link = of(Category.network, Severity.warning)
    steps = of(Category.compute, Severity.critical)
    bottleneck, score, notes = judged([memory, link, steps])
    assert bottleneck is Bottleneck.memory
    said = " | ".join(notes)
    assert "CMP002 (compute) is a symptom of network" in said
    assert "NET004 (network, warning) fired too, and memory does not explain it" in said
    assert score == judged([memory, link])[1]


# --- preview rules and independent evidence ---------------------------------------------------------------------


def test_a_preview_rule_starts_no_higher_than_a_stable_one_at_the_same_severity():
    stable = judged([finding("CMP002", Category.compute, Severity.critical, "prefill_time_seconds")])
    preview = judged([finding("CMP005", Category.compute, Severity.critical, "sm_clock_ratio")])
    assert preview[1] <= stable[1]
    assert any("CMP005 is a preview rule" in note for note in preview[2])


def test_a_class_found_by_preview_rules_alone_weighs_no_more_than_with_a_stable_one_among_them():
    link = [
        finding("NET004", Category.network, Severity.critical, "link_utilization_ratio", margin=5.0),
        finding("NET001", Category.network, Severity.critical, "sm_idle_while_gpu_busy_ratio", margin=5.0),
        finding("NET007", Category.network, Severity.critical, "exposed_comm_share_of_step_ratio", margin=5.0),
    ]
    _, score, _ = judged(link)
    _, with_stable, _ = judged([*link, finding("CMP002", Category.network, Severity.critical, "prefill_time_seconds")])
    assert score <= with_stable


def test_a_second_finding_on_the_same_signal_adds_nothing():
    # CMP003, CMP004 and CMP008 all read the inter-token mean over the SLO with the same thresholds: each says where
    # the time goes, none is a second witness that it is slow; the prefill's share of TTFT is
    cmp008 = finding("CMP008", Category.compute, Severity.critical, "itl_mean_over_slo_tpot_ratio")
    again = finding("CMP004", Category.compute, Severity.critical, "itl_mean_over_slo_tpot_ratio")
    prefill = finding("CMP002", Category.compute, Severity.critical, "prefill_time_seconds")
    assert judged([cmp008, again])[1] == judged([cmp008])[1]
    assert judged([prefill, cmp008])[1] >= judged([prefill])[1]


# --- the two shapes end to end ----------------------------------------------------------------------------------


def test_kv_full_and_preempting_beside_admission_rejections_is_memory():
    # 100 s with the KV cache full: 8 running, 3 waiting, 1 preemption for 70 finished requests, and 60 requests
    # rejected at admission (0.6/s): the rejections are the full cache's symptom, whatever their severity
    window = dict(HEALTHY)
    window.update(
        requests_running={"mean": 8, "max": 8, "min": 8, "last": 8, "p90": 8},
        requests_waiting={"mean": 3, "max": 5, "min": 1, "last": 3, "p90": 5},
        kv_cache_usage_ratio={"mean": 0.97, "max": 1.0, "p90": 1.0},
        preemptions_per_second={"rate": 0.01, "increase": 1.0},
        requests_finished_per_second={"rate": 0.7, "increase": 70.0},
        admission_rejections_per_second={"rate": 0.6, "increase": 60.0},
        generation_tokens_per_second={"rate": 240.0, "increase": 24000.0},
        prompt_tokens_per_second={"rate": 120.0, "increase": 12000.0},
        ttft_seconds={"p50": 1.4, "p90": 2.6, "mean": 1.5, "count": 70},
        itl_seconds={"p50": 0.03, "p90": 0.045, "mean": 0.033, "count": 23930},
        queue_time_seconds={"p50": 1.1, "mean": 1.2, "count": 70, "sum": 84.0},
        prefill_time_seconds={"p50": 0.25, "mean": 0.28, "count": 70},
        inference_time_seconds={"p50": 11.0, "mean": 11.4, "count": 70, "sum": 800.0},
    )
    signals = make(**window)
    signals.window.duration_seconds = 100.0
    verdict = build_verdict(signals)
    codes = {f.code: f for f in verdict.findings}
    assert codes["SCH004"].severity is Severity.critical and codes["MEM001"].severity is Severity.warning
    assert verdict.bottleneck is Bottleneck.memory, verdict.summary
    assert verdict.findings[0].category is Category.memory
    rejections = {e.signal: e.value for e in codes["SCH004"].evidence}
    assert rejections["admission_rejections_per_second"] == 0.6
    assert any("SCH004 (scheduling) is a symptom of memory" in note for note in verdict.notes)
    assert verdict.class_confidence["scheduling"] < verdict.class_confidence["memory"]


def test_slow_steps_beside_a_busy_link_are_the_links():
    # inter-token mean 0.12 s (CMP001 critical: the SLO breach) with KV at half; the GPUs busy 95 % of the time but the
    # SMs only 42 % (1 - 0.42 / 0.95 = 0.56 of the busy time idle: NET001 warning) while NVLink moves 45 + 45 GB/s
    window = dict(HEALTHY)
    window.update(
        # 4 running at 0.12 s a token: 33 tokens/s in all, 667 in the 20 s window
        generation_tokens_per_second={"rate": 33.3, "increase": 667.0},
        itl_seconds={"p50": 0.11, "p90": 0.15, "mean": 0.12, "count": 660},
        kv_cache_usage_ratio={"mean": 0.4, "max": 0.5, "p90": 0.5},
        gpu_utilization_ratio={"mean": 0.95, "max": 0.97, "min": 0.93, "last": 0.95},
        sm_active_ratio={"mean": 0.42, "max": 0.45, "min": 0.40, "last": 0.42},
        nvlink_tx_bytes_per_second={"mean": 45e9, "max": 46e9, "min": 44e9, "last": 45e9},
        nvlink_rx_bytes_per_second={"mean": 45e9, "max": 46e9, "min": 44e9, "last": 45e9},
    )
    signals = make(**window)
    signals.add(Signal(name="requests_running_avg", kind="derived", unit="", stats={"value": 4.0}))
    verdict = build_verdict(signals)
    codes = {f.code: f for f in verdict.findings}
    assert codes["CMP001"].severity is Severity.critical and codes["NET001"].severity is Severity.warning
    assert verdict.bottleneck is Bottleneck.network, verdict.summary
    idle = {e.signal: e.value for e in codes["NET001"].evidence}["sm_idle_while_gpu_busy_ratio"]
    assert idle == pytest.approx(1 - 0.42 / 0.95)
    # the slow tokens are said beside it (advisory), never a rival class
    assert codes["CMP001"].advisory and "compute" not in verdict.class_confidence
    # the link's only finding is a preview rule: named
    assert any("NET001 is a preview rule" in note for note in verdict.notes)


def test_hbm_bound_steps_are_compute_where_slow_tokens_alone_are_not():
    # inter-token mean 0.12 s with KV at half (CMP001 critical: the SLO breach, advisory); DCGM shows HBM busy 72 %
    # and the tensor pipes 12 %: CMP004 is the proof that the step is the wall, and names compute
    window = dict(HEALTHY)
    window.update(
        generation_tokens_per_second={"rate": 33.3, "increase": 667.0},
        itl_seconds={"p50": 0.11, "p90": 0.15, "mean": 0.12, "count": 660},
        kv_cache_usage_ratio={"mean": 0.4, "max": 0.5, "p90": 0.5},
    )
    plain = build_verdict(make(**window))
    with_dcgm = make(**window)
    for name, mean in (("dram_active_ratio", 0.72), ("tensor_active_ratio", 0.12)):
        with_dcgm.add(Signal(name=name, kind="gauge", unit="", stats={"mean": mean, "max": mean, "min": mean}))
    both = build_verdict(with_dcgm)
    assert [f.code for f in plain.findings] == ["CMP001"]
    assert plain.bottleneck is not Bottleneck.compute, plain.summary
    assert {f.code for f in both.findings} == {"CMP001", "CMP004"}
    assert both.bottleneck is Bottleneck.compute
    assert both.findings[0].code == "CMP004"
    dram = {e.signal: e.value for e in both.findings[0].evidence}["dram_active_ratio"]
    assert dram == 0.72
