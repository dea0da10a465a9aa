"""The matched A/B end to end through the CLI, on the built-in simulator: record a workload with its baseline run,
replay it on the same simulated server (every interval covers 0), replay it on the server without its batch cap
(the intervals move the way the physics says), and refuse a server that serves another model.

The physics, independently of llmdiag's rules: the `scheduling` preset is the `healthy` deployment (Llama 3 8B on
one H100) capped at 4 sequences. With 16 closed-loop users, 12 wait for a slot, so a request's first token waits
for about three others to finish; without the cap all 16 decode at once, at a step only slightly longer (decode
is bandwidth-bound: the weights are read once per step whatever the batch). So TTFT collapses, total tokens/s
rises towards 16/4 = 4×, and streaming speed per user stays about the same.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from llmdiag.client.endpoint import Connection
from llmdiag.collect.load import LoadPlan, server_facts
from llmdiag.sim.dialect_llamacpp import BUILD as LLAMACPP_BUILD
from llmdiag.sim.dialect_sglang import SGLANG_VERSION
from llmdiag.sim.dialect_tgi import TGI_VERSION
from llmdiag.sim.dialect_trtllm import TRTLLM_VERSION
from llmdiag.sim.dialects import VLLM_VERSION
from llmdiag.sim.server import SimServer
from tests.conftest import run_cli
from tests.support.httpserver import Reply, ScriptedServer

SHAPE = ("--users", "16", "--duration", "5", "--warmup", "2", "--prompt-tokens", "128", "--output-tokens", "32:64")


def cli_json(*args: str) -> dict:
    result = run_cli("load", *args, "--json", timeout=180)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    """The workload, and its baseline run on the scheduling preset (the workload's own first run)."""
    folder = tmp_path_factory.mktemp("ab")
    workload, before = folder / "W.json", folder / "before.json"
    report = cli_json(
        "--preset", "scheduling", *SHAPE, "--seed", "5", "--save-workload", str(workload), "-o", str(before)
    )
    return workload, before, report


def metrics(report: dict) -> dict[str, dict]:
    [level] = report["comparison"]["levels"]
    return {m["name"]: m for m in level["metrics"]}


def test_the_recorded_workload_says_what_was_sent_and_what_served_it(recorded):
    workload_file, _, report = recorded
    workload = json.loads(workload_file.read_text())
    assert workload["kind"] == "llmdiag-workload" and workload["schema_version"] and workload["tool_version"]
    assert (workload["mode"], workload["levels"], workload["seed"]) == ("closed", [16], 5)
    assert (workload["prompt_tokens"], workload["output_tokens"]) == ("128", "32:64")
    # the simulator's /v1/models and /version, as `curl` shows them
    assert workload["model"] == report["model"] == "meta-llama/Meta-Llama-3-8B"
    assert workload["server_version"].endswith("+llmdiag.sim") and "/version" in workload["server_version_source"]
    # the goodput SLO is pinned with the workload: the default TPOT SLO when none was given
    assert workload["slo_tpot_seconds"] == report["slo_tpot_seconds"] == 0.05
    [point] = report["points"]
    assert len(point["samples"]) >= point["requests_completed"] > 10
    assert all(32 <= s["output_tokens"] <= 64 for s in point["samples"] if s["ok"])


def test_a_replay_on_the_same_server_shows_no_change(recorded, tmp_path):
    workload, before, _ = recorded
    after = cli_json("--preset", "scheduling", "--workload", str(workload), "--baseline", str(before))
    assert after["workload"]["seed"] == 5 and after["workload"]["levels"] == [16]
    m = metrics(after)
    for name in ("ttft_p50_seconds", "ttft_p90_seconds", "per_user_tokens_per_second_p50", "output_tokens_per_second"):
        assert m[name]["ci_low"] <= 0 <= m[name]["ci_high"], m[name]
        assert m[name]["change"] == "no change shown"
    assert m["error_ratio"]["after"] == m["error_ratio"]["before"] == 0
    # inter-token gaps are a few ms of wall time on this host, thousands of them: an interval a fraction of a ms
    # wide, which a busy host's own jitter between the two runs can move (seen: 0.2 ms of 6.7 ms, suite beside it);
    # the same server gives the same gaps to within a tenth
    itl = m["itl_p50_seconds"]
    assert abs(itl["difference"]) < 0.1 * itl["before"] and itl["ci_high"] - itl["ci_low"] < 0.1 * itl["before"]
    [level] = after["comparison"]["levels"]
    assert level["class_before"] == level["class_after"] == "scheduling"
    # and it renders where load renders: Markdown and HTML from the saved result
    saved = tmp_path / "after.json"
    saved.write_text(json.dumps(after))
    markdown = run_cli("report", str(saved), "--markdown", timeout=60)
    assert markdown.returncode == 0 and "**A/B** against" in markdown.stdout and "| TTFT p50 |" in markdown.stdout
    html = tmp_path / "after.html"
    assert run_cli("report", str(saved), "-o", str(html), timeout=60).returncode == 0
    assert "A/B against the baseline" in html.read_text()


def test_lifting_the_batch_cap_moves_every_interval_the_way_the_physics_says(recorded, tmp_path):
    workload, before, baseline = recorded
    # a prediction in whatif's contract (llmdiag whatif --json), to be printed beside the measurement
    prediction = tmp_path / "whatif.json"
    prediction.write_text(
        json.dumps(
            {
                "schema_version": "3",
                "changes": {"max_num_seqs": 256},
                "modelled": True,
                "class_before": "scheduling",
                "class_after": "healthy",
                "next_limit": "none within the load: all 16 users run",
                "before": {},
                "after": {"ttft_p50_seconds": 0.02, "total_tokens_per_second": 2000.0, "kv_peak_ratio": 0.01},
                "band_ratio": 0.25,
            }
        )
    )
    result = run_cli(
        "load", "--preset", "healthy", "--workload", str(workload), "--baseline", str(before),
        "--prediction", str(prediction), "-o", str(tmp_path / "after.json"), timeout=180, env={"COLUMNS": "160"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "A/B against" in result.stdout and "predicted (band)" in result.stdout
    after = json.loads((tmp_path / "after.json").read_text())
    m = metrics(after)
    assert m["ttft_p50_seconds"]["ci_high"] < 0 and m["ttft_p50_seconds"]["change"] == "better"
    assert m["per_user_tokens_per_second_p50"]["ci_low"] > 0
    assert m["output_tokens_per_second"]["ci_low"] > 0
    before_rate = baseline["points"][0]["output_tokens_per_second"]
    assert 2 < m["output_tokens_per_second"]["after"] / before_rate <= 4.5  # towards 16 / 4 slots
    # the streaming speed is the step's, which barely moves: within a third either way
    decode = m["per_user_decode_tokens_per_second_p50"]
    assert abs(decode["after"] / decode["before"] - 1) < 0.33
    [level] = after["comparison"]["levels"]
    assert (level["class_before"], level["class_after"], level["class_predicted"]) == (
        "scheduling",
        "healthy",
        "healthy",
    )
    assert m["ttft_p50_seconds"]["predicted"] == 0.02 and m["ttft_p50_seconds"]["predicted_high"] == 0.025
    assert m["output_tokens_per_second"]["predicted"] == 2000.0
    # the server's own gauges over each window: 4 slots of 16 users, 12 waiting; then nobody waits
    assert m["requests_running_mean"]["before"] == pytest.approx(4, abs=0.5)
    assert m["requests_waiting_mean"]["before"] == pytest.approx(12, abs=1.5)
    assert m["requests_waiting_mean"]["after"] < 1 and m["requests_running_mean"]["after"] > 12
    assert m["requests_waiting_mean"]["change"] == "server gauge" and m["requests_waiting_mean"]["ci_low"] is None
    assert m["kv_peak_ratio"]["predicted"] == 0.01


def test_a_server_serving_another_model_is_refused_before_any_load(recorded):
    workload, before, _ = recorded
    # the network preset serves Llama 3 70B
    result = run_cli("load", "--preset", "network", "--workload", str(workload), "--baseline", str(before), "--json")
    assert result.returncode == 2 and result.stdout == "", result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[0] == (
        f"ERROR: the model differs: the server serves 'meta-llama/Meta-Llama-3-70B', {before} ran "
        "'meta-llama/Meta-Llama-3-8B'"
    )
    assert lines[1].startswith("HINT: ") and len(lines) == 2


@pytest.mark.parametrize(
    ("dialect", "version", "where"),
    [
        ("vllm", VLLM_VERSION, "GET /version 'version'"),
        ("trtllm", TRTLLM_VERSION, "GET /version 'version'"),
        ("tgi", TGI_VERSION, "GET /info 'version'"),
        ("sglang", SGLANG_VERSION, "GET /get_server_info 'version'"),
        ("llamacpp", LLAMACPP_BUILD, "GET /props 'build_info'"),
    ],
)
def test_the_server_version_is_read_where_each_server_tells_it(dialect, version, where):
    with SimServer("healthy", dialect=dialect) as sim:
        connection = Connection(base_url=sim.url)
        served, got, source = asyncio.run(server_facts(connection, LoadPlan(levels=[1])))
    assert (got, source) == (version, where) and served


def test_a_server_that_tells_no_version_is_unknown_never_empty():
    def models_only(path: str, headers: dict[str, str]) -> Reply:
        if path.startswith("/v1/models"):
            return Reply(body=b'{"data": [{"id": "tiny"}]}', content_type="application/json")
        return Reply(status=404, body=b"not found")

    with ScriptedServer(models_only) as server:
        served, version, source = asyncio.run(server_facts(Connection(base_url=server.url), LoadPlan(levels=[1])))
    assert (served, version) == (["tiny"], None)
    assert source == "none of /version, /info, /get_server_info, /props told a version"
