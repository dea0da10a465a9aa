"""Slow decode steps: the user's TPOT SLO (CMP001), the proof that the step is the wall (CMP008), and the host
overhead that slows steps while the GPUs wait (SCH013, SCH014, SCH006).

The SignalSets are built by hand as a live scan builds them (llmdiag.collect): a scrape a second, gauges per scrape,
counter rates over the interval that ends at each scrape. Each decode step makes one token per running request, so
an interval's output tokens/s is its mean batch over its step time: the scrapes below are made from a step-time
model, step = fixed + per-request x batch, and the tests assert the per-request slope they were made with.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmdiag.api.scan import cached_model, place_under_ceiling
from llmdiag.config import DEFAULT_SLO_TPOT_SECONDS, Settings, load_settings
from llmdiag.engine.capacity import deployment_seen
from llmdiag.engine.evaluate import build_verdict
from llmdiag.engine.stepwall import step_fit
from llmdiag.errors import ConfigError, option
from llmdiag.model import Bottleneck, Signal, SignalSet, SourceInfo, Verdict
from tests.unit.engine.test_stalls import Readings

# the batch steps up through four levels over a 20 s window, as a load that ramps does
RAMP = [4.0] * 5 + [8.0] * 5 + [16.0] * 5 + [24.0] * 6
STEADY = [16.0] * 21


def scan(
    running: list[float],
    step_seconds,
    *,
    gpu_utilization: float | None = None,
    busiest_process_cores: float | None = None,
) -> SignalSet:
    """A live scan whose output rate follows ``step_seconds(batch)`` interval by interval."""
    n = len(running)
    batches = [running[0]] + [(running[i - 1] + running[i]) / 2 for i in range(1, n)]  # each interval's mean batch
    gauges = {
        "requests_running": running,
        "requests_waiting": [0.0] * n,
        "kv_cache_usage_ratio": [0.3] * n,
        "itl_seconds": [step_seconds(b) for b in batches],
    }
    if gpu_utilization is not None:
        gauges["gpu_utilization_ratio"] = [gpu_utilization] * n
    if busiest_process_cores is not None:
        gauges["busiest_server_process_cpu_cores"] = [busiest_process_cores] * n
    rates = {
        "generation_tokens_per_second": [b / step_seconds(b) for b in batches],
        "prompt_tokens_per_second": [900.0] * n,
        "preemptions_per_second": [0.0] * n,
    }
    signals = Readings(interval=1.0, gauges=gauges, rates=rates).signal_set("vllm")
    # first tokens in a fraction of a second, as with nothing queued: no rule's business here
    ttft = {"count": 40.0, "mean": 0.12, "p50": 0.1, "p90": 0.2, "p95": 0.22, "p99": 0.25}
    signals.add(Signal(name="ttft_seconds", kind="histogram", unit="seconds", stats=ttft))
    return signals


def finding_evidence(verdict: Verdict, code: str) -> dict[str, float | None]:
    finding = next((f for f in verdict.findings if f.code == code), None)
    assert finding is not None, f"{code} did not fire: {[(f.code, f.summary) for f in verdict.findings]}"
    return {f"{e.signal}.{e.stat}": e.value for e in finding.evidence}


def codes(verdict: Verdict) -> set[str]:
    return {f.code for f in verdict.findings}


def mean_itl(signals: SignalSet) -> float:
    return signals.signals["itl_seconds"].stats["mean"]


# --- the SLO --------------------------------------------------------------------------------------------------------


def flat(seconds: float):
    return lambda batch: seconds


@pytest.mark.parametrize(("slo_seconds", "fires"), [(0.1, False), (0.06, True)])
def test_the_same_slow_steps_cross_the_slo_or_not_by_the_slo_given(slo_seconds: float, fires: bool):
    signals = scan(STEADY, flat(0.08))
    verdict = build_verdict(signals, Settings(slo_tpot_seconds=slo_seconds))
    assert ("CMP001" in codes(verdict)) is fires
    if fires:
        found = finding_evidence(verdict, "CMP001")
        assert found["itl_mean_over_slo_tpot_ratio.value"] == pytest.approx(0.08 / slo_seconds)
        assert found["itl_seconds.mean"] == pytest.approx(0.08)
        cmp001 = next(f for f in verdict.findings if f.code == "CMP001")
        assert f"TPOT SLO of {slo_seconds:.3f} s" in cmp001.summary
    assert verdict.signals["slo_tpot_seconds"].stats["value"] == slo_seconds


def test_slo_from_llmdiag_toml(tmp_path: Path):
    config = tmp_path / "llmdiag.toml"
    config.write_text("slo_tpot_seconds = 0.2\n")
    assert load_settings(config).slo_tpot_seconds == 0.2
    assert Settings().slo_tpot_seconds == DEFAULT_SLO_TPOT_SECONDS
    config.write_text("slo_tpot_seconds = 0\n")
    with pytest.raises(ConfigError, match="slo_tpot_seconds"):
        load_settings(config)


# --- the proof that the step is the wall ----------------------------------------------------------------------------

FIXED_SECONDS, PER_REQUEST_SECONDS = 0.02, 0.004


def grows(batch: float) -> float:
    return FIXED_SECONDS + PER_REQUEST_SECONDS * batch


def test_a_step_that_grows_with_the_batch_is_the_wall():
    signals = scan(RAMP, grows)
    verdict = build_verdict(signals)
    assert verdict.bottleneck is Bottleneck.compute, verdict.summary
    found = finding_evidence(verdict, "CMP008")
    assert found["itl_seconds_per_running_request.value"] == pytest.approx(PER_REQUEST_SECONDS)
    assert found["itl_seconds_per_running_request_r2.value"] == pytest.approx(1.0)
    assert found["itl_seconds.mean"] == pytest.approx(mean_itl(signals))
    assert verdict.signals["step_wall_proofs_count"].stats["value"] == 1.0  # the roofline is unknown here
    assert verdict.signals["roofline_fraction_ratio"].unavailable
    # the SLO breach is said beside it, as what users feel, never as the class
    assert next(f for f in verdict.findings if f.code == "CMP001").advisory


def test_slow_steps_without_proof_are_unknown_not_compute_and_not_healthy():
    # a steady batch gives nothing to fit, and the deployment is unknown: the step may be the GPU's or the host's
    verdict = build_verdict(scan(STEADY, flat(0.12)))
    assert verdict.bottleneck is Bottleneck.unknown, verdict.summary
    assert "CMP008" not in codes(verdict)
    assert "CMP001" in codes(verdict)
    assert verdict.class_confidence == {}  # no capacity class named
    reason = verdict.signals["step_wall_proofs_count"].unavailable
    assert reason and "16-16 requests" in reason and "deployment is unknown" in reason
    # the summary says the breach with its numbers, why nothing is proven, and what would prove it
    summary = verdict.summary
    assert "0.120 s apart" in summary and "2.4x the TPOT SLO of 0.050 s" in summary, summary
    assert reason in summary
    assert f"{option('gpu')} with {option('model_shape')}" in summary and "batch varies" in summary, summary


def test_a_step_judged_flat_with_no_host_evidence_is_unknown_and_says_what_was_judged():
    # the batch ramps and the step holds still: not the wall; but no GPU telemetry and no process seen pinned
    verdict = build_verdict(scan(RAMP, host_bound))
    assert verdict.bottleneck is Bottleneck.unknown, verdict.summary
    assert not codes(verdict) & {"CMP008", "SCH013", "SCH014"}
    assert verdict.signals["step_wall_proofs_count"].stats["value"] == 0.0
    slope = verdict.signals["itl_seconds_per_running_request"].stats["value"]
    assert f"{slope:+.4f} s per running request" in verdict.summary, verdict.summary
    assert "not shown to be the wall" in verdict.summary


def test_fast_tokens_stay_healthy():
    verdict = build_verdict(scan(STEADY, flat(0.02)))  # 20 ms a token, inside the default 50 ms SLO
    assert verdict.bottleneck is Bottleneck.healthy, verdict.summary
    assert "CMP001" not in codes(verdict)


def test_an_interval_across_a_jump_in_the_batch_is_no_point_of_the_fit():
    """Two levels as the real CPU vLLM test drives them (32 users and a canary, then 4), with what that server showed
    between: the running gauge read 2 for two readings with no token made, and the interval back to 33 made 64.6
    tokens/s. An interval whose end readings differ that much has no known mean batch: left out, the levels alone
    give the slope they were made with."""
    running = [33.0] * 5 + [2.0] * 3 + [33.0] * 3 + [4.0] * 8
    per_interval = []
    for before, now in zip(running, running[1:], strict=False):
        if before == now:
            per_interval.append(now / grows(now) if now > 2 else 0.0)  # a steady level, or the stall
        else:  # the jumps, as read from the real server: into the stall, out of it, and down to the low level
            per_interval.append({(33.0, 2.0): 231.3, (2.0, 33.0): 64.6, (33.0, 4.0): 284.8}[(before, now)])
    n = len(running)
    gauges = {
        "requests_running": running,
        "requests_waiting": [0.0] * n,
        "kv_cache_usage_ratio": [0.1] * n,
        "itl_seconds": [grows(b) for b in running],
    }
    rates = {
        "generation_tokens_per_second": [per_interval[0], *per_interval],  # the first reading has no interval
        "prompt_tokens_per_second": [200.0] * n,
        "preemptions_per_second": [0.0] * n,
    }
    signals = Readings(interval=1.0, gauges=gauges, rates=rates).signal_set("vllm")
    verdict = build_verdict(signals)
    found = finding_evidence(verdict, "CMP008")
    assert found["itl_seconds_per_running_request.value"] == pytest.approx(PER_REQUEST_SECONDS)
    assert found["itl_seconds_per_running_request_r2.value"] == pytest.approx(1.0)


def test_decode_near_the_ceiling_is_the_wall_without_a_ramp():
    signals = scan(STEADY, flat(0.12))
    signals.add(
        Signal(name="roofline_fraction_ratio", kind="derived", unit="ratio", stats={"value": 0.7}, source="scan")
    )
    verdict = build_verdict(signals)
    assert verdict.bottleneck is Bottleneck.compute, verdict.summary
    found = finding_evidence(verdict, "CMP008")
    assert found["roofline_fraction_ratio.value"] == 0.7
    assert verdict.signals["step_wall_proofs_count"].stats["value"] == 1.0


# --- the host: slow steps, GPUs waiting -----------------------------------------------------------------------------


# the step holds at 0.1 s whatever the batch (host work per step), give or take 2 ms between readings
def host_bound(batch: float) -> float:
    return 0.1 + (0.002 if batch in (4.0, 16.0, 10.0) else -0.002)


def test_slow_steps_while_the_gpus_wait_are_the_hosts():
    signals = scan(RAMP, host_bound, gpu_utilization=0.25)
    verdict = build_verdict(signals)
    found = finding_evidence(verdict, "SCH013")
    assert found["gpu_utilization_ratio.mean"] == 0.25
    assert abs(found["itl_seconds_per_running_request.value"]) < 0.001  # flat: nothing like the batch's share
    assert verdict.signals["step_wall_proofs_count"].stats["value"] == 0.0
    assert "CMP008" not in codes(verdict)
    assert verdict.bottleneck is Bottleneck.scheduling
    assert any("--enforce-eager" in fix for fix in next(f for f in verdict.findings if f.code == "SCH013").fixes)


def test_without_gpu_telemetry_the_pinned_process_is_the_evidence():
    signals = scan(RAMP, host_bound, busiest_process_cores=0.99)
    verdict = build_verdict(signals)
    assert "gpu_utilization_ratio" not in verdict.signals  # no NVML, no DCGM
    found = finding_evidence(verdict, "SCH014")
    assert found["busiest_server_process_cpu_cores.mean"] == pytest.approx(0.99)
    assert "SCH013" not in codes(verdict)  # GPU utilisation unavailable is not "not busy"


def test_a_pinned_process_beside_a_batch_that_held_still_proves_no_host_overhead():
    # on a CPU server the pinned process is the compute: with no batch spread the fit cannot tell, so nothing is named
    verdict = build_verdict(scan(STEADY, flat(0.1), busiest_process_cores=0.99))
    assert "SCH014" not in codes(verdict)
    assert verdict.bottleneck is Bottleneck.unknown, verdict.summary
    assert verdict.signals["step_not_the_wall_proofs_count"].unavailable is not None


def test_a_step_that_grows_noisily_is_neither_proven_the_wall_nor_the_host():
    # the step grows with the batch (its share of the step well above a quarter), but one interval's stall spoils
    # the line: no proof of the wall, and no proof that the batch sets none of its pace
    def noisy(batch: float) -> float:
        return grows(batch) * (2.5 if batch == 8.0 else 1.0)

    signals = scan(RAMP, noisy, busiest_process_cores=0.99)
    shape = step_fit(signals)
    # what the driven steps show: the batch's share is well off zero, and the line explains little of the spread
    assert shape.batch_share_ratio > 0.3 and shape.r2 < 0.3, shape
    verdict = build_verdict(signals)
    assert not codes(verdict) & {"SCH014", "CMP008"}, codes(verdict)
    assert verdict.bottleneck is Bottleneck.unknown, verdict.summary


def test_a_pinned_process_beside_a_step_that_grows_is_a_spin_wait_not_the_host():
    verdict = build_verdict(scan(RAMP, grows, busiest_process_cores=1.0))
    assert "SCH014" not in codes(verdict)
    assert "CMP008" in codes(verdict)


def test_with_both_seen_sch006_names_the_process_and_the_stand_ins_step_aside():
    signals = scan(RAMP, host_bound, gpu_utilization=0.25, busiest_process_cores=0.99)
    verdict = build_verdict(signals)
    assert finding_evidence(verdict, "SCH006")["busiest_server_process_cpu_cores.mean"] == pytest.approx(0.99)
    assert not codes(verdict) & {"SCH013", "SCH014"}


# --- the deployment without flags -----------------------------------------------------------------------------------


def sources(gpu_names: list[str], served: str) -> SignalSet:
    """A vLLM page serving ``served`` and a dcgm-exporter page whose modelName labels are ``gpu_names``."""
    from llmdiag.collect.telemetry.nvidia_smi import gpus_config

    return SignalSet(
        sources=[
            SourceInfo(probe="vllm", models=[served]),
            SourceInfo(probe="dcgm", server="dcgm-exporter", config=gpus_config(gpu_names)),
        ]
    )


def test_one_known_gpu_serving_a_known_model_is_the_deployment():
    deployment, where = deployment_seen(sources(["NVIDIA L4"], "meta-llama/Meta-Llama-3-8B-Instruct"))
    assert deployment is not None, where
    assert (deployment.gpu.name, deployment.model.name, deployment.tp) == ("L4", "llama-3-8b", 1)
    assert "dcgm" in where and "meta-llama/Meta-Llama-3-8B-Instruct" in where and "one GPU seen" in where


@pytest.mark.parametrize(
    ("gpus", "served", "why"),
    [
        (["NVIDIA H100 80GB HBM3"] * 8, "meta-llama/Meta-Llama-3-8B-Instruct", "tensor-parallel size"),
        (["NVIDIA A800-SXM4-80GB"], "meta-llama/Meta-Llama-3-8B-Instruct", "not in the GPU table"),
        (["NVIDIA L4"], "my-finetune", "not in the model table"),
        ([], "meta-llama/Meta-Llama-3-8B-Instruct", "no GPU seen"),
    ],
)
def test_no_deployment_is_guessed(gpus: list[str], served: str, why: str):
    signals = sources(gpus, served) if gpus else SignalSet(sources=[SourceInfo(probe="vllm", models=[served])])
    deployment, where = deployment_seen(signals)
    assert deployment is None and why in where


def test_a_served_model_outside_the_table_is_read_from_the_hugging_face_cache(tmp_path, monkeypatch):
    # vLLM serves a model under its repository id; the hub cache keeps models--ORG--NAME/snapshots/REV/config.json
    from tests.unit.physics.test_physics import LLAMA_3_8B_CONFIG

    snapshot = tmp_path / "hub" / "models--acme--llama3-support-bot" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(LLAMA_3_8B_CONFIG))
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    signals = sources(["NVIDIA L4"], "acme/llama3-support-bot")
    assert deployment_seen(signals)[0] is None  # not in the table, and no cache asked
    deployment, where = deployment_seen(signals, local_model=cached_model)
    assert deployment is not None, where
    assert (deployment.model.hidden_size, deployment.model.layers) == (4096, 32)  # the config's, not a guess
    assert str(snapshot / "config.json") in where and "Hugging Face cache" in where
    deployment, where = deployment_seen(sources(["NVIDIA L4"], "acme/not-downloaded"), local_model=cached_model)
    assert deployment is None and "or a local config.json" in where


def test_the_seen_deployment_places_the_decode_rate_and_says_where_it_came_from():
    signals = scan(STEADY, flat(0.07))
    signals.sources += sources(["NVIDIA L4"], "meta-llama/Meta-Llama-3-8B-Instruct").sources
    signals.sources[0].models = ["meta-llama/Meta-Llama-3-8B-Instruct"]
    for name, mean in (("prompt_length_tokens", 512.0), ("output_length_tokens", 128.0)):
        signals.add(Signal(name=name, kind="histogram", unit="tokens", stats={"mean": mean, "count": 10.0}))
    roofline = place_under_ceiling(signals, None)
    assert roofline is not None and (roofline.gpu, roofline.model, roofline.tp) == ("L4", "llama-3-8b", 1)
    # the measured rate is the window's: its running requests over its step
    assert roofline.measured_tokens_per_second == pytest.approx(16 / 0.07)
    assert signals.signals["roofline_fraction_ratio"].stats["value"] == roofline.fraction_of_ceiling_ratio
    assert any(s.probe == "deployment" and "dcgm" in s.note for s in signals.sources)
