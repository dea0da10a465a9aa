"""`llmdiag scan --prometheus`: simulated vLLM replicas scraped every second by a real Prometheus (Debian's), judged
per instance from PromQL. Four replicas (three healthy, one memory-bound), each with its DCGM page under the same
``pod`` label as Kubernetes service discovery would attach, except one whose GPU page is labelled for another pod
(the join must say it cannot join), plus a target that is down. A second Prometheus with a tiny
``--query.max-samples`` gives real query-limit errors; a small proxy in front of the first one gives HTTP errors,
empty answers, Mimir's series limit and an auth wall. The timeline test switches one replica's preset at a known time.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import pytest
import requests

from llmdiag.collect.promql import (
    PrometheusSource,
    choose_window,
    collect_prometheus,
    collect_prometheus_timeline,
    parse_duration,
    parse_time,
    selector_matchers,
)
from llmdiag.errors import UsageError
from llmdiag.sim.presets import get_preset
from llmdiag.sim.server import ClosedLoopLoad, SimServer
from tests import prometheus_server
from tests.conftest import run_cli

PRESETS = {"sim-0": "healthy", "sim-1": "healthy", "sim-2": "healthy", "sim-3": "memory"}
UNJOINED = "sim-2"  # its DCGM page carries another pod's label
DEAD = "sim-dead"
SECRET = "s3cr3t-token-value"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Fleet:
    def __init__(self) -> None:
        self.sims: dict[str, SimServer] = {}
        self.loads: dict[str, ClosedLoopLoad] = {}
        self.prom: prometheus_server.PrometheusServer | None = None
        self.limited: prometheus_server.PrometheusServer | None = None

    def load(self, pod: str, preset: str) -> None:
        old = self.loads.pop(pod, None)
        if old is not None:
            old.stop()
        spec = get_preset(preset).load
        if preset == "healthy":  # healthy with fewer users: the same class, less CPU on a shared 2-core machine
            spec = type(spec)(users=8, prompt_tokens=spec.prompt_tokens, output_tokens=spec.output_tokens,
                              output_spread=spec.output_spread)  # fmt: skip
        sim = self.sims[pod]
        self.loads[pod] = ClosedLoopLoad(sim.url, sim.model, spec, max_seconds=600)
        self.loads[pod].start()

    def close(self) -> None:
        for load in self.loads.values():
            load.stop()
        for prom in (self.prom, self.limited):
            if prom is not None:
                prom.stop()
        for sim in self.sims.values():
            sim.stop()


@pytest.fixture(scope="module")
def fleet():
    prometheus_server.require()
    fleet = Fleet()
    try:
        for pod, preset in PRESETS.items():
            fleet.sims[pod] = SimServer(preset).start()
            fleet.load(pod, preset)
        labels = {pod: {"pod": pod, "namespace": "llm"} for pod in PRESETS}
        servers = [(s.metrics_url, labels[pod]) for pod, s in fleet.sims.items()]
        servers.append((f"http://127.0.0.1:{_closed_port()}/metrics", {"pod": DEAD, "namespace": "llm"}))
        gpus = [(s.dcgm_url, labels[pod] if pod != UNJOINED else {"pod": "someone-else", "namespace": "llm"})
                for pod, s in fleet.sims.items()]  # fmt: skip
        groups = {"vllm": servers, "dcgm": gpus}
        fleet.prom = prometheus_server.PrometheusServer(groups).start()
        fleet.limited = prometheus_server.PrometheusServer(groups, extra_args=["--query.max-samples=200"]).start()
        fleet.prom.wait_for_samples("vllm:num_requests_running", len(PRESETS), samples=3)
        time.sleep(12)  # a window of samples under load
        yield fleet
    finally:
        fleet.close()


def scan(*args: str, env: dict[str, str] | None = None):
    result = run_cli("scan", *args, "--json", env=env)
    doc = json.loads(result.stdout) if result.returncode in (0, 1) and result.stdout.strip() else None
    return result, doc


# --------------------------------------------------------------------------------------------------------------------


def test_each_instance_gets_its_class_and_evidence(fleet: Fleet) -> None:
    result, doc = scan("--prometheus", fleet.prom.url, "--selector", '{job="vllm"}', "--since", "12s")
    assert doc is not None, result.stderr
    classes = {k: v["bottleneck"] for k, v in doc["instances"].items()}
    assert classes == {"llm/sim-0": "healthy", "llm/sim-1": "healthy", "llm/sim-2": "healthy",
                       "llm/sim-3": "memory", f"llm/{DEAD}": "unknown"}, classes  # fmt: skip
    assert doc["scrape_interval_seconds"] == 1.0
    assert doc["window_seconds"] == 12.0
    memory = doc["instances"]["llm/sim-3"]
    codes = {f["code"] for f in memory["findings"]}
    assert {"MEM001"} <= codes, codes
    evidence = [ev for f in memory["findings"] for ev in f["evidence"]]
    kv_ev = next(ev for ev in evidence if ev["signal"] == "kv_cache_usage_ratio")
    assert kv_ev["value"] > 0.9, kv_ev
    assert kv_ev["source"].startswith("prometheus: last_over_time(vllm:kv_cache_usage_perc{job=\"vllm\"}[1s])")
    assert kv_ev["verify"].startswith("curl -s") and "query_range" in kv_ev["verify"]
    assert kv_ev["window_seconds"] == 12.0
    dead = doc["instances"][f"llm/{DEAD}"]
    assert "no inference-server series" in json.dumps(dead["coverage"])


def test_signals_match_the_simulators_own_numbers(fleet: Fleet) -> None:
    source = PrometheusSource(fleet.prom.url)
    result = collect_prometheus(source, '{job="vllm"}', None, 12.0)
    healthy, memory = result.instances["llm/sim-0"], result.instances["llm/sim-3"]
    # KV: the memory replica's pool is full, the healthy one's nearly empty
    assert memory.get("kv_cache_usage_ratio").stats["mean"] > 0.9
    assert healthy.get("kv_cache_usage_ratio").stats["max"] < 0.2
    assert memory.get("preemptions_per_second").stats["rate"] > 0
    assert healthy.get("preemptions_per_second").stats["rate"] == 0
    # generation rate over the window vs the simulator's own counter over about the same time
    before = fleet.sims["sim-1"].snapshot()["generation_tokens"]
    time.sleep(6)
    after = fleet.sims["sim-1"].snapshot()["generation_tokens"]
    time.sleep(1.5)  # one more scrape
    again = collect_prometheus(source, '{job="vllm"}', None, 6.0).instances["llm/sim-1"]
    rate = again.get("generation_tokens_per_second").stats["rate"]
    assert rate == pytest.approx((after - before) / 6, rel=0.35)
    ttft = again.get("ttft_seconds")
    assert ttft.unavailable is None and 0 < ttft.stats["p50"] <= ttft.stats["p99"] and ttft.stats["count"] > 0
    assert ttft.source.startswith("prometheus: label_replace(histogram_quantile(0.5, sum by (job, instance, "
                                  "namespace, pod, le) (rate(vllm:time_to_first_token_seconds_bucket")  # fmt: skip
    # GPU series joined by pod; the replica whose GPU page has another pod's label says it cannot join
    assert healthy.get("gpu_power_watts").unavailable is None
    assert any(s.probe == "dcgm" and s.ok and "joined by pod sim-0" in s.note for s in healthy.sources)
    unjoined = result.instances[f"llm/{UNJOINED}"]
    assert unjoined.get("gpu_power_watts") is None
    note = next(s.note for s in unjoined.sources if s.probe == "dcgm")
    assert "none share a pod or host with llm/sim-2" in note


def test_query_count_does_not_grow_with_the_fleet(fleet: Fleet) -> None:
    counts: dict[int, int] = {}
    for selector in ('{job="vllm",pod="sim-0"}', '{job="vllm",pod=~"sim-[01]"}', '{job="vllm"}'):
        source = PrometheusSource(fleet.prom.url)
        result = collect_prometheus(source, selector, None, 10.0)
        counts[len(result.instances)] = result.queries
    assert set(counts) == {1, 2, 5}
    assert len(set(counts.values())) == 1, counts
    print(f"queries by instance count: {counts}")


def test_timeline_shows_the_preset_switch_within_one_step(fleet: Fleet) -> None:
    sim = fleet.sims["sim-0"]
    switched = time.time()
    sim.switch_preset("memory")
    fleet.load("sim-0", "memory")
    assert sim.snapshot()["num_gpu_blocks"] == SimServer("memory").config.engine.num_gpu_blocks
    time.sleep(14)
    step = 4
    result, doc = scan("--prometheus", fleet.prom.url, "--selector", '{job="vllm",pod="sim-0"}', "--from",
                       f"{switched - 12:.3f}", "--to", f"{switched + 12:.3f}", "--step", f"{step}s")  # fmt: skip
    assert doc is not None, result.stderr
    classes = [(s["end_unix"], s["classes"]["llm/sim-0"]) for s in doc["steps"]]
    assert len(classes) == 6, classes
    before = [c for t, c in classes if t <= switched]
    after = [c for t, c in classes if t > switched + step]
    assert before and set(before) == {"healthy"}, classes
    assert after and set(after) == {"memory"}, classes
    first_memory = next(t for t, c in classes if c == "memory")
    # the step that holds the switch, or (when the switch falls at its very end) the next one
    assert switched < first_memory <= switched + 2 * step, (switched, classes)
    print(f"switched at {switched:.1f}; steps (end, class): {classes}; {doc['queries']} queries")
    # range queries: as many for one step as for six
    one = collect_prometheus_timeline(PrometheusSource(fleet.prom.url), '{job="vllm",pod="sim-0"}', switched - 4,
                                      switched, step)  # fmt: skip
    assert len(one) == 1 and one[0][1].queries == doc["queries"]


# --------------------------------------------------------------------------------------------------------------------
# errors: never "healthy" without the evidence


def test_query_limits_give_unknown_with_the_reason(fleet: Fleet) -> None:
    result, doc = scan("--prometheus", fleet.limited.url, "--selector", '{job="vllm"}', "--since", "12s")
    assert doc is not None, result.stderr
    assert "too many samples" in " ".join(doc["notes"])
    for key, verdict in doc["instances"].items():
        assert verdict["bottleneck"] != "healthy", key


class Proxy:
    """A real HTTP proxy in front of Prometheus that can refuse, empty or limit what it forwards."""

    def __init__(self, upstream: str, rule: Callable[[str, dict, dict], tuple[int, dict] | None]) -> None:
        self.upstream, self.rule = upstream, rule
        self.seen_headers: list[dict[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                outer.seen_headers.append(headers)
                form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
                answer = outer.rule(self.path, form, headers)
                if answer is None:
                    upstream = requests.request(method, outer.upstream + self.path, data=body or None,
                                                headers={"Content-Type": headers.get("content-type", "")})  # fmt: skip
                    status, payload = upstream.status_code, upstream.content
                else:
                    status, payload = answer[0], json.dumps(answer[1]).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:  # noqa: N802
                self._handle("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._handle("POST")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def error(kind: str, text: str) -> dict:
    return {"status": "error", "errorType": kind, "error": text}


def test_prometheus_errors_are_said_plainly(fleet: Fleet) -> None:
    def down(path: str, form: dict, headers: dict):
        return 503, error("unavailable", "the query engine is overloaded")

    proxy = Proxy(fleet.prom.url, down)
    try:
        result, _ = scan("--prometheus", proxy.url, "--since", "12s")
    finally:
        proxy.close()
    assert result.returncode == 2
    assert "ERROR: Prometheus answered HTTP 503" in result.stderr and "overloaded" in result.stderr
    assert "Traceback" not in result.stderr

    result, _ = scan("--prometheus", fleet.prom.url, "--selector", '{job="nope"}', "--since", "12s")
    assert result.returncode == 2
    assert "no inference-server series and no targets matching {job=\"nope\"}" in result.stderr
    assert "HINT:" in result.stderr


def test_series_limits_and_empty_answers_are_unknown_never_healthy(fleet: Fleet) -> None:
    def limited(path: str, form: dict, headers: dict):
        if path.startswith("/api/v1/query") and "_bucket" in form.get("query", ""):
            return 422, error("execution", "the query exceeded the maximum number of series (limit: 10)")
        return None

    def empty(path: str, form: dict, headers: dict):
        if path.startswith("/api/v1/query"):
            kind = "matrix" if "query_range" in path else "vector"
            return 200, {"status": "success", "data": {"resultType": kind, "result": []}}
        return None

    for rule, words in ((limited, "maximum number of series"), (empty, "no samples in the window")):
        proxy = Proxy(fleet.prom.url, rule)
        try:
            result, doc = scan("--prometheus", proxy.url, "--selector", '{job="vllm"}', "--since", "12s")
        finally:
            proxy.close()
        assert doc is not None, result.stderr
        for key, verdict in doc["instances"].items():
            if rule is empty or key in ("llm/sim-1", "llm/sim-2", f"llm/{DEAD}"):
                assert verdict["bottleneck"] == "unknown", (rule.__name__, key, verdict["bottleneck"])
            assert verdict["bottleneck"] != "healthy"
        assert words in json.dumps(doc), rule.__name__


def test_auth_headers_and_secrets(fleet: Fleet) -> None:
    def wall(path: str, form: dict, headers: dict):
        if headers.get("authorization") != f"Bearer {SECRET}" or headers.get("x-scope-orgid") != "team-a":
            return 401, error("unauthorized", "no valid token")
        return None

    proxy = Proxy(fleet.prom.url, wall)
    try:
        result, doc = scan("--prometheus", proxy.url, "--selector", '{job="vllm",pod="sim-3"}', "--since", "12s",
                           "--prometheus-token-env", "PROM_TOKEN", "--header", "X-Scope-OrgID: team-a",
                           env={"PROM_TOKEN": SECRET})  # fmt: skip
        assert doc is not None, result.stderr
        assert doc["instances"]["llm/sim-3"]["bottleneck"] == "memory"
        assert SECRET not in result.stdout + result.stderr
        assert "Bearer $PROM_TOKEN" in result.stdout  # the verify lines name the variable, not the value
        result, _ = scan("--prometheus", proxy.url, "--since", "12s", "--prometheus-token-env", "PROM_TOKEN",
                         env={"PROM_TOKEN": "wrong-" + SECRET})  # fmt: skip
        assert result.returncode == 2 and "HTTP 401" in result.stderr and "--prometheus-token-env" in result.stderr
        assert SECRET not in result.stdout + result.stderr
    finally:
        proxy.close()


# --------------------------------------------------------------------------------------------------------------------
# small parts


def test_times_windows_and_selectors() -> None:
    assert parse_duration("1h30m") == 5400 and parse_duration("500ms") == 0.5 and parse_duration("90") == 90
    with pytest.raises(UsageError):
        parse_duration("soon")
    assert parse_time("10m", now=10_000.0) == 9_400.0
    assert parse_time("1700000000") == 1_700_000_000.0
    assert parse_time("2025-01-31T14:05:00Z") == 1738332300.0
    noon = parse_time("12:00", now=time.time())
    assert noon <= time.time() and time.localtime(noon)[3:6] == (12, 0, 0)
    assert selector_matchers('{job="vllm"}') == 'job="vllm"' and selector_matchers(None) == ""
    with pytest.raises(UsageError):
        selector_matchers("{job=vllm")
    with pytest.raises(UsageError):
        selector_matchers("vllm")
    assert choose_window(15.0, None) == (60.0, "")
    assert choose_window(30.0, None)[0] == 120.0
    widened, note = choose_window(15.0, 20.0)
    assert widened == 60.0 and "widened" in note


def test_source_options_keep_secrets_out_of_curl(tmp_path, monkeypatch) -> None:
    token = tmp_path / "token"
    token.write_text(SECRET + "\n")
    source = PrometheusSource.from_options("https://prom.example:9090", ["X-Scope-OrgID: t1"], token_file=token,
                                           ca_file=token)  # fmt: skip
    line = source.curl('up{job="x"}', 1.0)
    assert SECRET not in line and "$(cat " in line and "--cacert" in line and "X-Scope-OrgID: t1" in line
    monkeypatch.setenv("PW", SECRET)
    basic = PrometheusSource.from_options("http://prom:9090", user="alice", password_env="PW")
    assert SECRET not in basic.curl("up", 1.0) and '"alice:$PW"' in basic.curl("up", 1.0)
    with pytest.raises(UsageError):
        PrometheusSource.from_options("http://prom:9090", token_env="NOT_SET_ANYWHERE_X")
    with pytest.raises(UsageError):
        PrometheusSource.from_options("http://prom:9090", user="alice")
