"""`llmdiag load` end to end through the CLI: the simulator in known states, a server that refuses every request,
and bad input. Classes, structure and ratios are asserted, never absolute times."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli
from tests.e2e.test_bad_input import free_port, vllm_exposition
from tests.support.httpserver import Reply, ScriptedServer

FAST = ("--duration", "5", "--warmup", "2", "--prompt-tokens", "128", "--output-tokens", "32", "--json")


def load_json(*args: str, timeout: float = 180) -> dict:
    result = run_cli("load", *args, timeout=timeout)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout)


def test_a_batch_cap_shows_as_the_knee_with_a_scheduling_verdict(tmp_path: Path):
    """The simulator with --max-num-seqs 4: one user streams at full speed; 16 users mostly queue."""
    report_file = tmp_path / "load.json"
    report = load_json("--preset", "scheduling", "--sweep", "1,16", *FAST, "--output", str(report_file))
    assert json.loads(report_file.read_text()) == report  # the file holds the same report
    alone, crowd = report["points"]
    assert (alone["users"], crowd["users"]) == (1, 16)
    assert alone["requests_completed"] > 0 and crowd["requests_completed"] > 0
    assert not alone["errors"] and not crowd["errors"]
    # TTFT becomes queue time: many times the lone user's
    assert crowd["ttft_seconds"]["p50"] > 3 * alone["ttft_seconds"]["p50"]
    server = crowd["verdict"]["signals"]
    assert server["queue_time_seconds"]["stats"]["mean"] > 0.5 * crowd["ttft_seconds"]["mean"]
    # streaming stays fast for the four in the batch; over the whole request each user gets about a quarter
    assert crowd["per_user_tokens_per_second"]["p50"] < 0.5 * alone["per_user_tokens_per_second"]["p50"]
    assert crowd["per_user_decode_tokens_per_second"]["p50"] > 0.5 * alone["per_user_decode_tokens_per_second"]["p50"]
    assert crowd["verdict"]["bottleneck"] == "scheduling"
    knee = report["knee"]
    assert knee["users"] == 16 and knee["bottleneck"] == "scheduling" and "under half" in knee["reason"]
    # the seed arithmetic's inputs: total over users
    assert crowd["naive_per_user_tokens_per_second"] == crowd["output_tokens_per_second"] / 16


def test_healthy_sweep_prints_the_table_and_the_per_user_arithmetic():
    result = run_cli("load", "--preset", "healthy", "--sweep", "1,8", *FAST[:-1], timeout=180, env={"COLUMNS": "120"})
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "No knee" in out and "healthy" in out
    assert "8 users: the " in out and "split 8 ways would be" in out and "users measured p50" in out


def api_refusing_every_request(path: str, headers: dict[str, str]) -> Reply:
    if path.startswith("/metrics"):
        return Reply(body=vllm_exposition(10).encode())
    if path.startswith("/v1/models"):
        return Reply(
            body=b'{"object": "list", "data": [{"id": "tiny", "object": "model"}]}', content_type="application/json"
        )
    return Reply(
        status=503, body=b'{"error": {"message": "server overloaded", "code": 503}}', content_type="application/json"
    )


def test_refused_requests_are_counted_by_kind_never_fatal():
    with ScriptedServer(api_refusing_every_request) as server:
        report = load_json(server.url, "--users", "2", "--duration", "2", "--warmup", "1", "--json", "--no-nvml")
    [point] = report["points"]
    assert point["requests_completed"] == 0 and point["errors"].get("http 503", 0) > 0
    assert any("server overloaded" in e for e in point["error_examples"])
    assert point["ttft_seconds"]["count"] == 0 and point["ttft_seconds"]["p50"] is None  # unavailable, not zero


def test_bad_input_is_one_error_line_with_a_hint():
    cases = [
        (("http://192.0.2.10:8000", "--users", "1"), "--allow-remote"),
        (("--users", "0"), "whole numbers"),
        (("--users", "2", "--rate", "1"), "not both"),
        (("--prompt-tokens", "lots"), "is not a token count"),
        (("--sweep", "1,x"), "comma-separated"),
        (("--duration", "100000"), "--duration"),
        ((f"http://127.0.0.1:{free_port()}", "--users", "1", "--duration", "1", "--warmup", "1"), "refused"),
    ]
    for args, words in cases:
        result = run_cli("load", *args, timeout=60)
        assert result.returncode == 2 and "Traceback" not in result.stderr, (args, result.stderr)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert lines[0].startswith("ERROR: ") and words in result.stderr, (args, result.stderr)


def test_a_model_the_server_does_not_serve_is_refused_before_any_load():
    result = run_cli("load", "--model", "no-such-model", "--users", "1", "--json", timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("ERROR: --model 'no-such-model' is not served there (it serves ")
    assert result.stdout == ""
