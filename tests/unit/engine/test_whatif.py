"""The what-if model (llmdiag.engine.whatif): the closed loop's arithmetic, its refusals, and the inputs a real
verdict carries (llmdiag.engine.whatif_inputs, on the recorded vLLM 0.32 windows)."""

from __future__ import annotations

import pytest

from llmdiag.api.scan import diagnose_files
from llmdiag.engine.whatif import parse_changes, predict
from llmdiag.errors import UsageError
from llmdiag.model import WhatIfInputs
from tests.conftest import FIXTURES

VLLM = FIXTURES / "vllm-0.32.0"


def _verdict(state: str):
    return diagnose_files(sorted((VLLM / state).glob("scrape-*.prom")))


def _loop(**overrides) -> WhatIfInputs:
    """A closed loop of 32 users held at a batch cap of 4, the step fitted as 2 ms + 0.5 ms per sequence."""
    base = dict(
        server="vllm",
        scrapes=10,
        step_samples=[(1.0, 0.0025), (2.0, 0.003), (3.0, 0.0035), (4.0, 0.004)],
        step_intercept_seconds=0.002,
        step_slope_seconds_per_request=0.0005,
        step_fit_r2=1.0,
        step_seconds_at_mean_batch=0.004,
        kv_block_size_tokens=16.0,
        kv_gpu_blocks=1000.0,
        kv_usage_mean_ratio=0.05,
        kv_usage_peak_ratio=0.06,
        prompt_tokens_mean=256.0,
        output_tokens_mean=128.0,
        users_seen=32.0,
        requests_running_mean=4.0,
        requests_running_max=4.0,
        requests_waiting_mean=28.0,
        prefill_seconds_mean=0.01,
        generation_tokens_per_second=1000.0,
        ttft_p50_seconds=1.5,
        ttft_p90_seconds=1.8,
        preemptions_per_second=0.0,
        arrival_rate_per_second=7.8,
    )
    base.update(overrides)
    return WhatIfInputs(**base)


def test_raising_the_batch_cap_follows_littles_law_on_the_closed_loop():
    got = predict(_loop(), {"max_num_seqs": 16}, "scheduling")
    assert got.modelled, got.not_modelled_reason
    step = 0.002 + 0.0005 * 16  # the fitted line at the new batch
    rate = 16 / (0.01 + 128 * step)  # requests per second: the batch over each request's time in it
    assert got.after.requests_running == 16 and got.after.requests_waiting == 16
    assert got.after.per_user_tokens_per_second == pytest.approx(1 / step)
    assert got.after.total_tokens_per_second == pytest.approx(rate * 128)
    assert got.after.per_user_tokens_per_second_incl_waiting == pytest.approx(rate * 128 / 32)
    assert got.after.ttft_p50_seconds == pytest.approx(16 / rate + 0.01)  # the queue's wait plus the prefill
    assert got.class_after == "scheduling"  # 16 of 32 still wait for a slot
    assert "16 of 32 users still wait" in got.next_limit
    assert any("32 closed-loop users" in b or "closed loop of 32 users" in b for b in got.basis)


def test_a_cap_above_the_users_leaves_nobody_waiting():
    got = predict(_loop(), {"max_num_seqs": 64}, "scheduling")
    assert got.after.requests_running == 32 and got.after.requests_waiting == 0
    assert got.class_after == "healthy"
    assert "all 32 users" in got.next_limit


def test_the_kv_pool_caps_the_batch_when_it_holds_fewer_sequences():
    # 100 blocks of 16 tokens = 1600 tokens; each sequence holds ⌈(256 + 64) / 16⌉ · 16 = 320: 5 fit
    got = predict(_loop(kv_gpu_blocks=100.0), {"max_num_seqs": 16}, "scheduling")
    assert got.after.requests_running == pytest.approx(5)
    assert got.class_after == "memory"
    assert "KV caps at 5 sequences" in got.next_limit


def test_fp8_kv_doubles_the_sequences_that_fit():
    got = predict(_loop(kv_gpu_blocks=100.0), {"kv_cache_dtype": "fp8", "max_num_seqs": 32}, "memory")
    assert got.before.requests_running == pytest.approx(4)  # the cap seen, below the 5 that fit
    assert got.after.requests_running == pytest.approx(10)  # 3200 tokens over 320 a sequence
    assert any("fp8" in b for b in got.basis)


def test_replicas_split_the_users():
    got = predict(_loop(), {"replicas": 2}, "scheduling")
    assert got.after.requests_running == 8 and got.after.requests_waiting == 24  # 4 + 4 running, 12 + 12 waiting
    assert got.after.total_tokens_per_second == pytest.approx(2 * got.before.total_tokens_per_second)


def test_no_step_slope_refuses_a_change_that_moves_the_batch_but_not_one_that_keeps_it():
    flat = _loop(step_intercept_seconds=None, step_slope_seconds_per_request=None, step_fit_r2=None, step_samples=[])
    refused = predict(flat, {"max_num_seqs": 16}, "scheduling")
    assert not refused.modelled and "no step slope" in refused.not_modelled_reason
    assert refused.after.requests_running is None  # nothing guessed
    kept = predict(flat, {"replicas": 1}, "scheduling")
    assert kept.modelled and kept.after.requests_running == 4


def test_too_few_readings_and_a_stall_are_refused():
    assert "readings" in predict(_loop(scrapes=2), {"max_num_seqs": 8}).not_modelled_reason
    assert not predict(_loop(), {"max_num_seqs": 8}, "stalled").modelled


def test_unmodelled_changes_say_why():
    got = predict(_loop(), {"enforce_eager": True})
    assert not got.modelled and "CUDA graphs" in got.not_modelled_reason


@pytest.mark.parametrize(
    ("pairs", "words"),
    [
        ({"max_seqs": "8"}, "unknown"),
        ({"max_num_seqs": "0"}, "bad value"),
        ({"max_num_seqs": "2.5"}, "bad value"),
        ({"gpu_memory_utilization": "1.5"}, "bad value"),
        ({"enforce_eager": "maybe"}, "bad value"),
        ({"replicas": "nan"}, "bad value"),
    ],
)
def test_bad_changes_are_usage_errors(pairs, words):
    with pytest.raises(UsageError, match=words):
        parse_changes(pairs)


def test_a_real_scheduling_window_carries_its_inputs():
    """The recorded vLLM 0.32 `--max-num-seqs 2` window, 32 users × (64 + 128): 2 run, ~30 wait (README table)."""
    verdict = _verdict("scheduling")
    inputs = verdict.whatif_inputs
    assert inputs is not None
    assert inputs.kv_block_size_tokens == 128 and inputs.kv_gpu_blocks == 8192  # cache_config_info's labels
    assert inputs.users_seen == 32
    assert inputs.requests_running_max == 2
    assert inputs.output_tokens_mean == 128  # ignore_eos, max_tokens 128
    assert inputs.prompt_tokens_mean is not None and 60 < inputs.prompt_tokens_mean < 70
    # the batch held at 2: no slope, and the reason is kept, never a 0
    assert inputs.step_slope_seconds_per_request is None
    assert "spread" in inputs.unavailable["step_slope_seconds_per_request"]
    got = predict(inputs, {"replicas": 2}, verdict.bottleneck.value)
    assert got.modelled and got.class_after == "scheduling"
    assert got.after.requests_running == 4 and got.after.requests_waiting == 28


def test_a_real_window_without_a_server_page_has_no_inputs_to_guess_from():
    """A server log alone (vLLM 0.32's own stat lines): no lengths histogram, so no prediction, with the reason."""
    log = FIXTURES / "logs" / "vllm-0.32-healthy.log"
    verdict = diagnose_files([log])
    assert verdict.whatif_inputs is not None
    got = predict(verdict.whatif_inputs, {"max_num_seqs": 8}, verdict.bottleneck.value)
    assert not got.modelled and got.not_modelled_reason


QUANTIFIED = ("MEM001", "MEM003", "MEM005", "SCH001", "SCH002", "SCH004", "CMP001", "CMP002")


def test_the_named_rules_quantify_their_fixes_in_data():
    from llmdiag.schema.loader import load_rules

    rules = {rule.code: rule for rule in load_rules()}
    for code in QUANTIFIED:
        assert any(w.set for w in rules[code].fix.whatif), code


def test_a_real_verdict_prices_each_fix_or_says_why_not():
    """The scheduling window: SCH001's "double it" is 2 → 4 (the cap seen is 2) and "a slot per user" is 32; both
    move the batch, which held at 2, so both say why they are not priced; a second replica keeps the batch and is."""
    verdict = _verdict("scheduling")
    by_code = {f.code: f for f in verdict.findings}
    sch001 = by_code["SCH001"].predicted
    assert [e.changes for e in sch001] == [{"max_num_seqs": 4}, {"max_num_seqs": 32}]
    assert all(not e.modelled and "step slope" in e.not_modelled_reason and e.after is None for e in sch001)
    replicas = [e for f in verdict.findings for e in f.predicted if e.changes == {"replicas": 2}]
    assert replicas and replicas[0].modelled and replicas[0].class_after == "scheduling"
    assert replicas[0].after is not None and replicas[0].after.requests_running == 4
    for finding in verdict.findings:
        assert finding.predicted, finding.code  # every fix: quantified or not modelled, with the reason
        assert all(e.modelled or e.not_modelled_reason for e in finding.predicted)
