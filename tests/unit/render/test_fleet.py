"""The fleet report for the terminal: context, class counts, replicas worst first with why, the imbalance findings with
each replica's figure, and the timeline strip (one letter per class, a dot where there is no data).

The fleets are judged by the real fleet rules (llmdiag.engine.fleet.build_fleet); 1_800_000_000 is
2027-01-15 08:00:00 UTC.
"""

from __future__ import annotations

import io

from rich.console import Console

from llmdiag.engine.fleet import build_fleet, build_timeline, target_from_error
from llmdiag.model import Bottleneck, FleetStep, FleetTarget, ReplicaNumbers
from llmdiag.render.fleet import MAX_STRIP_COLUMNS, render_fleet, render_timeline, timeline_strip

T0 = 1_800_000_000.0
H, M, S = Bottleneck.healthy, Bottleneck.memory, Bottleneck.scheduling


def text_of(renderable) -> str:
    console = Console(width=220, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def replica(name: str, rate: float, ttft: float, cls: Bottleneck = H, state: str = "OK") -> FleetTarget:
    return FleetTarget(
        name=name,
        bottleneck=cls,
        state=state,
        confidence=0.7,
        primary="MEM001" if cls is M else "",
        numbers=ReplicaNumbers(
            request_rate_per_second=rate,
            requests_in_system_mean=rate,
            requests_running_mean=12.0,
            kv_cache_usage_max_ratio=0.5,
            ttft_p90_seconds=ttft,
            generation_tokens_per_second=900.0,
        ),
    )


def uneven_fleet():
    """'a' gets 30 requests/s against 4 and 5: the router-uneven-load rule (SCH008) names it."""
    targets = [replica("a", 30.0, 0.02, cls=M, state="CRITICAL"), replica("b", 4.0, 0.02), replica("c", 5.0, 0.02)]
    return build_fleet(targets, source="3 direct targets", window_seconds=10.0, at_unix=T0)


def test_context_and_class_counts_head_the_report():
    text = text_of(render_fleet(uneven_fleet()))
    lines = [line.strip() for line in text.splitlines()]
    assert lines[0] == "3 direct targets · 2027-01-15 08:00:00 UTC · window 10 s each"
    assert lines[1].split() == ["3", "replicas:", "1", "memory", "2", "healthy"]


def test_replicas_worst_first_with_their_numbers_and_who_flagged_them():
    text = text_of(render_fleet(uneven_fleet()))
    rows = [line.split() for line in text.splitlines() if line.split()[:1] in (["a"], ["b"], ["c"])]
    assert [row[0] for row in rows] == ["a", "b", "c"]  # the flagged critical one first, then equal TTFTs by name
    assert rows[0][:5] == ["a", "memory", "0.70", "CRITICAL", "30"]
    assert rows[2][:5] == ["c", "healthy", "0.70", "OK", "5"]
    assert "MEM001 · flagged by SCH008" in text


def test_the_imbalance_finding_lists_each_replicas_figure_highest_first():
    text = text_of(render_fleet(uneven_fleet()))
    block = text.split("Imbalance across replicas", 1)[1]
    assert "SCH008" in block.splitlines()[1] and "[router-uneven-load]" in block.splitlines()[1]
    # the figure compared is finished requests/s: 30 over the upper median of the others (5) = 6.00x
    assert "finished requests/s per replica: a 30 req/s, c 5 req/s, b 4 req/s" in block
    # the other peer ratios of the finding's evidence: requests in the system, 30 over 5 again
    assert "replica_requests_in_system_max_over_peers_ratio = 6.00x" in block


def test_an_even_fleet_says_why_no_rule_fired_and_a_failed_replica_shows_its_error():
    report = build_fleet(
        [replica("a", 5.0, 0.02), replica("b", 5.0, 0.02), target_from_error("down", "http://d:1", "refused", "start")],
        source="3 direct targets",
        at_unix=T0,
    )
    text = text_of(render_fleet(report))
    none_line = next(line for line in text.splitlines() if line.strip().startswith("none ("))
    assert "SCH008 passed" in none_line and "SCH009 passed" in none_line
    assert "refused (HINT: start)" in text
    assert "1 of 3 target(s) could not be judged" in text  # the report's note, under Notes


def test_prometheus_context_names_the_queries_and_scrape_interval():
    report = uneven_fleet()
    report.window_seconds, report.queries, report.scrape_interval_seconds = None, 12, 15.0
    first = text_of(render_fleet(report)).splitlines()[0].strip()
    assert first == "3 direct targets · 2027-01-15 08:00:00 UTC · 12 PromQL queries, scrape every 15 s"


def test_the_strip_has_a_letter_per_step_and_a_dot_where_a_replica_had_no_data():
    steps = [
        FleetStep(at_unix=T0, classes={"r1": H, "r2": H}),
        FleetStep(at_unix=T0 + 60, classes={"r1": H, "r2": M}),
        FleetStep(at_unix=T0 + 120, classes={"r1": S}),
    ]
    text = timeline_strip(build_timeline(steps, 60)).plain.splitlines()
    assert text[0].strip() == "08:00:00 … 08:02:00 UTC (one column per step)"  # under an hour: to the second
    assert [line.split() for line in text[1:3]] == [["r1", "hhS"], ["r2", "hM·"]]
    assert text[3].split() == ["M", "memory", "S", "scheduling", "h", "healthy", "·", "no", "data"]


def test_a_long_timeline_is_thinned_to_fit_and_says_so():
    steps = [FleetStep(at_unix=T0 + 60 * i, classes={"r": H}) for i in range(150)]
    lines = timeline_strip(build_timeline(steps, 60)).plain.splitlines()
    # over an hour: to the minute; the last column shown is step 147 (every 3rd from 0), at 10:27
    assert lines[0].split()[:3] == ["08:00", "…", "10:27"]
    # 150 steps over 72 columns: every 3rd step, 50 columns
    assert lines[1].split() == ["r", "h" * 50]
    assert len(lines[1].split()[1]) <= MAX_STRIP_COLUMNS and "every 3 step(s)" in lines[0]


def test_the_timeline_names_the_first_replica_to_go_and_the_fleets_change():
    steps = [
        FleetStep(at_unix=T0, classes={"r1": H, "r2": H, "r3": H}),
        FleetStep(at_unix=T0 + 300, classes={"r1": H, "r2": M, "r3": H}),
        FleetStep(at_unix=T0 + 600, classes={"r1": M, "r2": M, "r3": H}),
    ]
    text = text_of(render_timeline(build_timeline(steps, 300)))
    assert "first to go: r2 → memory at 2027-01-15 08:05:00 UTC" in text
    assert "2027-01-15 08:10:00 UTC  the fleet: healthy → memory" in text
    assert "2027-01-15 08:10:00 UTC  r1: healthy → memory" in text
    calm = text_of(render_timeline(build_timeline(steps[:1], 300)))
    assert "no replica went from healthy/idle to a bottleneck class" in calm
