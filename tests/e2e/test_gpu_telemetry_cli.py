"""GPU telemetry end to end through the CLI: no driver here (the real nvidia-ml-py says so), and NVML answers
replayed at the pynvml boundary with --nvml-replay, beside a real local HTTP server. The replayed files
(tests/fixtures/nvml) are hand-assembled in the recording format, not recorded from a device: see their README."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli
from tests.e2e.test_bad_input import FAST, growing_vllm
from tests.support.httpserver import ScriptedServer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvml"
NO_GPU_LINE = "GPU telemetry: unavailable (no NVIDIA driver found; pass --dcgm-url for remote GPUs)"


def scan_json(url: str, *extra: str) -> dict:
    result = run_cli("scan", url, *FAST, "--json", *extra)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


def test_without_a_gpu_the_coverage_says_so_and_gpu_rules_are_skipped():
    with ScriptedServer(growing_vllm) as server:
        verdict = scan_json(server.url)
        text = run_cli("scan", server.url, *FAST)
    [nvml] = [p for p in verdict["coverage"]["probes"] if p["probe"] == "nvml"]
    assert nvml["ok"] is False and nvml["note"] == NO_GPU_LINE
    network = next(c for c in verdict["coverage"]["classes"] if c["category"] == "network")
    assert network["evaluated"] is False and "GPU telemetry" in network["reason"]
    skipped = {r["code"]: r["reason"] for r in verdict["coverage"]["rules"] if r["status"] == "skipped"}
    assert "NET001" in skipped and "gpu_utilization_ratio" in skipped["NET001"]
    assert "gpu_utilization_ratio" not in verdict["signals"]  # never a zero
    coverage = text.stdout[text.stdout.index("Coverage") :]
    assert NO_GPU_LINE in coverage and "network     not evaluated" in coverage
    assert "NET001 skipped" not in coverage  # each skipped rule is in the JSON, and in the terminal under --verbose


def test_no_nvml_flag_leaves_nvml_out_entirely():
    with ScriptedServer(growing_vllm) as server:
        verdict = scan_json(server.url, "--no-nvml")
    assert "nvml" not in [p["probe"] for p in verdict["coverage"]["probes"]]


def test_an_h100_replay_feeds_the_gpu_signals_and_the_network_class():
    with ScriptedServer(growing_vllm) as server:
        verdict = scan_json(server.url, "--nvml-replay", str(FIXTURES / "h100-sxm-tp2-decode.json"))
    [nvml] = [p for p in verdict["coverage"]["probes"] if p["probe"] == "nvml"]
    assert nvml["ok"] is True and nvml["config"]["gpus"] == "2 × NVIDIA H100 80GB HBM3"
    signals = verdict["signals"]
    assert signals["gpu_utilization_ratio"]["stats"]["mean"] > 0.98
    assert signals["gpu_power_limit_watts"]["stats"]["mean"] == 700.0
    assert signals["nvlink_active_links"]["stats"]["min"] == 18
    network = next(c for c in verdict["coverage"]["classes"] if c["category"] == "network")
    assert network["evaluated"] is True


def test_a_consumer_gpu_replay_shows_unsupported_signals_as_unavailable():
    with ScriptedServer(growing_vllm) as server:
        verdict = scan_json(server.url, "--nvml-replay", str(FIXTURES / "rtx4090-x2-pcie-power-capped.json"))
    ecc = verdict["signals"]["ecc_uncorrected_errors_per_second"]
    assert ecc["stats"] == {} and "not supported on this GPU" in ecc["unavailable"]
    assert verdict["signals"]["clocks_power_capped_ratio"]["stats"]["mean"] == 1.0


def test_a_file_that_is_not_a_recording_is_a_clean_error(tmp_path: Path):
    bad = tmp_path / "not-a-recording.json"
    bad.write_text('{"hello": 1}')
    result = run_cli("scan", "http://127.0.0.1:9", *FAST, "--nvml-replay", str(bad))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "not an NVML recording" in result.stderr and "gpu_check.py --record" in result.stderr


def test_nvml_is_sampled_on_its_own_faster_interval_in_the_same_window():
    from llmdiag.api import diagnose
    from llmdiag.client.endpoint import Connection
    from llmdiag.collect.live import TelemetryOptions
    from llmdiag.collect.telemetry.nvml_record import ReplayNvml

    replay = ReplayNvml.from_file(FIXTURES / "h100-sxm-tp2-decode.json")
    with ScriptedServer(growing_vllm) as server:
        verdict = diagnose(
            Connection(base_url=server.url), 2.0, telemetry=TelemetryOptions(nvml_library=replay, host=False)
        )
    assert verdict.window.scrapes == 3  # the server: at least 3 scrapes, 1 s apart at most
    samples = verdict.signals["gpu_utilization_ratio"].samples
    assert len(samples) >= 4  # NVML every 0.5 s over the same 2 s
    times = [t for t, _ in samples]
    assert verdict.window.start_unix - 0.5 <= times[0] and times[-1] <= verdict.window.end_unix + 0.5
