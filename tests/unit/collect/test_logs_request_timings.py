"""Log shapes read per finished request (llama.cpp's print_timings rows, TGI's router spans), records wrapped over
physical lines, and SGLang's date-less "[hh:mm:ss TP0]" prefix (llmdiag.collect.log_lines / llmdiag.collect.logs).

Every line below is copied verbatim from where it was posted (the comment above it says where); the numbers the
tests expect are the ones visible in those lines.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path

import pytest

from llmdiag.collect.log_lines import LineReader, iter_file
from llmdiag.collect.logs import collect_logs
from llmdiag.schema.logs import load_log_spec


def _log(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "server.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _records(path: Path):
    return list(iter_file(path, LineReader(load_log_spec()), {"lines": 0}, []))


def _utc(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()


# ---- llama.cpp --------------------------------------------------------------------------------------------------

# ggml-org/llama.cpp#10054 (us58), llama-server --parallel 8: print_timing's rows on lines of their own, no time
LLAMACPP_10054 = (
    "slot      release: id  0 | task 9 | stop processing: n_past = 2038, truncated = 0",
    "slot print_timing: id  0 | task 9 |",
    "prompt eval time =    2792.23 ms /  2029 tokens (    1.38 ms per token,   726.66 tokens per second)",
    "       eval time =     786.69 ms /    10 tokens (   78.67 ms per token,    12.71 tokens per second)",
    "      total time =    3578.92 ms /  2039 tokens",
    "slot launch_slot_: id  0 | task 10 | processing task",
    "slot print_timing: id  0 | task 10 |",
    "prompt eval time =    2801.33 ms /  2029 tokens (    1.38 ms per token,   724.30 tokens per second)",
    "       eval time =     786.51 ms /    10 tokens (   78.65 ms per token,    12.71 tokens per second)",
    "      total time =    3587.84 ms /  2039 tokens",
)


def test_llamacpp_rows_of_each_finished_request(tmp_path: Path):
    records = _records(_log(tmp_path, *LLAMACPP_10054))
    assert [(r.fmt, r.server) for r in records] == [
        ("llamacpp-prompt-eval", "llamacpp"),
        ("llamacpp-eval", "llamacpp"),
    ] * 2
    assert records[0].values == {"prompt_ms": 2792.23, "prompt_tokens": 2029.0}
    assert records[1].values == {"gen_ms": 786.69, "gen_tokens": 10.0, "gen_ms_per_token": 78.67, "finished": 1.0}
    assert all(r.at is None for r in records)
    signals = collect_logs([tmp_path / "server.log"]).signals
    assert signals["ttft_seconds"].stats["mean"] == pytest.approx((2.79223 + 2.80133) / 2)
    assert signals["itl_seconds"].stats["mean"] == pytest.approx((0.07867 + 0.07865) / 2)
    assert "eval time" in signals["itl_seconds"].source
    # no times: counts per second are unavailable, not zero
    assert signals["requests_finished_per_second"].unavailable


# mid-2024 server_log shape, with the row's Unix time: a public GitHub thread on an ik_llama.cpp llama-server (code
# corpus file id 39214841378, "It's solved now.")
LLAMACPP_OLD = (
    "INFO [           print_timings] prompt eval time     =     754.84 ms /    10 tokens (   75.48 ms per token,    "
    '13.25 tokens per second) | tid="133469181147392" timestamp=1759196830 id_slot=0 id_task=0 '
    "t_prompt_processing=754.835 n_prompt_tokens_processed=10 t_token=75.4835 n_tokens_second=13.247928355203456",
    "INFO [           print_timings] generation eval time =   61781.59 ms /   279 runs   (  221.44 ms per token,     "
    '4.52 tokens per second) | tid="133469181147392" timestamp=1759196830 id_slot=0 id_task=0 '
    "t_token_generation=61781.588 n_decoded=279 t_token=221.43938351254482 n_tokens_second=4.515908526015873",
    'INFO [           print_timings]           total time =   62536.42 ms | tid="133469181147392" '
    "timestamp=1759196830 id_slot=0 id_task=0 t_prompt_processing=754.835 t_token_generation=61781.588 "
    "t_total=62536.423",
)


def test_llamacpp_old_print_timings_with_unix_time(tmp_path: Path):
    records = _records(_log(tmp_path, *LLAMACPP_OLD))
    assert [r.fmt for r in records] == ["llamacpp-prompt-eval", "llamacpp-eval"]
    assert [r.at for r in records] == [1759196830.0, 1759196830.0]
    assert records[1].values == {"gen_ms": 61781.59, "gen_tokens": 279.0, "gen_ms_per_token": 221.44, "finished": 1.0}
    signals = collect_logs([tmp_path / "server.log"])
    assert signals.window.kind == "snapshot"
    assert signals.signals["ttft_seconds"].stats["last"] == pytest.approx(0.75484)
    assert signals.signals["itl_seconds"].stats["last"] == pytest.approx(0.22144)


# current builds, one slot prefix per row: a public plan document quoting a llama-server log (code corpus, "add to
# test_modelctl_stats.py"), "[52035]" being its own port tag
def test_llamacpp_row_after_its_slot_prefix(tmp_path: Path):
    line = (
        "[52035] 0.10.612.795 I slot print_timing: id  0 | task 0 | prompt eval time =     824.79 ms /    11 tokens "
        "(   74.98 ms per token,    13.34 tokens per second)"
    )
    (record,) = _records(_log(tmp_path, line))
    assert record.values == {"prompt_ms": 824.79, "prompt_tokens": 11.0}


# ---- TGI --------------------------------------------------------------------------------------------------------

# a public GitHub doc on TGI's XPU backend ("Verify connection to TGI server", code corpus file id 22330811902)
TGI_SUCCESS = (
    '2024-12-10T21:50:03.478010Z  INFO chat_completions{total_time="735.200735ms" validation_time="955.594µs" '
    'queue_time="73.176µs" inference_time="734.172108ms" time_per_token="36.708605ms" '
    'seed="Some(13465365087046561476)"}: text_generation_router::server: router/src/server.rs:622: Success'
)


def test_tgi_request_span(tmp_path: Path):
    (record,) = _records(_log(tmp_path, TGI_SUCCESS))
    assert record.server == "tgi"
    assert record.at == _utc("2024-12-10 21:50:03")
    assert record.values == pytest.approx(
        {
            "tgi_queue": 73.176e-6,
            "tgi_total": 0.735200735,
            "tgi_inference": 0.734172108,
            "tgi_per_token": 0.036708605,
            "finished": 1.0,
        }
    )
    signals = collect_logs([tmp_path / "server.log"]).signals
    assert signals["queue_time_seconds"].stats["last"] == pytest.approx(73.176e-6)
    assert signals["itl_seconds"].stats["last"] == pytest.approx(0.036708605)


# huggingface/text-generation-inference#3173 (jazken): the span's fields quoted in prose, no time
def test_tgi_fields_quoted_alone(tmp_path: Path):
    (record,) = _records(_log(tmp_path, 'validation_time="5.669107ms" queue_time="161.454300714s"'))
    assert record.values == {"tgi_queue": pytest.approx(161.454300714)}
    assert record.at is None


# ---- wrapped records --------------------------------------------------------------------------------------------

# vllm-project/vllm#27073 (dingwenhao): docker log lines wrapped mid-word by the terminal
WRAPPED_27073 = (
    "2025-10-15T00:02:38.756689123Z (APIServer pid=1) INFO 10-14 17:02:38 [loggers.py:123] Engine 000: Avg prompt "
    "throughput: 0.0 tokens/s, Avg generation throughpu",
    "t: 843.6 tokens/s, Running: 38 reqs, Waiting: 0 reqs, GPU KV cache usage: 88.5%, Prefix cache hit rate: 42.4%",
    '2025-10-15T00:02:43.157050784Z (APIServer pid=1) INFO:     10.250.5.33:50840 - "GET /metrics HTTP/1.1" 200 OK',
    "2025-10-15T00:02:48.756603837Z (APIServer pid=1) INFO 10-14 17:02:48 [loggers.py:123] Engine 000: Avg prompt "
    "throughput: 1386.0 tokens/s, Avg generation throug",
    "hput: 852.1 tokens/s, Running: 38 reqs, Waiting: 0 reqs, GPU KV cache usage: 89.8%, Prefix cache hit rate: 42.4%",
)


def test_wrapped_record_joined_back(tmp_path: Path):
    records = _records(_log(tmp_path, *WRAPPED_27073))
    assert [r.fmt for r in records] == ["vllm-v1-stats", "vllm-v1-stats"]
    assert [(r.values["gen_tps"], r.values["running"], r.values["kv_pct"]) for r in records] == [
        (843.6, 38.0, 88.5),
        (852.1, 38.0, 89.8),
    ]
    assert records[1].at - records[0].at == 10.0


def test_a_cut_line_is_not_joined_with_the_next_record(tmp_path: Path):
    """The next line starts a record of its own (its own time): the cut line stays unread and the next is read."""
    records = _records(_log(tmp_path, WRAPPED_27073[0], WRAPPED_27073[3], WRAPPED_27073[4]))
    assert [r.values["gen_tps"] for r in records] == [852.1]


# vllm-project/vllm#18115 (jmkuebler): stat lines run together on one line, the last cut at "tokens/": its two
# throughputs are whole, its gauges lost
def test_run_together_lines_each_read():
    path = Path(__file__).resolve().parents[3] / "tests/fixtures/field/vllm-18115-v1-kv-runs-out-concatenated"
    records = _records(path / "server.log")
    assert [r.values.get("kv_pct") for r in records] == [91.2, 91.6, 91.9, None]
    assert [r.values["gen_tps"] for r in records] == [239.2, 239.2, 240.0, 240.8]
    assert records[3].fmt == "vllm-throughput"


# ---- SGLang ≤ 0.3: a time of day, no date -----------------------------------------------------------------------

# sgl-project/sglang#1612 (pjyi2147)
SGLANG_1612 = (
    "[16:43:29] SGLang Generating!",
    "[16:43:29 TP0] Prefill batch. #new-seq: 1, #new-token: 2062, #cached-token: 0, cache hit rate: 0.00%, token "
    "usage: 0.00, #running-req: 0, #queue-req: 0",
    "[16:43:30 TP0] Prefill batch. #new-seq: 6, #new-token: 8192, #cached-token: 2753, cache hit rate: 14.16%, token "
    "usage: 0.18, #running-req: 4, #queue-req: 34",
    "[16:43:33 TP0] Prefill batch. #new-seq: 5, #new-token: 8192, #cached-token: 1832, cache hit rate: 11.92%, token "
    "usage: 0.77, #running-req: 21, #queue-req: 18",
)


def test_sglang_time_of_day_prefix(tmp_path: Path):
    records = _records(_log(tmp_path, *SGLANG_1612))
    assert [r.values["new_tokens"] for r in records] == [2062.0, 8192.0, 8192.0]
    assert [r.at - records[0].at for r in records] == [0.0, 1.0, 4.0]  # type: ignore[operator]
    assert all(r.clock for r in records)
    signals = collect_logs([tmp_path / "server.log"])
    assert signals.window.duration_seconds == 4.0
    assert signals.signals["kv_cache_usage_ratio"].stats["max"] == 0.77
    assert not math.isnan(signals.signals["prompt_tokens_per_second"].stats["rate"])


# huggingface/text-embeddings-inference#305 (lambdaupb): an embeddings router's span has the same fields; not TGI
def test_text_embeddings_router_span_is_not_tgi(tmp_path: Path):
    line = (
        '2025-08-09T19:36:02.798333Z  INFO openai_embed{total_time="1.207716998s" tokenization_time="11.232786ms" '
        'queue_time="686.203µs" inference_time="1.195713965s"}: text_embeddings_router::http::server: '
        "router/src/http/server.rs:1290: Success"
    )
    assert _records(_log(tmp_path, line)) == []
