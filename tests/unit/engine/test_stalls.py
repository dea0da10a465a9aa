"""Stalls, snapshots, trends and impossible numbers: what the engine says of each shape.

The SignalSets are built by hand the way the readers build them: a log gives one reading per stat line (vLLM prints
one every 10 s: gauges held, counter rates over the interval that ends at the line), a live scan one per second.
Every stall shape is judged from both, and each test checks the class, that the stall finding comes first, that
no capacity class beside it reaches 0.5, and that the evidence carries the numbers fed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from llmdiag.engine.derived import FASTEST_HBM_BYTES_PER_SECOND
from llmdiag.engine.evaluate import build_verdict
from llmdiag.model import Bottleneck, Signal, SignalSet, SourceInfo, Verdict, Window
from llmdiag.model.verdict import State, state_of

T0 = 1_796_020_685.0
CAPACITY = ("memory", "compute", "scheduling", "network")


@dataclass
class Readings:
    """One value per reading for each signal; counters as the rate over the interval that ends at the reading."""

    interval: float
    gauges: dict[str, list[float]] = field(default_factory=dict)
    rates: dict[str, list[float]] = field(default_factory=dict)

    def signal_set(self, probe: str, models: tuple[str, ...] = ()) -> SignalSet:
        n = len(next(iter(self.gauges.values())))
        times = [T0 + i * self.interval for i in range(n)]
        duration = times[-1] - times[0]
        out = SignalSet(
            window=Window(kind="window", start_unix=times[0], end_unix=times[-1], duration_seconds=duration, scrapes=n),
            sources=[SourceInfo(probe=probe, models=list(models))],
        )
        for name, values in self.gauges.items():
            ordered = sorted(values)
            stats = {
                "last": values[-1],
                "mean": sum(values) / n,
                "min": ordered[0],
                "max": ordered[-1],
                "p90": ordered[min(n - 1, int(0.9 * n))],
            }
            out.add(
                Signal(name=name, kind="gauge", unit="", stats=stats, samples=list(zip(times, values, strict=True)))
            )
        for name, values in self.rates.items():
            # the first reading has no interval before it: rates start at the second
            increase = sum(v * self.interval for v in values[1:])
            samples = list(zip(times[1:], values[1:], strict=True))
            stats = {"rate": increase / duration, "increase": increase}
            out.add(Signal(name=name, kind="counter", unit="", stats=stats, samples=samples))
        return out


def log_readings(productive: int, stuck: int, *, running: float, waiting: float, kv: float) -> Readings:
    """A vLLM log: ``productive`` stat lines of a busy server, then ``stuck`` lines with 0.0 tokens/s and the
    last state held (running, waiting, KV)."""
    n = productive + stuck
    return Readings(
        interval=10.0,
        gauges={
            "requests_running": [24.0] * productive + [running] * stuck,
            "requests_waiting": [0.0] * productive + [waiting] * stuck,
            "kv_cache_usage_ratio": [0.40] * productive + [kv] * stuck,
            "requests_swapped": [0.0] * n,
        },
        rates={
            "generation_tokens_per_second": [1650.0] * productive + [0.0] * stuck,
            "prompt_tokens_per_second": [820.0] * productive + [0.0] * stuck,
            "preemptions_per_second": [0.0] * n,
        },
    )


def live_readings(seconds: int, *, running: float, waiting: list[float], kv: float) -> Readings:
    """A live scan of an engine stuck for the whole window: a scrape a second, counters that never move."""
    n = seconds + 1
    return Readings(
        interval=1.0,
        gauges={
            "requests_running": [running] * n,
            "requests_waiting": waiting,
            "kv_cache_usage_ratio": [kv] * n,
        },
        rates={
            "generation_tokens_per_second": [0.0] * n,
            "prompt_tokens_per_second": [0.0] * n,
            "preemptions_per_second": [0.0] * n,
            "requests_finished_per_second": [0.0] * n,
        },
    )


def evidence(verdict: Verdict, code: str) -> dict[str, float | None]:
    finding = next(f for f in verdict.findings if f.code == code)
    return {f"{e.signal}.{e.stat}": e.value for e in finding.evidence}


def assert_stalled(verdict: Verdict, code: str) -> None:
    assert verdict.bottleneck is Bottleneck.stalled, verdict.summary
    assert verdict.findings[0].code == code and verdict.findings[0].stall
    assert verdict.summary.startswith("Stalled: ")
    for name, confidence in verdict.class_confidence.items():
        if name in CAPACITY:
            assert confidence < 0.5, f"{name} at {confidence} beside a stall"
    assert state_of(verdict) is State.CRITICAL


# --- the three stall shapes, from a log and live ------------------------------------------------------------------


def test_log_stuck_with_kv_headroom_is_a_hang_not_capacity():
    # 20 busy lines, then 6 lines of 'Avg generation throughput: 0.0 tokens/s, Running: 4 reqs, Waiting: 12 reqs,
    # GPU KV cache usage: 31.0%': the stall spans the 6 intervals those lines cover
    signals = log_readings(20, 6, running=4, waiting=12, kv=0.31).signal_set("vllm-log")
    verdict = build_verdict(signals)
    assert_stalled(verdict, "SCH003")
    found = evidence(verdict, "SCH003")
    assert found["no_progress_seconds.value"] == 6 * 10.0
    assert found["requests_running.last"] == 4
    assert found["kv_cache_usage_ratio.last"] == 0.31
    assert found["requests_waiting.last"] == 12
    # the fixes name the next steps: the engine's stacks and the known causes
    fixes = " ".join(verdict.findings[0].fixes)
    assert "py-spy dump" in fixes and "--enforce-eager" in fixes and "NCCL_P2P_DISABLE" in fixes


def test_log_stuck_with_kv_full_is_a_memory_triggered_hang_and_memory_stays_below_half():
    signals = log_readings(20, 5, running=62, waiting=30, kv=0.998).signal_set("vllm-log")
    verdict = build_verdict(signals)
    assert_stalled(verdict, "MEM007")
    found = evidence(verdict, "MEM007")
    assert found["no_progress_seconds.value"] == 5 * 10.0
    assert found["kv_cache_usage_ratio.last"] == 0.998
    assert found["requests_running.last"] == 62
    assert found["requests_waiting.last"] == 30
    # the full cache also fires a memory capacity rule: shown, below half, after the stall
    assert "memory" in verdict.class_confidence
    assert verdict.class_confidence["memory"] < 0.5


def test_log_queue_grows_with_nothing_admitted_is_an_admission_stall():
    readings = log_readings(10, 5, running=0, waiting=0, kv=0.0)
    readings.gauges["requests_waiting"][-5:] = [8.0, 15.0, 22.0, 30.0, 37.0]
    verdict = build_verdict(readings.signal_set("vllm-log"))
    assert_stalled(verdict, "SCH011")
    found = evidence(verdict, "SCH011")
    assert found["requests_waiting.last"] == 37
    assert found["requests_running.last"] == 0
    assert found["kv_cache_usage_ratio.last"] == 0.0
    assert found["no_progress_seconds.value"] == 5 * 10.0


def test_live_stuck_with_kv_headroom_and_a_queue_keeps_scheduling_below_half():
    readings = live_readings(20, running=4, waiting=[12.0] * 21, kv=0.31)
    verdict = build_verdict(readings.signal_set("vllm"))
    assert_stalled(verdict, "SCH003")
    assert evidence(verdict, "SCH003")["no_progress_seconds.value"] == 20.0
    # 12 waiting behind 4 running with no token made in the whole window: a queue behind a stuck engine, not an
    # admission cap, so the queue rule stays silent and scheduling has no confidence at all
    assert not any(f.code == "SCH012" for f in verdict.findings)
    assert verdict.class_confidence.get("scheduling", 0.0) < 0.5


def test_live_stuck_with_kv_full():
    verdict = build_verdict(live_readings(15, running=62, waiting=[30.0] * 16, kv=0.99).signal_set("vllm"))
    assert_stalled(verdict, "MEM007")
    found = evidence(verdict, "MEM007")
    assert found["no_progress_seconds.value"] == 15.0
    assert found["kv_cache_usage_ratio.last"] == 0.99


def test_live_admission_stall():
    waiting = [5.0 + 2 * i for i in range(21)]
    verdict = build_verdict(live_readings(20, running=0, waiting=waiting, kv=0.0).signal_set("vllm"))
    assert_stalled(verdict, "SCH011")
    assert evidence(verdict, "SCH011")["requests_waiting.last"] == waiting[-1]


def test_a_stall_with_a_slow_step_is_never_compute_bound():
    # the field failure: a server that had stopped was called compute-bound at 0.75. Its busy phase had a slow
    # decode step (ITL 0.2 s), which CMP001 reads; then it stopped
    readings = log_readings(20, 6, running=4, waiting=12, kv=0.31)
    readings.gauges["itl_seconds"] = [0.2] * 26
    verdict = build_verdict(readings.signal_set("vllm-log"))
    assert_stalled(verdict, "SCH003")
    assert any(f.code == "CMP001" for f in verdict.findings)
    assert verdict.class_confidence.get("compute", 0.0) < 0.5  # CMP001 is advisory now: no compute class at all


def test_one_quiet_line_at_the_end_is_not_a_stall():
    # a request that arrived just before the last stat line: one interval without tokens is not a hang
    signals = log_readings(20, 1, running=1, waiting=0, kv=0.02).signal_set("vllm-log")
    verdict = build_verdict(signals)
    assert verdict.bottleneck is not Bottleneck.stalled
    assert verdict.signals["no_progress_seconds"].stats["value"] == 0.0


def test_a_busy_server_has_no_stall():
    verdict = build_verdict(log_readings(25, 0, running=24, waiting=0, kv=0.4).signal_set("vllm-log"))
    assert verdict.bottleneck is not Bottleneck.stalled
    assert verdict.signals["no_progress_seconds"].stats["value"] == 0.0


# --- snapshots ------------------------------------------------------------------------------------------------------


def snapshot(**gauges: float) -> SignalSet:
    out = SignalSet(window=Window(kind="snapshot", scrapes=1), sources=[SourceInfo(probe="vllm")])
    for name, value in gauges.items():
        stats = {"last": value, "mean": value, "min": value, "max": value, "p90": value}
        out.add(Signal(name=name, kind="gauge", unit="", stats=stats, samples=[(T0, value)]))
    for name in ("generation_tokens_per_second", "preemptions_per_second", "prompt_tokens_per_second"):
        out.add(Signal.missing(name, "counter", "", "a single dump without a process start time has no time base"))
    return out


def test_snapshot_with_kv_full_and_a_queue_is_memory_labelled_snapshot():
    verdict = build_verdict(snapshot(requests_running=24, requests_waiting=40, kv_cache_usage_ratio=0.99))
    assert verdict.bottleneck is Bottleneck.memory
    assert verdict.findings[0].code == "MEM008"
    found = evidence(verdict, "MEM008")
    assert found["kv_cache_usage_ratio.last"] == 0.99 and found["requests_waiting.last"] == 40
    assert verdict.snapshot and "one snapshot" in verdict.summary
    assert verdict.confidence <= 0.6 and verdict.confidence_label != "high"
    assert any("one snapshot" in note for note in verdict.notes)
    # one moment shows no progress or its absence: never a stall
    assert "one moment" in (verdict.signals["no_progress_seconds"].unavailable or "")


def test_snapshot_queue_fifty_times_the_batch_with_kv_room_is_scheduling_not_healthy():
    # the field failure: ~50x more pending than running was called healthy
    verdict = build_verdict(snapshot(requests_running=5, requests_waiting=250, kv_cache_usage_ratio=0.62))
    assert verdict.bottleneck is Bottleneck.scheduling
    assert verdict.findings[0].code == "SCH012"
    found = evidence(verdict, "SCH012")
    assert found["queue_over_running_ratio.value"] == 250 / 5
    assert found["requests_waiting.last"] == 250 and found["requests_running.last"] == 5
    # one moment names the class but is never a confident verdict: it cannot tell a limit from a passing state
    assert verdict.confidence < 0.5 and verdict.window.kind == "snapshot"


def test_snapshot_with_nothing_running_and_no_count_is_not_called_idle():
    # the gauges at one moment read 0, and no counter or histogram says whether anything was served: idle needs a
    # count that stayed at zero (tests/unit/engine/test_idle_evidence.py has the snapshots that show one)
    verdict = build_verdict(snapshot(requests_running=0, requests_waiting=0, kv_cache_usage_ratio=0.0))
    assert verdict.bottleneck is Bottleneck.unknown
    assert verdict.confidence < 0.5 and "one snapshot" in verdict.summary


# --- trends ---------------------------------------------------------------------------------------------------------


def test_kv_climbing_without_a_queue_forecasts_when_it_fills():
    n = 31
    kv = [0.30 + 0.01 * i for i in range(n)]  # +1 point per 10 s: 0.60 at the end, full in 400 s
    readings = Readings(
        interval=10.0,
        gauges={"requests_running": [20.0] * n, "requests_waiting": [0.0] * n, "kv_cache_usage_ratio": kv},
        rates={"generation_tokens_per_second": [900.0] * n, "preemptions_per_second": [0.0] * n},
    )
    verdict = build_verdict(readings.signal_set("vllm-log"))
    finding = next(f for f in verdict.findings if f.code == "MEM009")
    assert finding.advisory and verdict.bottleneck is not Bottleneck.memory
    assert evidence(verdict, "MEM009")["kv_cache_full_in_seconds.value"] == pytest.approx((1 - kv[-1]) / 0.001)
    assert "KV cache full in about 400 s" in finding.summary


def test_throughput_drifting_down_under_a_steady_load_gets_its_own_line():
    n = 31
    rate = [1600.0 - 20.0 * i for i in range(n)]  # 1600 → 1000 tokens/s while 32 requests run
    readings = Readings(
        interval=10.0,
        gauges={"requests_running": [32.0] * n, "requests_waiting": [0.0] * n, "kv_cache_usage_ratio": [0.5] * n},
        rates={"generation_tokens_per_second": rate, "preemptions_per_second": [0.0] * n},
    )
    verdict = build_verdict(readings.signal_set("vllm-log"))
    finding = next(f for f in verdict.findings if f.code == "CMP006")
    assert finding.advisory
    # the rates start at the second reading: the line through them runs from 1580 to 1000 tokens/s
    assert evidence(verdict, "CMP006")["generation_throughput_trend_ratio.value"] == pytest.approx(1000 / 1580)


def test_throughput_that_follows_a_falling_load_is_no_drift():
    n = 31
    readings = Readings(
        interval=10.0,
        gauges={
            "requests_running": [32.0 - 0.6 * i for i in range(n)],
            "requests_waiting": [0.0] * n,
            "kv_cache_usage_ratio": [0.5] * n,
        },
        rates={"generation_tokens_per_second": [1600.0 - 30.0 * i for i in range(n)]},
    )
    verdict = build_verdict(readings.signal_set("vllm-log"))
    assert "load" in (verdict.signals["generation_throughput_trend_ratio"].unavailable or "")
    assert not any(f.code == "CMP006" for f in verdict.findings)


# --- impossible numbers -------------------------------------------------------------------------------------------


def test_a_7b_streaming_thousands_of_tokens_per_second_to_each_request_is_a_sanity_finding():
    n = 21
    readings = Readings(
        interval=1.0,
        gauges={"requests_running": [2.0] * n, "requests_waiting": [0.0] * n, "kv_cache_usage_ratio": [0.1] * n},
        rates={"generation_tokens_per_second": [6000.0] * n, "preemptions_per_second": [0.0] * n},
    )
    verdict = build_verdict(readings.signal_set("vllm", models=("Qwen/Qwen2.5-7B-Instruct",)))
    finding = next(f for f in verdict.findings if f.code == "SAN005")
    assert finding.category.value == "sanity"
    # 6000 tokens/s over 2 running: 3000 each, against Qwen2.5-7B's 7.6e9 weights at 4 bits on the fastest HBM
    assert verdict.signals["per_user_tokens_per_second"].stats["value"] == 3000.0
    ceiling = FASTEST_HBM_BYTES_PER_SECOND / (7.6e9 * 0.5)
    assert evidence(verdict, "SAN005")["per_user_decode_over_ceiling_ratio.value"] == pytest.approx(
        3000 / ceiling, rel=0.01
    )
    assert "cannot be trusted" in finding.summary
    assert any("sanity" in note for note in verdict.notes)


def test_ttft_histogram_counting_beyond_finished_requests_is_san003():
    n = 21
    readings = Readings(
        interval=1.0,
        gauges={"requests_running": [4.0] * n, "requests_waiting": [0.0] * n, "kv_cache_usage_ratio": [0.1] * n},
        rates={"requests_finished_per_second": [7.0] * n},
    )
    signals = readings.signal_set("vllm")
    # 140 finished, 4 still running; the TTFT histogram counted 424 first tokens
    signals.add(Signal(name="ttft_seconds", kind="histogram", unit="s", stats={"count": 424.0, "p50": 0.1}))
    verdict = build_verdict(signals)
    assert evidence(verdict, "SAN003")["histogram_count_excess_ratio.value"] == pytest.approx((424 - 4) / 140)
    assert verdict.class_confidence.get("scheduling") is None


def test_kv_usage_frozen_while_decoding_is_a_sanity_finding_live_only():
    n = 21
    readings = Readings(
        interval=1.0,
        gauges={"requests_running": [12.0] * n, "requests_waiting": [0.0] * n, "kv_cache_usage_ratio": [0.41] * n},
        rates={"generation_tokens_per_second": [850.0] * n},
    )
    live = build_verdict(readings.signal_set("sglang"))
    assert evidence(live, "SAN006")["kv_usage_frozen_while_decoding_seconds.value"] == 20.0
    assert evidence(live, "SAN006")["kv_cache_usage_ratio.last"] == 0.41
    # a log prints the usage rounded to 2 places: a steady printed value proves nothing
    from_log = build_verdict(readings.signal_set("sglang-log"))
    assert not any(f.code == "SAN006" for f in from_log.findings)


# --- a real log, through the log reader ----------------------------------------------------------------------------


def test_a_real_v0_log_stuck_at_zero_tokens_with_one_request_is_stalled():
    from pathlib import Path

    from llmdiag.collect.logs import collect_logs

    log = Path(__file__).parents[2] / "fixtures" / "logs" / "vllm-v0-stalled-cpu.log"
    verdict = build_verdict(collect_logs([log]))
    assert_stalled(verdict, "SCH003")
    found = evidence(verdict, "SCH003")
    # six lines from 00:40:43 to 00:43:18, every one 'Avg generation throughput: 0.0 tokens/s, Running: 1 reqs'
    assert found["no_progress_seconds.value"] == (43 * 60 + 18) - (40 * 60 + 43)
    assert found["requests_running.last"] == 1
    assert found["kv_cache_usage_ratio.last"] == pytest.approx(0.001)


# --- fleets ---------------------------------------------------------------------------------------------------------


def test_a_stalled_replica_names_its_stall_finding_and_counts_as_gone_bad_in_a_timeline():
    from llmdiag.engine.fleet import build_timeline, target_from_verdict
    from llmdiag.model.fleet import FleetStep

    verdict = build_verdict(log_readings(20, 6, running=4, waiting=12, kv=0.31).signal_set("vllm-log"))
    target = target_from_verdict("gpu-b", "http://10.0.0.2:8000", verdict)
    assert target.bottleneck is Bottleneck.stalled and target.primary == "SCH003" and target.state == "CRITICAL"
    steps = [
        FleetStep(at_unix=T0, classes={"r1": Bottleneck.healthy, "r2": Bottleneck.healthy}),
        FleetStep(at_unix=T0 + 300, classes={"r1": Bottleneck.healthy, "r2": Bottleneck.stalled}),
    ]
    timeline = build_timeline(steps)
    assert timeline.first_to_go == ["r2"] and timeline.first_to_go_class is Bottleneck.stalled


def test_a_mean_ttft_shorter_than_one_forward_pass_is_a_sanity_finding():
    n = 21
    readings = Readings(
        interval=1.0,
        gauges={"requests_running": [4.0] * n, "requests_waiting": [0.0] * n, "kv_cache_usage_ratio": [0.1] * n},
        rates={"generation_tokens_per_second": [300.0] * n},
    )
    signals = readings.signal_set("vllm", models=("meta-llama/Meta-Llama-3-70B-Instruct",))
    # 0.2 ms on average: Llama 3 70B's weights at 4 bits are ~35 GB, 7 ms at 4.8 TB/s
    signals.add(Signal(name="ttft_seconds", kind="histogram", unit="s", stats={"mean": 0.0002, "count": 90.0}))
    verdict = build_verdict(signals)
    found = evidence(verdict, "SAN007")
    assert found["ttft_seconds.mean"] == 0.0002
    floor = 70.6e9 * 0.5 / FASTEST_HBM_BYTES_PER_SECOND
    assert found["ttft_mean_over_floor_ratio.value"] == pytest.approx(0.0002 / floor, rel=0.01)
    assert "cannot be trusted" in next(f for f in verdict.findings if f.code == "SAN007").summary


# --- the constraint, whatever later fits the confidence ---------------------------------------------------------------


def test_beside_a_stall_no_capacity_class_reaches_half_even_when_every_one_fires_critical():
    from llmdiag.engine.confidence import class_confidence as _class_confidence
    from llmdiag.model import Category, Finding, Severity

    def finding(code: str, category: Category, stall: bool = False) -> Finding:
        return Finding(
            code=code,
            slug="x",
            title="x",
            category=category,
            severity=Severity.critical,
            summary="x",
            evidence=[],
            stall=stall,
        )

    findings = [finding("SCH003", Category.scheduling, stall=True)] + [
        finding(f"{c.value[:3].upper()}999", c)
        for c in (Category.memory, Category.compute, Category.scheduling, Category.network)
    ]
    out = _class_confidence(Bottleneck.stalled, 0.99, findings)
    assert out["stalled"] == 0.99
    assert set(out) == {"stalled", *CAPACITY} and all(out[c] < 0.5 for c in CAPACITY)


def test_a_stall_rule_can_be_neither_advisory_nor_sanity():
    from pydantic import ValidationError

    from llmdiag.schema.loader import load_rules
    from llmdiag.schema.rules import RuleSpec

    sch003 = next(r for r in load_rules() if r.code == "SCH003").model_dump()
    with pytest.raises(ValidationError, match="stall rule"):
        RuleSpec.model_validate({**sch003, "advisory": True})
    stall_codes = {r.code for r in load_rules() if r.stall}
    assert {"SCH003", "SCH011", "MEM007", "NET005"} <= stall_codes


def test_triton_engine_model_at_zero_while_its_ensemble_counts_is_a_sanity_finding():
    n = 11
    readings = Readings(
        interval=1.0,
        gauges={"requests_running": [6.0] * n, "requests_waiting": [2.0] * n, "kv_cache_usage_ratio": [0.3] * n},
        rates={"ensemble_requests_finished_per_second": [24.0] * n, "requests_finished_per_second": [0.0] * n},
    )
    verdict = build_verdict(readings.signal_set("triton"))
    found = evidence(verdict, "SAN008")
    assert found["ensemble_requests_finished_per_second.increase"] == 240.0
    assert found["requests_finished_per_second.increase"] == 0.0
    assert found["engine_model_unseen_requests_ratio.value"] == 1.0
    assert verdict.class_confidence.get("sanity") is None  # sanity never sets a class


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", 7.6e9),  # the model table: its shape's count
        ("Qwen/Qwen3-30B-A3B", 3.35e9),  # the model table: 8 of 128 experts (+ attention, embeddings)
        ("openai/gpt-oss-120b", 5.71e9),  # the model table: 4 of 128 experts, not the 117e9 total
        ("Qwen/Qwen3-Next-80B-A3B-Instruct", 3e9),  # not in the table: a mixture's name states what a token reads
        ("moonshotai/Kimi-K2-Instruct", None),  # neither: a size in a name may be a mixture's total
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 12.9e9),  # the table knows its active experts
    ],
)
def test_the_model_size_behind_the_physics_bounds_is_never_a_mixtures_total(name: str, params: float | None):
    from llmdiag.engine.derived import Missing, model_active_params

    signals = SignalSet(sources=[SourceInfo(probe="vllm", models=[name])])
    if params is None:
        with pytest.raises(Missing, match="mixture"):
            model_active_params(signals)
    else:
        assert model_active_params(signals)[0] == pytest.approx(params, rel=0.02)
