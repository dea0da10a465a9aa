"""Bad input, end to end through the CLI: one ERROR line, one HINT line, exit 2, never a traceback.

Every case runs `python -m llmdiag …` in a subprocess (``run_cli``) against a real local HTTP server
(``ScriptedServer``), a closed port, an ``.invalid`` host (resolves nothing, sends no traffic) or a file.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import CliResult, run_cli
from tests.support.httpserver import Reply, ScriptedServer

# The golden pins: every case's exit code and ERROR/HINT lines, less ports, temporary paths and the Python
# version in a server header. LLMDIAG_GOLDEN_RECORD=1 rewrites them (an intended change, in its own commit).
PINS = Path(__file__).resolve().parent / "golden" / "bad_input.json"
_seen: list[list[object]] | None = None


def _normalised(text: str, tmp: str) -> str:
    text = text.replace(tmp, "TMP") if tmp else text
    text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", text)
    return re.sub(r"Python/[0-9.]+", "Python/X", text)


@pytest.fixture(autouse=True)
def pinned(request: pytest.FixtureRequest) -> Iterator[None]:
    """Compares what this case printed with its pin (see PINS)."""
    global _seen
    _seen = []
    tmp = str(request.getfixturevalue("tmp_path")) if "tmp_path" in request.fixturenames else ""
    yield
    got = [[code, [_normalised(line, tmp) for line in lines]] for code, lines in _seen]
    _seen = None
    pins = json.loads(PINS.read_text()) if PINS.exists() else {}
    if os.environ.get("LLMDIAG_GOLDEN_RECORD") == "1":
        pins[request.node.name] = got
        PINS.write_text(json.dumps(dict(sorted(pins.items())), indent=1, ensure_ascii=False) + "\n")
    elif got:
        assert pins.get(request.node.name) == got, "the ERROR/HINT lines changed (LLMDIAG_GOLDEN_RECORD=1 re-pins)"


def pin(result: CliResult) -> CliResult:
    """Keep this result's exit code and ERROR/HINT lines for the case's pin."""
    if _seen is not None:
        lines = [line for line in result.stderr.splitlines() if line.startswith(("ERROR:", "HINT:"))]
        _seen.append([result.returncode, lines])
    return result


# A scan window short enough to keep the file fast: 3 scrapes, 0.5 s apart.
FAST = ("--duration", "1", "--timeout", "1")

TTFT_BOUNDS = (
    "0.001",
    "0.005",
    "0.01",
    "0.02",
    "0.04",
    "0.06",
    "0.08",
    "0.1",
    "0.25",
    "0.5",
    "0.75",
    "1.0",
    "2.5",
    "5.0",
    "7.5",
    "10.0",
    "20.0",
    "40.0",
    "80.0",
    "160.0",
    "640.0",
    "2560.0",
)


def vllm_exposition(requests_done: int = 10, *, running: int = 1, waiting: int = 0, kv: float = 0.25) -> str:
    """A minimal but realistic vLLM 0.32-style /metrics page. Counters grow with ``requests_done``."""
    labels = 'engine="0",model_name="tiny"'
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {float(running)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} {float(waiting)}",
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{labels}}} {kv}",
        "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
        "# TYPE vllm:num_preemptions_total counter",
        f"vllm:num_preemptions_total{{{labels}}} 0.0",
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{{{labels}}} {float(requests_done * 24)}",
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{labels}}} {float(requests_done * 16)}",
        "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.",
        "# TYPE vllm:time_to_first_token_seconds histogram",
    ]
    # every request's first token took between 20 and 40 ms
    for le in (*TTFT_BOUNDS, "+Inf"):
        count = requests_done if le == "+Inf" or float(le) >= 0.04 else 0
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{{labels},le="{le}"}} {float(count)}')
    lines.append(f"vllm:time_to_first_token_seconds_count{{{labels}}} {float(requests_done)}")
    lines.append(f"vllm:time_to_first_token_seconds_sum{{{labels}}} {requests_done * 0.03}")
    return "\n".join(lines) + "\n"


def padded_exposition(target_bytes: int) -> bytes:
    """A valid vLLM page grown to about ``target_bytes`` with HTTP middleware series, as a busy server has."""
    head = vllm_exposition()
    rows = [
        "# HELP http_requests_total Total number of requests by method, status and handler.",
        "# TYPE http_requests_total counter",
    ]
    size, i = len(head), 0
    while size < target_bytes:
        row = f'http_requests_total{{handler="/v1/route/{i:07d}",method="POST",status="2xx"}} {i}.0'
        rows.append(row)
        size += len(row) + 1
        i += 1
    return (head + "\n".join(rows) + "\n").encode()


def always(reply: Reply) -> Callable[[str, dict[str, str]], Reply]:
    return lambda path, headers: reply


class Sequence:
    """Answers request n with ``replies[n]``, then keeps giving the last one."""

    def __init__(self, replies: list[Reply]) -> None:
        self.replies = replies
        self.count = 0
        self.lock = threading.Lock()

    def __call__(self, path: str, headers: dict[str, str]) -> Reply:
        with self.lock:
            reply = self.replies[min(self.count, len(self.replies) - 1)]
            self.count += 1
        return reply


def growing_vllm(path: str, headers: dict[str, str], _state={"n": 0}) -> Reply:  # noqa: B006 (per-process counter)
    _state["n"] += 1
    return Reply(body=vllm_exposition(10 + 5 * _state["n"]).encode())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_clean_error(result: CliResult) -> tuple[str, str]:
    """The contract: exit 2, no traceback, stderr is exactly one ERROR line then one HINT line."""
    pin(result)
    everything = result.stdout + result.stderr
    assert "Traceback" not in everything, everything
    assert result.returncode == 2, everything
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 2, f"expected exactly an ERROR and a HINT line, got:\n{result.stderr}"
    error, hint = lines
    assert error.startswith("ERROR: "), result.stderr
    assert hint.startswith("HINT: "), result.stderr
    assert "internal error" not in error, f"a bad input reached the 'this is a bug' path:\n{result.stderr}"
    assert result.stdout.strip() == "", result.stdout
    return error, hint


def scan(url: str, *extra: str, env: dict[str, str] | None = None) -> CliResult:
    return run_cli("scan", url, *FAST, *extra, env=env)


# ---------------------------------------------------------------------------------------------
# the server cannot be reached


def test_connection_refused():
    port = free_port()
    error, hint = assert_clean_error(scan(f"http://127.0.0.1:{port}"))
    assert f"127.0.0.1:{port}" in error
    assert "connection refused" in error
    assert "server running" in hint


def test_dns_failure():
    error, hint = assert_clean_error(scan("http://no-such-host.invalid:8000"))
    assert "no-such-host.invalid" in error
    assert "DNS" in error
    assert "curl" in hint


def test_timeout():
    with ScriptedServer(always(Reply(body=vllm_exposition().encode(), delay_seconds=3))) as server:
        error, hint = assert_clean_error(scan(server.url))
    assert "did not answer within 1 s" in error
    assert "--timeout" in hint


# ---------------------------------------------------------------------------------------------
# the server answers, but not with metrics


@pytest.mark.parametrize(
    ("status", "reason", "hint_word"),
    [
        (401, "Unauthorized", "--api-key"),
        (403, "Forbidden", "--api-key"),
        (404, "Not Found", "--metrics-url"),
        (500, "Internal Server Error", "log"),
    ],
)
def test_http_error_status(status: int, reason: str, hint_word: str):
    with ScriptedServer(always(Reply(status=status, body=b"nope"))) as server:
        error, hint = assert_clean_error(scan(server.url))
    assert f"{server.url}/metrics answered HTTP {status} {reason}" in error
    assert hint_word in hint


HTML = b"<!DOCTYPE html>\n<html><head><title>Grafana</title></head><body>login</body></html>\n"


def test_html_page_with_html_content_type():
    with ScriptedServer(always(Reply(body=HTML, content_type="text/html; charset=utf-8"))) as server:
        error, hint = assert_clean_error(scan(server.url))
    assert "HTML page" in error
    assert "--metrics-url" in hint


def test_html_page_served_as_text_plain():
    with ScriptedServer(always(Reply(body=HTML, content_type="text/plain"))) as server:
        error, hint = assert_clean_error(scan(server.url))
    assert "HTML" in error and "not Prometheus metrics" in error
    assert "--metrics-url" in hint


def test_json_body_points_at_trtllm_prometheus_page():
    body = json.dumps([{"iter": 1, "numActiveRequests": 0, "kvCacheStats": {"usedNumBlocks": 3}}]).encode()
    with ScriptedServer(always(Reply(body=body, content_type="application/json"))) as server:
        error, hint = assert_clean_error(scan(server.url))
    assert "is JSON" in error
    assert "/prometheus/metrics" in hint


def test_truncated_exposition_ending_mid_line():
    text = vllm_exposition()
    cut = text.index("vllm:kv_cache_usage_perc{") + 20  # in the middle of a sample line, no final newline
    with ScriptedServer(always(Reply(body=text[:cut].encode()))) as server:
        error, hint = assert_clean_error(scan(server.url))
    assert "truncated" in error
    assert "Prometheus text" in hint


def test_connection_dropped_mid_body():
    # the server promises the whole page (Content-Length) but hangs up half way through
    body = vllm_exposition().encode()
    with ScriptedServer(always(Reply(body=body, cut_after_bytes=len(body) // 2))) as server:
        error, _hint = assert_clean_error(scan(server.url))
    assert f"{server.url}/metrics" in error
    assert "mid-page" in error


def test_server_stalls_mid_body():
    # headers and the first bytes arrive, then nothing: a read timeout inside the body, not a crash
    body = vllm_exposition().encode()
    ready = threading.Event()
    release = threading.Event()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]

        def serve() -> None:
            ready.set()
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                head = f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n\r\n"
                conn.sendall(head.encode() + body[:100])
                release.wait(10)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        ready.wait(5)
        try:
            error, hint = assert_clean_error(scan(f"http://127.0.0.1:{port}"))
        finally:
            release.set()
    assert "stopped sending mid-page" in error
    assert "--timeout" in hint


def test_body_that_does_not_match_its_content_encoding():
    reply = Reply(body=vllm_exposition().encode(), headers={"Content-Encoding": "gzip"})  # says gzip, is not
    with ScriptedServer(always(reply)) as server:
        error, hint = assert_clean_error(scan(server.url))
    assert "cannot be decoded (Content-Encoding 'gzip')" in error
    assert "--compressed" in hint


def test_garbage_text():
    body = b"hello world\nthis is not a metrics page at all\n"
    with ScriptedServer(always(Reply(body=body))) as server:
        error, hint = assert_clean_error(scan(server.url))
    assert "not valid Prometheus text" in error
    assert "curl" in hint


def test_garbage_text_with_square_brackets():
    body = b"status [/ok] all good\n"
    with ScriptedServer(always(Reply(body=body))) as server:
        error, _hint = assert_clean_error(scan(server.url))
    assert "[/ok]" in error


def test_valid_prometheus_but_no_vllm_metrics():
    body = (
        b"# HELP go_goroutines Number of goroutines that currently exist.\n"
        b"# TYPE go_goroutines gauge\n"
        b"go_goroutines 5\n"
        b"# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
        b"# TYPE process_cpu_seconds_total counter\n"
        b"process_cpu_seconds_total 1\n"
    )
    with ScriptedServer(always(Reply(body=body))) as server:
        error, hint = assert_clean_error(scan(server.url))
    assert "unsupported or unrecognised server" in error
    assert "go_goroutines" in error and "process_cpu_seconds_total" in error  # says what it did see
    assert "header server: BaseHTTP" in error
    assert "vLLM" in hint and "SGLang" in hint and "--server" in hint
    # named with --server, the page is checked against that server's names
    with ScriptedServer(always(Reply(body=body))) as server:
        error, hint = assert_clean_error(scan(server.url, "--server", "vllm"))
    assert "none from vLLM" in error and "vllm:" in error
    assert "vLLM server" in hint


# ---------------------------------------------------------------------------------------------
# the DCGM exporter page (--dcgm-url)


def dcgm_coverage(result: CliResult) -> dict:
    """A scan whose DCGM page failed still gives a verdict; the page's line in the coverage says why."""
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    assert result.returncode in (0, 1), result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["bottleneck"] in ("healthy", "idle", "unknown", "memory", "compute", "scheduling")
    [dcgm] = [p for p in verdict["coverage"]["probes"] if p["probe"] == "dcgm"]
    assert dcgm["ok"] is False and "gpu_utilization_ratio" not in verdict["signals"]
    return dcgm


def test_dcgm_url_refused_leaves_a_coverage_line_and_a_verdict():
    port = free_port()
    with ScriptedServer(growing_vllm) as server:
        dcgm = dcgm_coverage(scan(server.url, "--dcgm-url", f"http://127.0.0.1:{port}/metrics", "--json"))
    assert dcgm["note"].startswith("DCGM exporter: ") and f"127.0.0.1:{port}" in dcgm["note"]
    assert "connection refused" in dcgm["note"] and "9400" in dcgm["note"]  # the hint rides along


def test_dcgm_url_pointing_at_the_vllm_page_leaves_a_coverage_line():
    with ScriptedServer(growing_vllm) as server:
        dcgm = dcgm_coverage(scan(server.url, "--dcgm-url", f"{server.url}/metrics", "--json"))
    assert "none from DCGM exporter" in dcgm["note"] and "DCGM_" in dcgm["note"]


def test_dcgm_failure_is_shown_in_the_terminal_coverage():
    port = free_port()
    with ScriptedServer(growing_vllm) as server:
        result = scan(server.url, "--dcgm-url", f"http://127.0.0.1:{port}/metrics")
    assert result.returncode in (0, 1), result.stderr
    coverage = result.stdout[result.stdout.index("Coverage") :]
    assert "DCGM exporter: " in coverage and "connection refused" in coverage


def test_dcgm_page_sends_no_credentials():
    seen: list[dict[str, str]] = []

    def dcgm(path: str, headers: dict[str, str]) -> Reply:
        seen.append(headers)
        return Reply(body=b'# TYPE DCGM_FI_DEV_GPU_UTIL gauge\nDCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="h"} 40\n')

    with ScriptedServer(growing_vllm) as server, ScriptedServer(dcgm) as exporter:
        result = scan(server.url, "--dcgm-url", f"{exporter.url}/metrics", "--api-key", "sk-secret", "--json")
    assert result.returncode in (0, 1), result.stderr
    assert seen and not any("sk-secret" in v for h in seen for v in h.values())
    verdict = json.loads(result.stdout)
    # the host probe also finds this test process listening: it is not the point here
    assert [p["probe"] for p in verdict["coverage"]["probes"] if p["ok"] and p["probe"] != "host"] == ["vllm", "dcgm"]
    assert verdict["signals"]["gpu_utilization_ratio"]["stats"]["mean"] == pytest.approx(0.4)  # 40 % as a ratio


# ---------------------------------------------------------------------------------------------
# the window


def test_empty_window_after_http_503():
    first = Reply(body=vllm_exposition(10).encode())
    responder = Sequence([first, Reply(status=503, body=b"overloaded")])
    with ScriptedServer(responder) as server:
        error, hint = assert_clean_error(scan(server.url, "--no-probe"))  # only scrapes may count here
    assert "only 1 of 3 scrapes" in error
    assert "HTTP 503" in error
    assert "scan again" in hint
    assert responder.count == 3


def test_empty_window_after_connection_drops():
    body = vllm_exposition(10).encode()
    responder = Sequence([Reply(body=body), Reply(body=body, cut_after_bytes=0)])
    with ScriptedServer(responder) as server:
        error, hint = assert_clean_error(scan(server.url))
    assert "only 1 of 3 scrapes" in error
    assert "scan again" in hint


def test_server_restart_mid_scan_is_not_an_error():
    # before the restart the counters are high; after it they start again from (nearly) zero
    responder = Sequence([Reply(body=vllm_exposition(n).encode()) for n in (500, 2, 6)])
    with ScriptedServer(responder) as server:
        result = scan(server.url, "--json")
    assert "Traceback" not in result.stdout + result.stderr
    assert not [line for line in result.stderr.splitlines() if line.startswith(("ERROR:", "HINT:"))], result.stderr
    assert result.returncode in (0, 1), result.stderr
    verdict = json.loads(result.stdout)
    codes = {f["code"] for f in verdict["findings"]}
    notes = " ".join(verdict["notes"])
    assert "SAN002" in codes and "restart" in notes, (codes, notes)
    # the window counts what the restarted process made (6 requests of 16 tokens, 24 prompt tokens, one TTFT each),
    # never the old process's 500 requests nor a negative step
    stats = {name: verdict["signals"][name]["stats"] for name in ("generation_tokens_per_second", "ttft_seconds")}
    stats["prompt"] = verdict["signals"]["prompt_tokens_per_second"]["stats"]
    assert stats["generation_tokens_per_second"]["increase"] == 6 * 16, stats
    assert stats["prompt"]["increase"] == 6 * 24, stats
    assert stats["ttft_seconds"]["count"] == 6, stats


# ---------------------------------------------------------------------------------------------
# size cap


def test_20_mb_page_is_refused_at_the_default_cap():
    body = padded_exposition(20 * 1024 * 1024)
    with ScriptedServer(always(Reply(body=body))) as server:
        error, hint = assert_clean_error(scan(server.url))
    assert "larger than 16 MiB" in error
    assert "--max-metrics-bytes" in hint


def test_max_metrics_bytes_lets_a_200_kb_page_through():
    # the vLLM series moved behind 190 KB of padding, with numbers of their own: only a page read whole has them
    padded = padded_exposition(200_000).decode()
    body = (padded.replace(vllm_exposition(), "") + vllm_exposition(running=3, waiting=2, kv=0.625)).encode()
    assert 200_000 <= len(body) < 210_000 and body.index(b"vllm:") > 190_000
    with ScriptedServer(lambda p, h: Reply(body=body)) as server:
        result = scan(server.url, "--max-metrics-bytes", "300000", "--json")
    assert "Traceback" not in result.stdout + result.stderr
    assert not [line for line in result.stderr.splitlines() if line.startswith(("ERROR:", "HINT:"))], result.stderr
    assert result.returncode == 0, result.stderr  # a page that never changes holds no critical finding
    verdict = json.loads(result.stdout)
    stats = {name: verdict["signals"][name]["stats"] for name in ("requests_running", "requests_waiting")}
    stats["kv"] = verdict["signals"]["kv_cache_usage_ratio"]["stats"]
    assert (stats["requests_running"]["min"], stats["requests_running"]["max"]) == (3, 3), stats
    assert (stats["requests_waiting"]["min"], stats["requests_waiting"]["max"]) == (2, 2), stats
    assert (stats["kv"]["min"], stats["kv"]["max"]) == (0.625, 0.625), stats


def test_max_metrics_bytes_rejects_a_200_kb_page_below_it():
    body = padded_exposition(200_000)
    with ScriptedServer(always(Reply(body=body))) as server:
        error, hint = assert_clean_error(scan(server.url, "--max-metrics-bytes", "100000"))
    assert "100000 bytes" in error
    assert "0 MiB" not in error
    assert "--max-metrics-bytes" in hint


# ---------------------------------------------------------------------------------------------
# analyze: files


def test_analyze_missing_file(tmp_path):
    missing = tmp_path / "nope.prom"
    error, hint = assert_clean_error(run_cli("analyze", str(missing)))
    assert f"{missing}: no such file" in error
    assert "curl" in hint


def test_analyze_directory(tmp_path):
    error, hint = assert_clean_error(run_cli("analyze", str(tmp_path)))
    assert "is a directory" in error
    assert "check the path" in hint


def test_analyze_empty_file(tmp_path):
    empty = tmp_path / "empty.prom"
    empty.write_text("")
    error, _hint = assert_clean_error(run_cli("analyze", str(empty)))
    assert f"{empty} is empty" in error


def test_analyze_binary_file(tmp_path):
    binary = tmp_path / "core.bin"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\0\0\0" + bytes(range(256)))
    error, hint = assert_clean_error(run_cli("analyze", str(binary)))
    assert f"{binary} is a binary file" in error
    assert "/metrics" in hint


def test_analyze_prose_only(tmp_path):
    """A bug report's text without its data: refused, not read as an idle server."""
    report = tmp_path / "issue.md"
    report.write_text("### Describe the bug\nThe server gets slow after an hour. Logs attached below.\n")
    error, hint = assert_clean_error(run_cli("analyze", str(report)))
    assert "holds no metric or log lines" in error and "Describe the bug" in error
    assert "prose, quotes and code fences around them are fine" in hint


def test_analyze_only_fences(tmp_path):
    report = tmp_path / "issue.md"
    report.write_text("```\n```\n> ```text\n> ```\n")
    error, _hint = assert_clean_error(run_cli("analyze", str(report)))
    assert "only Markdown fences and quote marks" in error


def test_analyze_page_whose_every_sample_is_elided(tmp_path):
    page = tmp_path / "metrics.md"
    page.write_text("```\nvllm:num_requests_running{...} 3\nvllm:num_requests_waiting{...} 0\n```\n")
    error, hint = assert_clean_error(run_cli("analyze", str(page)))
    assert "holds no metric samples" in error and "curl" in hint


def test_analyze_path_with_square_brackets(tmp_path):
    missing = tmp_path / "x[" / "y].prom"
    error, _hint = assert_clean_error(run_cli("analyze", str(missing)))
    assert str(missing) in error


# ---------------------------------------------------------------------------------------------
# usage and configuration


def test_scan_non_http_url():
    error, hint = assert_clean_error(run_cli("scan", "ftp://x"))
    assert "'ftp://x' is not an http(s) URL" in error
    assert "http://HOST:PORT" in hint


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:99999", "Port out of range"),
        ("http://127.0.0.1:notaport", "Port could not be cast"),
        ("http://[::1", "Invalid IPv6 URL"),
        ("http://alice:hunter2@127.0.0.1:99999", "Port out of range"),
    ],
)
def test_scan_malformed_url(url: str, reason: str):
    result = run_cli("scan", url, "--timeout", "1")
    error, hint = assert_clean_error(result)
    assert "is not a valid URL" in error
    assert reason in error
    assert "hunter2" not in result.stderr
    assert "http://HOST:PORT" in hint


def test_scan_duration_zero():
    error, hint = assert_clean_error(run_cli("scan", f"http://127.0.0.1:{free_port()}", "--duration", "0"))
    assert "--duration must be positive" in error
    assert "--duration 20" in hint


def test_scan_duration_not_a_number():
    error, _hint = assert_clean_error(run_cli("scan", "http://127.0.0.1:8000", "--duration", "abc"))
    assert "--duration" in error


def test_header_without_value():
    error, hint = assert_clean_error(run_cli("scan", "http://127.0.0.1:8000", "--header", "novalue"))
    assert "--header 'novalue' is not 'Name: value'" in error
    assert "X-Tenant" in hint


def test_config_file_missing(tmp_path):
    missing = tmp_path / "llmdiag.toml"
    error, hint = assert_clean_error(run_cli("scan", "http://127.0.0.1:8000", "--config", str(missing)))
    assert f"{missing}: no such config file" in error
    assert "Configuration" in hint


def test_config_file_invalid_toml(tmp_path):
    bad = tmp_path / "llmdiag.toml"
    bad.write_text("[rules.MEM001\nwarning = \n")
    error, hint = assert_clean_error(run_cli("analyze", str(tmp_path / "x.prom"), "--config", str(bad)))
    assert f"{bad}: cannot read it" in error
    assert "line 1" in error
    assert "Configuration" in hint


# ---------------------------------------------------------------------------------------------
# secrets


def unauthorized(path: str, headers: dict[str, str]) -> Reply:
    return Reply(status=401, body=b'{"error": "Unauthorized"}', content_type="application/json")


def test_api_key_is_sent_but_never_printed():
    with ScriptedServer(unauthorized) as server:
        result = scan(server.url, "--api-key", "sk-SECRET123")
        error, hint = assert_clean_error(result)
    assert "sk-SECRET123" not in result.stdout + result.stderr
    assert "HTTP 401" in error
    assert "--api-key" in hint
    assert server.requests, "the server saw no request"
    assert all(h.get("authorization") == "Bearer sk-SECRET123" for _, h in server.requests)


def test_api_key_from_environment_is_sent_but_never_printed():
    with ScriptedServer(unauthorized) as server:
        result = scan(server.url, env={"LLMDIAG_API_KEY": "sk-ENVSECRET"})
        error, _hint = assert_clean_error(result)
    assert "ENVSECRET" not in result.stdout + result.stderr
    assert "HTTP 401" in error
    assert server.requests[0][1].get("authorization") == "Bearer sk-ENVSECRET"


def test_password_in_url_is_redacted_in_http_errors():
    with ScriptedServer(unauthorized) as server:
        url = server.url.replace("http://", "http://alice:hunter2@")
        result = scan(url)
        error, _hint = assert_clean_error(result)
    host = server.url.removeprefix("http://")
    assert "hunter2" not in result.stdout + result.stderr
    assert f"http://***@{host}/metrics answered HTTP 401" in error


def test_password_in_url_is_redacted_when_unreachable():
    port = free_port()
    result = scan(f"http://alice:hunter2@127.0.0.1:{port}", "--metrics-url", f"http://bob:s3cr3t@127.0.0.1:{port}/m")
    error, _hint = assert_clean_error(result)
    assert "hunter2" not in result.stdout + result.stderr
    assert "s3cr3t" not in result.stdout + result.stderr
    assert f"http://***@127.0.0.1:{port}/m" in error


def test_password_in_url_is_redacted_in_usage_errors():
    result = run_cli("scan", "ftp://alice:hunter2@example.invalid/")
    error, _hint = assert_clean_error(result)
    assert "hunter2" not in result.stdout + result.stderr
    assert "ftp://***@example.invalid/" in error


# ---------------------------------------------------------------------------------------------
# --insecure


def test_insecure_flag_is_accepted_on_plain_http():
    with ScriptedServer(growing_vllm) as server:
        result = scan(server.url, "--insecure", "--api-key", "sk-SECRET123", "--json")
    assert "Traceback" not in result.stdout + result.stderr
    assert result.returncode in (0, 1), result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["target"] == server.url
    assert "sk-SECRET123" not in result.stdout + result.stderr
    assert len([path for path, _ in server.requests if path == "/metrics"]) == 3
    # every request carries the key: the scrapes and the canary requests alike
    assert all(h.get("authorization") == "Bearer sk-SECRET123" for _, h in server.requests)


def test_gpu_without_model_shape_is_a_usage_error():
    result = pin(run_cli("scan", "http://127.0.0.1:9", "--gpu", "H100"))
    assert result.returncode == 2
    assert "--gpu and --model-shape (or --model-config) go together" in result.stderr
    assert "Traceback" not in result.stderr


def test_model_shape_and_model_config_together_is_a_usage_error(tmp_path):
    config = tmp_path / "config.json"
    config.write_text("{}")
    result = pin(
        run_cli("scan", "http://127.0.0.1:9", "--gpu", "H100", "--model-shape", "llama-3-8b", "--model-config", config)
    )
    assert result.returncode == 2
    assert "name the model twice" in result.stderr and "Traceback" not in result.stderr


def test_a_model_config_that_is_not_one_is_one_error(tmp_path):
    config = tmp_path / "config.json"
    config.write_text("[1, 2]")
    result = pin(run_cli("scan", "http://127.0.0.1:9", "--gpu", "H100", "--model-config", config))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "not a model config" in result.stderr


def test_unknown_gpu_names_the_known_ones():
    result = pin(run_cli("scan", "http://127.0.0.1:9", "--gpu", "TPUv9", "--model-shape", "llama-3-8b"))
    assert result.returncode == 2
    assert "H100" in result.stderr and "HINT:" in result.stderr
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------------------------------------
# load: a replayed workload against a baseline (the matched A/B)


def served_tiny(path: str, headers: dict[str, str]) -> Reply:
    """An OpenAI-compatible server of the model 'tiny', vLLM 0.32.0 by its /version."""
    if path.startswith("/v1/models"):
        return Reply(body=b'{"object": "list", "data": [{"id": "tiny", "object": "model", "owned_by": "vllm"}]}')
    if path.startswith("/version"):
        return Reply(body=b'{"version": "0.32.0"}', content_type="application/json")
    return Reply(body=vllm_exposition().encode())


def ab_files(tmp_path: Path, workload: dict | None = None, **baseline: object) -> tuple[Path, Path]:
    """A workload file and a baseline run of it (vLLM 0.32.0 serving 'tiny'), with the baseline's changes."""
    from llmdiag.model import LoadPoint, LoadReport
    from llmdiag.model.workload import Workload

    shape = dict(mode="closed", levels=[2.0], duration_seconds=1, warmup_seconds=1, max_requests=100)
    shape |= dict(prompt_tokens="16", output_tokens="8", seed=0, slo_tpot_seconds=0.05)
    recorded = Workload(**shape, model="tiny", server_version="0.32.0")
    point = LoadPoint(users=2, window_seconds=1.0, samples=[])
    run = LoadReport(model="tiny", points=[point], workload=recorded.model_copy(update=baseline))
    (tmp_path / "W.json").write_text(Workload(**(shape | (workload or {}))).model_dump_json())
    (tmp_path / "before.json").write_text(run.model_dump_json())
    return tmp_path / "W.json", tmp_path / "before.json"


def replay(url: str, workload: Path, *extra: str) -> CliResult:
    return run_cli("load", url, "--workload", str(workload), *extra, "--no-nvml", "--json")


def test_load_replay_of_another_workload_is_refused(tmp_path):
    workload, before = ab_files(tmp_path, workload={"levels": [4.0]})
    with ScriptedServer(served_tiny) as server:
        error, hint = assert_clean_error(replay(server.url, workload, "--baseline", str(before)))
    assert f"the workload differs from {before}'s: levels 4 here, 2 in the baseline" in error
    assert "--workload" in hint


def test_load_replay_on_another_server_version_is_refused(tmp_path):
    workload, before = ab_files(tmp_path, server_version="0.31.1")
    with ScriptedServer(served_tiny) as server:
        error, hint = assert_clean_error(replay(server.url, workload, "--baseline", str(before)))
    assert f"the server version differs: '0.32.0' here, '0.31.1' in {before}" in error
    assert "new baseline" in hint


def test_load_replay_of_another_model_is_refused(tmp_path):
    workload, before = ab_files(tmp_path, model="llama-3-8b")
    with ScriptedServer(served_tiny) as server:
        error, hint = assert_clean_error(replay(server.url, workload, "--baseline", str(before)))
    assert f"the model differs: the server serves 'tiny', {before} ran 'llama-3-8b'" in error
    assert "--model" in hint


def test_load_baseline_that_recorded_no_workload_is_refused(tmp_path):
    from llmdiag.model import LoadPoint, LoadReport

    workload, before = ab_files(tmp_path)
    before.write_text(LoadReport(model="tiny", points=[LoadPoint(users=2, window_seconds=1.0)]).model_dump_json())
    with ScriptedServer(served_tiny) as server:
        error, hint = assert_clean_error(replay(server.url, workload, "--baseline", str(before)))
    assert f"{before} records no workload" in error and "--save-workload" in hint


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--users", "4"), "--users with --workload: a replay sends exactly the recorded load"),
        (("--baseline", "B.json", "--prediction", "P.json", "--seed", "3"), "--seed with --workload"),
    ],
)
def test_load_replay_with_the_load_shaped_again_is_refused(tmp_path, args, words):
    workload, _ = ab_files(tmp_path)
    error, hint = assert_clean_error(run_cli("load", "--workload", str(workload), *args, "--json"))
    assert words in error and "--save-workload" in hint


def test_load_baseline_or_prediction_without_what_they_compare_is_refused(tmp_path):
    error, hint = assert_clean_error(run_cli("load", "--baseline", str(tmp_path / "B.json"), "--json"))
    assert "--baseline compares a replay" in error and "--workload" in hint
    workload, _ = ab_files(tmp_path)
    error, hint = assert_clean_error(run_cli("load", "--workload", str(workload), "--prediction", "P.json", "--json"))
    assert "--prediction is shown beside an A/B" in error and "--baseline" in hint


def test_load_workload_and_prediction_files_that_are_not_ones(tmp_path):
    verdict = tmp_path / "verdict.json"
    verdict.write_text('{"schema_version": "2", "bottleneck": "healthy"}')
    error, hint = assert_clean_error(run_cli("load", "--workload", str(verdict), "--json"))
    assert f"{verdict} holds JSON, but not an llmdiag workload" in error and "--save-workload" in hint
    workload, before = ab_files(tmp_path)
    args = ("--workload", str(workload), "--baseline", str(before), "--prediction", str(verdict), "--json")
    error, hint = assert_clean_error(run_cli("load", *args))
    assert f"{verdict} holds JSON, but not a whatif prediction" in error and "llmdiag whatif" in hint


def test_load_prediction_for_a_sweep_is_refused(tmp_path):
    workload, before = ab_files(tmp_path, workload={"levels": [1.0, 2.0]}, levels=[1.0, 2.0])
    prediction = tmp_path / "whatif.json"
    prediction.write_text('{"modelled": true, "class_after": "healthy", "after": {"ttft_p50_seconds": 0.1}}')
    with ScriptedServer(served_tiny) as server:
        result = replay(server.url, workload, "--baseline", str(before), "--prediction", str(prediction))
    error, hint = assert_clean_error(result)
    assert "a prediction is for one load, and the workload has 2 levels" in error and "--users" in hint


@pytest.mark.parametrize("flag", ["--save-workload", "--output", "--html"])
def test_load_file_that_cannot_be_written_is_refused_before_the_load(tmp_path, flag):
    """A typo in a path costs nothing: the refusal comes before one request is sent (the server sees none)."""
    with ScriptedServer(served_tiny) as server:
        result = run_cli("load", server.url, "--users", "2", "--duration", "1", flag, str(tmp_path / "no" / "f.json"))
        error, hint = assert_clean_error(result)
        assert server.requests == [], server.requests
    assert f"no folder {tmp_path / 'no'}" in error and flag in hint


# ---- llmdiag whatif: a saved verdict and NAME=VALUE changes -------------------------------------------------------


def _saved_verdict(tmp_path: Path) -> Path:
    """A real verdict (the recorded vLLM 0.32 scheduling window, analyzed), saved as `analyze --json` writes it."""
    from llmdiag.api.scan import diagnose_files

    pages = sorted((REPO_FIXTURES / "vllm-0.32.0" / "scheduling").glob("scrape-*.prom"))
    path = tmp_path / "verdict.json"
    path.write_text(diagnose_files(pages).model_dump_json())
    return path


REPO_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_whatif_missing_file(tmp_path):
    error, hint = assert_clean_error(run_cli("whatif", str(tmp_path / "nope.json"), "--set", "max_num_seqs=8"))
    assert "no such file" in error
    assert "scan --json" in hint


def test_whatif_unknown_name(tmp_path):
    error, hint = assert_clean_error(run_cli("whatif", str(_saved_verdict(tmp_path)), "--set", "max_seqs=8"))
    assert "'max_seqs'" in error
    assert "max_num_seqs" in hint and "--set" in hint


def test_whatif_bad_value(tmp_path):
    error, hint = assert_clean_error(run_cli("whatif", str(_saved_verdict(tmp_path)), "--set", "max_num_seqs=eight"))
    assert "'eight'" in error and "max_num_seqs" in error
    assert "whole number" in hint


def test_whatif_not_an_assignment(tmp_path):
    error, hint = assert_clean_error(run_cli("whatif", str(_saved_verdict(tmp_path)), "--set", "max_num_seqs"))
    assert "not NAME=VALUE" in error


def test_whatif_no_change(tmp_path):
    error, hint = assert_clean_error(run_cli("whatif", str(_saved_verdict(tmp_path))))
    assert "no change" in error
    assert "--set" in hint


def test_whatif_on_a_load_report_without_verdicts_is_refused(tmp_path):
    report = tmp_path / "load.json"
    report.write_text(json.dumps({"schema_version": "3", "points": []}))
    error, hint = assert_clean_error(run_cli("whatif", str(report), "--set", "replicas=2"))
    assert "no level with a server-side verdict" in error
    assert "load -o" in hint


# ---------------------------------------------------------------------------------------------
# llmdiag rules export


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--server", "nginx"), "--server"),
        (("--selector", '{job="vllm"'), "--selector"),
        (("--selector", "job=vllm"), "--selector"),
        (("--selector", '{job="vllm}'), "--selector"),
        (("--window", "5 minutes"), "--window"),
        (("--for", "-2m"), "--for"),
        (("--format", "json"), "--format"),
        (("--runbook-url", "https://runbooks.example/{rule}"), "--runbook-url"),
    ],
    ids=["server", "selector-brace", "selector-matchers", "selector-string", "window", "for", "format", "runbook-url"],
)
def test_rules_export_bad_option(args: tuple[str, str], named: str):
    error, hint = assert_clean_error(run_cli("rules", "export", *args))
    assert named in error


def test_rules_export_unwritable_output(tmp_path):
    error, hint = assert_clean_error(run_cli("rules", "export", "-o", str(tmp_path / "no" / "such" / "rules.yml")))
    assert "rules.yml" in error
