"""`llmdiag analyze` on what people paste: a whole incident (log, dump, DCGM page) in one command, wrapper text
and all. Through the CLI in a subprocess, as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import FIXTURES, run_cli

MEMORY = FIXTURES / "vllm-0.32.0" / "memory"
LOG = FIXTURES / "logs" / "vllm-0.32-kv-starved.log"
DCGM = FIXTURES / "dcgm" / "a800-8gpu-mig-idle.prom"


def github_comment(path: Path, source: Path) -> Path:
    """A real page quoted into a GitHub comment: a reply header, a quoted fence, a remark after it."""
    body = "\n".join(f"> {line}" for line in source.read_text().splitlines())
    path.write_text(f"@maintainer here is /metrics while it was stuck:\n\n> ```\n{body}\n> ```\n\nvLLM 0.32, 1 GPU\n")
    return path


def analyze(*args: str) -> dict:
    result = run_cli("analyze", "--json", "--fail-on", "never", *args)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


def test_a_pasted_dump_gives_the_verdict_of_the_dump_itself(tmp_path):
    pasted = analyze(str(github_comment(tmp_path / "comment.md", MEMORY / "scrape-06.prom")))
    direct = analyze(str(MEMORY / "scrape-06.prom"))
    assert pasted["bottleneck"] == direct["bottleneck"] == "memory"
    assert [f["code"] for f in pasted["findings"]] == [f["code"] for f in direct["findings"]]
    # the page's own numbers: 30 waiting, 27 preemptions against 26 finished requests
    evidence = {(e["signal"], e["stat"]): e["value"] for e in pasted["findings"][0]["evidence"]}
    assert evidence[("requests_waiting_avg", "value")] == 30
    assert evidence[("preemptions_per_finished_request", "value")] == 27 / 26
    assert pasted["window"] == direct["window"]


def test_bad_lines_are_counted_in_the_coverage(tmp_path):
    lines = (MEMORY / "scrape-06.prom").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("vllm:num_requests_running{"))
    lines.insert(at, "vllm:num_requests_running{...} 2.0")  # elided labels, as people shorten a page
    lines.append("vllm:kv_cache_usage_perc{engine=")  # the paste cut off mid-line
    page = tmp_path / "page.txt"
    page.write_text("\n".join(lines))
    verdict = analyze(str(page))
    [source] = verdict["coverage"]["probes"]
    assert f"skipped 2 unreadable lines (first: line {at + 1})" in source["note"]
    assert verdict["signals"]["requests_running"]["stats"]["last"] == 2  # the real line, kept


def test_one_command_reads_a_log_a_dump_and_a_dcgm_page(tmp_path):
    dump = github_comment(tmp_path / "metrics.md", MEMORY / "scrape-06.prom")
    verdict = analyze(str(LOG), str(dump), str(DCGM))
    probes = verdict["coverage"]["probes"]
    assert [p["probe"] for p in probes] == ["vllm-log", "vllm", "dcgm"]
    assert all("gave " in p["note"] for p in probes)
    assert verdict["target"].startswith("3 files: ")
    assert verdict["signals"]["ttft_seconds"]["source"].startswith("vllm /metrics")  # from the dump
    assert verdict["signals"]["gpu_temperature_celsius"]["stats"]["last"] == 33  # the hottest A800 in the page
    assert verdict["signals"]["requests_running"]["source"].startswith("vLLM log")  # the log's window


def test_a_dcgm_page_alone_is_judged_as_a_snapshot():
    verdict = analyze(str(DCGM))
    assert verdict["window"]["kind"] == "snapshot" and verdict["window"]["duration_seconds"] is None
    assert verdict["bottleneck"] == "unknown"  # no server page: never idle, never healthy
    assert "no server page or log given" in verdict["signals"]["requests_running"]["unavailable"]
    assert verdict["signals"]["gpu_memory_used_bytes"]["unavailable"] is None


def test_since_with_dumps_present_cuts_only_the_logs():
    verdict = analyze(str(LOG), str(MEMORY / "scrape-06.prom"), "--since", "15s")
    assert verdict["window"]["duration_seconds"] == 10  # the log's last two stat lines, 10 s apart
    assert verdict["signals"]["ttft_seconds"]["stats"]["count"] > 0  # the dump, whole
