"""Render a LoadReport for the terminal: one row per load level, the knee, and the per-user arithmetic."""

from __future__ import annotations

from rich import box
from rich.console import Group, JustifyMethod, RenderableType
from rich.table import Table
from rich.text import Text

from llmdiag.model import LoadPoint, LoadReport, Percentiles
from llmdiag.render.abtest import render_comparison
from llmdiag.render.format import UNAVAILABLE, milliseconds, rate
from llmdiag.render.terminal import CLASS_STYLE


def _pair_ms(p: Percentiles, low: str = "p50", high: str = "p99") -> str:
    return f"{milliseconds(getattr(p, low))} / {milliseconds(getattr(p, high))}"


def _level(point: LoadPoint) -> str:
    return f"{point.users}" if point.users is not None else f"{point.rate_per_second:g}/s"


def _where(point: LoadPoint) -> str:
    return _users(point.users) if point.users is not None else f"{point.rate_per_second:g} requests/s"


def _errors(point: LoadPoint) -> Text:
    total = sum(point.errors.values())
    if not total:
        return Text("0")
    worst = ", ".join(f"{n} {kind}" for kind, n in list(point.errors.items())[:2])
    return Text(f"{total} ({worst})", style="red")


def _users(n: int) -> str:
    return f"{n} user" if n == 1 else f"{n} users"


def seed_arithmetic(point: LoadPoint, lightest: LoadPoint) -> str | None:
    """The question every team gets asked: "we do X tokens/s; with N users does each get X/N?" Answered with the
    lightest load's total split N ways, this level's own total split N ways, and what users measured."""
    if point.users is None or point.output_tokens_per_second is None or point.naive_per_user_tokens_per_second is None:
        return None
    streaming = point.per_user_decode_tokens_per_second.p50
    overall = point.per_user_tokens_per_second.p50
    split = ""
    if point is not lightest and lightest.output_tokens_per_second and lightest.users:
        split = (
            f"the {rate(lightest.output_tokens_per_second)} tok/s of {_users(lightest.users)} split "
            f"{point.users} ways would be {rate(lightest.output_tokens_per_second / point.users)} each; "
        )
    return (
        f"{_users(point.users)}: {split}the server did {rate(point.output_tokens_per_second)} tok/s total (naive "
        f"X/N {rate(point.naive_per_user_tokens_per_second)}); users measured p50 {rate(streaming)} tok/s while "
        f"streaming, {rate(overall)} over the whole request"
    )


def render_load(report: LoadReport) -> RenderableType:
    level = "users" if report.mode == "closed" else "rate"
    table = Table(
        title=f"{report.target} · model {report.model} · prompt {report.prompt_tokens} / output "
        f"{report.output_tokens} tokens",
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        pad_edge=False,
    )
    # TPOT and end-to-end percentiles are in --json; the table keeps what fits in 100 columns
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        (level, "right"),
        ("ok", "right"),
        ("errors", "left"),
        ("TTFT ms\np50/p99", "right"),
        ("ITL ms\np50/p99", "right"),
        ("tok/s\ntotal", "right"),
        ("per user tok/s\np5/p50/p95", "right"),
        ("naive\nX/N", "right"),
        ("good-\nput", "right"),
        ("verdict", "left"),
    )
    for title, justify in columns:
        table.add_column(title, justify=justify, no_wrap=True, min_width=10 if title == "verdict" else None)
    for point in report.points:
        per_user = point.per_user_decode_tokens_per_second
        verdict = Text(UNAVAILABLE)
        if point.verdict is not None:
            verdict = Text(point.verdict.bottleneck.value, style=CLASS_STYLE[point.verdict.bottleneck])
        goodput = UNAVAILABLE if point.goodput_ratio is None else f"{point.goodput_ratio:.0%}"
        table.add_row(
            _level(point),
            str(point.requests_completed),
            _errors(point),
            _pair_ms(point.ttft_seconds),
            _pair_ms(point.itl_seconds),
            rate(point.output_tokens_per_second),
            f"{rate(per_user.p5)} / {rate(per_user.p50)} / {rate(per_user.p95)}",
            rate(point.naive_per_user_tokens_per_second),
            goodput,
            verdict,
        )
    parts: list[RenderableType] = [table]
    lines = Text()
    if report.knee is not None:
        knee = report.knee
        where = _users(knee.users) if knee.users is not None else f"{knee.rate_per_second:g} requests/s"
        lines.append(f"Knee at {where}: {knee.reason}", style="bold")
        if knee.bottleneck is not None:
            lines.append(f"; the server there is {knee.bottleneck.value}", style="bold")
        lines.append("\n")
    elif len(report.points) > 1:
        lines.append("No knee: per-user speed and goodput held across the sweep\n", style="green")
    for point in report.points:
        arithmetic = seed_arithmetic(point, report.points[0])
        if arithmetic:
            lines.append(f"  {arithmetic}\n", style="dim")
    for point in report.points:
        if point.verdict is not None and point.verdict.findings:
            lines.append(f"  at {_where(point)}: {point.verdict.summary}\n")
    for note in report.notes:
        lines.append(f"  - {note}\n", style="dim")
    parts.append(lines)
    if report.comparison is not None:
        parts.append(render_comparison(report.comparison))
    return Group(*parts)
