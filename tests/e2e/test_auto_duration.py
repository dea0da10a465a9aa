"""`scan --duration auto` against the simulator: the window ends when the verdict holds still, and says so."""

from __future__ import annotations

import json
import re
import time

from llmdiag.collect import DEFAULT_DURATION_SECONDS
from llmdiag.sim.load import ClosedLoopLoad
from llmdiag.sim.presets import get_preset
from llmdiag.sim.server import SimServer
from tests.conftest import run_cli
from tests.e2e.test_bad_input import assert_clean_error

WARMUP_SECONDS = 2.0


def test_auto_scan_of_a_queueing_server_names_it_and_its_window_matches_its_note():
    preset = get_preset("scheduling")
    with SimServer(preset) as sim, ClosedLoopLoad(sim.url, sim.model, preset.load, max_seconds=60):
        time.sleep(WARMUP_SECONDS)
        result = run_cli("scan", sim.url, "--no-nvml", "--duration", "auto", "--json", "--fail-on", "never", timeout=90)
        queue_at_the_end = sim.snapshot()["waiting"]
    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["bottleneck"] == "scheduling", verdict["summary"]
    # the server's own queue, read from the simulator: requests were waiting when the scan ended
    assert queue_at_the_end > 0
    assert verdict["findings"][0]["code"].startswith("SCH")
    note = next(n for n in verdict["notes"] if n.startswith("automatic window"))
    window = verdict["window"]["duration_seconds"]
    ended = re.search(r"ended after (\d+) s", note)
    if ended:  # the window the verdict was judged on is the one the note names, shorter than the longest
        assert abs(window - float(ended.group(1))) <= 1.0
        assert window < DEFAULT_DURATION_SECONDS
    else:  # on a machine too busy for the verdict to hold still, the full window
        assert "full" in note and window >= DEFAULT_DURATION_SECONDS - 1.0


def test_auto_is_for_one_server():
    error, hint = assert_clean_error(
        run_cli("scan", "http://127.0.0.1:9", "http://127.0.0.1:10", "--duration", "auto", timeout=30)
    )
    assert "--duration auto scans one server" in error and "-d 20" in hint


def test_a_duration_that_is_neither_seconds_nor_auto_is_refused():
    error, hint = assert_clean_error(run_cli("scan", "http://127.0.0.1:9", "--duration", "soon", timeout=30))
    assert "'soon'" in error and "auto" in hint
