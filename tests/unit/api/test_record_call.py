"""What a recorded scan was called with (llmdiag.api.record.ScanCall) survives the bundle's JSON: the deployment,
the baseline from check's history, the settings that change a verdict and a scan's profiler traces."""

from __future__ import annotations

import json

from llmdiag.api.record import ScanCall
from llmdiag.client.endpoint import Connection
from llmdiag.collect.live import TelemetryOptions
from llmdiag.collect.trace.analysis import analyze
from llmdiag.config import Settings
from llmdiag.engine.baseline import Baseline
from llmdiag.physics.hardware import GPUS, MODELS, interconnect_for
from llmdiag.physics.step import Deployment
from tests.conftest import SHARED


def test_a_call_round_trips_through_json_with_everything_that_changes_a_verdict() -> None:
    trace_set = SHARED / "traces" / "hta-sampled-2rank"
    trace = analyze([trace_set]) if trace_set.is_dir() else None
    call = ScanCall(
        Connection(base_url="http://gpu-7:8000", timeout_seconds=7.5, max_metrics_bytes=4096),
        12.0,
        Settings.model_validate({"slo_tpot_seconds": 0.08, "mute": [{"code": "SCH002", "reason": "batch job"}]}),
        TelemetryOptions(dcgm_url="http://gpu-7:9400/metrics", nvml="off", pids=[4242], host=True),
        Deployment(GPUS["A100"], MODELS["llama-3-70b"], tp=8, interconnect=interconnect_for(GPUS["A100"], "pcie4")),
        canary=True,
        baseline=Baseline("gpu-7", 1_700_000_000.0, 7, 5, checks=9, medians={"ttft_p99": 0.42}, counts={"ttft_p99": 9}),
        trace=trace,
        server="vllm",
        auto_duration=True,
    )
    back = ScanCall.from_json(json.loads(json.dumps(call.to_json(), allow_nan=False)))
    assert back.deployment == call.deployment
    assert back.baseline == call.baseline
    assert back.settings is not None and back.settings.slo_tpot_seconds == 0.08
    assert back.settings.mute_reason("SCH002") == "batch job"
    assert (
        back.telemetry is not None
        and back.telemetry.pids == [4242]
        and back.telemetry.dcgm_url == call.telemetry.dcgm_url
    )  # type: ignore[union-attr]
    assert (back.duration_seconds, back.server, back.canary, back.auto_duration) == (12.0, "vllm", True, True)
    assert (back.connection.timeout_seconds, back.connection.max_metrics_bytes) == (7.5, 4096)
    if trace is not None:
        assert back.trace == trace
