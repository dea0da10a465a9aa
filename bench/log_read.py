"""How fast ``llmdiag analyze`` reads a big server log, and whether its memory stays flat (issue: "a 100 MB log is
read in under 10 s with flat memory").

The log is generated in a temporary folder from real line shapes: vLLM 0.10+ V1 stat lines (``(APIServer pid=N)
INFO MM-DD hh:mm:ss [loggers.py:N] Engine 000: …``, as in vllm-project/vllm#43295) every 10 s, with the uvicorn
access lines a busy server prints between them (``(APIServer pid=N) INFO:     127.0.0.1:PORT - "POST
/v1/chat/completions HTTP/1.1" 200 OK``, as in facebookresearch/meta-agents-research-environments#32), ACCESS lines
per stat line: 60 (a server finishing 6 requests/s), and 0: every line a stat line, the worst case for time and
memory (one record per line). Both mixes are measured by default.

Each size is read by ``llmdiag.collect.logs.collect_logs`` in a fresh child process, twice: once timed with nothing
else running (wall seconds, and the child's peak RSS from getrusage), once under tracemalloc (the peak of Python's
own allocations, which is what "flat" means: it must not grow with the bytes of the file, only with its records).

    .venv/bin/python bench/log_read.py                  # 10 MB and 100 MB, 60 and 0 access lines per stat line
    .venv/bin/python bench/log_read.py --sizes 100 --stat-share 1 --json out.json   # stat lines only
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from datetime import datetime, timedelta, timezone
from pathlib import Path

STAT = (
    "(APIServer pid=3646) INFO {stamp} [loggers.py:271] Engine 000: Avg prompt throughput: {prompt:.1f} tokens/s, "
    "Avg generation throughput: {gen:.1f} tokens/s, Running: {running} reqs, Waiting: {waiting} reqs, GPU KV cache "
    "usage: {kv:.1f}%, Prefix cache hit rate: 0.0%"
)
ACCESS = '(APIServer pid=3646) INFO:     127.0.0.1:{port} - "POST /v1/chat/completions HTTP/1.1" 200 OK'
START = datetime(2026, 5, 19, 10, 13, 11, tzinfo=timezone.utc)


def write_log(path: Path, size_bytes: int, access_per_stat: int) -> dict:
    """A log of about ``size_bytes``: one stat line every 10 s, ``access_per_stat`` access lines after each."""
    stats = lines = written = 0
    with path.open("w", encoding="utf-8") as out:
        while written < size_bytes:
            at = START + timedelta(seconds=10 * stats)
            step = stats % 97  # numbers that move, so the signals are not constant
            chunk = [
                STAT.format(
                    stamp=at.strftime("%m-%d %H:%M:%S"),
                    prompt=1000.0 + 37.0 * step,
                    gen=900.0 + 11.0 * step,
                    running=18 + step % 7,
                    waiting=step % 5,
                    kv=40.0 + step * 0.5,
                )
            ]
            chunk += [ACCESS.format(port=40000 + (stats * 7 + i) % 20000) for i in range(access_per_stat)]
            text = "\n".join(chunk) + "\n"
            out.write(text)
            written += len(text.encode())
            stats += 1
            lines += len(chunk)
    return {"bytes": written, "lines": lines, "stat_lines": stats}


def child(path: str, trace: bool) -> None:
    """Read one log (in a fresh process) and print what it cost as JSON."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from llmdiag.collect.logs import collect_logs

    if trace:
        tracemalloc.start()
    began = time.perf_counter()
    signals = collect_logs([Path(path)], max_bytes=1 << 40)
    seconds = time.perf_counter() - began
    result = {
        "seconds": seconds,
        "scrapes": signals.window.scrapes,
        "duration_seconds": signals.window.duration_seconds,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if trace:
        result["tracemalloc_peak_mb"] = tracemalloc.get_traced_memory()[1] / 1e6
    print(json.dumps(result))


def measure(path: Path, trace: bool) -> dict:
    mode = ["--trace"] if trace else []
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(path), *mode], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100", help="log sizes in MB, comma-separated")
    parser.add_argument("--access", default="60,0", help="access lines per stat line, comma-separated (0: none)")
    parser.add_argument("--stat-share", type=float, default=None, help="1: every line a stat line (--access 0)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.trace)
        return
    mixes = [0] if args.stat_share == 1 else [int(a) for a in args.access.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="llmdiag-log-bench-") as folder:
        for access in mixes:
            for size_mb in (float(s) for s in args.sizes.split(",")):
                path = Path(folder) / f"vllm-{size_mb:g}mb-{access}.log"
                made = write_log(path, int(size_mb * 1e6), access)
                timed, traced = measure(path, trace=False), measure(path, trace=True)
                rows.append(
                    {"size_mb": size_mb, "access_per_stat": access, **made, **timed}
                    | {"tracemalloc_peak_mb": traced["tracemalloc_peak_mb"]}
                )
                path.unlink()
    print(
        f"{'MB':>6} {'access/stat':>11} {'lines':>10} {'stat lines':>10} {'seconds':>8} {'peak RSS MB':>12} "
        f"{'tracemalloc MB':>15}"
    )
    for r in rows:
        print(
            f"{r['bytes'] / 1e6:6.1f} {r['access_per_stat']:11d} {r['lines']:10d} {r['stat_lines']:10d} "
            f"{r['seconds']:8.2f} {r['peak_rss_mb']:12.1f} {r['tracemalloc_peak_mb']:15.1f}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
