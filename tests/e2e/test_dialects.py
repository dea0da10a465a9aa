"""Other servers than vLLM: the simulator in each dialect scanned live, server detection, and hand-assembled pages
of each server (tests/fixtures/SERVERS-README.md) read through their probe specs.

The live tests run the simulator in SGLang's, TGI's and llama.cpp's dialect, in the same presets as the vLLM tests,
and scan it with the CLI as a user would (``llmdiag scan URL``, no --server): the server must be detected, and the
verdict must be the same class as vLLM's where the server exposes the signals. TGI and llama.cpp have no TTFT
histogram: the canary requests' client-side TTFT stands in for the healthy judgement, and the verdict says so. llama.cpp
(a recent build) has no KV gauge: its mean time per output token comes from its generation counters and its slot count
from /props; requests deferred with every slot busy are scheduling (SCH010), requests deferred with free slots stay
unknown, naming the missing KV gauge (README, Servers).
"""

from __future__ import annotations

import json
import time

import pytest

from llmdiag.api import diagnose_files
from llmdiag.client.endpoint import Connection
from llmdiag.collect.detect import detect_live, server_names
from llmdiag.sim.dialects import dialect_names, get_dialect
from llmdiag.sim.load import ClosedLoopLoad
from llmdiag.sim.presets import get_preset
from llmdiag.sim.server import SimServer
from tests.conftest import FIXTURES, run_cli
from tests.support.httpserver import Reply, ScriptedServer
from tests.support.simlag import run_cli_on_sim

SCAN_SECONDS = "5"
WARMUP_SECONDS = 2.0


def scan_dialect(dialect: str, preset_name: str, *extra: str) -> dict:
    preset = get_preset(preset_name)
    # the load outlasts two scans on a starved host
    with SimServer(preset, dialect=dialect) as sim, ClosedLoopLoad(sim.url, sim.model, preset.load, max_seconds=150):
        time.sleep(WARMUP_SECONDS)
        scan = ("scan", sim.url, "--no-nvml", "--duration", SCAN_SECONDS, "--json", "--fail-on", "never", *extra)
        result = run_cli_on_sim(sim, *scan, timeout=90)  # once more if a starved host stopped the simulator's clock
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def stat(verdict: dict, signal: str, name: str) -> float:
    entry = verdict["signals"][signal]
    assert entry.get("unavailable") is None, (signal, entry.get("unavailable"))
    return entry["stats"][name]


def describe(verdict: dict) -> str:
    return f"{verdict['bottleneck']}: {[(f['code'], f['severity']) for f in verdict['findings']]}"


def server_note(verdict: dict) -> str:
    return verdict["coverage"]["probes"][0]["note"]


def codes(verdict: dict) -> set[str]:
    return {f["code"] for f in verdict["findings"]}


def test_registry_knows_every_dialect_and_refuses_others():
    assert {"vllm", "sglang", "tgi", "llamacpp"} <= set(dialect_names())
    assert {"vllm", "sglang", "tgi", "llamacpp"} <= set(server_names())
    with pytest.raises(Exception, match="unknown simulator dialect"):
        get_dialect("ollama")


# --- live: each dialect × preset, the same class as vLLM ---------------------------------------------------------


@pytest.mark.parametrize("dialect", ["sglang", "tgi"])
def test_memory_preset_is_memory(dialect):
    verdict = scan_dialect(dialect, "memory")
    assert verdict["bottleneck"] == "memory", describe(verdict)
    assert stat(verdict, "kv_cache_usage_ratio", "max") >= 0.9
    assert stat(verdict, "requests_waiting", "max") >= 1
    if dialect == "sglang":  # retractions are SGLang's preemptions
        assert "MEM001" in codes(verdict)
        assert stat(verdict, "preemptions_per_second", "rate") > 0
        assert verdict["signals"]["preemptions_per_second"]["source"].endswith("sglang:num_retracted_requests_total")
    else:  # TGI never preempts: the KV-full-with-a-queue rule speaks, and the zero is by design, not measured
        assert "MEM003" in codes(verdict)
        assert stat(verdict, "preemptions_per_second", "rate") == 0
        assert "by design" in verdict["signals"]["preemptions_per_second"]["source"]
        assert "tgi_batch_max_total_tokens" in verdict["signals"]["kv_cache_usage_ratio"]["source"]
    assert server_note(verdict).startswith(f"server: detected {'SGLang' if dialect == 'sglang' else 'TGI'}")


@pytest.mark.parametrize("dialect", ["sglang", "tgi"])
def test_scheduling_preset_is_scheduling(dialect):
    verdict = scan_dialect(dialect, "scheduling")
    assert verdict["bottleneck"] == "scheduling", describe(verdict)
    assert "SCH001" in codes(verdict)
    cap = get_preset("scheduling").engine.max_num_seqs
    assert stat(verdict, "requests_running", "max") == cap
    assert stat(verdict, "requests_waiting", "mean") >= 4
    assert stat(verdict, "kv_cache_usage_ratio", "max") < 0.8
    assert stat(verdict, "itl_seconds", "mean") < 0.05


@pytest.mark.parametrize("dialect", ["sglang", "tgi", "llamacpp"])
def test_healthy_preset_is_healthy(dialect):
    verdict = scan_dialect(dialect, "healthy")
    assert not [f for f in verdict["findings"] if f["category"] != "sanity"], describe(verdict)
    assert verdict["bottleneck"] == "healthy", describe(verdict)
    assert stat(verdict, "requests_running", "max") >= 30  # the preset's 32 users
    assert stat(verdict, "requests_waiting", "mean") < 1
    if dialect == "sglang":
        assert stat(verdict, "ttft_seconds", "p50") < 0.1
        return
    # no server-side TTFT histogram on TGI or llama.cpp: the canary requests' TTFT stands in, and the verdict says so
    assert "ttft_seconds" not in verdict["signals"]
    assert 0 < stat(verdict, "client_ttft_seconds", "p50") < 0.1
    assert "(llmdiag's canary requests)" in verdict["summary"]
    assert any(
        n.startswith("TTFT from llmdiag's own canary requests") and n.endswith("the server exposes none")
        for n in verdict["notes"]
    ), verdict["notes"]
    if dialect == "tgi":  # TGI counts requests, not tokens
        assert stat(verdict, "requests_finished_per_second", "rate") > 0
        assert stat(verdict, "kv_cache_usage_ratio", "max") < 0.1
    else:  # llama.cpp: the KV gauge is gone; an empty queue on a server that never preempts stands in, said so
        assert stat(verdict, "generation_tokens_per_second", "rate") > 0
        assert any(n.startswith("KV cache usage unavailable") and "never preempts" in n for n in verdict["notes"])
        itl = verdict["signals"]["itl_seconds"]
        assert "tokens_predicted_seconds_total" in itl["source"]
        assert 0 < itl["stats"]["mean"] < 0.02  # the healthy deployment's ~7 ms steps
        assert itl["stats"]["mean"] == pytest.approx(stat(verdict, "client_tpot_seconds", "p50"), rel=0.5)


def deployment_flags(preset_name: str) -> tuple[str, ...]:
    """--gpu/--model-shape/--tp of the preset's simulated deployment: slow steps are a compute verdict only with proof
    that the step is the wall, here the decode rate placed under the deployment's ceiling (CMP008)."""
    dep = get_preset(preset_name).deployment
    return ("--gpu", dep.gpu.name, "--model-shape", dep.model.name, "--tp", str(dep.tp))


def test_sglang_compute_preset_is_compute():
    verdict = scan_dialect("sglang", "compute", *deployment_flags("compute"))
    assert verdict["bottleneck"] == "compute", describe(verdict)
    assert {"CMP001", "CMP008"} <= codes(verdict)
    assert stat(verdict, "roofline_fraction_ratio", "value") >= 0.5
    assert stat(verdict, "itl_seconds", "mean") >= 0.05
    assert stat(verdict, "kv_cache_usage_ratio", "max") < 0.8


def test_the_model_shape_from_its_config_json_places_the_same_ceiling(tmp_path):
    """--model-config: the served model's Hugging Face config.json (here the table's own verbatim copy of the
    preset's model) gives the same shape, so the same ceiling and the same proof, as --model-shape."""
    import tomllib

    from tests.conftest import REPO_ROOT

    dep = get_preset("compute").deployment
    table = tomllib.loads((REPO_ROOT / "probes" / "tables" / "models.toml").read_text())
    config = next(m["config"] for m in table["model"] if m["name"] == dep.model.name)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    flags = ("--gpu", dep.gpu.name, "--model-config", str(path), "--tp", str(dep.tp))
    verdict = scan_dialect("sglang", "compute", *flags)
    assert verdict["bottleneck"] == "compute", describe(verdict)
    assert "CMP008" in codes(verdict)
    roofline = verdict["roofline"]
    assert roofline["ceiling_tokens_per_second"] > roofline["measured_tokens_per_second"] > 0


def test_tgi_compute_preset_is_compute_without_a_token_counter():
    """TGI has no output-token counter: the decode rate placed under the ceiling is its running requests over its
    mean step (one token per running request a step), and that proves the step is the wall."""
    verdict = scan_dialect("tgi", "compute", *deployment_flags("compute"))
    assert verdict["bottleneck"] == "compute", describe(verdict)
    assert {"CMP001", "CMP008"} <= codes(verdict)
    roofline = verdict["roofline"]
    assert roofline["measured_tokens_per_second"] == pytest.approx(
        stat(verdict, "requests_running_avg", "value") / stat(verdict, "itl_seconds", "mean")
    )
    assert stat(verdict, "itl_seconds", "mean") >= 0.05


@pytest.mark.parametrize("dialect", ["llamacpp", "triton"])
def test_compute_preset_without_request_lengths_is_the_slo_breach_only(dialect):
    """llama.cpp and Triton give no prompt or output lengths, so the decode rate cannot be placed under the ceiling,
    and a steady batch gives nothing to fit the step against: their mean step still names the slow decode as the
    SLO breach (CMP001, judging a missing KV gauge by the preemption gate alone), never as a proven compute wall,
    and never as healthy: the verdict is unknown and says the breach with its numbers."""
    verdict = scan_dialect(dialect, "compute", *deployment_flags("compute"))
    assert verdict["bottleneck"] == "unknown", describe(verdict)
    cmp001 = next(f for f in verdict["findings"] if f["code"] == "CMP001")
    assert cmp001["advisory"]
    assert verdict["signals"]["step_wall_proofs_count"]["unavailable"]
    itl = stat(verdict, "itl_seconds", "mean")
    assert itl >= 0.05
    assert f"tokens come {itl:.3f} s apart" in verdict["summary"], describe(verdict)


@pytest.mark.parametrize("dialect", ["sglang", "tgi", "llamacpp", "trtllm", "triton"])
def test_network_preset_is_network_with_the_gpu_page(dialect):
    """The network state shows on the GPUs (busy but idle SMs, NVLink/PCIe traffic): with the simulator's DCGM page
    every dialect names it; llama.cpp's tokens, counted only as requests end, are no reason to call it stalled."""
    preset = get_preset("network")
    with SimServer(preset, dialect=dialect) as sim, ClosedLoopLoad(sim.url, sim.model, preset.load, max_seconds=150):
        time.sleep(WARMUP_SECONDS)
        result = run_cli_on_sim(
            sim,
            "scan",
            sim.url,
            "--no-nvml",
            "--duration",
            SCAN_SECONDS,
            "--json",
            "--fail-on",
            "never",
            "--dcgm-url",
            sim.dcgm_url,
            timeout=90,
        )
    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["bottleneck"] == "network", describe(verdict)
    assert "NET001" in codes(verdict) and "SCH003" not in codes(verdict)


def test_llamacpp_memory_preset_says_it_cannot_see_the_kv_cache():
    """A recent llama.cpp has no KV gauge: requests deferred while slots are free are not a slot limit, and what else
    holds them back cannot be seen. The verdict stays unknown and names the missing gauge; it never guesses memory."""
    verdict = scan_dialect("llamacpp", "memory")
    assert verdict["bottleneck"] == "unknown", describe(verdict)
    assert not [f for f in verdict["findings"] if f["category"] != "sanity"], describe(verdict)
    kv = verdict["signals"]["kv_cache_usage_ratio"]
    assert "PR #13660" in kv["unavailable"]
    waiting = stat(verdict, "requests_waiting", "mean")
    assert waiting >= 5  # the deferred requests are seen
    slots = get_preset("memory").engine.max_num_seqs
    assert stat(verdict, "max_active_requests", "value") == slots  # /props total_slots
    assert stat(verdict, "batch_slots_in_use_ratio", "value") < 0.2
    summary = verdict["summary"]
    assert summary.startswith("Unknown: ") and f"of {slots} slots busy" in summary and "PR #13660" in summary
    assert "missing kv_cache_usage_ratio" in summary
    sch010 = next(r for r in verdict["coverage"]["rules"] if r["code"] == "SCH010")
    assert sch010["status"] == "passed" and "batch_slots_in_use_ratio" in sch010["reason"]
    assert "llama.cpp" in server_note(verdict) and "canary" in server_note(verdict)


def test_llamacpp_scheduling_preset_is_every_slot_busy():
    """Deferred requests with every --parallel slot busy and fast steps: the slot limit (SCH010, standing in for
    SCH001, which needs the KV gauge)."""
    verdict = scan_dialect("llamacpp", "scheduling")
    assert verdict["bottleneck"] == "scheduling", describe(verdict)
    assert [f["code"] for f in verdict["findings"] if f["category"] != "sanity"] == ["SCH010"]
    cap = get_preset("scheduling").engine.max_num_seqs
    numbers = {e["signal"]: e["value"] for e in verdict["findings"][0]["evidence"]}
    assert numbers["requests_waiting_avg"] >= 20
    assert numbers["batch_slots_in_use_ratio"] == 1.0
    assert numbers["max_active_requests"] == numbers["requests_running"] == cap
    assert numbers["itl_seconds"] < 0.05
    assert numbers["preemptions_per_second"] == 0
    sch001 = next(r for r in verdict["coverage"]["rules"] if r["code"] == "SCH001")
    assert sch001["status"] == "skipped" and "kv_cache_usage_ratio" in sch001["reason"]
    assert any("--parallel" in fix for fix in verdict["findings"][0]["fixes"])


# --- detection ------------------------------------------------------------------------------------------------


def test_detection_reasons_and_override():
    with SimServer("healthy", dialect="llamacpp") as sim:
        found = detect_live(Connection(base_url=sim.url))
        assert found.probe == "llamacpp"
        assert found.reason == f"10 metric names on {sim.metrics_url} start with 'llamacpp:'"
        # a page at another URL that is none of theirs: the headers, endpoints and /v1/models still tell
        bare = detect_live(Connection(base_url=sim.url, metrics_url=f"{sim.url}/dcgm/metrics"))
        assert bare.probe == "llamacpp" and "header 'server: llama.cpp'" in bare.reason
    with SimServer("healthy", dialect="tgi") as sim:
        found = detect_live(Connection(base_url=sim.url, metrics_url=f"{sim.url}/dcgm/metrics"))
        assert found.probe == "tgi" and found.reason == "/info answered JSON with 'router' = 'text-generation-router'"
    with SimServer("healthy", dialect="sglang") as sim:
        found = detect_live(Connection(base_url=sim.url, metrics_url=f"{sim.url}/dcgm/metrics"))
        assert found.probe == "sglang"  # /get_model_info, or /v1/models' owned_by
    with SimServer("healthy") as sim:
        found = detect_live(Connection(base_url=sim.url))
        assert found.probe == "vllm" and found.version == "0.33.0+llmdiag.sim"
        # --server overrides detection, and a page that is not that server's is refused as before
        result = run_cli("scan", sim.url, "--server", "sglang", "--no-nvml", "--no-probe", "--duration", "2")
        assert result.returncode == 2
        assert "none from SGLang" in result.stderr
        result = run_cli("scan", sim.url, "--server", "ollama", "--duration", "2")
        assert result.returncode == 2 and "--server ollama: unknown server" in result.stderr


def test_unrecognised_server_is_one_clear_error():
    with SimServer("healthy") as sim:  # the DCGM page: Prometheus, but no inference server's names
        result = run_cli("scan", sim.url, "--metrics-url", f"{sim.url}/dcgm/metrics", "--no-nvml", "--duration", "2")
    # the simulator's /v1/models says owned_by vllm: detection falls back to it, and the scan then says the page
    # is not vLLM's
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[0].startswith("ERROR:") and "none from vLLM" in lines[0]


# --- hand-assembled pages (tests/fixtures/SERVERS-README.md) ------------------------------------------------


def test_sglang_pages_fold_tp_copies_and_find_dp_imbalance():
    verdict = diagnose_files(sorted((FIXTURES / "sglang").glob("*.prom")))
    assert verdict.signals["requests_running"].stats["max"] == 34  # 31 + 3: dp ranks summed, tp copies once
    assert verdict.signals["requests_running"].by_series.keys() == {
        "dp_rank=0,model_name=meta-llama/Llama-3.1-8B-Instruct",
        "dp_rank=1,model_name=meta-llama/Llama-3.1-8B-Instruct",
    }
    imbalance = verdict.signals["engine_load_imbalance_ratio"].stats["value"]
    assert imbalance == pytest.approx((31 + 14 + 30 + 12) / 2 / ((31 + 14 + 30 + 12 + 3 + 4) / 4), rel=1e-6)
    assert "SCH005" in {f.code for f in verdict.findings}
    assert verdict.signals["preemptions_per_second"].stats["rate"] == 0  # retraction counter flat in the window
    assert "detected SGLang" in verdict.coverage.probes[0].note


def test_tgi_pages_read_the_token_budget_as_kv_usage():
    verdict = diagnose_files(sorted((FIXTURES / "tgi").glob("*.prom")))
    assert verdict.signals["kv_cache_usage_ratio"].stats["max"] == pytest.approx(159500 / 160000)
    assert verdict.signals["requests_waiting"].stats["mean"] == 10
    assert verdict.signals["requests_finished_per_second"].stats["rate"] == pytest.approx(9.0)
    assert verdict.bottleneck.value == "memory"
    assert "MEM003" in {f.code for f in verdict.findings}


def test_llamacpp_pages_say_the_kv_gauge_is_gone():
    verdict = diagnose_files(sorted((FIXTURES / "llamacpp").glob("*.prom")))
    assert "PR #13660" in verdict.signals["kv_cache_usage_ratio"].unavailable
    assert verdict.signals["requests_waiting"].stats["mean"] == 6.5
    assert verdict.signals["generation_tokens_per_second"].stats["rate"] == pytest.approx(160.0)
    # summed slot time per generated token: the mean time per output token, 40 s / 1600 tokens
    assert verdict.signals["generation_busy_seconds_per_second"].stats["rate"] == pytest.approx(4.0)
    assert verdict.signals["itl_seconds"].stats["mean"] == pytest.approx(40 / 1600)
    assert "total_slots" in verdict.signals["max_active_requests"].unavailable  # a saved page has no /props
    assert verdict.bottleneck.value == "unknown"
    assert "missing kv_cache_usage_ratio" in verdict.summary


def test_analyze_server_override_and_unrecognised_dump(tmp_path):
    dump = tmp_path / "other.prom"
    dump.write_text("# TYPE go_goroutines gauge\ngo_goroutines 5\n")
    result = run_cli("analyze", str(dump))
    assert result.returncode == 2
    assert "unsupported or unrecognised server" in result.stderr and "go_goroutines" in result.stderr
    pages = [str(p) for p in sorted((FIXTURES / "tgi").glob("*.prom"))]
    result = run_cli("analyze", *pages, "--server", "tgi", "--json", "--fail-on", "never")
    assert result.returncode == 0, result.stderr
    assert "--server tgi given" in json.loads(result.stdout)["coverage"]["probes"][0]["note"]


def test_sglang_without_enable_metrics_says_which_flag():
    """SGLang started without --enable-metrics: /metrics answers 404, /v1/models' owned_by names SGLang. One ERROR
    line and one HINT line naming the flag, exit 2."""

    def sglang_without_metrics(path: str, headers: dict[str, str]) -> Reply:
        if path.startswith("/v1/models"):
            body = {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "sglang"}]}
            return Reply(body=json.dumps(body).encode(), content_type="application/json")
        return Reply(status=404, body=b'{"detail":"Not Found"}', content_type="application/json")

    with ScriptedServer(sglang_without_metrics) as server:
        result = run_cli("scan", server.url, "--no-nvml", "--no-probe", "--duration", "2")
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 2, lines
    assert lines[0].startswith("ERROR:") and "HTTP 404" in lines[0] and "SGLang answers" in lines[0]
    assert lines[1].startswith("HINT:") and "--enable-metrics" in lines[1]
