"""The fleet's HTML report: one file that runs no script and loads nothing, every server string escaped, and its heat
strip: a cell per replica per step coloured by class (grey where there is no data, never healthy), or, for a direct
scan, a cell per scrape shaded by the replica's waiting requests against the fleet's highest."""

from __future__ import annotations

import html
import re

import pytest

from llmdiag.engine.fleet import build_fleet, build_timeline, target_from_error
from llmdiag.model import Bottleneck, FleetStep, FleetTarget, ReplicaNumbers
from llmdiag.render.fleet_html import MAX_CELLS, NO_DATA_COLOR, _tint, heat_strip, render_fleet_html
from llmdiag.render.html import CLASS_COLORS

T0 = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
H, M = Bottleneck.healthy, Bottleneck.memory


def replica(name: str, cls: Bottleneck = H, waiting: list[float] | None = None) -> FleetTarget:
    return FleetTarget(
        name=name,
        bottleneck=cls,
        state="OK" if cls is H else "CRITICAL",
        confidence=0.7,
        numbers=ReplicaNumbers(request_rate_per_second=5.0, ttft_p90_seconds=0.02),
        waiting_samples=[(T0 + 2 * i, v) for i, v in enumerate(waiting or [])],
    )


def test_tint_blends_with_white():
    assert _tint("#c62828", 1.0) == "#c62828"
    assert _tint("#c62828", 0.0) == "#ffffff"
    assert _tint("#000000", 0.5) == "#808080"  # 255 - 255 * 0.5 = 127.5, rounded to 128


def test_a_timeline_strip_is_a_class_cell_per_step_and_grey_where_a_replica_had_no_data():
    report = build_fleet([replica("r1"), replica("r2")], at_unix=T0)
    report.timeline = build_timeline(
        [
            FleetStep(at_unix=T0, classes={"r1": H, "r2": H}),
            FleetStep(at_unix=T0 + 60, classes={"r1": M}),
        ],
        step_seconds=60,
    )
    strip = heat_strip(report)
    assert strip.caption == "class of each replica at each of 2 steps (60 s apart)" and strip.columns == 2
    cells = {row["name"]: [(c.cls, c.color) for c in row["cells"]] for row in strip.rows}
    assert cells == {
        "r1": [("healthy", CLASS_COLORS[H]), ("memory", CLASS_COLORS[M])],
        "r2": [("healthy", CLASS_COLORS[H]), ("none", NO_DATA_COLOR)],
    }
    assert strip.rows[1]["cells"][1].title == "r2 at 08:01:00: no data"
    assert strip.legend == [("memory", CLASS_COLORS[M]), ("healthy", CLASS_COLORS[H]), ("no data", NO_DATA_COLOR)]


def test_a_long_timeline_is_thinned_to_the_cell_cap():
    report = build_fleet([replica("r")], at_unix=T0)
    report.timeline = build_timeline([FleetStep(at_unix=T0 + i, classes={"r": H}) for i in range(MAX_CELLS * 2 + 1)])
    strip = heat_strip(report)
    # 801 steps over at most 400 cells: every 3rd step, 267 cells
    assert strip.columns == 267 and len(strip.rows[0]["cells"]) == 267 <= MAX_CELLS


def test_a_direct_scan_strip_shades_each_scrape_by_waiting_against_the_fleets_peak():
    report = build_fleet(
        [replica("busy", M, waiting=[0.0, 10.0, 20.0]), replica("calm", waiting=[0.0, 0.0]), replica_down()],
        at_unix=T0,
    )
    strip = heat_strip(report)
    assert "the fleet's highest: 20" in strip.caption and strip.columns == 3
    rows = {row["name"]: row["cells"] for row in strip.rows}
    busy = [c.color for c in rows["busy"]]
    # alpha = 0.08 + 0.92 x share of the peak: 0.08, 0.54, 1.0
    assert busy == [_tint(CLASS_COLORS[M], 0.08), _tint(CLASS_COLORS[M], 0.54), CLASS_COLORS[M]]
    assert rows["calm"][0].title == "calm at 08:00:00: 0 waiting"
    assert [(c.cls, c.color) for c in rows["down"]] == [("none", NO_DATA_COLOR)]
    assert "refused" in rows["down"][0].title
    assert strip.axis == ["+0 s", "+2 s", "+4 s"]  # seconds from the longest row's first scrape
    assert strip.legend[-1] == ("no data", NO_DATA_COLOR)


def replica_down() -> FleetTarget:
    return target_from_error("down", "http://d:1", "refused")


def test_no_samples_and_no_timeline_gives_an_empty_strip_that_says_why():
    strip = heat_strip(build_fleet([replica("a"), replica("b")], at_unix=T0))
    assert strip.columns == 0 and strip.caption == "no replica recorded per-scrape waiting requests"


@pytest.fixture(scope="module")
def page() -> str:
    hostile = replica('<script>alert("x")</script>', M, waiting=[1.0])
    report = build_fleet([hostile, replica("b", waiting=[0.0]), replica("c", waiting=[0.0])], at_unix=T0)
    report.notes.append("<img src=x onerror=alert(1)>")
    return render_fleet_html(report)


def test_the_page_runs_no_script_and_loads_nothing(page: str):
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page)
    assert csp is not None
    policy = html.unescape(csp.group(1))
    assert "default-src 'none'" in policy and "script-src 'none'" in policy
    assert "<script" not in page.lower()
    assert not re.search(r'(?:src|href)="(?:https?:)?//', page)  # no external resource


def test_server_strings_are_escaped(page: str):
    assert "&lt;script&gt;alert(" in page
    assert "<img src=x" not in page


def test_the_title_counts_the_replicas_by_class(page: str):
    assert "<title>llmdiag fleet report: 3 replicas (1 memory, 2 healthy)</title>" in page
