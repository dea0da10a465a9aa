"""`llmdiag capacity --compare` end to end through the CLI: every comparison's table in JSON with the physics and
the simulator side by side, the direction each classic comparison must show (never an absolute figure), the
terminal tables, the HTML page with a table and charts per comparison, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmdiag.model.compare import COMPARISONS
from tests.conftest import run_cli
from tests.e2e.test_capacity_cli import assert_usage_error
from tests.support import browser

# 64 users on 32 slots: a queue, so priority has something to reorder
CASE = (
    "capacity",
    "--gpu",
    "H100",
    "--model",
    "llama-3-8b",
    "--users",
    "64",
    "--max-num-seqs",
    "32",
    "--prompt-tokens",
    "500",
    "--output-tokens",
    "200",
)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    html = tmp_path_factory.mktemp("compare") / "compare.html"
    result = run_cli(*CASE, "--compare", "all", "--json", "--html", str(html))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # --json: no progress lines
    return json.loads(result.stdout), html


def rows(report: dict, name: str) -> dict[tuple[str, str], dict]:
    comparison = next(c for c in report["comparisons"] if c["name"] == name)
    return {(r["alternative"], r["method"]): r["values"] for r in comparison["rows"]}


def test_every_comparison_has_the_physics_beside_the_simulator(report):
    data, _ = report
    assert data["kind"] == "compare" and [c["name"] for c in data["comparisons"]] == list(COMPARISONS)
    assert data["inputs"]["users"] == 64 and data["inputs"]["max_num_seqs"] == 32
    for comparison in data["comparisons"]:
        keys = [c["key"] for c in comparison["columns"]]
        assert set(comparison["chart_columns"]) <= set(keys)
        assert comparison["finding"] and comparison["rows"]
        methods = {r["method"] for r in comparison["rows"]}
        assert {"physics", "simulator"} <= methods, comparison["name"]
        for row in comparison["rows"]:
            assert list(row["values"]) == keys
            # a figure a method cannot give is null with the reason, never 0
            assert {k for k, v in row["values"].items() if v is None} == set(row["unavailable"])


def test_continuous_batching_beats_static_when_output_lengths_spread(report):
    table = rows(report[0], "batching")
    for method in ("physics", "simulator"):
        cont, static = table["continuous ±90%", method], table["static ±90%", method]
        assert cont["total_tokens_per_second"] > static["total_tokens_per_second"], method
        assert static["idle_slot_ratio"] > cont["idle_slot_ratio"], method
        # the wider the spread, the more a static batch loses
        assert table["static ±0%", method]["total_tokens_per_second"] > static["total_tokens_per_second"]


def test_paged_kv_fits_more_sequences_than_reserving_the_maximum(report):
    table = rows(report[0], "kv")
    reserved = next(v for (a, m), v in table.items() if a.startswith("reserved") and m == "physics")
    paged = next(v for (a, m), v in table.items() if a.startswith("paged") and m == "physics")
    assert paged["sequences_fit"] > reserved["sequences_fit"]
    assert reserved["kv_waste_ratio"] > paged["kv_waste_ratio"]


def test_narrower_weights_shrink_memory_and_speed_the_step(report):
    table = rows(report[0], "precision")
    bf16, fp8, int4 = table["BF16", "physics"], table["FP8", "physics"], table["INT4 weight-only", "physics"]
    assert bf16["weight_bytes_per_gpu"] == 2 * fp8["weight_bytes_per_gpu"] == 4 * int4["weight_bytes_per_gpu"]
    assert fp8["kv_bytes_per_token_per_gpu"] * 2 == bf16["kv_bytes_per_token_per_gpu"]  # FP8 KV
    assert fp8["sequences_fit"] > bf16["sequences_fit"]
    for method in ("physics", "simulator"):
        assert table["FP8", method]["total_tokens_per_second"] > table["BF16", method]["total_tokens_per_second"]
    comparison = next(c for c in report[0]["comparisons"] if c["name"] == "precision")
    assert any("your judgement" in line for line in comparison["basis"])


def test_priority_serves_paid_users_first_and_free_users_wait(report):
    table = rows(report[0], "priority")
    for method in ("physics", "simulator"):
        paid, free = table["priority, paid users", method], table["priority, free users", method]
        assert (
            paid["ttft_p50_seconds"] < table["FCFS, paid users", method]["ttft_p50_seconds"] < free["ttft_p50_seconds"]
        )


def test_disaggregation_and_the_naive_division(report):
    table = rows(report[0], "disagg")
    assert table["disaggregated: 1 prefill + 1 decode", "simulator"]["gpus"] == 2
    users = rows(report[0], "users")
    naive = next(v for (a, m), v in users.items() if m == "naive")
    served = users["batching: continuous ±0%", "simulator"]
    assert served["per_user_tokens_per_second"] > 10 * naive["per_user_tokens_per_second"]


def test_the_terminal_shows_a_table_per_comparison():
    result = run_cli(*CASE, "--compare", "batching,precision")
    assert result.returncode == 0, result.stderr
    assert "comparing: batching" in result.stderr
    assert "Static vs continuous batching" in result.stdout and "KV reserved" not in result.stdout
    assert "your judgement" in result.stdout


def test_the_html_page_has_a_table_and_charts_per_comparison(report):
    _, html = report
    text = html.read_text()
    for name in COMPARISONS:
        assert f'id="compare-{name}"' in text
    assert "chart-batching-total_tokens_per_second" in text and "Content-Security-Policy" in text


def test_the_html_page_draws_in_chromium(report):
    browser.require()
    _, html = report
    with browser.open_file(html) as visit:
        assert visit.page_errors == [] and visit.console_errors == []
        assert visit.requests == [html.resolve().as_uri()]
        drawn = int(visit.page.get_attribute("body", "data-charts-rendered") or 0)
        assert drawn == visit.page.locator(".chart").count() > len(COMPARISONS)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("--compare", "speed"), ("unknown comparison 'speed'", "batching, kv")),
        (("--html", "x.html"), ("--html goes with --compare",)),
        (("--compare", "kv", "--simulate"), ("--simulate and --compare", "drop --simulate")),
    ],
)
def test_bad_compare_input_is_one_error_and_one_hint(args, needles):
    assert_usage_error(run_cli(*CASE, *args), *needles)


def test_long_prompts_slow_the_decodes_they_share_a_step_with_and_disaggregation_removes_it():
    long_prompts = ("--users", "128", "--prompt-tokens", "4000", "--output-tokens", "200")
    result = run_cli(*CASE[:5], *long_prompts, "--max-num-batched-tokens", "2048", "--compare", "disagg", "--json")
    assert result.returncode == 0, result.stderr
    table = rows(json.loads(result.stdout), "disagg")
    for method in ("physics", "simulator"):
        whole = table["colocated, whole prompts", method]["itl_p90_seconds"]
        chunked = table["colocated, chunked prefill", method]["itl_p90_seconds"]
        apart = table["disaggregated: 1 prefill + 1 decode", method]["itl_p90_seconds"]
        assert whole > chunked > apart, method
