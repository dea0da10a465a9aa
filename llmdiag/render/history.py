"""The check history as a table per target: what `llmdiag history` prints."""

from __future__ import annotations

import statistics
import time

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from llmdiag.history import CheckRow
from llmdiag.render.format import UNAVAILABLE, rate

STATE_STYLE = {"OK": "green", "WARNING": "yellow", "CRITICAL": "bold red", "UNKNOWN": "magenta"}


def _seconds(value: float | None) -> str:
    return UNAVAILABLE if value is None else f"{value:.3f} s"


def _rate(value: float | None) -> str:
    return rate(value, whole_from=0)


def _trend(rows: list[CheckRow], column: str, fmt) -> str:
    values = [v for r in rows if (v := getattr(r, column)) is not None]
    if not values:
        return f"{column}: {UNAVAILABLE}"
    median = statistics.median(values)
    latest = values[-1]
    change = f" ({latest / median - 1:+.0%} vs median)" if median > 0 else ""
    return f"median {fmt(median)}, latest {fmt(latest)}{change}"


def render_history(rows: list[CheckRow], since: str, limit: int, path: str) -> RenderableType:
    if not rows:
        return Text(f"no checks in the last {since} in {path}")
    parts: list[RenderableType] = []
    targets = sorted({r.target for r in rows})
    for target in targets:
        mine = [r for r in rows if r.target == target]
        states = {s: sum(1 for r in mine if r.state == s) for s in STATE_STYLE}
        counts = ", ".join(f"{n} {s}" for s, n in states.items() if n)
        parts.append(Text(f"{target} ({mine[-1].url}): {len(mine)} checks in the last {since}: {counts}", style="bold"))
        parts.append(Text(f"  TTFT p95  {_trend(mine, 'ttft_p95_seconds', _seconds)}"))
        parts.append(Text(f"  TPOT p95  {_trend(mine, 'tpot_p95_seconds', _seconds)}"))
        parts.append(Text(f"  tokens/s  {_trend(mine, 'generation_tokens_per_second', _rate)}"))
        table = Table(box=None, header_style="bold", pad_edge=False)
        for column in ("time", "state", "class", "TTFT p95", "TPOT p95", "tokens/s", "running", "findings"):
            table.add_column(column)
        for r in mine[-limit:]:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.at_unix))
            running = UNAVAILABLE if r.requests_running_mean is None else f"{r.requests_running_mean:.1f}"
            findings = r.findings or ("" if r.error is None else f"error: {r.error}")
            table.add_row(
                when,
                Text(r.state, style=STATE_STYLE.get(r.state, "")),
                r.bottleneck or "not diagnosed",
                _seconds(r.ttft_p95_seconds),
                _seconds(r.tpot_p95_seconds),
                _rate(r.generation_tokens_per_second),
                running,
                findings,
            )
        parts.append(table)
        parts.append(Text(""))
    return Group(*parts)
