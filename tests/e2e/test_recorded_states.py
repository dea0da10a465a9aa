"""Real vLLM 0.32 /metrics pages recorded in five states (tests/fixtures/vllm-0.32.0, see its README):
each must give its class and the evidence numbers, from saved dumps and from a live scan replaying them.

The evidence is checked against numbers this file computes from the recordings themselves, read with
prometheus_client's parser (not llmdiag's), and against the load and server settings in each state's meta.json:
a rule's threshold is never the expectation."""

from __future__ import annotations

import json
import re
import statistics

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmdiag.api import diagnose_files
from llmdiag.config import DEFAULT_SLO_TPOT_SECONDS
from llmdiag.model.report import SCHEMA_VERSION
from tests.conftest import FIXTURES, run_cli
from tests.support.httpserver import ReplayResponder, ScriptedServer

STATES = FIXTURES / "vllm-0.32.0"
SAME = 1e-9  # the same numbers by another road: only float rounding apart


def dumps(state: str):
    return sorted((STATES / state).glob("scrape-*.prom"))


def evidence(verdict, code: str) -> dict[str, float | None]:
    finding = next(f for f in verdict.findings if f.code == code)
    return {e.signal: e.value for e in finding.evidence}


class Recorded:
    """One state's dumps read independently of llmdiag: window deltas between the first and last scrape, gauge
    readings per scrape, and the state's meta.json (the load the recorder drove, the server's arguments)."""

    def __init__(self, state: str) -> None:
        self.scrapes: list[tuple[float, dict[str, list[tuple[dict[str, str], float]]]]] = []
        for path in dumps(state):
            text = path.read_text()
            at = re.search(r"^# llmdiag-scraped-at: ([0-9.]+)$", text, re.M)
            assert at, path
            samples: dict[str, list[tuple[dict[str, str], float]]] = {}
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    samples.setdefault(s.name, []).append((s.labels, s.value))
            self.scrapes.append((float(at.group(1)), samples))
        self.meta = json.loads((STATES / state / "meta.json").read_text())
        self.window_seconds = self.scrapes[-1][0] - self.scrapes[0][0]

    @staticmethod
    def _total(samples: dict, name: str, **labels: str) -> float:
        return sum(v for lab, v in samples.get(name, []) if all(lab.get(k) == w for k, w in labels.items()))

    def delta(self, name: str, **labels: str) -> float:
        return self._total(self.scrapes[-1][1], name, **labels) - self._total(self.scrapes[0][1], name, **labels)

    def rate(self, name: str) -> float:
        return self.delta(name) / self.window_seconds

    def gauge(self, name: str) -> list[float]:
        return [self._total(samples, name) for _, samples in self.scrapes]

    def mean(self, histogram: str) -> float:
        """The window's mean observation: Δsum / Δcount."""
        return self.delta(f"{histogram}_sum") / self.delta(f"{histogram}_count")

    def time_average(self, histogram: str, gauge: str) -> float:
        """Requests in a stage on average: the larger of Little's law (seconds spent in it per second) and the
        gauge's mean (signals.toml's definition of requests_waiting_avg and requests_running_avg)."""
        return max(self.delta(f"{histogram}_sum") / self.window_seconds, statistics.mean(self.gauge(gauge)))

    def median_bucket(self, histogram: str) -> tuple[float, float]:
        """The (lower, upper] bucket bounds that hold the window's median observation."""
        first, last = self.scrapes[0][1], self.scrapes[-1][1]
        bounds = sorted({float(lab["le"]) for lab, _ in last[f"{histogram}_bucket"]})
        cumulative = [(le, self._total(last, f"{histogram}_bucket", le=_le(le))) for le in bounds]
        cumulative = [(le, n - self._total(first, f"{histogram}_bucket", le=_le(le))) for le, n in cumulative]
        half = cumulative[-1][1] / 2
        i = next(i for i, (_, n) in enumerate(cumulative) if n >= half)
        return (cumulative[i - 1][0] if i else 0.0), cumulative[i][0]

    def server_arg(self, flag: str) -> float:
        args = self.meta["server_args"]
        return float(args[args.index(flag) + 1])


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def test_idle():
    rec = Recorded("idle")
    verdict = diagnose_files(dumps("idle"))
    assert verdict.bottleneck.value == "idle"
    assert verdict.findings == []
    # the recordings show no token made and no request running in the window
    assert rec.delta("vllm:generation_tokens_total") == 0 and set(rec.gauge("vllm:num_requests_running")) == {0}
    assert verdict.signals["generation_tokens_per_second"].stats["increase"] == 0


def test_healthy():
    rec = Recorded("healthy")
    verdict = diagnose_files(dumps("healthy"))
    assert verdict.bottleneck.value == "healthy"
    assert {f.category.value for f in verdict.findings} <= {"sanity"}
    signals = verdict.signals
    assert signals["generation_tokens_per_second"].stats["rate"] == pytest.approx(
        rec.rate("vllm:generation_tokens_total"), rel=SAME
    )
    assert signals["requests_waiting_avg"].stats["value"] == pytest.approx(
        rec.time_average("vllm:request_queue_time_seconds", "vllm:num_requests_waiting"), rel=SAME
    )
    running = signals["requests_running_avg"].stats["value"]
    assert running == pytest.approx(
        rec.time_average("vllm:request_inference_time_seconds", "vllm:num_requests_running"), rel=SAME
    )
    # 4 closed-loop users and nothing waits: all 4 are in the batch
    assert running == pytest.approx(rec.meta["load"]["users"], rel=0.05)


def test_max_num_seqs_2_is_scheduling():
    rec = Recorded("scheduling")
    verdict = diagnose_files(dumps("scheduling"))
    assert verdict.bottleneck.value == "scheduling"
    assert verdict.findings[0].code == "SCH001"
    numbers = evidence(verdict, "SCH001")
    waiting = rec.time_average("vllm:request_queue_time_seconds", "vllm:num_requests_waiting")
    running = rec.time_average("vllm:request_inference_time_seconds", "vllm:num_requests_running")
    assert numbers["requests_waiting_avg"] == pytest.approx(waiting, rel=SAME)
    assert numbers["requests_running_avg"] == pytest.approx(running, rel=SAME)
    # the load and the cap: --max-num-seqs 2 run, the other 30 of the 32 users wait
    cap = rec.server_arg("--max-num-seqs")
    assert numbers["requests_running_avg"] == pytest.approx(cap, rel=0.05)
    assert numbers["requests_waiting_avg"] == pytest.approx(rec.meta["load"]["users"] - cap, rel=0.1)
    assert rec.delta("vllm:num_preemptions_total") == 0 and numbers["preemptions_per_second"] == 0
    queue_share = rec.mean("vllm:request_queue_time_seconds") / rec.mean("vllm:time_to_first_token_seconds")
    assert evidence(verdict, "SCH002")["queue_share_of_ttft_ratio"] == pytest.approx(queue_share, rel=SAME)
    # the capacity question: a user who joins the queue gets far less than a running request does
    exp = verdict.experience
    users = exp.requests_running_mean + exp.requests_waiting_mean
    assert exp.per_user_tokens_per_second_incl_waiting == exp.generation_tokens_per_second / users
    assert exp.per_user_tokens_per_second_incl_waiting < exp.per_user_tokens_per_second / 5


def test_kv_starved_is_memory():
    rec = Recorded("memory")
    verdict = diagnose_files(dumps("memory"))
    assert verdict.bottleneck.value == "memory"
    assert verdict.findings[0].code == "MEM001"
    numbers = evidence(verdict, "MEM001")
    preempted = rec.delta("vllm:num_preemptions_total")
    assert preempted > 0  # the recording shows requests preempted in the window
    assert numbers["preemptions_per_second"] == pytest.approx(preempted / rec.window_seconds, rel=SAME)
    finished = rec.delta("vllm:request_success_total")
    assert numbers["preemptions_per_finished_request"] == pytest.approx(preempted / finished, rel=SAME)
    waiting = rec.time_average("vllm:request_queue_time_seconds", "vllm:num_requests_waiting")
    assert numbers["requests_waiting_avg"] == pytest.approx(waiting, rel=SAME)
    assert numbers["kv_cache_usage_ratio"] == max(rec.gauge("vllm:kv_cache_usage_perc"))
    # the KV cache the server was given: --kv-cache-memory-bytes 2 MiB, which vLLM made into 16 blocks
    [(config, _)] = rec.scrapes[-1][1]["vllm:cache_config_info"]
    assert numbers["kv_cache_blocks"] == float(config["num_gpu_blocks"]) == 16
    # 32 closed-loop users, nearly all of them queued behind a batch the KV cache keeps at about 2
    in_system = numbers["requests_waiting_avg"] + numbers["requests_running_avg"]
    assert in_system == pytest.approx(rec.meta["load"]["users"], rel=0.1)
    assert not any(f.category.value in ("scheduling", "compute") for f in verdict.findings)


def test_queue_cap_is_scheduling_with_rejections():
    rec = Recorded("admission")
    verdict = diagnose_files(dumps("admission"))
    assert verdict.bottleneck.value == "scheduling"
    numbers = evidence(verdict, "SCH004")
    rejected = rec.delta("vllm:admission_rejections_total", reason="max_num_queued_reqs")
    assert rejected > 0
    assert numbers["admission_rejections_per_second"] == pytest.approx(rejected / rec.window_seconds, rel=SAME)
    # every rejection is an HTTP 503 the load generator saw (it counted over the whole run, the window included)
    assert rejected <= rec.meta["loadgen"]["http_errors"]["503"]
    # --max-num-queued-reqs 8 bounds the queue the evidence reports
    assert numbers["requests_waiting_avg"] <= rec.server_arg("--max-num-queued-reqs")


def test_139m_model_is_compute():
    rec = Recorded("compute")
    verdict = diagnose_files(dumps("compute"))
    assert verdict.bottleneck.value == "compute"
    assert verdict.findings[0].category.value == "compute"
    prefill = evidence(verdict, "CMP002")
    low, high = rec.median_bucket("vllm:request_prefill_time_seconds")
    assert low < prefill["prefill_time_seconds"] <= high
    prefill_share = rec.mean("vllm:request_prefill_time_seconds") / rec.mean("vllm:time_to_first_token_seconds")
    assert prefill["prefill_share_of_ttft_ratio"] == pytest.approx(prefill_share, rel=SAME)
    assert prefill["prompt_tokens_per_second"] == pytest.approx(rec.rate("vllm:prompt_tokens_total"), rel=SAME)
    # the slow decode is the SLO breach beside it (advisory): the mean over the default 50 ms SLO
    cmp001 = next(f for f in verdict.findings if f.code == "CMP001")
    assert cmp001.advisory
    numbers = evidence(verdict, "CMP001")
    # mean time per output token in the window, from the histogram's own sum and count
    itl_mean = rec.mean("vllm:inter_token_latency_seconds")
    mean = next(e.value for e in cmp001.evidence if (e.signal, e.stat) == ("itl_seconds", "mean"))
    assert mean == pytest.approx(itl_mean, rel=SAME)
    assert numbers["itl_mean_over_slo_tpot_ratio"] == pytest.approx(itl_mean / DEFAULT_SLO_TPOT_SECONDS, rel=SAME)
    assert numbers["generation_tokens_per_second"] == pytest.approx(rec.rate("vllm:generation_tokens_total"), rel=SAME)
    assert rec.delta("vllm:num_preemptions_total") == 0 and numbers["preemptions_per_second"] == 0
    # 16 closed-loop users with room in the KV cache: never more than the 16 in the system (a closed loop has no
    # more requests to send), and at least the batch the server's own gauge showed (each user is also between
    # requests for a moment: the stream's end, the next request's HTTP)
    in_system = (
        verdict.signals["requests_waiting_avg"].stats["value"] + verdict.signals["requests_running_avg"].stats["value"]
    )
    gauge_batch = statistics.mean(rec.gauge("vllm:num_requests_running"))
    assert gauge_batch <= in_system <= rec.meta["load"]["users"]


def test_the_tpot_slo_from_the_command_line_and_llmdiag_toml(tmp_path):
    """The same dumps breach a TPOT SLO under their mean inter-token latency and meet one above it, whether the SLO
    comes from --slo-tpot or from slo_tpot_seconds in llmdiag.toml."""
    files = [str(p) for p in dumps("compute")]
    mean = Recorded("compute").mean("vllm:inter_token_latency_seconds")
    loose = run_cli("analyze", *files, "--json", "--fail-on", "never", "--slo-tpot", f"{2 * mean:.4f}")
    assert loose.returncode == 0, loose.stderr
    assert "CMP001" not in {f["code"] for f in json.loads(loose.stdout)["findings"]}
    config = tmp_path / "llmdiag.toml"
    config.write_text(f"slo_tpot_seconds = {mean / 2:.6f}\n")
    tight = run_cli("analyze", *files, "--json", "--fail-on", "never", "--config", str(config))
    assert tight.returncode == 0, tight.stderr
    cmp001 = next(f for f in json.loads(tight.stdout)["findings"] if f["code"] == "CMP001")
    assert cmp001["evidence"][0]["value"] == pytest.approx(2.0, rel=1e-3)


def test_slow_tokens_in_one_dump_are_unknown_not_healthy():
    """One page of the compute state: its lifetime mean inter-token latency is past the default SLO, and one page
    proves nothing about the step (no deployment, no readings over time to fit against the batch). That is unknown,
    with the breach and its numbers said, never healthy; under an SLO above that mean the same page is healthy."""
    page = dumps("compute")[0]
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(page.read_text()):
        for s in family.samples:
            totals[s.name] = totals.get(s.name, 0.0) + s.value
    itl_mean = totals["vllm:inter_token_latency_seconds_sum"] / totals["vllm:inter_token_latency_seconds_count"]
    assert itl_mean > DEFAULT_SLO_TPOT_SECONDS  # the recording's own numbers, read without llmdiag
    verdict = diagnose_files([page])
    assert verdict.bottleneck.value == "unknown", verdict.summary
    assert verdict.class_confidence == {}
    assert f"tokens come {itl_mean:.3f} s apart" in verdict.summary, verdict.summary
    ratio = itl_mean / DEFAULT_SLO_TPOT_SECONDS
    assert f"{ratio:.1f}x the TPOT SLO of {DEFAULT_SLO_TPOT_SECONDS:.3f} s" in verdict.summary, verdict.summary
    loose = run_cli("analyze", str(page), "--json", "--slo-tpot", f"{2 * itl_mean:.4f}")
    assert json.loads(loose.stdout)["bottleneck"] == "healthy", loose.stdout


def test_gauges_sampled_at_the_wrong_moments_are_called_out_and_not_believed():
    # recorded while the scraper was starved: every gauge read 0, the request timings did not lie
    rec = Recorded("scheduling-starved")
    verdict = diagnose_files(dumps("scheduling-starved"))
    assert set(rec.gauge("vllm:num_requests_waiting")) == {0} == set(rec.gauge("vllm:num_requests_running"))
    assert verdict.signals["requests_waiting"].stats["max"] == 0
    assert verdict.bottleneck.value == "scheduling"
    # the queue comes from the queue times (Little's law), not from the gauge that read 0
    queued = rec.delta("vllm:request_queue_time_seconds_sum") / rec.window_seconds
    assert evidence(verdict, "SCH001")["requests_waiting_avg"] == pytest.approx(queued, rel=SAME)
    san = next(f for f in verdict.findings if f.code == "SAN004")
    zero_share = sum(v == 0 for v in rec.gauge("vllm:num_requests_running")) / len(rec.scrapes)
    assert san.evidence[0].value == zero_share == 1.0  # the running gauge read 0 in every scrape


def test_single_dump_uses_lifetime_averages_and_says_so():
    verdict = diagnose_files(dumps("scheduling")[-1:])
    assert verdict.window.kind == "lifetime"
    assert "lifetime" in verdict.window.note
    assert any("lifetime" in note for note in verdict.notes)
    assert verdict.confidence_factors["single_dump"].value == 1.0
    # one dump never weighs more than the window (the fitted weight is held at most 0: llmdiag.engine.confidence)
    assert verdict.confidence <= diagnose_files(dumps("scheduling")).confidence


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
