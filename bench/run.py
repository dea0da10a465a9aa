"""Benchmarks, run by hand or in CI (`make bench`); they print, they do not assert.

- parse: time to parse one real vLLM /metrics page and to build a 21-scrape window from it;
- oversized page: peak memory of `llmdiag scan` against a 20 MB page (it must refuse at the cap, not load it);
- scan wall time: a default 20 s scan against a local server replaying real pages.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

from page_server import PageServer, recorded_page

from llmdiag.collect.exposition import parse_exposition
from llmdiag.collect.signals import build_signal_set
from llmdiag.engine.evaluate import build_verdict
from llmdiag.schema.loader import load_probe

REPO = Path(__file__).resolve().parents[1]

FIXTURES = REPO / "tests" / "fixtures" / "vllm-0.32.0"


def real_pages(state: str = "healthy") -> list[Path]:
    return sorted((FIXTURES / state).glob("scrape-*.prom"))


def bench_parse() -> None:
    page = recorded_page(real_pages()[0]).decode()
    runs = 50
    start = time.perf_counter()
    for _ in range(runs):
        parse_exposition(page, 0.0)
    per_parse = (time.perf_counter() - start) / runs
    scrapes = [parse_exposition(page, float(i)) for i in range(21)]
    start = time.perf_counter()
    signals = build_signal_set(load_probe("vllm"), scrapes, "bench")
    build_verdict(signals)
    judge = time.perf_counter() - start
    print(f"parse one real vLLM page ({len(page) / 1024:.0f} KiB): {per_parse * 1000:.1f} ms")
    print(f"window of 21 scrapes -> signals -> verdict: {judge * 1000:.1f} ms")


def child_peak_rss_mib(args: list[str]) -> tuple[float, int, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "llmdiag", *args], capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(peak, before) / 1024, proc.returncode, wall


def bench_oversized_page() -> None:
    line = 'vllm:num_requests_running{engine="0",model_name="' + "x" * 60 + '"} 1.0\n'
    body = (line * (20 * 1024 * 1024 // len(line))).encode()
    with PageServer([body], path=None) as server:
        rss, rc, wall = child_peak_rss_mib(["scan", server.url, "--duration", "2"])
    print(f"20 MB /metrics page: exit {rc} after {wall:.1f} s, peak RSS of the llmdiag process {rss:.0f} MiB")


def bench_default_scan() -> None:
    with PageServer([recorded_page(path) for path in real_pages("healthy")]) as server:
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "llmdiag", "scan", server.url, "--json"], capture_output=True, text=True, cwd=REPO
        )
        wall = time.perf_counter() - start
    print(f"default scan (20 s window) wall time: {wall:.1f} s, exit {proc.returncode}")


if __name__ == "__main__":
    bench_parse()
    bench_oversized_page()
    if "--quick" not in sys.argv:
        bench_default_scan()
