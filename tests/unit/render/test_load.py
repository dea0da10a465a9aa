"""`llmdiag load`'s table: a row per level, the knee, and the per-user arithmetic ("do N users each get X/N?")."""

from __future__ import annotations

import io

from rich.console import Console

from llmdiag.model import Bottleneck, Knee, LoadPoint, LoadReport, Percentiles, Verdict, Window
from llmdiag.render.load import render_load, seed_arithmetic


def text_of(report: LoadReport) -> str:
    console = Console(width=200, record=True, file=io.StringIO(), color_system=None)
    console.print(render_load(report))
    return console.export_text()


def point(users: int | None, total: float, p50: float, **extra: object) -> LoadPoint:
    return LoadPoint(
        users=users,
        window_seconds=20.0,
        requests_completed=40,
        output_tokens_per_second=total,
        naive_per_user_tokens_per_second=total / users if users else None,
        per_user_decode_tokens_per_second=Percentiles(count=40, p5=p50 * 0.8, p50=p50, p95=p50 * 1.2),
        per_user_tokens_per_second=Percentiles(count=40, p50=p50 * 0.9),
        ttft_seconds=Percentiles(count=40, p50=0.05, p99=0.25),
        itl_seconds=Percentiles(count=40, p50=0.0123, p99=0.04),
        **extra,  # type: ignore[arg-type]
    )


def memory_verdict() -> Verdict:
    return Verdict(
        bottleneck=Bottleneck.memory,
        confidence=0.8,
        confidence_label="high",
        summary="Memory-bound: KV cache full",
        window=Window(duration_seconds=20),
        findings=[],
    )


def sweep() -> LoadReport:
    one = point(1, 50.0, 50.0)
    eight = point(8, 320.0, 40.0, errors={"http 503": 3, "timeout": 1}, goodput_ratio=0.75)
    eight.verdict = memory_verdict().model_copy(update={"findings": [_finding()]})
    return LoadReport(
        target="http://127.0.0.1:8000",
        model="llama",
        prompt_tokens="256",
        output_tokens="128",
        points=[one, eight],
        knee=Knee(users=8, reason="per-user speed fell to 80% of 1 user's", bottleneck=Bottleneck.memory),
        notes=["at 8: two requests timed out"],
    )


def _finding():
    from llmdiag.model import Category, Evidence, Finding, Severity

    return Finding(
        code="MEM001",
        slug="kv-cache-saturated",
        title="KV cache full",
        category=Category.memory,
        severity=Severity.critical,
        summary="s",
        evidence=[Evidence(signal="x", stat="value", value=1.0, unit="ratio")],
    )


def test_seed_arithmetic_splits_the_lightest_total_and_this_levels_total_n_ways():
    report = sweep()
    one, eight = report.points
    # 50 tok/s at 1 user split 8 ways: 6.25 each; 320 tok/s at 8 users: 40 each (naive X/N)
    assert seed_arithmetic(eight, one) == (
        "8 users: the 50.0 tok/s of 1 user split 8 ways would be 6.2 each; the server did 320 tok/s total "
        "(naive X/N 40.0); users measured p50 40.0 tok/s while streaming, 36.0 over the whole request"
    )
    # the lightest level is not compared with itself
    assert seed_arithmetic(one, one) == (
        "1 user: the server did 50.0 tok/s total (naive X/N 50.0); users measured p50 50.0 tok/s while streaming, "
        "45.0 over the whole request"
    )


def test_an_open_loop_level_has_no_users_to_split_among():
    rate_point = point(None, 300.0, 30.0, rate_per_second=4.0)
    assert seed_arithmetic(rate_point, rate_point) is None


def test_the_table_has_a_row_per_level_with_its_figures():
    text = text_of(sweep())
    assert "http://127.0.0.1:8000 · model llama · prompt 256 / output 128 tokens" in text
    rows = [line.split() for line in text.splitlines() if line.strip().startswith(("1 ", "8 "))]
    # users, ok, errors, TTFT p50 / p99 ms, ITL p50 / p99 ms, tok/s, per user p5 / p50 / p95, naive X/N
    assert rows[0][:14] == ["1", "40", "0", "50.0", "/", "250", "12.3", "/", "40.0", "50.0", "40.0", "/", "50.0", "/"]
    assert rows[1][-4:] == ["48.0", "40.0", "75%", "memory"]
    assert "4 (3 http 503, 1 timeout)" in text  # errors: the total, then the commonest kinds


def test_the_knee_says_where_and_why_and_the_class_there():
    text = text_of(sweep())
    assert "Knee at 8 users: per-user speed fell to 80% of 1 user's; the server there is memory" in text
    assert "at 8 users: Memory-bound: KV cache full" in text  # a level with findings says its summary
    assert "- at 8: two requests timed out" in text


def test_a_sweep_without_a_knee_says_the_speed_held():
    report = sweep()
    report.knee = None
    assert "No knee: per-user speed and goodput held across the sweep" in text_of(report)
    report.points = report.points[:1]  # one level: nothing to compare, nothing said
    assert "No knee" not in text_of(report)


def test_open_loop_levels_are_rates():
    report = LoadReport(mode="open", points=[point(None, 300.0, 30.0, rate_per_second=4.0)])
    report.knee = Knee(rate_per_second=4.0, reason="goodput fell below 90%")
    text = text_of(report)
    assert any(line.split()[:2] == ["rate", "ok"] for line in text.splitlines() if line.strip())
    assert any(line.strip().startswith("4/s ") for line in text.splitlines())
    assert "Knee at 4 requests/s: goodput fell below 90%" in text
