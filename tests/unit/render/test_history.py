"""`llmdiag history`: per target, its checks counted by state, the trend of its key numbers, and its latest rows."""

from __future__ import annotations

import io

from rich.console import Console

from llmdiag.history import CheckRow
from llmdiag.render.history import render_history

T0 = 1_800_000_000.0


def text_of(renderable) -> str:
    console = Console(width=200, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def row(minute: int, target: str = "a", state: str = "OK", **numbers: object) -> CheckRow:
    return CheckRow(at_unix=T0 + 60 * minute, target=target, url=f"http://{target}:8000", state=state, **numbers)  # type: ignore[arg-type]


def test_no_rows_says_where_it_looked_and_over_what_span():
    assert text_of(render_history([], "24h", 20, "/var/lib/h.sqlite")).strip() == (
        "no checks in the last 24h in /var/lib/h.sqlite"
    )


def test_each_target_counts_its_states_and_gives_median_and_latest_with_the_change():
    rows = [
        row(0, ttft_p95_seconds=0.1, generation_tokens_per_second=1500.0, bottleneck="healthy"),
        row(1, ttft_p95_seconds=0.2, bottleneck="healthy"),
        row(2, state="CRITICAL", ttft_p95_seconds=0.4, generation_tokens_per_second=500.0, bottleneck="memory"),
    ]
    text = text_of(render_history(rows, "24h", 20, "h.sqlite"))
    assert "a (http://a:8000): 3 checks in the last 24h: 2 OK, 1 CRITICAL" in text
    # TTFT: median of 0.1, 0.2, 0.4 is 0.2; the latest 0.4 is twice that
    assert "TTFT p95  median 0.200 s, latest 0.400 s (+100% vs median)" in text
    # tokens/s: the rows without a value are left out: median of 1500 and 500 is 1000; 500 is half
    assert "tokens/s  median 1,000, latest 500 (-50% vs median)" in text
    assert "TPOT p95  tpot_p95_seconds: unavailable" in text  # never measured: said, not zero


def test_targets_are_listed_by_name_and_only_the_last_rows_up_to_the_limit():
    rows = [row(i, target="b", findings=f"MEM00{i}:critical") for i in range(1, 6)] + [row(0, target="a")]
    text = text_of(render_history(rows, "7d", 2, "h.sqlite"))
    assert text.index("a (http://a:8000)") < text.index("b (http://b:8000)")
    assert "b (http://b:8000): 5 checks in the last 7d: 5 OK" in text  # the count is of every row
    shown = [code for code in ("MEM001", "MEM002", "MEM003", "MEM004", "MEM005") if code in text]
    assert shown == ["MEM004", "MEM005"]  # the table: the last 2


def test_a_failed_check_is_not_diagnosed_and_shows_its_error():
    rows = [row(0, state="UNKNOWN", error="connection refused", requests_running_mean=None)]
    text = text_of(render_history(rows, "24h", 20, "h.sqlite"))
    line = next(line for line in text.splitlines() if "UNKNOWN" in line and "not diagnosed" in line)
    assert "error: connection refused" in line
    assert "1 UNKNOWN" in text


def test_a_zero_median_gives_no_percentage():
    rows = [row(0, generation_tokens_per_second=0.0), row(1, generation_tokens_per_second=0.0)]
    assert "tokens/s  median 0, latest 0\n" in text_of(render_history(rows, "1h", 20, "h.sqlite"))
