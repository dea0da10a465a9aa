"""`llmdiag analyze` on server logs: vLLM V0/V1 stat-logger lines, SGLang batch lines, TensorRT-LLM iteration JSON.

Fixtures (tests/fixtures/logs/README.md says where each format was copied from): two real vLLM 0.32 CPU logs
recorded by tests/realserver, and logs written line for line in each server's own format.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmdiag.api import diagnose_logs
from llmdiag.collect.logs import collect_logs, looks_like_log, parse_when
from llmdiag.errors import InputFileError, UsageError
from llmdiag.schema.logs import load_log_spec
from tests.conftest import REPO_ROOT, run_cli

LOGS = REPO_ROOT / "tests" / "fixtures" / "logs"


def _finding(verdict, code):
    return next(f for f in verdict.findings if f.code == code)


def _ev(finding, signal, stat):
    return next(e.value for e in finding.evidence if e.signal == signal and e.stat == stat)


def test_spec_loads_and_every_group_has_a_field():
    spec = load_log_spec()
    assert {line.server for line in spec.line} == {"vllm", "sglang", "llamacpp", "tgi", "any"}
    assert {p.name for p in spec.prefix} == {"vllm", "sglang", "sglang-clock", "glog", "pylog", "iso"}


def test_real_vllm_032_kv_starved_log_is_memory_bound():
    """Recorded from the real CPU vLLM 0.32 with a 2 MiB KV cache: 2 running, ~30 waiting, KV 87-100 %."""
    verdict = diagnose_logs([LOGS / "vllm-0.32-kv-starved.log"])
    assert verdict.bottleneck.value == "memory"
    mem = _finding(verdict, "MEM003")
    assert mem.severity.value == "critical"
    assert _ev(mem, "kv_cache_usage_ratio", "p90") == pytest.approx(1.0)
    assert _ev(mem, "requests_waiting_avg", "value") == pytest.approx(30.5)
    assert _ev(mem, "preemptions_per_second", "rate") == 0.0
    assert verdict.window.duration_seconds == pytest.approx(30.0)
    assert verdict.window.scrapes == 4
    assert "every 10 s" in verdict.window.note
    # the "CPU KV cache usage" wording of a CPU build is read as the KV gauge
    assert verdict.signals["requests_running"].stats["mean"] == 2.0
    assert verdict.signals["generation_tokens_per_second"].stats["rate"] == pytest.approx(699.4, abs=0.1)


def test_real_vllm_032_healthy_log():
    verdict = diagnose_logs([LOGS / "vllm-0.32-healthy.log"])
    assert verdict.bottleneck.value == "healthy"
    assert verdict.findings == []
    assert "logs carry no TTFT" in verdict.summary
    assert verdict.signals["requests_waiting"].stats["max"] == 0.0
    assert verdict.signals["ttft_seconds"].unavailable.startswith("not in server logs")


def test_vllm_v1_preemptions_are_memory_with_the_rate():
    verdict = diagnose_logs([LOGS / "vllm-v1-memory.log"])
    assert verdict.bottleneck.value == "memory"
    mem = _finding(verdict, "MEM005")
    assert mem.severity.value == "critical"
    preempt = verdict.signals["preemptions_per_second"]
    # "Preemptions: N" of every line after the series' first, over the 350 s the lines span
    assert preempt.stats["increase"] == 137.0
    assert _ev(mem, "preemptions_per_second", "rate") == pytest.approx(137 / 350)
    assert _ev(mem, "kv_cache_usage_ratio", "max") == pytest.approx(1.0, abs=0.002)
    # the queue beside it (no longer a gate: a preempted request may be re-admitted between two stat lines)
    assert verdict.signals["requests_waiting_avg"].stats["value"] == pytest.approx(16.7, abs=0.1)
    outcomes = {o.code: o for o in verdict.coverage.rules}
    assert outcomes["MEM001"].status == "skipped"  # no finished-request count in logs; MEM005 stands in
    assert "not in server logs" in outcomes["MEM001"].reason
    assert preempt.samples and len(verdict.signals["kv_cache_usage_ratio"].samples) == 36
    # fixes for the server the log came from, vLLM's flags
    assert any("--gpu-memory-utilization" in fix for fix in mem.fixes)


def test_until_and_since_change_the_window_and_the_verdict():
    path = LOGS / "vllm-v1-memory.log"
    early = diagnose_logs([path], until="06:39:55")  # the first 12 lines: 24 running, nothing waits
    assert early.bottleneck.value == "healthy"
    assert early.window.scrapes == 12
    assert early.window.duration_seconds == pytest.approx(110.0)
    late = diagnose_logs([path], since="2m")  # the last 2 minutes before the last line
    assert late.bottleneck.value == "memory"
    assert late.window.scrapes == 13
    assert late.signals["kv_cache_usage_ratio"].stats["min"] > 0.98


def test_vllm_v0_swapping_is_memory():
    verdict = diagnose_logs([LOGS / "vllm-v0-swap.log"])
    assert verdict.bottleneck.value == "memory"
    swap = _finding(verdict, "MEM002")
    assert swap.severity.value == "critical"
    assert _ev(swap, "requests_swapped", "mean") == pytest.approx(154 / 24)  # the 24 stat lines
    assert verdict.signals["cpu_kv_cache_usage_ratio"].stats["max"] > 0.2
    # warnings at cumulative 1, 51, 101, 151: 151 preemptions in the window
    assert verdict.signals["preemptions_per_second"].stats["increase"] == 151.0


def test_sglang_queue_with_low_token_usage_is_scheduling():
    verdict = diagnose_logs([LOGS / "sglang-scheduling.log"])
    assert verdict.bottleneck.value == "scheduling"
    sch = _finding(verdict, "SCH001")
    assert sch.severity.value == "critical"
    # one sample per logged second (a prefill and a decode line of the same second are one moment): the mean of
    # each second's last '#queue-req' over the 60 seconds with lines
    assert _ev(sch, "requests_waiting_avg", "value") == pytest.approx(3002 / 60)
    assert _ev(sch, "kv_cache_usage_ratio", "max") < 0.3
    assert _ev(sch, "preemptions_per_second", "rate") == 0.0
    assert _ev(sch, "itl_seconds", "mean") == pytest.approx(32 / 1900, rel=0.05)
    assert any("--max-running-requests" in fix for fix in sch.fixes)  # SGLang's flags for an SGLang log
    assert verdict.signals["prompt_tokens_per_second"].stats["increase"] > 0
    assert verdict.coverage.probes[0].server == "SGLang"


def test_trtllm_iteration_json_lines():
    verdict = diagnose_logs([LOGS / "trtllm-iterations.log"])
    assert verdict.bottleneck.value == "memory"
    assert _finding(verdict, "MEM005").severity.value == "critical"
    kv = verdict.signals["kv_cache_usage_ratio"]
    assert kv.stats["max"] == pytest.approx(4093 / 4096)
    assert verdict.signals["itl_seconds"].stats["max"] == pytest.approx(0.0415)
    assert verdict.signals["requests_waiting"].stats["max"] == 14.0


def test_interleaved_data_parallel_log_keeps_each_engine():
    signals = collect_logs([LOGS / "vllm-v1-dp2.log"])
    running = signals.signals["requests_running"]
    assert set(running.by_series) == {"engine=pid 7001/0", "engine=pid 7001/1"}
    assert running.by_series["engine=pid 7001/0"] == pytest.approx(40, abs=1)
    assert running.by_series["engine=pid 7001/1"] == pytest.approx(4, abs=1)
    # the server total sums both engines at each moment
    assert running.stats["mean"] == pytest.approx(44, abs=1.5)
    verdict = diagnose_logs([LOGS / "vllm-v1-dp2.log"])
    imbalance = _finding(verdict, "SCH005")
    assert _ev(imbalance, "engine_load_imbalance_ratio", "value") == pytest.approx(1.85, abs=0.05)


def test_two_files_merge_in_time_order(tmp_path: Path):
    lines = (LOGS / "vllm-v1-memory.log").read_text().splitlines()
    (tmp_path / "a.log").write_text("\n".join(lines[:15]) + "\n")
    (tmp_path / "b.log").write_text("\n".join(lines[15:]) + "\n")
    whole = collect_logs([LOGS / "vllm-v1-memory.log"])
    split = collect_logs([tmp_path / "b.log", tmp_path / "a.log"])
    assert split.window.duration_seconds == whole.window.duration_seconds
    assert split.signals["preemptions_per_second"].stats == whole.signals["preemptions_per_second"].stats


def test_sglang_retraction_on_every_tp_rank_counts_once(tmp_path: Path):
    text = (
        "[2026-11-30 07:00:00 TP0] Decode batch. #running-req: 8, #token: 9000, token usage: 0.97, "
        "gen throughput (token/s): 400.00, #queue-req: 3\n"
        "[2026-11-30 07:00:02 TP0] Decode out of memory happened. #retracted_reqs: 2, #new_token_ratio: 0.4 -> 0.6\n"
        "[2026-11-30 07:00:02 TP1] Decode out of memory happened. #retracted_reqs: 2, #new_token_ratio: 0.4 -> 0.6\n"
        "[2026-11-30 07:00:04 TP0] Decode batch. #running-req: 6, #token: 9100, token usage: 0.98, "
        "gen throughput (token/s): 300.00, #queue-req: 5\n"
    )
    (tmp_path / "s.log").write_text(text)
    signals = collect_logs([tmp_path / "s.log"])
    assert signals.signals["preemptions_per_second"].stats["increase"] == 2.0


def test_parse_when_forms():
    last = 1_796_020_792.0  # 2026-11-30 06:39:52 UTC
    assert parse_when("30m", last, "--since") == last - 1800
    assert parse_when("06:39:00", last, "--since") == last - 52
    assert parse_when("2026-11-30T06:39:52Z", last, "--since") == last
    with pytest.raises(UsageError):
        parse_when("yesterday-ish", last, "--since")


def test_a_window_with_no_lines_is_an_input_error():
    with pytest.raises(InputFileError, match="no stat lines between"):
        collect_logs([LOGS / "vllm-v1-memory.log"], since="2026-01-01", until="2026-01-02")


def test_looks_like_log_tells_dumps_apart():
    assert looks_like_log(LOGS / "vllm-v1-memory.log")
    assert looks_like_log(LOGS / "trtllm-iterations.log")
    dump = next((REPO_ROOT / "tests" / "fixtures" / "vllm-0.32.0").rglob("*.prom"))
    assert not looks_like_log(dump)


def test_cli_analyze_log_json_and_exit_codes():
    result = run_cli("analyze", str(LOGS / "vllm-v1-memory.log"), "--json")
    assert result.returncode == 1, result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["bottleneck"] == "memory"
    assert verdict["findings"][0]["code"] == "MEM005"
    early = run_cli("analyze", str(LOGS / "vllm-v1-memory.log"), "--until", "06:39:55", "--json")
    assert early.returncode == 0 and json.loads(early.stdout)["bottleneck"] == "healthy"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["garbage.log"], "holds no metric or log lines (it starts: hello world"),  # prose: no data at all
        (["vllm-v1-memory.log", "--since", "soon"], "--since 'soon' is neither a time nor a span"),
        (["vllm-v1-memory.log", "sglang-scheduling.log"], "mixes logs of SGLang, vLLM"),
    ],
)
def test_cli_bad_log_input_is_one_error_line(args: list[str], message: str):
    paths = [str(LOGS / a) if a.endswith(".log") else a for a in args]
    result = run_cli("analyze", *paths)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("ERROR:") and message in lines[0]
    assert lines[1].startswith("HINT:")
    assert "Traceback" not in result.stderr


def test_cli_since_on_a_dump_is_a_usage_error():
    dump = next((REPO_ROOT / "tests" / "fixtures" / "vllm-0.32.0").rglob("*.prom"))
    result = run_cli("analyze", str(dump), "--since", "5m")
    assert result.returncode == 2
    assert "--since/--until apply to server logs" in result.stderr


def test_cli_reads_a_pasted_bug_report_as_a_log(tmp_path: Path):
    """Prose, a fence and '> ' quotes around real SGLang PD prefill lines (sgl-project/sglang#5450, the fixture's
    first four lines): `llmdiag analyze` tells it is a log and judges the four DP ranks' one moment."""
    lines = (LOGS / "sglang-pd-prefill-mooncake.log").read_text().splitlines()[:4]
    report = tmp_path / "report.md"
    report.write_text("The prefill node is slow, log below.\n\n```\n" + "\n".join(f"> {x}" for x in lines) + "\n```\n")
    result = run_cli("analyze", str(report), "--json")
    assert result.returncode in (0, 1), result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["window"]["kind"] == "snapshot"
    assert verdict["signals"]["kv_bootstrap_queue_requests"]["stats"]["last"] == 325 + 374 + 375 + 343
