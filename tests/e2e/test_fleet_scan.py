"""`llmdiag scan URL1 URL2 …` against real simulator instances: four replicas driven differently (one healthy
replica gets 24 users, two get 3 each, one is the memory preset under its own load) and one port where nothing
listens. Per-replica classes, the imbalance findings with their numbers, the unreachable row, exit codes, the fleet
JSON, and the HTML fleet section in headless Chromium."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from llmdiag.model import FleetReport
from llmdiag.sim.load import ClosedLoopLoad
from llmdiag.sim.presets import get_preset
from llmdiag.sim.server import SimServer
from tests.conftest import run_cli
from tests.support import browser

WINDOW = ("--duration", "3", "--timeout", "2")


@dataclass
class Fleet:
    busy: SimServer
    quiet_a: SimServer
    quiet_b: SimServer
    memory: SimServer
    dead_url: str

    def urls(self) -> list[str]:
        return [s.url for s in (self.busy, self.quiet_a, self.quiet_b, self.memory)] + [self.dead_url]

    def name(self, server: SimServer) -> str:
        return f"127.0.0.1:{server.port}"


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    healthy, memory = get_preset("healthy"), get_preset("memory")
    plan = [
        (healthy, replace(healthy.load, users=24)),
        (healthy, replace(healthy.load, users=3)),
        (healthy, replace(healthy.load, users=3)),
        (memory, memory.load),
    ]
    servers, loads = [], []
    try:
        for preset, load in plan:
            server = SimServer(preset).start()
            servers.append(server)
            driver = ClosedLoopLoad(server.url, server.model, load, max_seconds=240)
            driver.start()
            loads.append(driver)
        time.sleep(2.0)  # the memory replica's KV cache fills, the queues settle
        yield Fleet(*servers, dead_url=f"http://127.0.0.1:{_dead_port()}")
    finally:
        for driver in loads:
            driver.stop()
        for server in servers:
            server.stop()


@pytest.fixture(scope="module")
def scanned(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> tuple[FleetReport, Path, int]:
    out = tmp_path_factory.mktemp("fleet")
    html = out / "fleet.html"
    result = run_cli("scan", *fleet.urls(), *WINDOW, "--json", "--html", str(html), "--concurrency", "5")
    (out / "fleet.json").write_text(result.stdout)
    assert result.stderr == "" or "ERROR" not in result.stderr, result.stderr
    return FleetReport.model_validate_json(result.stdout), html, result.returncode


def test_per_replica_classes_and_numbers(fleet: Fleet, scanned):
    report, _, code = scanned
    assert code == 1  # critical findings (the memory replica, and both fleet rules) at the default --fail-on
    by_name = {t.name: t for t in report.targets}
    memory = by_name[fleet.name(fleet.memory)]
    assert memory.bottleneck.value == "memory"
    # how severe depends on preemptions per finished request inside a 3 s window, which a busy 2-core machine moves;
    # that it is a problem at all rests on the replica's own counter: it preempted
    assert memory.state in {"WARNING", "CRITICAL"} and memory.state == memory.worst_severity.name.upper()
    assert fleet.memory.snapshot()["preemptions"] > 0
    for server in (fleet.busy, fleet.quiet_a, fleet.quiet_b):
        assert by_name[fleet.name(server)].bottleneck.value == "healthy", by_name[fleet.name(server)].summary
    assert report.class_counts == {"memory": 1, "healthy": 3, "unknown": 1}
    busy, quiet = by_name[fleet.name(fleet.busy)].numbers, by_name[fleet.name(fleet.quiet_a)].numbers
    assert busy.request_rate_per_second > 4 * quiet.request_rate_per_second
    assert busy.requests_running_mean > 4 * quiet.requests_running_mean
    mem = by_name[fleet.name(fleet.memory)].numbers
    assert mem.kv_cache_usage_max_ratio > 0.9 and mem.requests_waiting_mean > 1
    assert mem.ttft_p90_seconds > 10 * busy.ttft_p90_seconds


def test_imbalance_findings_name_the_replicas_with_their_numbers(fleet: Fleet, scanned):
    report, _, _ = scanned
    found = {f.finding.code: f for f in report.imbalance}
    assert set(found) == {"SCH008", "SCH009"}
    router = found["SCH008"]
    assert router.replica == fleet.name(fleet.busy)
    rates = router.values
    assert set(rates) == {fleet.name(s) for s in (fleet.busy, fleet.quiet_a, fleet.quiet_b, fleet.memory)}
    peers = sorted(v for k, v in rates.items() if k != router.replica)
    expected = rates[router.replica] / peers[len(peers) // 2]  # the upper median of the three others
    assert router.finding.evidence[0].value == pytest.approx(expected, rel=1e-3)
    # the rates the rule compared are each replica's own verdict's
    by_name = {t.name: t for t in report.targets}
    assert rates == pytest.approx({name: by_name[name].numbers.request_rate_per_second for name in rates}, rel=1e-9)
    assert router.finding.severity.value == "critical"
    worse = found["SCH009"]
    assert worse.replica == fleet.name(fleet.memory)
    # the slowest replica's TTFT p90 over the upper median of the others', from each replica's own verdict
    ttft = {name: by_name[name].numbers.ttft_p90_seconds for name in worse.values}
    assert worse.values == pytest.approx(ttft, rel=1e-9)
    others = sorted(v for k, v in ttft.items() if k != worse.replica)
    assert worse.finding.evidence[0].value == pytest.approx(ttft[worse.replica] / others[len(others) // 2], rel=1e-3)
    # worst first: the two replicas the fleet rules name come before the unreachable one and the quiet healthy ones
    order = [t.name for t in report.targets]
    assert set(order[:2]) == {fleet.name(fleet.memory), fleet.name(fleet.busy)}
    assert order[2] == fleet.dead_url.removeprefix("http://")


def test_the_unreachable_target_says_why_and_the_rest_are_judged(fleet: Fleet, scanned):
    report, _, _ = scanned
    dead = next(t for t in report.targets if t.error is not None)
    assert dead.url == fleet.dead_url and dead.bottleneck.value == "unknown" and dead.state == "UNKNOWN"
    assert "connection refused" in dead.error and dead.hint
    assert report.probed() == 4
    assert report.fleet_signals["fleet_replicas_judged"].stats["value"] == 4.0
    assert any(dead.name in note for note in report.notes)


def test_terminal_view_from_a_targets_file_and_exit_codes(fleet: Fleet, tmp_path: Path):
    targets = tmp_path / "targets.txt"
    targets.write_text(f"# two replicas\nbusy={fleet.busy.url}\nquiet={fleet.quiet_a.url}\n{fleet.dead_url}\n")
    result = run_cli("scan", "--targets", str(targets), *WINDOW, "--fail-on", "never")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    busy = next(line for line in lines if line.startswith("busy "))
    assert "healthy" in busy and "flagged by SCH008" in busy
    assert "SCH008" in result.stdout and "finished requests/s per replica: busy" in result.stdout
    dead = next(line for line in lines if line.startswith(fleet.dead_url.removeprefix("http://")))
    assert "unknown" in dead and "connection refused" in result.stdout
    assert "WARNING: 1 of 3 targets could not be probed" in result.stderr


def test_no_target_probed_is_exit_2(tmp_path: Path):
    result = run_cli("scan", f"http://127.0.0.1:{_dead_port()}", f"http://127.0.0.1:{_dead_port()}", *WINDOW)
    assert result.returncode == 2
    assert "ERROR: none of the 2 targets could be probed" in result.stderr and "HINT:" in result.stderr
    assert result.stdout.count("connection refused") >= 2  # the rows still say why


def test_one_server_options_are_refused_for_a_fleet():
    result = run_cli("scan", "http://127.0.0.1:1", "http://127.0.0.1:2", "--dcgm-url", "http://x:9400/metrics")
    assert result.returncode == 2 and result.stderr.startswith("ERROR: --dcgm-url belong")


def test_html_fleet_section_in_chromium(fleet: Fleet, scanned, tmp_path: Path):
    report, html, _ = scanned
    browser.require()
    # `llmdiag report` re-renders the saved JSON to the same page
    saved = tmp_path / "fleet.json"
    saved.write_text(report.model_dump_json())
    again = tmp_path / "again.html"
    assert run_cli("report", str(saved), "-o", str(again)).returncode == 0
    for path in (html, again):
        with browser.open_file(path) as visit:
            page = visit.page
            assert visit.page_errors == [] and visit.console_errors == []
            assert visit.requests == [path.resolve().as_uri()]
            rows = page.locator("tr.replica")
            assert rows.count() == 5
            assert rows.nth(0).get_attribute("data-replica") in {fleet.name(fleet.memory), fleet.name(fleet.busy)}
            assert (
                page.locator(f'tr.replica[data-replica="{fleet.name(fleet.memory)}"]').get_attribute("data-class")
                == "memory"
            )
            assert page.locator("#fleet-SCH008").count() == 1 and page.locator("#fleet-SCH009").count() == 1
            assert "connection refused" in page.locator("table.replicas").inner_text()
            strip = page.locator(".heat-strip .heat-row[data-replica]")
            assert strip.count() == 5
            cells = page.locator(f'.heat-row[data-replica="{fleet.name(fleet.memory)}"] .heat-cell')
            assert cells.count() >= 3  # one per scrape
            box = cells.nth(0).bounding_box()
            assert box is not None and box["width"] >= 10 and box["height"] >= 10
            assert page.locator(".fleet-counts .badge[data-class=memory]").inner_text().startswith("1 ")
            browser.screenshot(visit, f"fleet-{path.stem}")
    assert json.loads(saved.read_text())["kind"] == "fleet"
