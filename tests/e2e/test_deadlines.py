"""Total deadlines against slow-drip servers (tests/support/hostile.py): one that drips its head, one that drips its
body, one that accepts and never answers. A per-read timeout never fires against a server that sends one byte
every second or two; the deadline must. Bounds are asserted with generous margins (the machine is shared and
slow), never as exact times: each is far below what the drip would hold without a deadline (minutes)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from llmdiag.api.runner import run_bounded
from llmdiag.client.deadline import Deadline
from llmdiag.client.endpoint import Connection
from llmdiag.collect.http import HttpMetricsSource
from llmdiag.collect.live import SCAN_MARGIN_SECONDS, TelemetryOptions, collect_live
from llmdiag.collect.prometheus.api import PrometheusSource
from llmdiag.errors import EmptyWindowError, ProbeError, ProbeTimeout
from tests.conftest import run_cli
from tests.support.hostile import (
    HostileServer,
    drip_body,
    drip_head,
    first_then,
    replay,
    routes,
    silent,
    status,
)

REPO = Path(__file__).resolve().parents[2]
HEALTHY = sorted((REPO / "tests/fixtures/vllm-0.32.0/healthy").glob("scrape-*.prom"))
# what a slow shared machine adds to a bound in-process (thread start-up, the verdict); a CLI run adds start-up
SLACK_SECONDS = 2.0
CLI_SLACK_SECONDS = 8.0


def elapsed_of(fn):
    started = time.monotonic()
    try:
        return fn(), time.monotonic() - started
    except Exception as exc:  # the error is part of the outcome
        return exc, time.monotonic() - started


@pytest.mark.parametrize("behaviour", [drip_head(0.3), drip_body(0.3), silent()], ids=["head", "body", "silent"])
def test_one_scrape_ends_by_its_timeout(behaviour):
    with HostileServer(behaviour) as server:
        page = HttpMetricsSource(Connection(base_url=server.url, timeout_seconds=1.0))
        outcome, seconds = elapsed_of(page.fetch_text)
        page.close()
    assert isinstance(outcome, ProbeTimeout), outcome
    assert seconds < 1.0 + SLACK_SECONDS
    assert server.url.split("//")[1] in outcome.message


def test_reported_case_scan_against_one_byte_every_2_s():
    """The issue's case: `scan --duration 3 --timeout 5` against a page sent one byte every 2 s ran for 45 s+."""
    with HostileServer(drip_body(2.0)) as server:
        started = time.monotonic()
        result = run_cli("scan", server.url, "--duration", "3", "--timeout", "5", timeout=60)
        seconds = time.monotonic() - started
    assert seconds < 3 + 5 + SCAN_MARGIN_SECONDS + CLI_SLACK_SECONDS, seconds
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert [line.split(":")[0] for line in lines] == ["ERROR", "HINT"], result.stderr
    assert "within 5 s" in lines[0]


def test_scan_ends_by_window_plus_timeout_when_the_server_turns_slow():
    """The first scrape is answered, every later one dripped: each later read ends by the timeout, and the window
    ends by the scan's deadline (window + timeout + margin), not after one timeout per scrape."""
    duration, timeout = 3.0, 4.0
    with HostileServer(first_then(1, replay(HEALTHY), drip_body(0.3))) as server:
        connection = Connection(base_url=server.url, timeout_seconds=timeout)
        outcome, seconds = elapsed_of(lambda: collect_live(connection, duration, probe="vllm"))
    # without the scan's deadline: 3 more scrapes of 4.25 s each after the first, about 13 s
    assert seconds < duration + timeout + SCAN_MARGIN_SECONDS + SLACK_SECONDS, seconds
    assert isinstance(outcome, EmptyWindowError), outcome
    assert "the scan's deadline" in outcome.message


def test_detection_ends_by_the_scan_deadline():
    """No metrics page (404) and every other endpoint dripping its head: detection asks several pages and JSON
    endpoints, each bounded by the timeout; all of them together end by the scan's deadline."""
    duration, timeout = 2.0, 3.0
    with HostileServer(routes({"/metrics": status(404)}, drip_head(0.3))) as server:
        connection = Connection(base_url=server.url, timeout_seconds=timeout)
        outcome, seconds = elapsed_of(lambda: collect_live(connection, duration, probe=None))
    assert seconds < duration + timeout + SCAN_MARGIN_SECONDS + SLACK_SECONDS, seconds
    assert isinstance(outcome, ProbeError), outcome
    assert len(server.requests) >= 2  # it did ask beyond the page


def test_a_dripping_dcgm_page_is_dropped_and_the_scan_ends_in_time():
    duration, timeout = 3.0, 2.0
    with HostileServer(replay(HEALTHY)) as vllm, HostileServer(drip_body(0.3)) as dcgm:
        connection = Connection(base_url=vllm.url, timeout_seconds=timeout)
        telemetry = TelemetryOptions(dcgm_url=dcgm.url, nvml="off", host=False)
        outcome, seconds = elapsed_of(lambda: collect_live(connection, duration, probe="vllm", telemetry=telemetry))
    assert seconds < duration + timeout + SCAN_MARGIN_SECONDS + SLACK_SECONDS, seconds
    assert not isinstance(outcome, Exception), outcome
    notes = [s.note for s in outcome.sources if s.probe == "dcgm"]
    assert notes and "did not send its whole answer within 2 s" in notes[0], notes


def test_canaries_against_a_dripping_api_end_in_time():
    """/metrics answers; the OpenAI API (/v1/models, the completions stream) drips. The canaries give up by the
    scan's deadline and say so in the coverage; the scan itself goes on."""
    duration, timeout = 2.0, 2.0
    with HostileServer(routes({"/metrics": replay(HEALTHY)}, drip_head(0.3))) as server:
        connection = Connection(base_url=server.url, timeout_seconds=timeout)
        outcome, seconds = elapsed_of(lambda: collect_live(connection, duration, probe="vllm", canary=True))
    assert seconds < duration + timeout + SCAN_MARGIN_SECONDS + SLACK_SECONDS, seconds
    assert not isinstance(outcome, Exception), outcome
    canary = [s for s in outcome.sources if s.probe == "canary"]
    assert canary and not canary[0].ok, canary


def test_a_prometheus_query_ends_by_its_timeout():
    with HostileServer(drip_body(0.3, content_type="application/json")) as server:
        source = PrometheusSource(url=server.url, timeout_seconds=1.0)
        outcome, seconds = elapsed_of(lambda: source.query("up", time.time()))
        source.close()
    assert isinstance(outcome, ProbeTimeout), outcome
    assert seconds < 1.0 + SLACK_SECONDS


def test_check_ends_by_its_deadline_with_unknown_targets():
    """Two targets that never answer, a timeout longer than the whole check's --deadline: both UNKNOWN, saying
    they did not finish in time, and the check ends by its deadline (UNKNOWN, exit 3)."""
    with HostileServer(silent()) as one, HostileServer(silent()) as two:
        started = time.monotonic()
        result = run_cli(
            "check", one.url, two.url, "--duration", "2", "--timeout", "20", "--deadline", "3", "--no-history",
            "--json", timeout=60,
        )  # fmt: skip
        seconds = time.monotonic() - started
    assert seconds < 3 + CLI_SLACK_SECONDS, seconds
    assert result.returncode == 3, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    import json

    report = json.loads(result.stdout)
    assert [t["state"] for t in report["targets"]] == [3, 3] or all(
        t["state"] in (3, "UNKNOWN") for t in report["targets"]
    ), report["targets"]
    for target in report["targets"]:
        assert "did not finish in time" in target["error"] or "check's deadline" in target["error"], target


def test_run_bounded_gives_up_on_jobs_past_the_run_deadline():
    """concurrency 1, three jobs of 1 s each, a 1.5 s deadline: the first finishes, the second is given up at the
    deadline, the third never starts."""
    deadline = Deadline.after(1.5, "the run's deadline")
    started = time.monotonic()
    results = run_bounded(
        [1, 2, 3],
        lambda item: (time.sleep(1.0), f"done {item}")[1],
        concurrency=1,
        on_timeout=lambda item, seconds: f"late {item} ({seconds:g})",
        deadline=deadline,
    )
    assert time.monotonic() - started < 1.5 + SLACK_SECONDS
    assert results[0] == "done 1"
    assert results[1].startswith("late 2") and not results[1].endswith("(0)")
    assert results[2] == "late 3 (0)"


def test_a_small_api_answer_ends_by_the_client_timeout():
    """/v1/models (and /version, /info, /props, /tokenize through request_json) dripped: the whole answer must come
    within the client's timeout, not merely each byte."""
    import asyncio

    from llmdiag.client.openai import OpenAIClient

    async def ask(url: str) -> list[str]:
        async with OpenAIClient(url, timeout_seconds=1.0) as client:
            return await client.models()

    with HostileServer(drip_head(0.3)) as server:
        outcome, seconds = elapsed_of(lambda: asyncio.run(ask(server.url)))
    assert isinstance(outcome, ProbeTimeout), outcome
    assert "/v1/models" in outcome.message
    assert seconds < 1.0 + SLACK_SECONDS
