"""Record and replay (--record, `llmdiag analyze bundle.tar.gz`): a live run's bundle replays through the live collect
path into the same verdict, byte for byte, after the server is gone; no secret given on the command line is in it.

Every simulator preset is recorded once (the demo: the server's page, the DCGM page, the canary requests), the
simulator stopped, and the bundle replayed in-process. The CLI round trip scans the simulator with NVML played back
from a recording, the host sampled, and credentials in every form a user gives them.
"""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest

from llmdiag.api.record import Recorder, recording_to
from llmdiag.api.scan import replay_bundle, run_demo
from llmdiag.client.endpoint import Connection
from llmdiag.collect.bundle import read_bundle, read_members
from llmdiag.collect.taped import CANARY_CHANNEL
from llmdiag.render.json import render_json
from llmdiag.sim.load import ClosedLoopLoad
from llmdiag.sim.presets import PRESETS, get_preset
from llmdiag.sim.server import SimServer
from tests.conftest import FIXTURES, run_cli
from tests.support.httpserver import Reply, ScriptedServer

DEMO_SECONDS = 2.0
NVML_RECORDING = FIXTURES / "nvml" / "h100-sxm-tp2-decode.json"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_replays_to_the_verdict_it_gave_live(preset: str, tmp_path: Path) -> None:
    path = tmp_path / f"{preset}.tar.gz"
    # one preset ends its window when the verdict holds still (--duration auto): the replay must end it at the
    # same scrape, judged on the same clock readings
    auto = preset == "scheduling"
    with Recorder(path, "demo") as recorder, recording_to(recorder):
        live = run_demo(preset, 20.0 if auto else DEMO_SECONDS, auto_duration=auto)
    # the simulator is stopped: a replay that reached for the network would fail here
    started = time.monotonic()
    bundle, runs = replay_bundle(path)
    replay_seconds = time.monotonic() - started
    assert len(runs) == 1
    assert render_json(runs[0].verdict) == render_json(live)
    assert runs[0].recorded == render_json(live)  # the bundle carries what the live run said
    # the replay read what the live run read: each scrape of the window is one recorded page
    channels = bundle.runs[0].tape["channels"]
    pages = channels[f"page {live.coverage.probes[0].url}"]
    assert live.window.scrapes == len(pages) >= 3
    assert CANARY_CHANNEL in channels and any(k.endswith("/dcgm/metrics") for k in channels)
    # the window's sleeps are not replayed
    assert replay_seconds < DEMO_SECONDS
    if auto:
        assert "automatic window" in live.notes[-1], live.notes


def secret_free(path: Path, *secrets: str) -> None:
    raw = gzip.decompress(path.read_bytes())
    for secret in secrets:
        assert secret.encode() not in raw, secret


@pytest.mark.timeout(180)
def test_a_cli_scan_bundle_replays_byte_for_byte_and_holds_no_secret(tmp_path: Path) -> None:
    preset = get_preset("memory")
    bundle = tmp_path / "scan.tar.gz"
    api_key, header_token, password = "sk-live-4f9a8b7c6d5e", "hdr-tok-91f2e3d4c5b6", "pw-0a1b2c3d4e"
    with SimServer(preset) as sim, ClosedLoopLoad(sim.url, sim.model, preset.load, max_seconds=120):
        time.sleep(2.0)
        url = sim.url.replace("http://", f"http://alice:{password}@")
        live = run_cli(
            "scan", url, "--duration", "3", "--json", "--fail-on", "never",
            "--nvml-replay", str(NVML_RECORDING),
            "--api-key", api_key, "--header", f"Authorization: Bearer {header_token}", "--header", "X-Tenant: team-a",
            "--record", str(bundle),
            timeout=120,
        )  # fmt: skip
    assert live.returncode == 0, live.stderr
    assert "attach it to your issue" in live.stderr
    secret_free(bundle, api_key, header_token, password)
    replayed = run_cli("analyze", str(bundle), "--json", "--fail-on", "never", timeout=60)
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout == live.stdout
    verdict = json.loads(replayed.stdout)
    assert [p["probe"] for p in verdict["coverage"]["probes"]][:3] == ["vllm", "nvml", "host"]
    manifest = json.loads(read_members(bundle)["manifest.json"])
    connection = manifest["options"]["connection"]
    assert connection["header"] == ["Authorization: <redacted>", "X-Tenant: <redacted>"]
    assert connection["api_key"] == "<redacted>"
    assert manifest["options"]["url"].startswith("http://***@127.0.0.1:")
    assert manifest["runs"][0]["reads"]["source nvml"]["reads"] >= 3


def test_a_scan_that_failed_replays_into_the_same_error(tmp_path: Path) -> None:
    """A bug report's most useful bundle: the server answered, and llmdiag could not tell what it is."""
    page = b"# HELP app_requests_total Requests.\n# TYPE app_requests_total counter\napp_requests_total 7\n"
    server = ScriptedServer(lambda path, headers: Reply(body=page) if path == "/metrics" else Reply(status=404))
    bundle = tmp_path / "failed.tar.gz"
    with server:
        live = run_cli("scan", server.url, "--duration", "2", "--no-nvml", "--record", str(bundle))
    assert live.returncode == 2 and "unsupported or unrecognised server" in live.stderr
    replayed = run_cli("analyze", str(bundle))
    assert replayed.returncode == 2, replayed.stderr
    error = [line for line in live.stderr.splitlines() if line.startswith(("ERROR", "HINT"))]
    assert [line for line in replayed.stderr.splitlines() if line.startswith(("ERROR", "HINT"))] == error
    assert "app_requests_total" in error[0] and "Traceback" not in replayed.stderr
    run = read_bundle(bundle).runs[0]
    assert "unsupported or unrecognised server" in run.call["error"]["message"] and run.verdict is None


def test_a_bundle_is_replayed_alone_and_a_bad_one_is_one_error(tmp_path: Path) -> None:
    bundle = tmp_path / "b.tar.gz"
    bundle.write_bytes(gzip.compress(b"not a tar at all" * 100))
    result = run_cli("analyze", str(bundle))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("ERROR:") == 1 and "HINT:" in result.stderr


def test_the_recorded_connection_carries_no_secret_into_the_replay() -> None:
    from llmdiag.api.record import connection_from_json, connection_secrets, connection_to_json

    connection = Connection(
        base_url="http://bob:hunter2-long@gpu-7:8000",
        headers={"Authorization": "Bearer abcdef123456", "X-Tenant": "team-a"},
        api_key="sk-abcdef",
    )
    recorded = connection_to_json(connection)
    assert "hunter2" not in json.dumps(recorded) and "abcdef" not in json.dumps(recorded)
    assert set(connection_secrets(connection)) >= {"hunter2-long", "Bearer abcdef123456", "abcdef123456", "sk-abcdef"}
    assert "team-a" not in connection_secrets(connection)  # not a credential: left out of the options, not scrubbed
    replay = connection_from_json(recorded)
    assert replay.api_key == "" and replay.headers == {} and replay.base_url == "http://***@gpu-7:8000"


def test_bench_gpu_check_records_the_same_format_and_it_replays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench/gpu_check.py --record writes a bundle too: each phase's NVML samples as the scan's NVML source records
    them (here NVML is a recording of a real-device shape played back at the pynvml boundary: no GPU in CI)."""
    from bench import gpu_check
    from llmdiag.cli.options import load_nvml_replay
    from llmdiag.collect.signals import build_signal_set
    from llmdiag.collect.tape import Tape
    from llmdiag.collect.telemetry.nvml import NvmlSampler
    from llmdiag.collect.telemetry.nvml_record import ReplayNvml
    from llmdiag.schema.loader import load_probe

    monkeypatch.setattr(gpu_check, "SAMPLE_SECONDS", 0.01)
    answers = json.loads(NVML_RECORDING.read_text())
    library = ReplayNvml(answers)
    library.nvmlInit()
    sampler = NvmlSampler(library)
    tapes = Tape(), Tape()
    idle, loaded = gpu_check.sample(sampler, 0.05, tapes[0]), gpu_check.sample(sampler, 0.05, tapes[1])
    path = tmp_path / "gpu.tar.gz"
    gpu_check.write_recording(path, "cuda:0", [("idle", 0.05, tapes[0]), ("under load", 0.05, tapes[1])], answers)
    _, runs = replay_bundle(path)
    assert [r.name for r in runs] == ["idle", "under load"]
    for run, scrapes in zip(runs, (idle, loaded), strict=True):
        assert run.verdict is not None
        direct = build_signal_set(load_probe("nvml"), scrapes, "nvml")
        for name in ("gpu_utilization_ratio", "gpu_memory_used_bytes", "gpu_power_watts"):
            assert run.verdict.signals[name].stats == direct.signals[name].stats, name
        # only GPU telemetry: the server's signals are unavailable with the reason, never zero or idle
        assert run.verdict.signals["requests_running"].unavailable is not None
        assert run.verdict.bottleneck != "idle"
    # --nvml-replay takes the bundle: NVML's own answers ride in it
    replay = load_nvml_replay(path)
    assert isinstance(replay, ReplayNvml) and replay.recording == answers


@pytest.mark.timeout(180)
def test_load_and_check_record_each_scan_as_a_run_and_replay_them_all(tmp_path: Path) -> None:
    load_bundle, check_bundle = tmp_path / "load.tar.gz", tmp_path / "check.tar.gz"
    load = run_cli(
        "load", "--users", "4", "--duration", "2", "--warmup", "1", "--json", "--record", str(load_bundle),
        timeout=150,
    )  # fmt: skip
    assert load.returncode == 0, load.stderr
    replayed = run_cli("analyze", str(load_bundle), "--json", "--fail-on", "never")
    assert replayed.returncode == 0, replayed.stderr
    # one level: one run, replayed into the verdict the load report gave that level
    (point,) = json.loads(load.stdout)["points"]
    assert json.loads(replayed.stdout) == point["verdict"]
    preset = get_preset("scheduling")
    with SimServer(preset) as sim, ClosedLoopLoad(sim.url, sim.model, preset.load, max_seconds=120):
        time.sleep(2.0)
        dead = "http://127.0.0.1:9"  # the discard port: nothing listens there
        check = run_cli(
            "check", sim.url, dead, "--duration", "3", "--no-history", "--json", "--record", str(check_bundle),
            timeout=120,
        )  # fmt: skip
    report = json.loads(check.stdout)
    replayed = run_cli("analyze", str(check_bundle), "--json", "--fail-on", "never")
    assert replayed.returncode == 0, replayed.stderr
    runs = {r["run"]: r for r in json.loads(replayed.stdout)}
    live = {t["url"]: t for t in report["targets"]}
    assert runs[sim.url]["verdict"] == live[sim.url]["verdict"]
    # the dead target failed live: its run replays into the same error
    assert runs[dead]["error"] == live[dead]["error"] and "verdict" not in runs[dead]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("dialect", "channel"),
    [("llamacpp", "value {url}/props"), ("trtllm", "page {url}/prometheus/metrics")],
)
def test_other_servers_replay_with_their_own_reads(dialect: str, channel: str, tmp_path: Path) -> None:
    """llama.cpp's /props (the slot count) and TensorRT-LLM's JSON page with its Prometheus companion and /version
    are recorded and replayed as the scan read them."""
    from llmdiag.api.scan import diagnose

    preset = get_preset("scheduling")
    path = tmp_path / f"{dialect}.tar.gz"
    with SimServer(preset, dialect=dialect) as sim, ClosedLoopLoad(sim.url, sim.model, preset.load, max_seconds=60):
        time.sleep(1.0)
        with Recorder(path, "scan") as recorder, recording_to(recorder):
            live = diagnose(Connection(base_url=sim.url), 2.0, canary=True)
        url = sim.url
    _, (run,) = replay_bundle(path)
    assert run.verdict is not None and render_json(run.verdict) == render_json(live)
    assert channel.format(url=url) in read_bundle(path).runs[0].tape["channels"]
