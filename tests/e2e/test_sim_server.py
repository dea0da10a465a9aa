"""The simulated server over real HTTP on 127.0.0.1: the OpenAI API, the pages llmdiag reads, and the presets.

The preset tests run each preset under its bounded closed-loop load and scan it with the CLI exactly as a user
would (``python -m llmdiag scan URL --duration 8 --json``). They assert the class and the evidence's direction,
never absolute times.
"""

from __future__ import annotations

import json
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from llmdiag.collect.exposition import parse_exposition
from llmdiag.collect.servers.pages import check_server
from llmdiag.collect.signals import build_signal_set
from llmdiag.engine.evaluate import CORE_SIGNALS
from llmdiag.physics.hardware import GPUS, MODELS
from llmdiag.physics.step import Deployment
from llmdiag.schema.loader import load_probe
from llmdiag.sim.app import SimConfig
from llmdiag.sim.engine import EngineConfig
from llmdiag.sim.load import ClosedLoopLoad, run_for
from llmdiag.sim.openai import BUSY_MESSAGE
from llmdiag.sim.presets import PRESETS, LoadSpec, get_preset
from llmdiag.sim.server import SimServer
from tests.conftest import FIXTURES, run_cli

pytestmark = pytest.mark.timeout(120)

HEALTHY_DEPLOYMENT = Deployment(GPUS["H100"], MODELS["llama-3-8b"])
WARMUP_SECONDS = 3.0
SCAN_SECONDS = "8"


@pytest.fixture(scope="module")
def server():
    with SimServer("healthy") as sim:
        yield sim


def sse_events(response: requests.Response) -> list[str]:
    """The data payloads of an SSE stream, in order."""
    return [line[len("data: ") :] for line in response.iter_lines(decode_unicode=True) if line.startswith("data: ")]


def post(server: SimServer, path: str, body: dict, **kwargs) -> requests.Response:
    return requests.post(server.url + path, json=body, timeout=30, **kwargs)


# --- the OpenAI API ----------------------------------------------------------------------------------------


def test_completion_without_streaming(server):
    reply = post(server, "/v1/completions", {"model": server.model, "prompt": "one two three four", "max_tokens": 7})
    assert reply.status_code == 200
    body = reply.json()
    choice = body["choices"][0]
    assert body["object"] == "text_completion" and body["model"] == server.model
    assert len(choice["text"].split()) == 7 and choice["finish_reason"] == "length"
    # the prompt estimate: one token per word
    assert body["usage"] == {"prompt_tokens": 4, "total_tokens": 11, "completion_tokens": 7}


def test_streaming_completion_with_usage(server):
    body = {"prompt": "a b c", "max_tokens": 12, "stream": True, "stream_options": {"include_usage": True}}
    with post(server, "/v1/completions", body, stream=True) as reply:
        assert reply.status_code == 200 and reply.headers["Content-Type"].startswith("text/event-stream")
        events = sse_events(reply)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    usage, tokens = chunks[-1], chunks[:-1]
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 15,
        "completion_tokens": 12,
    }
    assert all(c["usage"] is None and c["object"] == "text_completion" for c in tokens)
    text = "".join(c["choices"][0]["text"] for c in tokens)
    assert len(text.split()) == 12
    # tokens arrive as the engine makes them: more than one event, and only the last one finishes
    assert len(tokens) > 1
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * (len(tokens) - 1) + ["length"]


def test_streaming_chat_names_the_role_first_and_sends_no_usage_unasked(server):
    body = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 5, "stream": True}
    with post(server, "/v1/chat/completions", body, stream=True) as reply:
        events = sse_events(reply)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" and c["choices"] for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert len(text.split()) == 5 and chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_chat_without_streaming_honours_max_completion_tokens(server):
    body = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "three more words"}]},
        ],
        "max_completion_tokens": 4,
    }
    reply = post(server, "/v1/chat/completions", body)
    assert reply.status_code == 200
    data = reply.json()
    assert data["object"] == "chat.completion" and data["choices"][0]["message"]["role"] == "assistant"
    assert data["usage"] == {"prompt_tokens": 5, "total_tokens": 9, "completion_tokens": 4}


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        ("/v1/completions", {"prompt": "x", "max_tokens": 9000}, 400, "maximum context length is 8192 tokens"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 3, "min_tokens": 5}, 400, "min_tokens"),
        ("/v1/completions", {"max_tokens": 3}, 400, "prompt"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages"),
        ("/v1/completions", {"model": "gpt-4", "prompt": "x"}, 404, "does not exist"),
    ],
)
def test_bad_requests_are_refused_like_vllm(server, path, body, status, fragment):
    reply = post(server, path, body)
    assert reply.status_code == status
    error = reply.json()["error"]
    assert fragment in error["message"] and error["code"] == status


def test_invalid_json_is_a_400(server):
    reply = requests.post(server.url + "/v1/completions", data=b"{not json", timeout=10)
    assert reply.status_code == 400 and "JSON" in reply.json()["error"]["message"]


def test_health_models_and_version(server):
    assert requests.get(server.url + "/health", timeout=10).status_code == 200
    models = requests.get(server.url + "/v1/models", timeout=10).json()
    assert models["data"][0]["id"] == server.model and models["data"][0]["max_model_len"] == 8192
    assert requests.get(server.url + "/version", timeout=10).json()["version"].startswith("0.33.0")


def test_eos_honours_ignore_eos_and_min_tokens():
    config = SimConfig(EngineConfig(HEALTHY_DEPLOYMENT), stop_after_tokens=3)
    with SimServer(config) as sim:

        def finish(**params) -> tuple[int, str]:
            choice = post(sim, "/v1/completions", {"prompt": "x", "max_tokens": 10, **params}).json()
            return len(choice["choices"][0]["text"].split()), choice["choices"][0]["finish_reason"]

        assert finish() == (3, "stop")
        assert finish(ignore_eos=True) == (10, "length")
        assert finish(min_tokens=6) == (6, "stop")
        assert finish(max_tokens=2) == (2, "length")


def test_queue_cap_answers_503_and_disconnects_abort():
    # each step takes 50 ms more than the physics, so the two admitted streams run for seconds
    engine = EngineConfig(HEALTHY_DEPLOYMENT, max_num_queued_reqs=2, extra_step_overhead_seconds=0.05)
    with SimServer(engine) as sim:
        body = {"prompt": "hold the line", "max_tokens": 200, "stream": True}
        held = [post(sim, "/v1/completions", body, stream=True) for _ in range(2)]
        # keep the line iterators: dropping one makes urllib3 close its connection, i.e. the client goes away
        lines = [reply.iter_lines() for reply in held]
        for reply, stream in zip(held, lines, strict=True):
            assert reply.status_code == 200
            next(stream)  # it is running
        rejected = post(sim, "/v1/completions", {"prompt": "one more", "max_tokens": 5})
        assert rejected.status_code == 503
        assert rejected.json()["error"] == {
            "message": BUSY_MESSAGE,
            "type": "Service Unavailable",
            "param": None,
            "code": 503,
        }
        for reply in held:
            reply.close()  # the clients go away
        # a request aborted while its step is on the GPU leaves the batch when that step ends
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and sim.snapshot()["running"]:
            time.sleep(0.05)
        stats = sim.snapshot()
        assert stats["request_success"]["abort"] == 2 and stats["running"] == 0
        assert stats["free_blocks"] == stats["num_gpu_blocks"] - 1  # every block came back
        page = requests.get(sim.metrics_url, timeout=10).text
    model = 'model_name="meta-llama/Meta-Llama-3-8B"'
    assert f'vllm:admission_rejections_total{{{model},reason="max_num_queued_reqs"}} 1.0' in page
    assert f'vllm:request_success_total{{engine="0",finished_reason="abort",{model}}} 2.0' in page


def test_shutdown_ends_open_streams_and_frees_the_port():
    sim = SimServer("healthy").start()
    url = sim.url
    reply = post(sim, "/v1/completions", {"prompt": "x", "max_tokens": 5000, "stream": True}, stream=True)
    lines = reply.iter_lines()
    next(lines)
    started = time.monotonic()
    sim.stop()
    assert time.monotonic() - started < 10
    reply.close()
    with pytest.raises(requests.ConnectionError):
        requests.get(url + "/health", timeout=5)


# --- the pages llmdiag reads --------------------------------------------------------------------------------


def families(text: str) -> dict[str, tuple[str, str, set[tuple[str, frozenset[str]]]]]:
    """name → (type, HELP, {(sample name, label names)}) for the vLLM families of a page."""
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("vllm:"):
            shapes = {(s.name, frozenset(s.labels)) for s in family.samples}
            out[family.name] = (family.type, family.documentation, shapes)
    return out


def test_metrics_page_has_the_shape_of_a_real_vllm_page(server):
    recorded = (FIXTURES / "vllm-0.32.0" / "healthy" / "scrape-01.prom").read_text().split("\n", 1)[1]
    real, ours = families(recorded), families(requests.get(server.metrics_url, timeout=10).text)
    assert set(real) <= set(ours), f"missing: {sorted(set(real) - set(ours))}"
    for name, (kind, help_text, shapes) in real.items():
        assert ours[name][0] == kind, name
        assert ours[name][1] == help_text, name
        assert ours[name][2] == shapes, name  # same samples (_bucket/_sum/_count/_total/_created), same labels


def test_metrics_page_is_read_by_the_vllm_probe(server):
    spec = load_probe("vllm")
    pages = []
    with ClosedLoopLoad(server.url, server.model, LoadSpec(8, 64, 32), max_seconds=15):
        time.sleep(1.0)
        for _ in range(3):
            pages.append(parse_exposition(requests.get(server.metrics_url, timeout=10).text, time.time()))
            time.sleep(1.0)
    check_server(spec, pages[0], server.metrics_url)
    signals = build_signal_set(spec, pages, server.metrics_url)
    for name in CORE_SIGNALS:
        assert signals.get(name).unavailable is None, (name, signals.get(name).unavailable)
    assert signals.get("generation_tokens_per_second").stats["rate"] > 0
    assert signals.get("requests_running").stats["max"] >= 1
    assert signals.get("kv_cache_blocks").stats["value"] == 28_834
    assert signals.get("kv_cache_block_size_tokens").stats["value"] == 16
    assert not signals.anomalies
    source = signals.sources[0]
    assert source.models == [server.model] and source.engines == ["0"]


def test_closed_loop_load_reads_whole_streams(server):
    stats = run_for(server, LoadSpec(users=4, prompt_tokens=16, output_tokens=8), seconds=1.5)
    assert stats.ok > 0 and not stats.errors and stats.rejected == 0
    assert stats.completion_tokens == 8 * stats.ok


# --- presets: put in a state, scanned by the CLI -------------------------------------------------------------


def scan_preset(name: str, tmp_path) -> dict:
    """`llmdiag demo --preset NAME`: the simulator in that state, its load, and a scan, as a user runs it."""
    report = tmp_path / "demo.json"
    result = run_cli("demo", "--preset", name, "--duration", SCAN_SECONDS, "--json", "-o", str(report), timeout=90)
    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout)
    assert json.loads(report.read_text()) == verdict  # the report file holds the same verdict
    return verdict


def stat(verdict: dict, signal: str, name: str) -> float:
    entry = verdict["signals"][signal]
    assert entry.get("unavailable") is None, (signal, entry.get("unavailable"))
    return entry["stats"][name]


def describe(verdict: dict) -> str:
    findings = [(f["code"], f["severity"], f["summary"]) for f in verdict["findings"]]
    return f"{verdict['bottleneck']}: {verdict['summary']}\nfindings {findings}"


def primary(verdict: dict) -> dict:
    classed = [f for f in verdict["findings"] if f["category"] != "sanity"]
    assert classed, describe(verdict)
    return classed[0]


def test_preset_healthy_scans_healthy(tmp_path):
    verdict = scan_preset("healthy", tmp_path)
    assert verdict["bottleneck"] == "healthy", describe(verdict)
    # the demo reads the simulator's DCGM page too and sends canary requests, and neither GPU telemetry nor the
    # canaries turn a healthy server into a finding
    assert [p["probe"] for p in verdict["coverage"]["probes"]] == ["vllm", "dcgm", "canary"]
    assert verdict["experience"]["client_requests"] >= 3
    network = next(c for c in verdict["coverage"]["classes"] if c["category"] == "network")
    assert network["evaluated"], network
    assert stat(verdict, "sm_active_ratio", "mean") > 0
    assert not [f for f in verdict["findings"] if f["category"] != "sanity"]
    assert stat(verdict, "generation_tokens_per_second", "rate") > 0
    assert stat(verdict, "preemptions_per_second", "rate") == 0
    assert stat(verdict, "requests_waiting", "max") <= 4


def test_preset_memory_scans_memory(tmp_path):
    verdict = scan_preset("memory", tmp_path)
    assert verdict["bottleneck"] == "memory", describe(verdict)
    finding = primary(verdict)
    assert finding["code"] == "MEM001" and finding["severity"] == "critical"
    assert stat(verdict, "preemptions_per_second", "rate") > 0
    assert stat(verdict, "kv_cache_usage_ratio", "max") >= 0.9
    assert stat(verdict, "requests_waiting", "max") >= 1


def test_preset_compute_scans_compute(tmp_path):
    verdict = scan_preset("compute", tmp_path)
    assert verdict["bottleneck"] == "compute", describe(verdict)
    # the step is proven the wall: HBM busy on the simulator's DCGM page (CMP004), decode near the ceiling (CMP008);
    # the SLO breach (CMP001) is said beside them, never as the class
    assert primary(verdict)["code"] in ("CMP004", "CMP008")
    codes = {f["code"]: f for f in verdict["findings"]}
    assert "CMP008" in codes and codes["CMP001"]["advisory"]
    assert stat(verdict, "itl_seconds", "mean") >= 0.05
    assert stat(verdict, "kv_cache_usage_ratio", "max") < 0.8
    assert stat(verdict, "preemptions_per_second", "rate") == 0
    # the demo knows the deployment (Llama 3 8B on an L4), so the verdict says which wall: HBM, not math
    roofline = verdict["roofline"]
    assert (roofline["gpu"], roofline["model"]) == ("L4", "llama-3-8b")
    assert roofline["bound_by"] == "hbm_bandwidth"
    assert 0.5 <= roofline["fraction_of_ceiling_ratio"] <= 1.1, roofline
    assert roofline["measured_tokens_per_second"] == stat(verdict, "generation_tokens_per_second", "rate")


def test_preset_scheduling_scans_scheduling(tmp_path):
    verdict = scan_preset("scheduling", tmp_path)
    assert verdict["bottleneck"] == "scheduling", describe(verdict)
    assert primary(verdict)["code"] in ("SCH001", "SCH002")
    assert {f["code"] for f in verdict["findings"]} >= {"SCH001"}
    assert stat(verdict, "requests_running", "max") == PRESETS["scheduling"].engine.max_num_seqs
    assert stat(verdict, "requests_waiting", "mean") >= 4
    assert stat(verdict, "kv_cache_usage_ratio", "max") < 0.8
    assert stat(verdict, "itl_seconds", "mean") < 0.05


def test_preset_network_scans_network(tmp_path):
    verdict = scan_preset("network", tmp_path)
    assert verdict["bottleneck"] == "network", describe(verdict)
    finding = primary(verdict)
    assert finding["code"] == "NET001" and finding["severity"] == "critical", describe(verdict)
    evidence = {(e["signal"], e["stat"]): e for e in finding["evidence"]}
    busy = evidence[("gpu_utilization_ratio", "mean")]["value"]
    sm_active = evidence[("sm_active_ratio", "mean")]["value"]
    assert busy >= 0.9 and sm_active <= 0.5
    # the share of busy time the SMs sat idle, from the two DCGM gauges the exporter page gave
    assert evidence[("sm_idle_while_gpu_busy_ratio", "value")]["value"] == pytest.approx(1 - sm_active / busy)
    link = PRESETS["network"].deployment.link
    assert evidence[("interconnect_bytes_per_second", "value")]["value"] >= 0.2 * link.bandwidth_bytes_per_second
    assert evidence[("pcie_tx_bytes_per_second", "mean")]["source"].startswith("dcgm /metrics: DCGM_FI_PROF_PCIE")
    assert evidence[("nvlink_tx_bytes_per_second", "mean")]["value"] is None  # a PCIe box: no NVLink fields
    # every network rule is still in preview: the class is named with confidence, and the preview factor says so
    assert verdict["confidence"] >= 0.5 and verdict["confidence_factors"]["preview"]["value"] == 1.0, describe(verdict)
    assert any(note.startswith("NET001 is a preview rule") for note in verdict["notes"])


def test_scan_with_dcgm_url_reads_the_simulators_exporter_page_over_loopback():
    """`llmdiag scan URL --dcgm-url URL` as a Kubernetes user runs it: the server and its GPUs' exporter page."""
    preset = get_preset("network")
    with SimServer(preset) as sim, ClosedLoopLoad(sim.url, sim.model, preset.load, max_seconds=60):
        time.sleep(WARMUP_SECONDS)
        result = run_cli(
            "scan",
            sim.url,
            "--dcgm-url",
            sim.dcgm_url,
            "--no-nvml",
            "--duration",
            SCAN_SECONDS,
            "--json",
            "--fail-on",
            "never",
            timeout=90,
        )
    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["bottleneck"] == "network", describe(verdict)
    assert primary(verdict)["code"] == "NET001"
    [dcgm] = [p for p in verdict["coverage"]["probes"] if p["probe"] == "dcgm"]
    assert dcgm["ok"] and dcgm["url"] == sim.dcgm_url
    assert verdict["signals"]["sm_clock_hertz"]["stats"]["min"] > 0  # a default exporter field, read live


def test_preset_network_shows_busy_links_and_idle_sms_on_the_dcgm_page():
    preset = get_preset("network")
    with SimServer(preset) as sim, ClosedLoopLoad(sim.url, sim.model, preset.load, max_seconds=30):
        time.sleep(WARMUP_SECONDS)
        page = requests.get(sim.dcgm_url, timeout=10).text
    scrape = parse_exposition(page, time.time())

    def per_gpu(field: str) -> list[float]:
        values = list(scrape.series[field].values())
        assert len(values) == preset.deployment.tp, field  # one series per tensor-parallel rank
        return values

    link = preset.deployment.link
    assert link.name == "pcie4" and "DCGM_FI_PROF_NVLINK_TX_BYTES" not in scrape.series
    for tx, rx in zip(per_gpu("DCGM_FI_PROF_PCIE_TX_BYTES"), per_gpu("DCGM_FI_PROF_PCIE_RX_BYTES"), strict=True):
        assert tx == rx >= 0.2 * link.bandwidth_bytes_per_second  # the all-reduces keep the link busy
    assert all(v >= 90 for v in per_gpu("DCGM_FI_DEV_GPU_UTIL"))  # something always runs …
    assert all(v <= 0.5 for v in per_gpu("DCGM_FI_PROF_SM_ACTIVE"))  # … but mostly not the model's kernels
    assert all(v <= 0.5 for v in per_gpu("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"))
    labels = {dict(key)["gpu"]: dict(key) for key in scrape.series["DCGM_FI_DEV_GPU_UTIL"]}
    assert sorted(labels) == [str(i) for i in range(8)]
    assert {"UUID", "Hostname", "modelName", "pci_bus_id", "device"} <= set(labels["0"])


def test_every_preset_carries_a_bounded_load_and_builds():
    assert set(PRESETS) == {"healthy", "memory", "compute", "scheduling", "network"}
    for name, preset in PRESETS.items():
        assert preset.expected == name and preset.load.users <= 64
        assert preset.engine.num_gpu_blocks > 1
        prompt, (_, longest) = preset.load.prompt_tokens, preset.load.output_range()
        assert prompt + longest <= preset.engine.max_model_len


def test_scan_without_a_server_scans_the_demo(tmp_path):
    """The README's main command: `llmdiag scan` with no URL diagnoses the built-in demo server."""
    result = run_cli("scan", "--duration", "6", "--json")  # exit 0: the demo is bottlenecked on purpose
    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["bottleneck"] == "scheduling"
    assert verdict["target"].startswith("llmdiag demo --preset scheduling")
    assert verdict["findings"][0]["code"] in ("SCH001", "SCH002")
