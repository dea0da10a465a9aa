"""The Markdown summary: compact, and a server's strings cannot break its table or inject markup."""

from __future__ import annotations

import re

from llmdiag.model import Category, Evidence, Finding, Severity, Verdict, Window
from llmdiag.render.markdown import code, md, render_markdown

HOSTILE = "x | y\nz <script>alert(1)</script> [a](http://evil) `tick` **b** _u_"


def verdict() -> Verdict:
    evidence = Evidence(
        signal="kv_cache_usage_ratio",
        stat="max",
        value=0.99,
        unit="ratio",
        threshold=0.9,
        op=">=",
        source=f"vllm /metrics: {HOSTILE}",
    )
    finding = Finding(
        code="MEM001",
        slug="kv-cache-saturated",
        title=f"title {HOSTILE}",
        category=Category.memory,
        severity=Severity.critical,
        summary="s",
        evidence=[evidence, evidence],
        fixes=[f"fix {HOSTILE}", "--gpu-memory-utilization 0.95 | more"],
    )
    return Verdict(
        bottleneck="memory",
        confidence=0.8,
        confidence_label="high",
        summary=f"summary {HOSTILE}",
        window=Window(duration_seconds=20, scrapes=21),
        target=f"http://h {HOSTILE}",
        findings=[finding],
    )


def cells(row: str) -> int:
    """Cells of a GFM table row: split on pipes that are not backslash-escaped."""
    return len(re.split(r"(?<!\\)\|", row.strip().strip("|")))


def test_table_rows_keep_their_column_count_whatever_the_server_wrote():
    text = render_markdown(verdict())
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert len(rows) == 4  # header, rule, two evidence rows
    assert {cells(row) for row in rows} == {6}


def test_no_raw_html_or_links_from_server_strings():
    # inside a code span GitHub shows '<script>' as text; outside one it must be escaped
    text = re.sub(r"(?<!\\)`[^`]*(?<!\\)`", "CODE", render_markdown(verdict()))
    assert "<script>" not in text and not re.search(r"(?<!\\)\]\(http://evil\)", text)
    assert "\\<script\\>" in text
    # the one HTML the renderer writes itself is the collapsible skipped-rules list
    assert set(re.findall(r"(?<!\\)<(/?\w+)", text)) <= {"details", "/details", "summary", "/summary", "sub", "/sub"}


def test_every_line_of_server_text_stays_on_one_line():
    assert "\n" not in md("a\nb\r\nc") and "\n" not in code("a\nb")
    assert md("snake_case_name") == "snake_case_name"  # readable; GitHub never emphasises inside a word
    assert md("_x_") == "\\_x\\_"
    assert code("a|b`c") == "`a\\|b'c`"


def test_headline_carries_class_and_confidence():
    first = render_markdown(verdict()).splitlines()[0]
    assert "MEMORY-BOUND" in first and "0.80" in first and "high" in first
