"""`llmdiag whatif` end to end: a real recorded vLLM 0.32 window, analyzed and saved, then re-predicted through the
CLI in each output (the JSON contract other commands read, the terminal table, Markdown and the HTML page)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmdiag.api.scan import diagnose_files
from tests.conftest import FIXTURES, run_cli
from tests.support import browser

FIGURES = {
    "requests_running",
    "requests_waiting",
    "per_user_tokens_per_second",
    "per_user_tokens_per_second_incl_waiting",
    "ttft_p50_seconds",
    "ttft_p90_seconds",
    "total_tokens_per_second",
    "kv_peak_ratio",
    "preemptions_per_second",
}
CONTRACT = {
    "schema_version",
    "tool_version",
    "source",
    "changes",
    "modelled",
    "not_modelled_reason",
    "basis",
    "class_before",
    "class_after",
    "next_limit",
    "before",
    "after",
    "band_ratio",
}


@pytest.fixture(scope="module")
def scheduling(tmp_path_factory) -> Path:
    """The recorded `--max-num-seqs 2` window: 32 closed-loop users, 2 running and ~30 waiting on every page."""
    pages = sorted((FIXTURES / "vllm-0.32.0" / "scheduling").glob("scrape-*.prom"))
    path = tmp_path_factory.mktemp("whatif") / "verdict.json"
    path.write_text(diagnose_files(pages).model_dump_json())
    return path


def test_json_is_the_contract(scheduling):
    result = run_cli("whatif", str(scheduling), "--set", "replicas=2", "--json")
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    assert set(got) == CONTRACT
    assert got["schema_version"] == "3" and got["changes"] == {"replicas": 2}
    assert set(got["before"]) == FIGURES and set(got["after"]) == FIGURES
    assert got["modelled"] is True and got["class_before"] == "scheduling" and got["class_after"] == "scheduling"
    # 32 users over two replicas each capped at 2: 4 run, 28 wait (the pages show 2 running, 29-30 waiting)
    assert got["after"]["requests_running"] == 4 and got["after"]["requests_waiting"] == 28
    assert "still wait" in got["next_limit"]


def test_a_change_the_window_cannot_price_is_refused_with_nulls(scheduling):
    result = run_cli("whatif", str(scheduling), "--set", "max_num_seqs=8", "--json")
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    assert got["modelled"] is False and "step slope" in got["not_modelled_reason"]
    assert all(value is None for value in got["after"].values())  # unknown is null, never 0


def test_terminal_markdown_and_html(scheduling, tmp_path):
    terminal = run_cli("whatif", str(scheduling), "--set", "replicas=2")
    assert terminal.returncode == 0 and "next limit" in terminal.stdout and "waiting" in terminal.stdout
    markdown = run_cli("whatif", str(scheduling), "--set", "replicas=2", "--markdown")
    assert "| waiting | 29.8 | 30.0 | 28.0 |" in markdown.stdout
    page = tmp_path / "whatif.html"
    html = run_cli("whatif", str(scheduling), "--set", "replicas=2", "--html", str(page))
    assert html.returncode == 0, html.stderr
    text = page.read_text()
    assert "Before and after" in text and "whatif_requests" in text and "<script" in text


def test_the_html_page_draws_in_chromium(scheduling, tmp_path):
    """The page a colleague opens: no script error, nothing fetched from outside, every chart drawn."""
    browser.require()
    page = tmp_path / "whatif.html"
    assert run_cli("whatif", str(scheduling), "--set", "replicas=2", "--html", str(page)).returncode == 0
    with browser.open_file(page) as visit:
        assert visit.page_errors == [] and visit.console_errors == []
        assert visit.requests == [page.resolve().as_uri()]
        charts = visit.page.locator(".chart").count()
        assert charts > 0 and int(visit.page.get_attribute("body", "data-charts-rendered") or 0) == charts
