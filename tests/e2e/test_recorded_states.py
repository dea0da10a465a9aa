"""Real vLLM 0.32 /metrics pages recorded in five states (tests/fixtures/vllm-0.32.0, see its README):
each must give its class and the evidence numbers, from saved dumps and from a live scan replaying them."""

from __future__ import annotations

import json

import pytest

from llmdiag.api import diagnose_files
from llmdiag.config import DEFAULT_SLO_TPOT_SECONDS
from llmdiag.model.report import SCHEMA_VERSION
from tests.conftest import FIXTURES, run_cli
from tests.support.httpserver import ReplayResponder, ScriptedServer

STATES = FIXTURES / "vllm-0.32.0"


def dumps(state: str):
    return sorted((STATES / state).glob("scrape-*.prom"))


def evidence(verdict, code: str) -> dict[str, float | None]:
    finding = next(f for f in verdict.findings if f.code == code)
    return {e.signal: e.value for e in finding.evidence}


def test_idle():
    verdict = diagnose_files(dumps("idle"))
    assert verdict.bottleneck.value == "idle"
    assert verdict.findings == []
    assert verdict.signals["generation_tokens_per_second"].stats["increase"] == 0


def test_healthy():
    verdict = diagnose_files(dumps("healthy"))
    assert verdict.bottleneck.value == "healthy"
    assert {f.category.value for f in verdict.findings} <= {"sanity"}
    assert verdict.signals["generation_tokens_per_second"].stats["rate"] > 100
    assert verdict.signals["requests_waiting_avg"].stats["value"] < 0.5
    # 4 closed-loop users: between 1 and 4 in the batch on average
    assert 1 <= verdict.signals["requests_running_avg"].stats["value"] <= 4


def test_max_num_seqs_2_is_scheduling():
    verdict = diagnose_files(dumps("scheduling"))
    assert verdict.bottleneck.value == "scheduling"
    assert verdict.findings[0].code == "SCH001"
    numbers = evidence(verdict, "SCH001")
    assert numbers["requests_waiting_avg"] > 4  # critical threshold
    assert numbers["requests_running_avg"] <= 3  # the --max-num-seqs cap of 2, plus edge effects
    assert numbers["preemptions_per_second"] == 0
    assert evidence(verdict, "SCH002")["queue_share_of_ttft_ratio"] > 0.8
    # the capacity question: a user who joins the queue gets far less than a running request does
    exp = verdict.experience
    users = exp.requests_running_mean + exp.requests_waiting_mean
    assert exp.per_user_tokens_per_second_incl_waiting == exp.generation_tokens_per_second / users
    assert exp.per_user_tokens_per_second_incl_waiting < exp.per_user_tokens_per_second / 5


def test_kv_starved_is_memory():
    verdict = diagnose_files(dumps("memory"))
    assert verdict.bottleneck.value == "memory"
    assert verdict.findings[0].code == "MEM001"
    numbers = evidence(verdict, "MEM001")
    assert numbers["preemptions_per_second"] > 0
    assert numbers["preemptions_per_finished_request"] >= 0.2
    assert numbers["requests_waiting_avg"] > 10
    assert numbers["kv_cache_usage_ratio"] >= 0.6
    assert not any(f.category.value in ("scheduling", "compute") for f in verdict.findings)


def test_queue_cap_is_scheduling_with_rejections():
    verdict = diagnose_files(dumps("admission"))
    assert verdict.bottleneck.value == "scheduling"
    numbers = evidence(verdict, "SCH004")
    assert numbers["admission_rejections_per_second"] > 1


def test_139m_model_is_compute():
    verdict = diagnose_files(dumps("compute"))
    assert verdict.bottleneck.value == "compute"
    assert verdict.findings[0].category.value == "compute"
    prefill = evidence(verdict, "CMP002")
    assert prefill["prefill_time_seconds"] >= 0.5
    assert prefill["prefill_share_of_ttft_ratio"] >= 0.5
    # the slow decode is the SLO breach beside it (advisory): the mean over the default 50 ms SLO
    cmp001 = next(f for f in verdict.findings if f.code == "CMP001")
    assert cmp001.advisory
    numbers = evidence(verdict, "CMP001")
    mean = next(e.value for e in cmp001.evidence if (e.signal, e.stat) == ("itl_seconds", "mean"))
    assert numbers["itl_mean_over_slo_tpot_ratio"] == pytest.approx(mean / DEFAULT_SLO_TPOT_SECONDS)
    assert numbers["itl_mean_over_slo_tpot_ratio"] >= 1
    assert numbers["preemptions_per_second"] == 0


def test_the_tpot_slo_from_the_command_line_and_llmdiag_toml(tmp_path):
    """The same dumps breach a TPOT SLO under their mean inter-token latency and meet one above it, whether the SLO
    comes from --slo-tpot or from slo_tpot_seconds in llmdiag.toml."""
    files = [str(p) for p in dumps("compute")]
    mean = diagnose_files(dumps("compute")).signals["itl_seconds"].stats["mean"]
    loose = run_cli("analyze", *files, "--json", "--fail-on", "never", "--slo-tpot", f"{2 * mean:.4f}")
    assert loose.returncode == 0, loose.stderr
    assert "CMP001" not in {f["code"] for f in json.loads(loose.stdout)["findings"]}
    config = tmp_path / "llmdiag.toml"
    config.write_text(f"slo_tpot_seconds = {mean / 2:.6f}\n")
    tight = run_cli("analyze", *files, "--json", "--fail-on", "never", "--config", str(config))
    assert tight.returncode == 0, tight.stderr
    cmp001 = next(f for f in json.loads(tight.stdout)["findings"] if f["code"] == "CMP001")
    assert cmp001["evidence"][0]["value"] == pytest.approx(2.0, rel=1e-3)


def test_gauges_sampled_at_the_wrong_moments_are_called_out_and_not_believed():
    # recorded while the scraper was starved: every gauge read 0, the request timings did not lie
    verdict = diagnose_files(dumps("scheduling-starved"))
    assert verdict.signals["requests_waiting"].stats["max"] == 0
    assert verdict.bottleneck.value == "scheduling"
    assert evidence(verdict, "SCH001")["requests_waiting_avg"] > 4
    san = next(f for f in verdict.findings if f.code == "SAN004")
    assert san.evidence[0].value == 1.0  # the running gauge read 0 in every scrape


def test_single_dump_uses_lifetime_averages_and_says_so():
    verdict = diagnose_files(dumps("scheduling")[-1:])
    assert verdict.window.kind == "lifetime"
    assert "lifetime" in verdict.window.note
    assert any("lifetime" in note for note in verdict.notes)
    assert verdict.confidence < diagnose_files(dumps("scheduling")).confidence


@pytest.mark.parametrize(
    ("state", "expected", "code"), [("memory", "memory", "MEM001"), ("scheduling", "scheduling", "SCH001")]
)
def test_live_scan_of_a_replayed_server(state: str, expected: str, code: str):
    with ScriptedServer(ReplayResponder(dumps(state))) as server:
        result = run_cli("scan", server.url, "--duration", "4", "--json", "--fail-on", "never")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["bottleneck"] == expected
    assert data["findings"][0]["code"] == code
    assert data["window"]["scrapes"] >= 3


def test_terminal_output_names_class_evidence_and_flags():
    result = run_cli("analyze", *map(str, dumps("memory")))
    assert result.returncode == 1  # a critical finding, default --fail-on critical
    out = result.stdout
    assert "MEMORY-BOUND" in out
    assert "MEM001" in out and "preemptions_per_second" in out
    assert "--gpu-memory-utilization" in out
    assert "network" in out and "not evaluated" in out
