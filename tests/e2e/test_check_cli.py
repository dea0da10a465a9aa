"""`llmdiag check` end to end: the Nagios exit codes reached for real against the simulator on 127.0.0.1, the
node_exporter textfile parsed with prometheus_client's own parser, a Pushgateway PUT received by a real local
HTTP server, config-file targets, and a regression against a history the test writes."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmdiag.history import CheckRow, History
from llmdiag.sim.load import ClosedLoopLoad
from llmdiag.sim.presets import get_preset
from llmdiag.sim.server import SimServer
from tests.conftest import run_cli
from tests.support.simlag import run_cli_on_sim

NAGIOS_CODES = {"OK": 0, "WARNING": 1, "CRITICAL": 2, "UNKNOWN": 3}
WINDOW = ("--duration", "3", "--timeout", "2", "--no-nvml")
STATUS_RE = re.compile(r"^LLMDIAG (OK|WARNING|CRITICAL|UNKNOWN) - [^|\n]+( \| .+)?$")
PERF_RE = re.compile(r"^('[^'=]+'|[^'=\s]+)=(-?[0-9.]+[a-zA-Z%]*|U)(;[-0-9.:@~]*){0,4}$")


class LoadedSim:
    def __init__(self, preset: str) -> None:
        self.preset = get_preset(preset)
        self.server = SimServer(self.preset)
        self.load: ClosedLoopLoad | None = None

    def __enter__(self) -> LoadedSim:
        self.server.start()
        self.load = ClosedLoopLoad(self.server.url, self.server.model, self.preset.load, max_seconds=240)
        self.load.start()
        time.sleep(3.0)  # as the demo does: the queue and the cache fill before the window
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.load is not None
        self.load.stop()
        self.server.stop()

    def args(self) -> tuple[str, ...]:
        return (self.server.url, "--dcgm-url", self.server.dcgm_url)


@pytest.fixture(scope="module")
def healthy() -> Iterator[LoadedSim]:
    with LoadedSim("healthy") as sim:
        yield sim


@pytest.fixture(scope="module")
def memory() -> Iterator[LoadedSim]:
    with LoadedSim("memory") as sim:
        yield sim


def closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_nagios(stdout: str) -> tuple[str, list[str]]:
    """The first line is the status line with valid perfdata; returns the state and the perfdata items."""
    first = stdout.splitlines()[0]
    match = STATUS_RE.match(first)
    assert match, first
    perf = first.split(" | ", 1)[1].split() if " | " in first else []
    for item in perf:
        assert PERF_RE.match(item), item
    return match.group(1), perf


def perf_value(perf: list[str], label: str) -> str:
    return next(p.split("=", 1)[1].split(";")[0] for p in perf if p.split("=", 1)[0] == label)


def test_healthy_is_ok_with_exit_0_and_perfdata(healthy: LoadedSim, tmp_path: Path):
    result = run_cli("check", *healthy.args(), *WINDOW, "--history", str(tmp_path / "h.sqlite"))
    assert result.returncode == 0, result.stdout + result.stderr
    state, perf = assert_nagios(result.stdout)
    assert state == "OK" and result.stdout.startswith("LLMDIAG OK - healthy: ")
    assert perf_value(perf, "ttft_p95_seconds").endswith("s")
    assert float(perf_value(perf, "generation_tokens_per_second")) > 0
    assert "baseline: not enough history (0 of 5" in result.stdout
    assert History(tmp_path / "h.sqlite").count() == 1


def test_the_tpot_slo_option_sets_the_line_slow_tokens_cross(healthy: LoadedSim):
    # the healthy replica decodes in ~7 ms steps: well inside the default 50 ms SLO, past a 1 ms one
    assert "CMP001" not in run_cli("check", *healthy.args(), *WINDOW, "--no-history").stdout
    result = run_cli("check", *healthy.args(), *WINDOW, "--no-history", "--slo-tpot", "0.001")
    assert re.search(r"CMP001 decode-step-slow: .*the TPOT SLO of 0\.001 s", result.stdout), result.stdout


def test_memory_starved_is_a_problem_with_the_state_its_perfdata_says(memory: LoadedSim, tmp_path: Path):
    result = run_cli("check", *memory.args(), *WINDOW, "--no-history")
    state, perf = assert_nagios(result.stdout)
    assert state in {"WARNING", "CRITICAL"}, result.stdout + result.stderr
    assert result.returncode == NAGIOS_CODES[state] and result.stdout.startswith(f"LLMDIAG {state} - memory: ")
    assert "(MEM001)" in result.stdout.splitlines()[0]
    # the ladder signal of the firing rule carries its thresholds (warn;crit), and the state is where its value
    # falls on them (a 3 s window on a busy machine may land in either band; the replica did preempt)
    ladder = next(p for p in perf if p.startswith("preemptions_per_finished_request="))
    value, warn, crit = (float(f) for f in ladder.split("=", 1)[1].split(";")[:3])
    assert (warn, crit) == (0.01, 0.2)
    assert state == ("CRITICAL" if value >= crit else "WARNING") and value >= warn
    assert re.search(rf"^{state} MEM001 kv-cache-saturated: ", result.stdout, re.M)
    assert memory.server.snapshot()["preemptions"] > 0


def test_unreachable_port_is_unknown_with_exit_3(tmp_path: Path):
    result = run_cli("check", f"http://127.0.0.1:{closed_port()}", *WINDOW, "--history", str(tmp_path / "h.sqlite"))
    assert result.returncode == 3, result.stdout + result.stderr
    state, perf = assert_nagios(result.stdout)
    assert state == "UNKNOWN" and "cannot check http://127.0.0.1:" in result.stdout and perf == []
    assert "HINT: is the server running" in result.stdout
    assert "Traceback" not in result.stderr
    [row] = History(tmp_path / "h.sqlite").rows()
    assert row.state == "UNKNOWN" and row.bottleneck is None and row.ttft_p95_seconds is None  # NULL, never 0
    assert "connection refused" in (row.error or "")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--bogus",), "No such option: --bogus"),
        (("http://127.0.0.1:9", "--duration", "0"), "--duration"),
        (("http://127.0.0.1:9", "--timeout", "-1"), "--timeout must be positive"),
        ((), "no target: give a URL"),
        (("--textfile", "/nonexistent/dir", "http://127.0.0.1:9"), "not a folder"),
    ],
)
def test_bad_arguments_are_unknown_with_exit_3(args: tuple[str, ...], fragment: str, tmp_path: Path):
    config = tmp_path / "empty.toml"
    config.write_text("")
    result = run_cli("check", *args, "--config", str(config), "--no-history")
    assert result.returncode == 3, result.stdout + result.stderr
    assert result.stdout.startswith("LLMDIAG UNKNOWN - ") and fragment in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[[targets]]\nname = 'a'\n", "targets.0.url: Field required"),
        (
            "[[targets]]\nname = 'a'\nurl = 'http://x'\nheaders = { Authorization = 'Bearer s3cret' }\n",
            "carries a credential",
        ),
        ("[check]\nwindow_seconds = 'ten'\n", "check.window_seconds"),
        ("[check]\nhistroy = 'x'\n", "check.histroy: Extra inputs are not permitted"),
        ("this is = = not toml", "cannot read it"),
    ],
)
def test_a_bad_config_file_is_unknown_with_exit_3(text: str, fragment: str, tmp_path: Path):
    config = tmp_path / "llmdiag.toml"
    config.write_text(text)
    result = run_cli("check", "--config", str(config), "--no-history")
    assert result.returncode == 3, result.stdout + result.stderr
    assert result.stdout.startswith("LLMDIAG UNKNOWN - ") and fragment in result.stdout
    assert "s3cret" not in result.stdout + result.stderr


def textfile_families(path: Path) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(path.read_text())}


def test_config_targets_textfile_and_worst_state(healthy: LoadedSim, memory: LoadedSim, tmp_path: Path):
    down = closed_port()
    config = tmp_path / "llmdiag.toml"
    config.write_text(f"""
[check]
window_seconds = 3
history = "{tmp_path / "history.sqlite"}"

[[targets]]
name = "gpu-a"
url = "{healthy.server.url}"
dcgm_url = "{healthy.server.dcgm_url}"
nvml = false

[[targets]]
name = "gpu-b"
url = "{memory.server.url}"
dcgm_url = "{memory.server.dcgm_url}"
nvml = false

[[targets]]
name = "gpu-c"
url = "http://127.0.0.1:{down}"
nvml = false
timeout_seconds = 1
""")
    started = time.time()
    result = run_cli("check", "--config", str(config), "--textfile", str(tmp_path))
    state, perf = assert_nagios(result.stdout)
    first = result.stdout.splitlines()[0]
    # gpu-b's severity rests on preemptions per finished request in a 3 s window, which a busy 2-core machine moves
    # between MEM001's warning and critical bands; either way it is the worst state and outranks gpu-c's UNKNOWN
    found = re.search(r"3 targets: gpu-a OK healthy, gpu-b (WARNING|CRITICAL) memory \(MEM001\), gpu-c UNKNOWN", first)
    assert found, first
    memory_state = found.group(1)
    assert state == memory_state and result.returncode == NAGIOS_CODES[memory_state], result.stdout + result.stderr
    assert memory.server.snapshot()["preemptions"] > 0  # the replica's own counter: it did preempt
    labels = {p.split("=", 1)[0] for p in perf}
    assert {"gpu-a_ttft_p95_seconds", "gpu-b_kv_cache_usage_ratio"} <= labels
    assert not any(label.startswith("gpu-c_") for label in labels)

    families = textfile_families(tmp_path / "llmdiag.prom")
    [last] = families["llmdiag_last_run_timestamp_seconds"]
    assert last.value >= started - 1
    states = {s.labels["target"]: s.value for s in families["llmdiag_check_state"]}
    assert states == {"gpu-a": 0, "gpu-b": NAGIOS_CODES[memory_state], "gpu-c": 3}
    verdict = {(s.labels["target"], s.labels["class"]) for s in families["llmdiag_verdict"] if s.value == 1}
    assert verdict == {("gpu-a", "healthy"), ("gpu-b", "memory")}
    findings = {(s.labels["target"], s.labels["code"], s.labels["severity"]) for s in families["llmdiag_finding"]}
    assert ("gpu-b", "MEM001", memory_state.lower()) in findings and not any(t == "gpu-a" for t, *_ in findings)
    probes = {(s.labels["target"], s.labels["probe"]): s.value for s in families["llmdiag_probe_up"]}
    assert probes[("gpu-a", "vllm")] == 1 and probes[("gpu-b", "dcgm")] == 1
    assert {s.labels["target"]: s.value for s in families["llmdiag_target_up"]} == {"gpu-a": 1, "gpu-b": 1, "gpu-c": 0}
    ttft = {(s.labels["target"], s.labels["quantile"]) for s in families["llmdiag_ttft_seconds"]}
    assert ("gpu-a", "0.95") in ttft
    # the unreachable target has no signal values at all: missing, never 0
    assert not any(s.labels.get("target") == "gpu-c" for s in families["llmdiag_requests_running"])
    assert not list(tmp_path.glob("llmdiag.prom.*")), "no temporary file left behind"

    rows = History(tmp_path / "history.sqlite").rows()
    assert sorted((r.target, r.state) for r in rows) == [("gpu-a", "OK"), ("gpu-b", memory_state), ("gpu-c", "UNKNOWN")]

    only = run_cli("check", "--config", str(config), "--target", "gpu-a", "--no-history")
    assert only.returncode == 0 and "LLMDIAG OK - healthy" in only.stdout, only.stdout + only.stderr
    wrong = run_cli("check", "--config", str(config), "--target", "gpu-z", "--no-history")
    assert wrong.returncode == 3 and "known: gpu-a, gpu-b, gpu-c" in wrong.stderr


def test_a_muted_finding_does_not_count(memory: LoadedSim, tmp_path: Path):
    config = tmp_path / "llmdiag.toml"
    config.write_text(
        '[[mute]]\ncode = "MEM001"\nreason = "this pool is small on purpose"\n'
        '[[mute]]\ncode = "SCH001"\nreason = "queueing is expected here"\n'
    )
    result = run_cli("check", *memory.args(), *WINDOW, "--no-history", "--config", str(config))
    assert "MEM001" not in result.stdout.splitlines()[0], result.stdout
    assert "muted MEM001: this pool is small on purpose" in result.stdout
    assert result.returncode != 2 or "CRITICAL" in result.stdout.splitlines()[0]


def test_a_regression_against_the_history_is_a_finding(healthy: LoadedSim, tmp_path: Path):
    """Five past checks at this target with a TTFT p95 of 1 ms: today's ~20 ms is far past 3× that."""
    db = tmp_path / "h.sqlite"
    name = healthy.server.url.split("//", 1)[1]

    def seed() -> None:  # afresh before each run: a run on a starved host is repeated once, with the same history
        db.unlink(missing_ok=True)
        now = time.time()
        history = History.open(db)
        history.record(
            [
                CheckRow(
                    at_unix=now - 3600 * (i + 1),
                    target=name,
                    url=healthy.server.url,
                    state="OK",
                    bottleneck="healthy",
                    ttft_p95_seconds=0.001,
                    generation_tokens_per_second=100.0,
                    requests_running_mean=30.0,
                )
                for i in range(5)
            ]
        )
        history.record(
            [CheckRow(at_unix=now - 60, target=name, url="", state="OK", bottleneck="idle", ttft_p95_seconds=0.0001)]
        )  # idle: not in the baseline

    result = run_cli_on_sim(healthy.server, "check", *healthy.args(), *WINDOW, "--history", str(db), before_each=seed)
    history = History.open(db)
    assert result.returncode == 2, result.stdout + result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith("LLMDIAG CRITICAL - healthy: TTFT p95 ") and "(REG001)" in first
    assert re.search(r"^CRITICAL REG001 ttft-p95-regressed: .*usual 0\.001 s", result.stdout, re.M)
    assert "baseline: median of 5 checks in 7 days" in result.stdout
    # throughput rose and fewer tokens/s would not have been less demand: REG003 stays quiet
    assert "REG003" not in result.stdout
    assert len(history.rows(name)) == 7


def test_scan_skips_the_regression_rules_for_want_of_a_baseline(healthy: LoadedSim):
    import json

    result = run_cli("scan", *healthy.args(), *WINDOW, "--json")
    verdict = json.loads(result.stdout)
    skipped = {r["code"]: r["reason"] for r in verdict["coverage"]["rules"] if r["status"] == "skipped"}
    assert "only `llmdiag check` compares" in skipped["REG001"]


class _Gateway(BaseHTTPRequestHandler):
    received: list[tuple[str, str, bytes]] = []

    def do_PUT(self) -> None:  # noqa: N802 (http.server API)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        _Gateway.received.append(("PUT", self.path, body))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_pushgateway_receives_the_metrics(healthy: LoadedSim):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        result = run_cli("check", *healthy.args(), *WINDOW, "--no-history", "--pushgateway", url)
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 0, result.stdout + result.stderr
    [(method, path, body)] = _Gateway.received
    assert method == "PUT" and path.startswith("/metrics/job/llmdiag/instance/")
    families = {f.name for f in text_string_to_metric_families(body.decode())}
    assert {"llmdiag_check_state", "llmdiag_verdict", "llmdiag_last_run_timestamp_seconds"} <= families

    refused = run_cli(
        "check", *healthy.args(), *WINDOW, "--no-history", "--pushgateway", f"http://127.0.0.1:{closed_port()}"
    )
    assert refused.returncode == 3 and "UNKNOWN: push to http://127.0.0.1:" in refused.stdout


def test_history_shows_the_trend_per_target_and_missing_values_as_unavailable(tmp_path: Path):
    import json

    db = tmp_path / "h.sqlite"
    now = time.time()
    History.open(db).record(
        [
            CheckRow(
                at_unix=now - 7200,
                target="gpu-a",
                url="http://a:8000",
                state="OK",
                bottleneck="healthy",
                ttft_p95_seconds=0.2,
                tpot_p95_seconds=None,
                generation_tokens_per_second=1000.0,
            ),
            CheckRow(
                at_unix=now - 3600,
                target="gpu-a",
                url="http://a:8000",
                state="WARNING",
                bottleneck="healthy",
                ttft_p95_seconds=0.4,
                generation_tokens_per_second=900.0,
                findings="REG001:warning",
            ),
            CheckRow(
                at_unix=now - 60, target="gpu-b", url="http://b:8000", state="UNKNOWN", error="connection refused"
            ),
            CheckRow(at_unix=now - 30 * 86400, target="gpu-a", url="http://a:8000", state="OK", bottleneck="healthy"),
        ]
    )
    result = run_cli("history", "--history", str(db), "--since", "7d")
    assert result.returncode == 0, result.stderr
    assert "gpu-a (http://a:8000): 2 checks in the last 7d: 1 OK, 1 WARNING" in result.stdout
    assert "TTFT p95  median 0.300 s, latest 0.400 s (+33% vs median)" in result.stdout
    assert "TPOT p95  tpot_p95_seconds: unavailable" in result.stdout
    assert "REG001:warning" in result.stdout and "error: connection refused" in result.stdout
    rows = json.loads(run_cli("history", "--history", str(db), "--target", "gpu-b", "--json").stdout)
    assert [r["state"] for r in rows] == ["UNKNOWN"] and rows[0]["ttft_p95_seconds"] is None
    bad = run_cli("history", "--history", str(db), "--since", "a week")
    assert bad.returncode == 2 and "e.g. 30m, 12h, 7d, 2w" in bad.stderr
