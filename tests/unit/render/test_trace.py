"""`llmdiag trace`'s terminal report: per-rank shares, per-collective sizes and bandwidths, the straggler, notes said
once, and the findings. Every figure below is worked out by hand from the report built here."""

from __future__ import annotations

import io

from rich.console import Console

from llmdiag.model import (
    Bottleneck,
    Category,
    CollectiveStats,
    Evidence,
    Finding,
    RankStats,
    Severity,
    Straggler,
    TraceProblem,
    TraceReport,
    Verdict,
    Window,
)
from llmdiag.render.trace import render_trace


def text_of(report: TraceReport) -> str:
    console = Console(width=220, record=True, file=io.StringIO(), color_system=None)
    console.print(render_trace(report))
    return console.export_text()


def rank(number: int | None, timeline: str = "gpu", **stats: object) -> RankStats:
    values: dict[str, object] = dict(
        rank=number,
        path=f"rank{number}.json",
        device="NVIDIA H100",
        timeline=timeline,
        span_seconds=0.0123,
        busy_ratio=0.5,
        comm_share_ratio=0.25,
        exposed_comm_share_ratio=0.125,
        overlap_ratio=None,
        notes=["the last ProfilerStep is cut short"],
    )
    values.update(stats)
    return RankStats(**values)  # type: ignore[arg-type]


def all_reduce(low: float | None, high: float | None) -> CollectiveStats:
    return CollectiveStats(
        collective="all_reduce",
        family="nccl",
        count=7,
        total_seconds=0.0042,
        message_bytes_min=low,
        message_bytes_max=high,
        group_size=2,
        algbw_bytes_per_second=60e9,
        busbw_bytes_per_second=120e9,
    )


def two_ranks() -> TraceReport:
    return TraceReport(
        world_size=2,
        bytes_read=3_500_000,
        parse_seconds=0.5,
        ranks=[
            rank(0, collectives=[all_reduce(1024.0, 2 * 1024**2)]),
            rank(1, collectives=[all_reduce(float(1 << 20), float(1 << 20)), all_reduce(None, None)], notes=[]),
        ],
        straggler=Straggler(
            rank=1,
            latest_count=6,
            matched=7,
            skew_seconds=0.0015,
            max_skew_seconds=0.004,
            lateness_seconds={0: 0.0, 1: 0.0021},
            runner_up=0,
        ),
        link="nvlink4",
        link_source="NVML",
        expected_busbw_bytes_per_second=360e9,
        problems=[TraceProblem(kind="warning", message="1 of 2 ranks has no ProfilerStep")],
    )


def lines_starting(text: str, first: str) -> list[list[str]]:
    """The rows of the tables whose first cell is ``first``, as words (the column rules left out)."""
    rows = [[word for word in line.split() if word != "│"] for line in text.splitlines()]
    return [row for row in rows if row[:1] == [first]]


def test_headline_counts_the_ranks_and_the_bytes_read():
    text = text_of(two_ranks())
    assert text.splitlines()[0].strip() == "2 rank trace(s) of world size 2, 3.5 MB read in 0.50 s"
    report = two_ranks()
    report.hta_compat = True
    assert "; counted HTA's way (µs-rounded, last ProfilerStep dropped" in text_of(report)


def test_per_rank_shares_are_percentages_and_missing_is_n_a():
    rows = lines_starting(text_of(two_ranks()), "0")
    # rank, device (2 words), span ms, busy %, comm %, exposed %, overlap %
    assert rows[0] == ["0", "NVIDIA", "H100", "12.30", "50.0", "25.0", "12.5", "n/a"]


def test_collective_sizes_are_a_range_one_size_or_unknown_and_bandwidth_in_gb_per_s():
    text = text_of(two_ranks())
    assert "1.0 KiB–2.0 MiB" in text
    collective_rows = [row for row in lines_starting(text, "1") if "all_reduce" in row]
    assert collective_rows[0] == ["1", "all_reduce", "nccl", "7", "4.20", "1.0", "MiB", "2", "60.0", "120.0"]
    assert collective_rows[1][5] == "unknown"
    assert "Collectives (kernel time includes waiting for peers)" in text


def test_the_straggler_sentence_in_milliseconds():
    text = " ".join(text_of(two_ranks()).split())
    assert (
        "Straggler: rank 1: it started 6 of 7 matched collectives last, 1.50 ms after the other ranks' median on "
        "average (widest spread 4.00 ms); next latest: rank 0. Mean start after the earliest rank, ms: 0: 0.00, "
        "1: 2.10"
    ) in text


def test_no_straggler_says_why_and_the_link_and_problems_are_said():
    report = two_ranks()
    report.straggler, report.cross_rank = None, "only one rank"
    text = text_of(report)
    assert "Straggler: none named (only one rank)" in text
    assert "Link: nvlink4 (from NVML), expected busbw 360.0 GB/s" in text
    assert "WARNING: 1 of 2 ranks has no ProfilerStep" in text


def test_a_note_of_every_rank_is_said_once_and_one_ranks_note_names_it():
    report = two_ranks()
    assert "rank 0: the last ProfilerStep is cut short" in text_of(report)
    report.ranks[1].notes = ["the last ProfilerStep is cut short"]
    text = text_of(report)
    assert text.count("the last ProfilerStep is cut short") == 1 and "every rank: the last" in text


def test_cpu_only_runs_say_their_time_is_cpu_time_and_paths_are_shown_literally():
    report = TraceReport(ranks=[rank(None, timeline="cpu", device="", path="[bold]run.json")])
    text = text_of(report)
    assert "Per rank (CPU time: no GPU activity; comm = gloo:* ranges, compute = cpu_ops)" in text
    assert "[bold]run.json" in text  # a file name is text, never rich markup
    assert "CPU" in lines_starting(text, "[bold]run.json")[0]
    assert "gloo range time includes waiting for peers" in text
    report.ranks.append(rank(1))
    assert "Per rank (GPU time; CPU time where the device says CPU)" in text_of(report)


def test_findings_with_their_first_fix_or_none_with_the_summary():
    report = two_ranks()
    finding = Finding(
        code="NET008",
        slug="straggler-rank",
        title="One rank starts its collectives late",
        category=Category.network,
        severity=Severity.critical,
        summary="rank 1 is 1.5 ms late",
        evidence=[Evidence(signal="straggler_skew_share_of_step_ratio", stat="value", value=0.2, unit="ratio")],
        fixes=["look at rank 1's host", "second fix"],
    )
    report.verdict = Verdict(
        bottleneck=Bottleneck.network,
        confidence=0.7,
        confidence_label="medium",
        summary="s",
        window=Window(),
        findings=[finding],
    )
    text = text_of(report)
    assert "CRITICAL NET008 One rank starts its collectives late" in text
    assert "  rank 1 is 1.5 ms late" in text and "  fix: look at rank 1's host" in text
    assert "second fix" not in text
    report.verdict.findings, report.verdict.summary = [], "No communication finding in the trace."
    assert "none: No communication finding in the trace." in text_of(report)
