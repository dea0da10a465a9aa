"""Time and memory grow with the input's size, no faster (issue 19 §2): the bound each parser is held to is
linear, checked loosely as a ratio (8 times the input may cost at most 16 times the CPU time and 24 times the peak
memory), never as an absolute time. A parser that went quadratic (a line re-read per line, a buffer copied per
event) fails these; the bombs that stop growth altogether are test_caps.py's.

Real fixtures, repeated: a vLLM page with the copies told apart by an engine label, a vLLM log, a Kineto trace's
events.
"""

from __future__ import annotations

import io
import re
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from bench import fuzz_inputs
from llmdiag.collect.exposition import parse_pasted
from llmdiag.collect.logs import collect_logs
from llmdiag.collect.trace.analysis import classifier
from llmdiag.collect.trace.reader import read_trace_stream
from tests.support.required import SHARED_TRACES, TRACES_ENV, require_tool

SMALL, FACTOR = 2, 8
TIME_SLACK, MEMORY_SLACK = 2.0, 3.0  # over the linear ratio: noise on a shared 2-core machine, caches, interning


def _cost(run: Callable[[], object]) -> tuple[float, int]:
    """CPU seconds (the least of three runs: other processes only ever add) and peak bytes allocated."""
    best = float("inf")
    for _ in range(3):
        began = time.process_time()
        run()
        best = min(best, time.process_time() - began)
    tracemalloc.start()
    try:
        run()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return best, peak


def _page(copies: int) -> str:
    page = fuzz_inputs.seeds("vllm-0.32.0/memory/scrape-01.prom")[0].decode()
    samples = [line for line in page.splitlines() if line and not line.startswith("#")]
    labelled = re.compile(r"^([^{ ]+)\{")
    out = []
    for n in range(copies):
        for line in samples:  # the copy's own engine label: distinct series, as a bigger server's page holds
            out.append(
                labelled.sub(rf'\1{{copy="{n}",', line) if "{" in line else line.replace(" ", f'{{copy="{n}"}} ', 1)
            )
    return "\n".join(out) + "\n"


def _log(copies: int, tmp: Path) -> Path:
    path = tmp / f"server-{copies}.log"
    path.write_bytes((fuzz_inputs.FIXTURES / "logs" / "vllm-0.32-kv-starved.log").read_bytes() * copies)
    return path


def _trace(copies: int) -> bytes:
    seeds = fuzz_inputs.trace_seeds()
    if not seeds:
        require_tool(f"{SHARED_TRACES} holds no trace to start from", TRACES_ENV)  # fails in make test
    head, _, events = seeds[0].partition(b"[")
    body = events.rsplit(b"]", 1)[0].strip()
    return head + b"[" + b",".join([body] * copies) + b"]}"


def _exposition(copies: int, tmp: Path) -> Callable[[], object]:
    text = _page(copies)
    return lambda: parse_pasted(text, None)


def _logs(copies: int, tmp: Path) -> Callable[[], object]:
    path = _log(copies, tmp)
    return lambda: collect_logs([path])


def _trace_read(copies: int, tmp: Path) -> Callable[[], object]:
    data = _trace(copies)
    return lambda: read_trace_stream(io.BytesIO(data), classifier().ops, "rank0.json")


CASES = {"exposition": _exposition, "logs": _logs, "trace": _trace_read}


@pytest.mark.parametrize("name", sorted(CASES))
def test_cost_grows_linearly_with_the_input(name: str, tmp_path: Path) -> None:
    small_time, small_peak = _cost(CASES[name](SMALL, tmp_path))
    large_time, large_peak = _cost(CASES[name](SMALL * FACTOR, tmp_path))
    assert large_time <= FACTOR * TIME_SLACK * max(small_time, 1e-3), (small_time, large_time)
    assert large_peak <= FACTOR * MEMORY_SLACK * small_peak, (small_peak, large_peak)
