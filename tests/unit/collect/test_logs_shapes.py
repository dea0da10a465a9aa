"""Server log lines in the shapes seen in the field, read by llmdiag.collect.log_lines / llmdiag.collect.logs.

Every line below is copied verbatim from where it was posted (the comment above it says where); the numbers the
tests expect are the ones visible in those lines. Fixture files: tests/fixtures/logs/README.md.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path

import pytest

from llmdiag.collect.log_lines import LineReader
from llmdiag.collect.logs import collect_logs, looks_like_log
from llmdiag.errors import InputFileError, UsageError
from llmdiag.schema.logs import load_log_spec
from tests.conftest import REPO_ROOT

LOGS = REPO_ROOT / "tests" / "fixtures" / "logs"
TRTLLM = REPO_ROOT / "tests" / "fixtures" / "trtllm"
MIB = 2**20


def _log(tmp_path: Path, *lines: str, name: str = "server.log") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _utc(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()


def _records(line: str):
    return LineReader(load_log_spec()).read_line(line, 2026, _utc("2026-12-01 00:00:00"))


# ---------------------------------------------------------------------------------------------
# vLLM


# vllm-project/vllm#7540, comment by skylee-01 (2024-08-20): V0 "Swapped/Pending" line, old "file.py:N]" prefix
V0_LINE = (
    "INFO 08-20 02:39:37 metrics.py:411] Avg prompt throughput: 871.4 tokens/s, Avg generation throughput: 88.1 "
    "tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 0.2%, CPU KV cache usage: 0.0%."
)
# vllm-project/vllm#19680 (2025-06-16): V1 "Waiting" line, "[file.py:N]" prefix without the process tag
V1_LINE = (
    "INFO 06-16 10:03:14 [loggers.py:87] Engine 000: Avg prompt throughput: 1254.4 tokens/s, Avg generation "
    "throughput: 29.2 tokens/s, Running: 10 reqs, Waiting: 4 reqs, GPU KV cache usage: 57.9%, Prefix cache hit "
    "rate: 40.5%"
)


def test_v0_pending_swapped_and_v1_waiting_lines():
    (v0,) = _records(V0_LINE)
    assert v0.fmt == "vllm-v0-stats"
    assert v0.values == {
        "prompt_tps": 871.4,
        "gen_tps": 88.1,
        "running": 1.0,
        "swapped": 0.0,
        "waiting": 0.0,
        "kv_pct": 0.2,
        "cpu_kv_pct": 0.0,
    }
    (v1,) = _records(V1_LINE)
    assert v1.fmt == "vllm-v1-stats"
    assert v1.values == {"prompt_tps": 1254.4, "gen_tps": 29.2, "running": 10.0, "waiting": 4.0, "kv_pct": 57.9}
    assert v1.at == _utc("2026-06-16 10:03:14")  # the year is the file's: vLLM prints none


def test_records_glued_onto_one_line_each_count():
    """vllm-project/vllm#2595: five V0 records on one line, the first one's "(" lost (fixture)."""
    signals = collect_logs([LOGS / "vllm-v0-glued.log"])
    window = signals.window
    assert window.kind == "window"
    assert window.scrapes == 5
    assert window.duration_seconds == 20.0  # 11:26:53 … 11:27:13, the lines' own times
    assert window.end_unix - window.start_unix == 20.0  # never measured to the time of analysis
    generation = signals.signals["generation_tokens_per_second"]
    # the first record's interval began before the log; each later one covers the 5 s since the one before
    assert generation.stats["increase"] == pytest.approx((77.3 + 77.3 + 76.8 + 76.4) * 5)
    assert generation.stats["rate"] == pytest.approx((77.3 + 77.3 + 76.8 + 76.4) * 5 / 20)
    # one series: the record without "(" is the same process
    assert set(signals.signals["requests_running"].by_series) == {"engine=pid 1974/0"}
    assert signals.signals["kv_cache_usage_ratio"].stats["max"] == pytest.approx(0.005)


# a public GitHub doc on `vllm bench latency` (find_string id 6563470627): a tqdm bar glued before a V0 line
TQDM_LINE = (
    "Warmup iterations:   0%|                                                                                       "
    "                                                                             | 0/2 [00:00<?, ?it/s]INFO 04-28 "
    "11:18:39 [metrics.py:481] Avg prompt throughput: 204.6 tokens/s, Avg generation throughput: 120.3 tokens/s, "
    "Running: 1 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 0.1%, CPU KV cache usage: 0.0%."
)


def test_a_tqdm_bar_before_the_info_line_is_one_snapshot(tmp_path: Path):
    signals = collect_logs([_log(tmp_path, TQDM_LINE)])
    assert signals.window.kind == "snapshot"
    assert signals.window.duration_seconds is None
    assert signals.window.note.startswith("one moment")
    # the server's own per-second averages are read as printed; nothing is integrated over an assumed interval
    assert signals.signals["prompt_tokens_per_second"].stats == {"rate": 204.6}
    assert signals.signals["generation_tokens_per_second"].stats == {"rate": 120.3}
    assert signals.signals["requests_running"].stats["last"] == 1.0
    assert signals.signals["kv_cache_usage_ratio"].stats["last"] == pytest.approx(0.001)
    assert "at least two" in signals.signals["itl_seconds"].unavailable


# a public GitHub markdown quoting a vLLM issue (find_string id 56685303809): the app's Python-logging format,
# records run together on one line as the doc printed them, the last one cut short ("Running: 1 re...")
PYLOG_LINE = (
    "2024-12-20 15:18:19 - vllm.executor.distributed_gpu_executor - INFO - # GPU blocks: 50231, # CPU blocks: 8192 "
    "2024-12-20 15:18:19 - vllm.executor.distributed_gpu_executor - INFO - Maximum concurrency for 32768 tokens per "
    "request: 24.53x 2024-12-23 18:28:10 - vllm.engine.metrics - INFO - Avg prompt throughput: 0.0 tokens/s, Avg "
    "generation throughput: 45.7 tokens/s, Running: 1 re..."
)


def test_python_logging_shape_anywhere_in_the_line():
    (record,) = _records(PYLOG_LINE)
    assert record.at == _utc("2024-12-23 18:28:10")  # the record's own time, year included
    assert record.fmt == "vllm-throughput"  # cut short: the two throughputs are all it says
    assert record.values == {"prompt_tps": 0.0, "gen_tps": 45.7}


# tenstorrent/tt-inference-server#3359, comment by ipastalTT: `docker logs --timestamps` (nanoseconds) before the
# V1 prefix; the third interval ran prefill (prompt throughput > 0)
DOCKER_LINES = (
    "2026-05-12T08:01:39.331095044Z (APIServer pid=1) INFO 05-12 08:01:39 [loggers.py:271] Engine 000: Avg prompt "
    "throughput: 6335.3 tokens/s, Avg generation throughput: 4.8 tokens/s, Running: 9 reqs, Waiting: 0 reqs, GPU KV "
    "cache usage: 62.8%, Prefix cache hit rate: 0.0%",
    "2026-05-12T08:01:49.332184394Z (APIServer pid=1) INFO 05-12 08:01:49 [loggers.py:271] Engine 000: Avg prompt "
    "throughput: 0.0 tokens/s, Avg generation throughput: 7.2 tokens/s, Running: 9 reqs, Waiting: 1 reqs, GPU KV "
    "cache usage: 68.8%, Prefix cache hit rate: 0.0%",
    "2026-05-12T08:01:59.333055436Z (APIServer pid=1) INFO 05-12 08:01:59 [loggers.py:271] Engine 000: Avg prompt "
    "throughput: 3411.1 tokens/s, Avg generation throughput: 5.7 tokens/s, Running: 10 reqs, Waiting: 0 reqs, GPU KV "
    "cache usage: 74.5%, Prefix cache hit rate: 0.0%",
    "2026-05-12T08:02:09.334253915Z (APIServer pid=1) INFO 05-12 08:02:09 [loggers.py:271] Engine 000: Avg prompt "
    "throughput: 0.0 tokens/s, Avg generation throughput: 7.2 tokens/s, Running: 10 reqs, Waiting: 0 reqs, GPU KV "
    "cache usage: 79.9%, Prefix cache hit rate: 0.0%",
)


def test_docker_timestamps_give_the_year_and_prefill_intervals_are_marked(tmp_path: Path):
    signals = collect_logs([_log(tmp_path, *DOCKER_LINES)])
    assert signals.window.start_unix == _utc("2026-05-12 08:01:39")
    assert signals.window.duration_seconds == 30.0
    itl = signals.signals["itl_seconds"]
    # the first line is left out (its interval began before the log); the other three: running ÷ throughput
    assert itl.stats["mean"] == pytest.approx((9 / 7.2 + 10 / 5.7 + 10 / 7.2) / 3)
    assert "from 3 of 4 stat lines" in itl.source
    assert "1 of the 3 intervals also ran prefill" in itl.source


# vllm-project/vllm#25677 (2025-09-24): V0 DEBUG lines, 1 request running and no token generated, between /metrics
# access lines
STALLED_LINES = (
    "DEBUG 09-24 15:06:53 [metrics.py:486] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 "
    "tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 5.3%, CPU KV cache usage: 0.0%.",
    'INFO:     172.17.33.84:58856 - "GET /metrics HTTP/1.1" 200 OK',
    "DEBUG 09-24 15:07:03 [metrics.py:486] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 "
    "tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 5.3%, CPU KV cache usage: 0.0%.",
    'INFO:     172.17.33.84:54154 - "GET /metrics HTTP/1.1" 200 OK',
    "DEBUG 09-24 15:07:13 [metrics.py:486] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 "
    "tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 5.3%, CPU KV cache usage: 0.0%.",
    "DEBUG 09-24 15:07:23 [metrics.py:486] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 "
    "tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 5.3%, CPU KV cache usage: 0.0%.",
)


def test_no_itl_estimate_from_a_line_whose_throughput_is_near_zero(tmp_path: Path):
    signals = collect_logs([_log(tmp_path, *STALLED_LINES)])
    itl = signals.signals["itl_seconds"]
    assert itl.unavailable is not None
    assert "estimated from 0 stat line(s)" in itl.unavailable
    assert "3 line(s) whose throughput gave fewer tokens than running requests" in itl.unavailable
    assert "1 first line(s)" in itl.unavailable
    # the gauges are still judged: one request running, KV 5.3 %
    assert signals.signals["requests_running"].stats["mean"] == 1.0
    assert signals.signals["generation_tokens_per_second"].stats["increase"] == 0.0


# a public GitHub doc of a P/D (NIXL) guide, "Expected" output (find_string id 55419183275): lines with no prefix
# and no time at all, the first cut short by the doc ("...")
UNTIMED_LINES = (
    "Engine 000: Avg prompt throughput: 0.1 tokens/s, Avg generation throughput: 10.0 tokens/s, ...",
    "KV Transfer metrics: Num successful transfers=1, Avg xfer time (ms)=8.505, P90 xfer time (ms)=8.505, Avg post "
    "time (ms)=4.581, P90 post time (ms)=4.581, Avg MB per transfer=2.0, Throughput (MB/s)=235.156, Avg number of "
    "descriptors=64.0",
)


def test_lines_without_any_time_are_ordered_as_given(tmp_path: Path):
    path = _log(tmp_path, *UNTIMED_LINES)
    signals = collect_logs([path])
    window = signals.window
    assert window.note.startswith("no timestamps: lines ordered as given")
    assert window.duration_seconds is None and window.start_unix is None and window.end_unix is None
    assert window.scrapes == 2
    # printed per-second averages as printed; a count per second needs time
    assert signals.signals["generation_tokens_per_second"].stats == {"rate": 10.0}
    assert signals.signals["prompt_tokens_per_second"].stats == {"rate": 0.1}
    transfers = signals.signals["kv_transfers_per_second"]
    assert transfers.unavailable.startswith("no timestamps")
    assert signals.signals["kv_transfer_seconds"].stats["last"] == pytest.approx(0.008505)
    assert signals.signals["kv_transfer_speed_bytes_per_second"].stats["last"] == pytest.approx(235.156 * MIB)
    # samples at the line's index, not at a made-up time
    assert [t for t, _ in signals.signals["kv_transfer_seconds"].samples] == [0.0]
    assert signals.signals["itl_seconds"].unavailable is not None  # the cut line has no running count to estimate from
    with pytest.raises(UsageError, match="need times"):
        collect_logs([path], since="5m")


def test_nixl_kv_transfer_line_alone_is_a_snapshot():
    """vllm-project/vllm PR #25388: one 'KV Transfer metrics' line (fixture)."""
    signals = collect_logs([LOGS / "vllm-nixl-kv-transfer.log"])
    assert signals.window.kind == "snapshot"
    assert signals.signals["kv_transfer_seconds"].stats["last"] == pytest.approx(0.009862)
    assert signals.signals["kv_transfer_speed_bytes_per_second"].stats["last"] == pytest.approx(7097.952 * MIB)
    for counter in ("kv_transfers_per_second", "kv_transfer_throughput_bytes_per_second"):
        assert signals.signals[counter].unavailable.startswith("one moment (a snapshot)")


# ---------------------------------------------------------------------------------------------
# SGLang


def test_sglang_pd_decode_lines_two_a_second():
    """A PD-decode log (fixture): two decode lines in most seconds share that second's interval."""
    signals = collect_logs([LOGS / "sglang-pd-decode.log"])
    generation = signals.signals["generation_tokens_per_second"]
    # 14:44:11 is covered once at the mean of its two lines, 14:44:12 likewise; 14:44:10 is the series' first
    assert generation.stats["increase"] == pytest.approx((78.20 + 77.89) / 2 + (77.90 + 77.90) / 2)
    assert signals.window.duration_seconds == 2.0
    assert signals.signals["kv_prealloc_queue_requests"].stats["max"] == 0.0
    assert signals.signals["kv_transfer_queue_requests"].stats["max"] == 0.0
    assert signals.signals["cuda_graph_batches_ratio"].stats["mean"] == 1.0
    itl = signals.signals["itl_seconds"]
    assert "from 4 of 5 stat lines" in itl.source  # the 0.04 tokens/s line is the series' first
    assert itl.stats["max"] == pytest.approx(1 / 77.89)


def test_sglang_dp_ranks_in_one_second_are_a_snapshot_of_all_ranks(tmp_path: Path):
    """sgl-project/sglang#5450: four DP ranks' prefill lines at 08:57:28 (the fixture's first four lines)."""
    lines = (LOGS / "sglang-pd-prefill-mooncake.log").read_text().splitlines()[:4]
    signals = collect_logs([_log(tmp_path, *lines)])
    assert signals.window.kind == "snapshot"
    assert signals.signals["kv_bootstrap_queue_requests"].stats["last"] == 325 + 374 + 375 + 343
    assert signals.signals["kv_transfer_queue_requests"].stats["last"] == 150 + 163 + 151 + 157
    assert set(signals.signals["kv_transfer_queue_requests"].by_series) == {
        "engine=15",
        "engine=11",
        "engine=13",
        "engine=9",
    }
    assert signals.signals["kv_cache_usage_ratio"].stats["last"] == pytest.approx(0.07)
    assert signals.signals["prompt_tokens_per_second"].unavailable.startswith("one moment")


def test_mooncake_transfer_engine_throughput_is_bytes_over_the_window():
    """sgl-project/sglang#5450 (fixture): glog lines of the Mooncake transfer engine among SGLang's."""
    signals = collect_logs([LOGS / "sglang-pd-prefill-mooncake.log"])
    throughput = signals.signals["kv_transfer_throughput_bytes_per_second"]
    # threads 104603, 104631, 104635, 104630 logged at 08:57:30 (their first lines) and again at 08:57:40, each
    # "over last 5s"; the other four threads' only lines are their first
    moved = (5.32 + 6.04 + 3.60 + 5.80) * 5 * MIB
    assert throughput.stats["increase"] == pytest.approx(moved)
    assert signals.window.duration_seconds == 12.0  # 08:57:28 … 08:57:40, the glog lines in the SGLang lines' year
    assert throughput.stats["rate"] == pytest.approx(moved / 12)
    assert "engine=thread 104603" in throughput.by_series
    assert "Transfer Engine Throughput" in throughput.verify


# sgl-project/sglang#22877 (2026-04-15): a custom logging format "[time][file:line][INFO]: ", PD prefill with
# "#prealloc-req" (bootstrap queue) and "#inflight-req"
BRACKETED_LINES = (
    "[2026-04-15 17:13:10][scheduler_metrics_mixin.py:424][INFO]: Prefill batch, #new-seq: 1, #new-token: 1, "
    "#cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, #prealloc-req: 18, #inflight-req: 1, "
    "cuda graph: False, input throughput (token/s): 2.49",
    "[2026-04-15 17:13:11][scheduler_metrics_mixin.py:424][INFO]: Prefill batch, #new-seq: 1, #new-token: 1, "
    "#cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, #prealloc-req: 22, #inflight-req: 1, "
    "cuda graph: False, input throughput (token/s): 1.00",
    "[2026-04-15 17:13:12][scheduler_metrics_mixin.py:424][INFO]: Prefill batch, #new-seq: 1, #new-token: 1, "
    "#cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, #prealloc-req: 27, #inflight-req: 1, "
    "cuda graph: False, input throughput (token/s): 1.00",
    "[2026-04-15 17:13:12][scheduler_metrics_mixin.py:424][INFO]: Prefill batch, #new-seq: 1, #new-token: 1, "
    "#cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, #prealloc-req: 28, #inflight-req: 1, "
    "cuda graph: False, input throughput (token/s): 5.19",
)


def test_sglang_prefill_with_the_bracketed_prefix_and_inflight_queue(tmp_path: Path):
    signals = collect_logs([_log(tmp_path, *BRACKETED_LINES)])
    assert signals.window.start_unix == _utc("2026-04-15 17:13:10")
    bootstrap = signals.signals["kv_bootstrap_queue_requests"]
    assert [v for _, v in bootstrap.samples] == [18.0, 22.0, 28.0]  # one sample per second: its last line
    assert signals.signals["kv_transfer_queue_requests"].stats["max"] == 1.0
    # "#new-token" of the lines after the first second (the first is the counter's base): 1 + 1 + 1
    assert signals.signals["prompt_tokens_per_second"].stats["increase"] == 3.0


# sgl-project/sglang#11648, comment by dizhang2020-web (2025-10-15): DP ranks with EP tags, DP8 twice in one second
EP_LINES = (
    "[2025-10-15 14:44:33 DP8 TP8 EP8] Prefill batch. #new-seq: 1, #new-token: 512, #cached-token: 0, token usage: "
    "0.01, #unbootstrapped-req: 0, #queue-req: 0, #transferring-req: 0, input throughput (token/s): 1258.57, ",
    "[2025-10-15 14:44:33 DP13 TP13 EP13] Prefill batch. #new-seq: 2, #new-token: 512, #cached-token: 0, token "
    "usage: 0.01, #unbootstrapped-req: 0, #queue-req: 3, #transferring-req: 0, input throughput (token/s): 1257.48, ",
    "[2025-10-15 14:44:33 DP15 TP15 EP15] Prefill batch. #new-seq: 3, #new-token: 512, #cached-token: 0, token "
    "usage: 0.02, #unbootstrapped-req: 0, #queue-req: 3, #transferring-req: 0, input throughput (token/s): 1252.73, ",
    "[2025-10-15 14:44:33 DP8 TP8 EP8] Prefill batch. #new-seq: 1, #new-token: 512, #cached-token: 0, token usage: "
    "0.01, #unbootstrapped-req: 0, #queue-req: 0, #transferring-req: 0, input throughput (token/s): 1242.79, ",
)


def test_sglang_ep_tagged_ranks_in_one_second(tmp_path: Path):
    signals = collect_logs([_log(tmp_path, *EP_LINES)])
    assert signals.window.kind == "snapshot"
    waiting = signals.signals["requests_waiting"]
    assert waiting.stats["last"] == 0 + 3 + 3  # DP8 (its later line), DP13, DP15
    assert set(waiting.by_series) == {"engine=8", "engine=13", "engine=15"}
    assert signals.signals["kv_cache_usage_ratio"].stats["last"] == pytest.approx((0.01 + 0.01 + 0.02) / 3)


def test_quoted_and_fenced_paste_is_read(tmp_path: Path):
    """A bug report as pasted: prose, a Markdown fence, '> ' quotes around the real lines of sglang#11648."""
    path = _log(tmp_path, "Here is what the prefill node printed:", "```", *(f"> {line}" for line in EP_LINES), "```")
    assert looks_like_log(path)
    signals = collect_logs([path])
    assert signals.signals["requests_waiting"].stats["last"] == 6.0


# ---------------------------------------------------------------------------------------------
# TensorRT-LLM: one record a line, a JSON array, pretty-printed


def _trt_records() -> list[dict]:
    long_prompt = json.loads((TRTLLM / "iteration-stats-executor-long-prompt.json").read_text())
    return long_prompt


@pytest.mark.parametrize("shape", ["array", "pretty", "pretty-array", "one-per-line"])
def test_trtllm_records_in_every_shape(tmp_path: Path, shape: str):
    """The executor record of NVIDIA/TensorRT-LLM#3376 (tests/fixtures/trtllm), written as each shape."""
    records = _trt_records()
    text = {
        "array": json.dumps(records),
        "pretty": json.dumps(records[0], indent=4),
        "pretty-array": json.dumps(records, indent=2),
        "one-per-line": "\n".join(json.dumps(r) for r in records),
    }[shape]
    path = tmp_path / "trt.log"
    path.write_text(f"[TensorRT-LLM] iteration stats follow\n{text}\n", encoding="utf-8")
    signals = collect_logs([path])
    assert signals.window.kind == "snapshot"
    assert signals.signals["requests_running"].stats["last"] == 1.0
    assert signals.signals["requests_waiting"].stats["last"] == 7.0
    assert signals.signals["kv_cache_usage_ratio"].stats["last"] == pytest.approx(5495 / 7240)


def test_trtllm_records_use_their_microsecond_timestamps(tmp_path: Path):
    # the two real records of tests/fixtures/trtllm, one a line: 04-07-2025 20:33:17.747028, 07-25-2025 16:54:34.140189
    lines = [json.dumps(json.loads(p.read_text())[0]) for p in sorted(TRTLLM.glob("*.json"))]
    signals = collect_logs([_log(tmp_path, *lines)])
    start = datetime(2025, 4, 7, 20, 33, 17, 747028, tzinfo=timezone.utc).timestamp()
    end = datetime(2025, 7, 25, 16, 54, 34, 140189, tzinfo=timezone.utc).timestamp()
    assert signals.window.start_unix == pytest.approx(start)
    assert signals.window.duration_seconds == pytest.approx(end - start)


# ---------------------------------------------------------------------------------------------
# telling logs apart, restricting to one server


def test_looks_like_log_finds_a_record_after_any_first_lines(tmp_path: Path):
    prose = _log(tmp_path, "# What I saw", "", "Some prose first.", "```text", f"    {V1_LINE}", "```", name="p.md")
    assert looks_like_log(prose)
    dump = next((REPO_ROOT / "tests" / "fixtures" / "vllm-0.32.0").rglob("*.prom"))
    assert not looks_like_log(dump)
    # a TensorRT-LLM JSON array is a /metrics dump as much as a log: the dump reader keeps it
    assert not looks_like_log(TRTLLM / "iteration-stats-executor-long-prompt.json")


def test_server_restricts_the_line_formats(tmp_path: Path):
    sglang = LOGS / "sglang-pd-decode.log"
    assert collect_logs([sglang], server="sglang").signals["requests_running"].stats["last"] == 1.0
    with pytest.raises(InputFileError, match="no vLLM stat lines"):
        collect_logs([sglang], server="vllm")
    with pytest.raises(UsageError, match="has no log formats"):
        collect_logs([sglang], server="triton")


def test_year_of_yearless_lines_follows_the_dated_lines():
    """glog times have no year: beside SGLang's dated lines they take that year, not the file's."""
    signals = collect_logs([LOGS / "sglang-pd-prefill-mooncake.log"])
    assert signals.window.start_unix == _utc("2025-05-18 08:57:28")
    assert not math.isnan(signals.signals["kv_transfer_throughput_bytes_per_second"].stats["rate"])


# a public GitHub doc on a TPU rollout, "Raw Engine Trace Metrics Extract" (find_string id 56828752005): 2 requests
# running and 0.2 generated tokens/s
SLOW_LINE = (
    "INFO 07-22 17:50:31 [loggers.py:271] Engine 000: Avg prompt throughput: 360.2 tokens/s, Avg generation "
    "throughput: 0.2 tokens/s, Running: 2 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%"
)


@pytest.mark.parametrize(("covered", "estimate"), [(5.0, None), (10.0, 2 / 0.2)])
def test_itl_estimate_needs_a_token_per_running_request_over_the_interval(covered: float, estimate: float | None):
    """Over 5 s, 0.2 tokens/s is 1 token for 2 running requests: the batch was not decoding throughout, so the line
    gives no estimate; over 10 s it is 2 tokens, one each (the interval is the one the line's own times would give)."""
    from llmdiag.collect.logs import ItlTally, _estimate_itl, _SeriesState

    (record,) = _records(SLOW_LINE)
    state, tally = _SeriesState(), ItlTally()
    _estimate_itl(record, state, covered, tally)
    assert state.gauges.get("itl_seconds") == estimate
    assert (tally.used, tally.near_zero, tally.mixed) == ((0, 1, 0) if estimate is None else (1, 0, 1))


# SGLang decode lines of three vintages: (a) 2024-11, TP tag, no "cuda graph" (an SGLang issue on the triton backend,
# find_string id 30382546397); (b) 2025-05, no rank tag (a Qwen3 reasoning demo, id 24104456057); (c) 2025-07 with a
# build's extra trailing field "timestamp: …" (a setup guide, id 4806320034)
SGLANG_DECODE_VINTAGES = (
    (
        "[2024-11-30 05:10:04 TP0] Decode batch. #running-req: 1, #token: 234, token usage: 0.00, gen throughput "
        "(token/s): 147.64, #queue-req: 0",
        {"running": 1.0, "kv_ratio": 0.0, "gen_tps": 147.64, "waiting": 0.0},
    ),
    (
        "[2025-05-07 09:50:02] Decode batch. #running-req: 1, #token: 99, token usage: 0.00, gen throughput "
        "(token/s): 77.55, #queue-req: 0",
        {"running": 1.0, "kv_ratio": 0.0, "gen_tps": 77.55, "waiting": 0.0},
    ),
    (
        "[2025-07-18 15:32:54 TP0] Decode batch. #running-req: 1, #token: 2266, token usage: 0.00, cuda graph: True, "
        "gen throughput (token/s): 3.13, #queue-req: 0, timestamp: 2025-07-18T15:32:54.159394",
        {"running": 1.0, "kv_ratio": 0.0, "gen_tps": 3.13, "waiting": 0.0, "cuda_graph": 1.0},
    ),
)


@pytest.mark.parametrize(("line", "values"), SGLANG_DECODE_VINTAGES)
def test_sglang_decode_lines_of_every_vintage(line: str, values: dict[str, float]):
    (record,) = _records(line)
    assert record.fmt == "sglang-decode"
    assert record.values == values
    assert record.series == "0"


# ---------------------------------------------------------------------------------------------
# event lines alone, and after the last stat line

# GAIR-NLP/LIMO#29 (tests/fixtures/field/vllm-limo-29-preempted-cumulative-101): a V0 preemption warning pasted alone,
# without its prefix, as the whole report
V0_PREEMPTED = (
    " Sequence group 221 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. "
    "This can affect the end-to-end performance. Increase gpu_memory_utilization or tensor_parallel_size to provide "
    "more KV cache memory. total_num_cumulative_preemption=101"
)


def test_a_log_of_one_preemption_warning_is_read_as_a_snapshot_with_its_count(tmp_path):
    from llmdiag.engine.evaluate import build_verdict

    signals = collect_logs([_log(tmp_path, V0_PREEMPTED, "", "how to solve this problem?")])
    assert signals.window.kind == "snapshot"
    assert signals.signals["preemptions_reported"].stats["last"] == 101  # the server's own running total
    assert signals.signals["preemptions_per_second"].unavailable  # one moment: no rate
    verdict = build_verdict(signals)
    assert verdict.bottleneck.value == "memory" and [f.code for f in verdict.findings] == ["MEM011"]
    assert verdict.confidence < 0.5


# sgl-project/sglang#2746 (tests/fixtures/field/sglang-2746-deepseek-v3-decode-oom): retractions logged after the
# last decode line, one per TP rank for the same scheduler decision
SGLANG_DECODE = (
    "[2025-01-06 02:58:41 TP0] Decode batch. #running-req: 2, #token: 307801, token usage: 1.00, "
    "gen throughput (token/s): 10.93, #queue-req: 0"
)
SGLANG_RETRACT = (
    "[2025-01-06 02:58:44 TP{rank}] Decode out of memory happened. "
    "#retracted_reqs: 1, #new_token_ratio: 0.0980 -> 0.9446"
)


def test_events_after_the_last_stat_line_still_count(tmp_path):
    earlier = SGLANG_DECODE.replace("02:58:41", "02:58:33").replace("10.93", "10.94")
    lines = [earlier, SGLANG_DECODE] + [SGLANG_RETRACT.format(rank=r) for r in (0, 5, 7, 2)]
    signals = collect_logs([_log(tmp_path, *lines)])
    assert signals.signals["preemptions_reported"].stats["last"] == 1
    assert signals.signals["preemptions_per_second"].stats["increase"] == 1
