"""`llmdiag scan --prometheus`: simulated vLLM replicas scraped every second by a real Prometheus (Debian's), judged
per instance from PromQL. Four replicas (three healthy, one memory-bound), each with its DCGM page under the same
``pod`` label as Kubernetes service discovery would attach, except one whose GPU page is labelled for another pod
(the join must say it cannot join), plus a target that is down. A second Prometheus with a tiny
``--query.max-samples`` gives real query-limit errors; a small proxy in front of the first one gives HTTP errors,
empty answers, Mimir's series limit and an auth wall. The timeline test switches one replica's preset at a known time.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import pytest
import requests

from llmdiag.collect.prometheus.api import PrometheusSource
from llmdiag.collect.prometheus.build import collect_prometheus, collect_prometheus_timeline
from llmdiag.collect.prometheus.plan import choose_window, parse_duration, parse_time, selector_matchers
from llmdiag.errors import UsageError
from llmdiag.sim.load import ClosedLoopLoad
from llmdiag.sim.presets import get_preset
from llmdiag.sim.server import SimServer
from tests.conftest import run_cli
from tests.support import prometheus_server

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
        self.presets = dict(PRESETS)  # each pod's preset now (the timeline test switches some)

    def load(self, pod: str, preset: str, users: int | None = None) -> None:
        old = self.loads.pop(pod, None)
        if old is not None:
            old.stop()
        self.presets[pod] = preset
        spec = get_preset(preset).load
        if preset == "healthy":  # healthy with fewer users: the same class, less CPU on a shared 2-core machine
            spec = type(spec)(
                users=users or 8,
                prompt_tokens=spec.prompt_tokens,
                output_tokens=spec.output_tokens,
                output_spread=spec.output_spread,
            )
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
        gpus = [
            (s.dcgm_url, labels[pod] if pod != UNJOINED else {"pod": "someone-else", "namespace": "llm"})
            for pod, s in fleet.sims.items()
        ]
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


def instances(doc: dict) -> dict[str, dict]:
    """The fleet JSON's replicas by name: each with its verdict (None: no data, with the error)."""
    return {t["name"]: t for t in doc["targets"]}


def test_each_instance_gets_its_class_and_evidence(fleet: Fleet) -> None:
    result, doc = scan("--prometheus", fleet.prom.url, "--selector", '{job="vllm"}', "--since", "12s")
    assert doc is not None, result.stderr
    assert doc["kind"] == "fleet" and result.returncode == 1  # the memory replica is critical
    rows = instances(doc)
    classes = {k: v["bottleneck"] for k, v in rows.items()}
    assert classes == {
        "llm/sim-0": "healthy",
        "llm/sim-1": "healthy",
        "llm/sim-2": "healthy",
        "llm/sim-3": "memory",
        f"llm/{DEAD}": "unknown",
    }, classes
    assert doc["class_counts"] == {"memory": 1, "healthy": 3, "unknown": 1}
    assert doc["scrape_interval_seconds"] == 1.0
    assert doc["window_seconds"] == 12.0
    assert doc["queries"] > 0
    # worst first: the memory replica (critical, named by SCH009), the healthy ones, the one without data
    assert doc["targets"][0]["name"] == "llm/sim-3" and doc["targets"][0]["state"] == "CRITICAL"
    found = {f["finding"]["code"]: f for f in doc["imbalance"]}
    assert set(found) == {"SCH009"}, {k: v["finding"]["summary"] for k, v in found.items()}
    worse = found["SCH009"]
    assert worse["replica"] == "llm/sim-3" and rows["llm/sim-3"]["flagged_by"] == ["SCH009"]
    ttft = worse["values"]
    assert set(ttft) == {"llm/sim-0", "llm/sim-1", "llm/sim-2", "llm/sim-3"}  # the one without data is left out
    peers = sorted(v for k, v in ttft.items() if k != "llm/sim-3")
    assert worse["finding"]["evidence"][0]["value"] == pytest.approx(ttft["llm/sim-3"] / peers[1], rel=1e-3)
    # the TTFTs the rule compared are each replica's own verdict's (its PromQL answers), not a number of its own
    assert ttft == pytest.approx({name: rows[name]["numbers"]["ttft_p90_seconds"] for name in ttft}, rel=1e-9)
    assert worse["finding"]["severity"] == "critical"
    rules = {o["code"]: o["status"] for o in doc["fleet_rules"]}
    assert rules == {"SCH008": "passed", "SCH009": "fired"}, rules
    assert doc["fleet_signals"]["fleet_replicas_judged"]["stats"]["value"] == 4.0
    print(f"SCH009: {worse['finding']['summary']}; TTFT p90 per replica {ttft}")
    mem_numbers = rows["llm/sim-3"]["numbers"]
    assert mem_numbers["kv_cache_usage_max_ratio"] > 0.9 and mem_numbers["requests_waiting_mean"] > 1
    memory = rows["llm/sim-3"]["verdict"]
    codes = {f["code"] for f in memory["findings"]}
    assert {"MEM001"} <= codes, codes
    evidence = [ev for f in memory["findings"] for ev in f["evidence"]]
    kv_ev = next(ev for ev in evidence if ev["signal"] == "kv_cache_usage_ratio")
    assert kv_ev["value"] > 0.9, kv_ev
    assert kv_ev["source"].startswith('prometheus: last_over_time(vllm:kv_cache_usage_perc{job="vllm"}[1s])')
    assert kv_ev["verify"].startswith("curl -s") and "query_range" in kv_ev["verify"]
    assert kv_ev["window_seconds"] == 12.0
    dead = rows[f"llm/{DEAD}"]
    assert dead["verdict"] is None and dead["state"] == "UNKNOWN" and "no inference-server series" in dead["error"]
    # the terminal view: the same table as a direct fleet scan
    text = run_cli("scan", "--prometheus", fleet.prom.url, "--selector", '{job="vllm"}', "--since", "12s")
    assert text.returncode == 1, text.stderr
    lines = text.stdout.splitlines()
    assert "5 replicas:" in text.stdout and "PromQL queries, scrape every 1 s" in text.stdout
    assert next(i for i, line in enumerate(lines) if line.startswith("llm/sim-3")) < next(
        i for i, line in enumerate(lines) if line.startswith("llm/sim-0")
    )
    assert "flagged by SCH009" in next(line for line in lines if line.startswith("llm/sim-3"))
    assert "TTFT p90 (seconds) per replica: llm/sim-3" in text.stdout


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
    assert ttft.source.startswith(
        "prometheus: label_replace(histogram_quantile(0.5, sum by (job, instance, "
        "namespace, pod, le) (rate(vllm:time_to_first_token_seconds_bucket"
    )
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


def test_check_through_prometheus_is_a_fleet_health_check(fleet: Fleet) -> None:
    def check(*args: str):
        result = run_cli("check", "--prometheus", *args, "--no-history")
        return result, result.stdout.splitlines()[0] if result.stdout else ""

    healthy = '{job="vllm",pod=~"sim-[012]"}'
    result, first = check(fleet.prom.url, "--selector", healthy, "--duration", "12")
    assert result.returncode == 0, result.stdout + result.stderr
    assert first.startswith("LLMDIAG OK - 3 targets: llm/sim-0 OK healthy, llm/sim-1 OK healthy, llm/sim-2 OK"), first
    perf = first.split(" | ", 1)[1].split()
    for pod in ("sim-0", "sim-1", "sim-2"):  # per-target perfdata, prefixed with the instance
        assert any(p.startswith(f"llm/{pod}_kv_cache_usage_ratio=") for p in perf), perf
    assert "fleet_replica_request_rate_max_over_peers_ratio=" in first and ";1.5;2.5;0" in first
    # one memory replica: CRITICAL, named, with the fleet rule that flags it
    result, first = check(fleet.prom.url, "--selector", '{job="vllm",pod=~"sim-[0123]"}', "--duration", "12")
    assert result.returncode == 2, result.stdout
    assert first.startswith("LLMDIAG CRITICAL - 4 targets:") and "llm/sim-3 CRITICAL memory (MEM001)" in first
    assert "fleet: SCH009 llm/sim-3" in first
    assert "fleet CRITICAL SCH009 replica-worse-than-peers: llm/sim-3:" in result.stdout
    # an instance Prometheus lists without data: UNKNOWN, named
    result, first = check(fleet.prom.url, "--selector", f'{{job="vllm",pod=~"sim-[01]|{DEAD}"}}', "--duration", "12")
    assert result.returncode == 3, result.stdout
    assert f"llm/{DEAD} UNKNOWN no data" in first and "llm/sim-0 OK healthy" in first
    # Prometheus unreachable: UNKNOWN, one status line, ERROR/HINT on stderr
    result, first = check(f"http://127.0.0.1:{_closed_port()}")
    assert result.returncode == 3 and first.startswith("LLMDIAG UNKNOWN - cannot connect to Prometheus")
    assert result.stderr.startswith("ERROR: cannot connect") and "HINT:" in result.stderr
    print(f"check --prometheus: 0 healthy, 2 memory, 3 no data, 3 unreachable; {first}")


def test_an_unbalanced_router_is_sch008_with_the_request_rates(fleet: Fleet) -> None:
    try:
        fleet.load("sim-1", "healthy", users=24)
        fleet.load("sim-0", "healthy", users=3)
        fleet.load("sim-2", "healthy", users=3)
        time.sleep(9)
        result, doc = scan(
            "--prometheus", fleet.prom.url, "--selector", '{job="vllm",pod=~"sim-[012]"}', "--since", "6s"
        )
    finally:
        for pod in ("sim-0", "sim-1", "sim-2"):
            fleet.load(pod, "healthy")
    assert doc is not None, result.stderr
    rows = instances(doc)
    assert {k: v["bottleneck"] for k, v in rows.items()} == dict.fromkeys(
        ("llm/sim-0", "llm/sim-1", "llm/sim-2"), "healthy"
    )
    found = {f["finding"]["code"]: f for f in doc["imbalance"]}
    assert "SCH008" in found, doc["fleet_rules"]
    router = found["SCH008"]
    rates = router["values"]
    assert router["replica"] == "llm/sim-1" and rows["llm/sim-1"]["flagged_by"][0] == "SCH008"
    assert rates["llm/sim-1"] == rows["llm/sim-1"]["numbers"]["request_rate_per_second"]
    expected = rates["llm/sim-1"] / max(rates["llm/sim-0"], rates["llm/sim-2"])  # upper median of two peers
    evidence = router["finding"]["evidence"][0]
    assert evidence["signal"] == "replica_request_rate_max_over_peers_ratio"
    assert evidence["value"] == pytest.approx(expected, rel=1e-3) and evidence["value"] >= 2.5
    assert router["finding"]["severity"] == "critical" and doc["targets"][0]["name"] == "llm/sim-1"
    print(f"SCH008: {router['finding']['summary']}; finished requests/s {rates}")


def test_timeline_shows_the_preset_switch_within_one_step(fleet: Fleet, tmp_path) -> None:
    """sim-0 goes memory-bound first, sim-1 two steps later: the timeline names sim-0 first, each transition within
    one step of its switch, and the fleet's majority turning memory-bound."""
    step = 4
    switched: dict[str, float] = {}
    for pod in ("sim-0", "sim-1"):
        if switched:
            time.sleep(2 * step)
        switched[pod] = time.time()
        fleet.sims[pod].switch_preset("memory")
        fleet.load(pod, "memory")
    assert fleet.sims["sim-0"].snapshot()["num_gpu_blocks"] == SimServer("memory").config.engine.num_gpu_blocks
    time.sleep(14)
    html = tmp_path / "timeline.html"
    span = ("--from", f"{switched['sim-0'] - 12:.3f}", "--to", f"{switched['sim-1'] + 12:.3f}", "--step", f"{step}s")
    result, doc = scan("--prometheus", fleet.prom.url, "--selector", '{job="vllm"}', *span, "--html", str(html))
    assert doc is not None, result.stderr
    timeline = doc["timeline"]
    assert timeline["step_seconds"] == step and len(timeline["steps"]) == 8, timeline["steps"]
    for pod, at in switched.items():
        classes = [(s["at_unix"], s["classes"][f"llm/{pod}"]) for s in timeline["steps"]]
        assert {c for t, c in classes if t <= at} == {"healthy"}, (pod, at, classes)
        assert {c for t, c in classes if t > at + step} == {"memory"}, (pod, at, classes)
        [went] = [t for t in timeline["transitions"] if t["replica"] == f"llm/{pod}"]
        assert (went["from_class"], went["to_class"]) == ("healthy", "memory")
        # the step that holds the switch, or (when the switch falls at its very end) the next one
        assert went["previous_at_unix"] <= at + step and at < went["at_unix"] <= at + 2 * step, (pod, at, went)
        print(
            f"{pod} switched at {at:.1f}; transition in the step ending {went['at_unix']:.1f} "
            f"(+{went['at_unix'] - at:.1f} s)"
        )
    assert timeline["first_to_go"] == ["llm/sim-0"] and timeline["first_to_go_class"] == "memory"
    # sim-3 was memory-bound throughout: not a transition; the dead target has no data: a gap, never a class
    assert all(t["replica"] not in ("llm/sim-3", f"llm/{DEAD}") for t in timeline["transitions"])
    assert all(f"llm/{DEAD}" not in s["classes"] for s in timeline["steps"])
    [fleet_went] = timeline["fleet_transitions"]
    assert (fleet_went["from_class"], fleet_went["to_class"]) == ("healthy", "memory")
    assert switched["sim-0"] < fleet_went["at_unix"] <= switched["sim-0"] + 2 * step
    # the replicas table is the worst step's: three memory-bound replicas
    assert doc["class_counts"] == {"memory": 3, "healthy": 1, "unknown": 1}, doc["class_counts"]
    print(f"{doc['queries']} queries; {doc['notes'][0]}")
    # the HTML heat strip: one row per replica, one cell per step, coloured by class; no data is grey, not healthy
    page = html.read_text()
    rows = dict(re.findall(r'<div class="heat-row" role="row" data-replica="([^"]+)">(.*?)</div>', page, re.S))
    cells = {name: re.findall(r'data-class="([a-z]+)"', row) for name, row in rows.items()}
    assert cells["llm/sim-0"][0] == "healthy" and cells["llm/sim-0"][-1] == "memory" and len(cells["llm/sim-0"]) == 8
    assert set(cells["llm/sim-3"]) == {"memory"} and set(cells[f"llm/{DEAD}"]) == {"none"}
    assert cells["llm/sim-1"].index("memory") > cells["llm/sim-0"].index("memory")
    # the terminal: the strip, the first to go and the fleet's transition
    text = run_cli("scan", "--prometheus", fleet.prom.url, "--selector", '{job="vllm"}', *span)
    assert text.returncode == 1, text.stderr
    assert "first to go: llm/sim-0 → memory at" in text.stdout and "the fleet: healthy → memory" in text.stdout
    strip = {
        line.split()[0]: line.split()[1]
        for line in text.stdout.splitlines()
        if line.startswith("  llm/sim-") and len(line.split()) == 2
    }
    assert strip["llm/sim-3"] == "M" * 8 and strip["llm/sim-0"].startswith("h") and strip["llm/sim-0"].endswith("M")
    print(text.stdout)
    # range queries: as many for one step as for eight
    one = collect_prometheus_timeline(
        PrometheusSource(fleet.prom.url), '{job="vllm"}', switched["sim-0"] - 4, switched["sim-0"], step
    )
    assert len(one) == 1 and one[0][1].queries == doc["queries"]


# --------------------------------------------------------------------------------------------------------------------
# errors: never "healthy" without the evidence


def test_query_limits_give_unknown_with_the_reason(fleet: Fleet) -> None:
    result, doc = scan("--prometheus", fleet.limited.url, "--selector", '{job="vllm"}', "--since", "12s")
    assert doc is not None, result.stderr
    assert "too many samples" in " ".join(doc["notes"])
    for key, row in instances(doc).items():
        assert row["bottleneck"] != "healthy", key


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
                    upstream = requests.request(
                        method,
                        outer.upstream + self.path,
                        data=body or None,
                        headers={"Content-Type": headers.get("content-type", "")},
                    )
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
    assert 'no inference-server series and no targets matching {job="nope"}' in result.stderr
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
        # without TTFT histograms a healthy replica cannot be told apart: unknown (memory still shows in KV/preemptions)
        still_healthy = [f"llm/{pod}" for pod, preset in fleet.presets.items() if preset == "healthy"]
        for key, row in instances(doc).items():
            if rule is empty or key in (*still_healthy, f"llm/{DEAD}"):
                assert row["bottleneck"] == "unknown", (rule.__name__, key, row["bottleneck"])
            assert row["bottleneck"] != "healthy"
        assert words in json.dumps(doc), rule.__name__


def test_auth_headers_and_secrets(fleet: Fleet) -> None:
    def wall(path: str, form: dict, headers: dict):
        if headers.get("authorization") != f"Bearer {SECRET}" or headers.get("x-scope-orgid") != "team-a":
            return 401, error("unauthorized", "no valid token")
        return None

    proxy = Proxy(fleet.prom.url, wall)
    try:
        result, doc = scan(
            "--prometheus",
            proxy.url,
            "--selector",
            '{job="vllm",pod="sim-3"}',
            "--since",
            "12s",
            "--prometheus-token-env",
            "PROM_TOKEN",
            "--header",
            "X-Scope-OrgID: team-a",
            env={"PROM_TOKEN": SECRET},
        )
        assert doc is not None, result.stderr
        assert instances(doc)["llm/sim-3"]["bottleneck"] == "memory"
        assert SECRET not in result.stdout + result.stderr
        assert "Bearer $PROM_TOKEN" in result.stdout  # the verify lines name the variable, not the value
        result, _ = scan(
            "--prometheus",
            proxy.url,
            "--since",
            "12s",
            "--prometheus-token-env",
            "PROM_TOKEN",
            env={"PROM_TOKEN": "wrong-" + SECRET},
        )
        assert result.returncode == 2 and "HTTP 401" in result.stderr and "--prometheus-token-env" in result.stderr
        assert SECRET not in result.stdout + result.stderr
    finally:
        proxy.close()


# --------------------------------------------------------------------------------------------------------------------
# the fault matrix's Prometheus rows (README "Fault matrix"): down mid-query, warnings and partial answers


def test_prometheus_going_down_mid_query_is_one_error_never_a_traceback(fleet: Fleet) -> None:
    answered: list[str] = []
    proxies: list[Proxy] = []

    def dies(path: str, form: dict, headers: dict):
        if path.startswith("/api/v1/query"):
            answered.append(form.get("query", ""))
            if len(answered) > 3:  # the fourth query: the process goes away mid-answer, its port closes
                threading.Thread(target=proxies[0].close, daemon=True).start()
                raise ConnectionAbortedError("Prometheus went away")
        return None

    proxies.append(Proxy(fleet.prom.url, dies))
    try:
        result, doc = scan("--prometheus", proxies[0].url, "--selector", '{job="vllm"}', "--since", "12s")
    finally:
        proxies[0].close()
    assert result.returncode == 2 and doc is None, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith(("ERROR:", "HINT:"))]
    assert [line.split(":")[0] for line in lines] == ["ERROR", "HINT"], result.stderr
    assert f"cannot connect to Prometheus at {proxies[0].url}" in lines[0]
    assert "Traceback" not in result.stderr and len(answered) == 4


def test_prometheus_warnings_and_partial_answers_are_said_and_unknown_never_healthy(fleet: Fleet) -> None:
    warning = "PromQL info: this query hit a partial response from store 10.0.0.7:10901 (Thanos)"

    def partial(path: str, form: dict, headers: dict):
        if not path.startswith("/api/v1/query"):
            return None
        upstream = requests.post(fleet.prom.url + path, data=form, timeout=30).json()
        if upstream.get("status") == "success":  # one replica's store did not answer: its series are missing
            upstream["data"]["result"] = [r for r in upstream["data"]["result"] if r["metric"].get("pod") != "sim-1"]
            upstream["warnings"] = [warning]
        return 200, upstream

    proxy = Proxy(fleet.prom.url, partial)
    try:
        result, doc = scan("--prometheus", proxy.url, "--selector", '{job="vllm"}', "--since", "12s")
    finally:
        proxy.close()
    assert doc is not None, result.stderr
    assert any(warning in note for note in doc["notes"]), doc["notes"]
    rows = instances(doc)
    # the replica whose answers were left out: no data, so unknown with the reason, never healthy
    assert rows["llm/sim-1"]["bottleneck"] == "unknown", rows["llm/sim-1"]
    # the others are judged on what came back, as without the warning (sim-3's full KV cache shows in any window;
    # the healthy sim-0, starved of CPU on a loaded machine, may fill its own: judged, whatever its class)
    assert rows["llm/sim-3"]["bottleneck"] == "memory"
    assert rows["llm/sim-0"]["bottleneck"] not in (None, "unknown"), rows["llm/sim-0"]


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
    source = PrometheusSource.from_options(
        "https://prom.example:9090", ["X-Scope-OrgID: t1"], token_file=token, ca_file=token
    )
    line = source.curl('up{job="x"}', 1.0)
    assert SECRET not in line and "$(cat " in line and "--cacert" in line and "X-Scope-OrgID: t1" in line
    monkeypatch.setenv("PW", SECRET)
    basic = PrometheusSource.from_options("http://prom:9090", user="alice", password_env="PW")
    assert SECRET not in basic.curl("up", 1.0) and '"alice:$PW"' in basic.curl("up", 1.0)
    with pytest.raises(UsageError):
        PrometheusSource.from_options("http://prom:9090", token_env="NOT_SET_ANYWHERE_X")
    with pytest.raises(UsageError):
        PrometheusSource.from_options("http://prom:9090", user="alice")
