"""Build a large multi-rank Kineto trace set from real steps: the "large trace" of bench/bench_trace.py.

Takes real ranks of one job from ../shared/traces (default: ranks 0 and 1 of param-dlrm-8rank, a V100 DLRM step
with NCCL all_to_all and all_reduce, ~0.9 MB of JSON and ~16 ms per rank) and writes each rank's step again and
again, shifted in time, until the rank's file reaches --mb megabytes of JSON (default 500). Each copy keeps the
events' order, durations and cross-stream overlap exactly; the copies follow each other with a gap of --gap-us, the
same shift on every rank (the ranks stay on one clock, so cross-rank skew is the real one), and get fresh
correlation / External id / flow ids and ProfilerStep#N numbers, so that CPU-GPU links stay one-to-one and each copy
is its own profiler step. Metadata events are written once; the "PyTorch Profiler" span is stretched over the lot.

The file is streamed (one copy in memory at a time). The output is uncompressed JSON, the worst case for a parser.

    .venv/bin/python bench/make_large_trace.py                       # /tmp/llmdiag-large-trace/, 2 x 500 MB
    .venv/bin/python bench/make_large_trace.py --mb 50 --out DIR     # smaller, elsewhere
    .venv/bin/python bench/make_large_trace.py --source single/hta-a100-2gpu-rank0-nccl2.17   # ns-float format

Prints what it wrote; reuses files that already match (size and a stamp of the arguments).
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import math
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"
DEFAULT_SOURCE = "param-dlrm-8rank"
DEFAULT_OUT = Path("/tmp/llmdiag-large-trace")
STEP = re.compile(r"^ProfilerStep#(\d+)$")
ID_ARGS = ("correlation", "External id")
STAMP = ".stamp.json"


def load(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        return json.loads(fh.read())


def _span(events: list[dict]) -> tuple[float, float]:
    timed = [e for e in events if e.get("ph") != "M" and "ts" in e and e.get("cat") != "Trace"]
    return min(e["ts"] for e in timed), max(e["ts"] + e.get("dur", 0) for e in timed)


def _max_id(events: list[dict]) -> int:
    top = 0
    for e in events:
        args = e.get("args") or {}
        for key in ID_ARGS:
            if isinstance(args.get(key), int):
                top = max(top, args[key])
        if e.get("ph") in ("s", "f") and isinstance(e.get("id"), int):
            top = max(top, e["id"])
    return top


def shifted(events: list[dict], shift: float, id_offset: int, step_offset: int, integer_ts: bool) -> list[dict]:
    """One copy of a rank's step: times moved by ``shift`` µs, ids by ``id_offset``, ProfilerStep#N by step_offset."""
    out = []
    for e in events:
        e = dict(e)
        ts = e["ts"] + shift
        e["ts"] = int(ts) if integer_ts else round(ts, 3)
        if e.get("ph") in ("s", "f") and isinstance(e.get("id"), int):
            e["id"] += id_offset
        args = e.get("args")
        if args and any(k in args for k in ID_ARGS):
            args = dict(args)
            for key in ID_ARGS:
                if isinstance(args.get(key), int) and args[key] >= 0:
                    args[key] += id_offset
            e["args"] = args
        match = STEP.match(e.get("name", ""))
        if match:
            e["name"] = f"ProfilerStep#{int(match[1]) + step_offset}"
        out.append(e)
    return out


def build(sources: list[Path], out_dir: Path, target_mb: float, gap_us: float) -> list[dict]:
    """Write one large file per source rank; returns what was written (path, bytes, copies, seconds)."""
    docs = [load(p) for p in sources]
    parts = []
    for doc in docs:
        events = doc["traceEvents"]
        meta = [e for e in events if e.get("ph") == "M"]
        span_event = next((e for e in events if e.get("cat") == "Trace"), None)
        body = [e for e in events if e.get("ph") != "M" and e.get("cat") != "Trace" and "ts" in e]
        body.sort(key=lambda e: e["ts"])
        parts.append((doc, meta, span_event, body))
    starts, ends = zip(*(_span(body) for *_, body in parts), strict=True)
    period = math.ceil(max(ends) - min(starts) + gap_us)
    id_stride = 10 ** len(str(max(_max_id(body) for *_, body in parts)))
    one_copy = max(len(json.dumps(body, separators=(",", ":"))) for *_, body in parts)
    copies = max(1, math.ceil(target_mb * 1e6 / one_copy))
    integer_ts = all(isinstance(e["ts"], int) for *_, body in parts for e in body[:1000])
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for source, (doc, meta, span_event, body) in zip(sources, parts, strict=True):
        rank = (doc.get("distributedInfo") or {}).get("rank", len(written))
        path = out_dir / f"rank-{rank}.json"
        started = time.perf_counter()
        header = {k: v for k, v in doc.items() if k != "traceEvents"}
        with open(path, "w", encoding="utf-8") as fh:
            text = json.dumps(header)  # default separators: HTA finds the rank with the regex '"rank":\s+(\d+)'
            fh.write(text[:-1] + (',"traceEvents":[' if header else '"traceEvents":['))
            if meta:
                fh.write(json.dumps(meta, separators=(",", ":"))[1:-1])
            for k in range(copies):
                chunk = json.dumps(shifted(body, k * period, k * id_stride, k, integer_ts), separators=(",", ":"))
                fh.write(("," if meta or k else "") + chunk[1:-1])
            if span_event is not None:
                span = copy.deepcopy(span_event)
                span["dur"] = copies * period
                fh.write("," + json.dumps(span, separators=(",", ":")))
            fh.write("]}")
        written.append(
            {
                "source": str(source),
                "path": str(path),
                "bytes": path.stat().st_size,
                "copies": copies,
                "period_us": period,
                "seconds": time.perf_counter() - started,
            }
        )
    return written


def source_files(source: str) -> list[Path]:
    root = Path(source) if Path(source).is_absolute() else SHARED_TRACES / source
    files = sorted(p for p in root.glob("*.json*") if p.is_file())
    if not files:
        raise FileNotFoundError(f"no trace files under {root}")
    return files


def ensure(
    out_dir: Path = DEFAULT_OUT,
    target_mb: float = 500,
    ranks: int = 2,
    source: str = DEFAULT_SOURCE,
    gap_us: float = 100.0,
) -> list[dict]:
    """The large set in ``out_dir``, reusing it when its stamp names the same arguments and the files are there."""
    args = {"source": source, "ranks": ranks, "mb": target_mb, "gap_us": gap_us, "version": 2}
    stamp = out_dir.parent / f"{out_dir.name}{STAMP}"  # beside the set, not in it: both tools read every *.json there
    if stamp.is_file():
        saved = json.loads(stamp.read_text())
        if (
            saved.get("args") == args
            and all(Path(w["path"]).stat().st_size == w["bytes"] for w in saved["written"] if Path(w["path"]).is_file())
            and all(Path(w["path"]).is_file() for w in saved["written"])
        ):
            return [dict(w, reused=True) for w in saved["written"]]
    for old in out_dir.glob("rank-*.json") if out_dir.is_dir() else []:
        old.unlink()
    written = build(source_files(source)[:ranks], out_dir, target_mb, gap_us)
    stamp.write_text(json.dumps({"args": args, "written": written}, indent=1))
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default=DEFAULT_SOURCE, help="a set under ../shared/traces, or an absolute dir")
    parser.add_argument("--ranks", type=int, default=2, help="how many of its ranks (default 2)")
    parser.add_argument("--mb", type=float, default=500, help="megabytes of JSON per rank (default 500)")
    parser.add_argument("--gap-us", type=float, default=100.0, help="idle gap between copies, µs")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ns = parser.parse_args()
    if ns.ranks < 1 or ns.mb <= 0:
        print("ERROR: --ranks and --mb must be positive\nHINT: e.g. --ranks 2 --mb 500", file=sys.stderr)
        return 2
    try:
        written = ensure(ns.out, ns.mb, ns.ranks, ns.source, ns.gap_us)
    except (FileNotFoundError, OSError, json.JSONDecodeError) as exc:
        print(f"ERROR: {exc}\nHINT: --source names a folder of ../shared/traces holding *.json(.gz)", file=sys.stderr)
        return 2
    for w in written:
        how = "reused" if w.get("reused") else f"written in {w['seconds']:.1f} s"
        print(
            f"{w['path']}: {w['bytes'] / 1e6:.0f} MB, {w['copies']} copies of {w['source']} "
            f"every {w['period_us']} µs ({how})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
