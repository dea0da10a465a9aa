"""`llmdiag trace --hta-compat` beside HolisticTraceAnalysis (HTA) on the same traces: agreement, speed, memory.

For each trace set (real ones from ../shared/traces, and a large one built by bench/make_large_trace.py: real DLRM
steps repeated to ~500 MB of JSON per rank, 2 ranks), two subprocesses, one after the other, each timed (wall,
CPU seconds from wait4) and sampled for memory (the summed RSS of its process tree every 20 ms, so HTA's worker
processes count; plus ru_maxrss, the largest single process):

* HTA 0.5.0 in its own virtualenv: ``TraceAnalysis(trace_dir=DIR)`` (which drops the last ProfilerStep, as it does
  by default), ``get_temporal_breakdown()`` and ``get_comm_comp_overlap()``. HTA reports no comm share, so its comm
  share is counted with HTA's own pieces: the union of the kernels its ``get_kernel_type`` calls COMMUNICATION
  (``merge_kernel_intervals``) over its busy time (kernel_time − idle_time from the temporal breakdown). That extra
  step is timed on its own and left out of "HTA API seconds".
* ours: ``llmdiag trace DIR --hta-compat --json`` (ns timestamps rounded as HTA does, the last step dropped, only
  ``nccl…Kernel`` names as communication).

Printed per rank: comm % (HTA, ours, |diff| in percentage points), overlap % (same), idle %; per set: wall seconds
and the ratio, peak memory and the ratio; and whether the targets hold: |diff| ≤ 1 pp, ≥ 10x faster, ≤ 1/4 of HTA's
peak memory. Prints, asserts nothing, exits 0 (2 on bad arguments), like the other benches.

    .venv/bin/python bench/bench_trace.py                         # every real set + the large one (~10 min)
    .venv/bin/python bench/bench_trace.py --sets param-dlrm-8rank --no-large
    .venv/bin/python bench/bench_trace.py --large-mb 100          # a smaller "large" set
    .venv/bin/python bench/bench_trace.py --json results.json     # also the raw numbers

HTA's venv: ``${LLMDIAG_CACHE_DIR:-~/.cache/llmdiag}/hta-0.5.0`` (``holistictraceanalysis==0.5.0 "pandas<3"``: HTA
0.5.0 crashes on pandas 3), built on first use (≈ 20 s from a warm pip cache, ≈ 500 MB) and reused (stamp file).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from make_large_trace import DEFAULT_OUT as LARGE_OUT
from make_large_trace import ensure as ensure_large
from venv_cache import build_lock, cache_dir

REPO = Path(__file__).resolve().parents[1]

SHARED_TRACES = REPO.parent / "shared" / "traces"
HTA_VERSION = "0.5.0"
HTA_SPECS = (f"holistictraceanalysis=={HTA_VERSION}", "pandas<3")
HTA_VENV = f"hta-{HTA_VERSION}"
HTA_STAMP = ".llmdiag-hta-complete.json"
SAMPLE_SECONDS = 0.02
TARGET_PP, TARGET_SPEEDUP, TARGET_MEMORY_SHARE = 1.0, 10.0, 0.25
REAL_SETS = [
    "param-dlrm-8rank",
    "hta-sampled-2rank",
    "single/hta-a100-2gpu-rank0-nccl2.17",
    "single/hta-v100-2gpu-rank1-allreduce",
    "single/hta-a100-16gpu-rank0-a2a",
    "single/hta-a100-8gpu-rank3-a2a",
    "single/hta-v100-2gpu-rank1-a2a",
    "single/tracelens-b200-vllm-tp8-rank0",
    "single/tracelens-mi300x-8gpu-rank0-rccl",
]

# Runs inside HTA's venv: argv[1] is the trace dir; prints one JSON line.
HTA_SCRIPT = r"""
import json, logging, sys, time
logging.disable(logging.WARNING)
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
from hta.utils.utils import KernelType, get_kernel_type, merge_kernel_intervals
t1 = time.perf_counter()
analyzer = TraceAnalysis(trace_dir=sys.argv[1])
t2 = time.perf_counter()
breakdown = analyzer.get_temporal_breakdown(visualize=False)
t3 = time.perf_counter()
overlap = analyzer.get_comm_comp_overlap(visualize=False)
t4 = time.perf_counter()
sym = analyzer.t.symbol_table.get_sym_table()
comm_ids = {i for i, name in enumerate(sym) if get_kernel_type(name) == KernelType.COMMUNICATION.name}
ranks = {}
for rank, df in analyzer.t.traces.items():
    gpu = df[df["stream"].ne(-1)]
    comm = merge_kernel_intervals(gpu[gpu["name"].isin(comm_ids)].copy())
    ranks[int(rank)] = {"comm_us": float((comm["end"] - comm["ts"]).sum()) if len(comm) else 0.0}
for row in breakdown.to_dict("records"):
    r = ranks.setdefault(int(row["rank"]), {})
    r.update(idle_us=float(row["idle_time(us)"]), compute_us=float(row["compute_time(us)"]),
             non_compute_us=float(row["non_compute_time(us)"]), kernel_time_us=float(row["kernel_time(us)"]))
for row in overlap.to_dict("records"):
    pctg = row["comp_comm_overlap_pctg"]  # HTA returns the percentage only, rounded to 0.01
    ranks.setdefault(int(row["rank"]), {})["overlap_ratio"] = None if pctg != pctg else float(pctg) / 100
t5 = time.perf_counter()
print(json.dumps({"ranks": ranks, "import_seconds": t1 - t0, "load_seconds": t2 - t1, "temporal_seconds": t3 - t2,
                  "overlap_seconds": t4 - t3, "comm_union_seconds": t5 - t4, "api_seconds": t4 - t1}))
"""


def log(msg: str) -> None:
    print(f"[bench_trace] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# HTA's virtualenv


def hta_venv() -> Path:
    return cache_dir() / HTA_VENV


def hta_python() -> Path:
    return hta_venv() / "bin" / "python"


def _hta_ready() -> bool:
    stamp = hta_venv() / HTA_STAMP
    try:
        return json.loads(stamp.read_text()).get("specs") == list(HTA_SPECS) and hta_python().exists()
    except (OSError, ValueError):
        return False


def ensure_hta() -> Path:
    if _hta_ready():
        return hta_python()
    with build_lock(HTA_VENV):
        if not _hta_ready():
            venv = hta_venv()
            if venv.exists():
                shutil.rmtree(venv)
            started = time.perf_counter()
            log(f"installing {' '.join(HTA_SPECS)} into {venv}")
            base = getattr(sys, "_base_executable", sys.executable)
            subprocess.run([base, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(hta_python()), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
            subprocess.run([str(hta_python()), "-m", "pip", "install", "-q", *HTA_SPECS], check=True)
            seconds = time.perf_counter() - started
            size = sum(p.stat().st_size for p in venv.rglob("*") if p.is_file())
            (venv / HTA_STAMP).write_text(json.dumps({"specs": list(HTA_SPECS), "seconds": seconds, "bytes": size}))
            log(f"HTA venv built in {seconds:.0f} s, {size / 1e6:.0f} MB")
    return hta_python()


# ---------------------------------------------------------------------------------------------------------------
# one measured subprocess


@dataclass
class Run:
    argv: list[str]
    returncode: int = -1
    stdout: str = ""
    stderr: str = ""
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    peak_tree_rss_bytes: int = 0  # the summed RSS of the process and its children, sampled
    max_rss_bytes: int = 0  # ru_maxrss of wait4: the largest single process of the tree
    extra: dict = field(default_factory=dict)


def measured(argv: list[str], timeout: float = 1800.0) -> Run:
    run = Run(argv=argv)
    out_path, err_path = (Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_trace.{os.getpid()}.{n}" for n in "oe")
    with open(out_path, "w+b") as out, open(err_path, "w+b") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, cwd=REPO)
        stop = threading.Event()
        cpu: dict[int, float] = {}  # pid -> user+system seconds, last seen (worker processes that exit count too)

        def sample() -> None:
            try:
                root = psutil.Process(proc.pid)
            except psutil.Error:
                return
            while not stop.is_set():
                total = 0
                try:
                    for p in [root, *root.children(recursive=True)]:
                        with contextlib.suppress(psutil.Error):
                            total += p.memory_info().rss
                            times = p.cpu_times()
                            cpu[p.pid] = max(cpu.get(p.pid, 0.0), times.user + times.system)
                except psutil.Error:
                    break
                run.peak_tree_rss_bytes = max(run.peak_tree_rss_bytes, total)
                stop.wait(SAMPLE_SECONDS)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        deadline = started + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.01)
        run.wall_seconds = time.perf_counter() - started
        stop.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        run.returncode = proc.returncode
        # wait4's figure misses workers the child never waited for; the samples miss the last 20 ms of each process
        run.cpu_seconds = max(usage.ru_utime + usage.ru_stime, sum(cpu.values()))
        run.max_rss_bytes = usage.ru_maxrss * 1024
        out.seek(0)
        err.seek(0)
        run.stdout, run.stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    out_path.unlink(missing_ok=True)
    err_path.unlink(missing_ok=True)
    return run


# ---------------------------------------------------------------------------------------------------------------
# the two tools


def run_hta(python: Path, trace_dir: Path) -> tuple[Run, dict | None, str]:
    run = measured([str(python), "-c", HTA_SCRIPT, str(trace_dir)])
    if run.returncode != 0:
        return run, None, (run.stderr.strip().splitlines() or ["(no output)"])[-1]
    data = json.loads(run.stdout.strip().splitlines()[-1])
    per_rank = {}
    for rank, r in data["ranks"].items():
        span = r.get("kernel_time_us") or 0
        busy = span - r.get("idle_us", 0)
        per_rank[int(rank)] = {
            "comm_share": r["comm_us"] / busy if busy > 0 else None,
            "overlap": r.get("overlap_ratio"),
            "idle_share": r["idle_us"] / span if span > 0 else None,
            "compute_share_of_span": r["compute_us"] / span if span > 0 else None,
        }
    return run, {"ranks": per_rank, **{k: v for k, v in data.items() if k != "ranks"}}, ""


def run_ours(trace_dir: Path) -> tuple[Run, dict | None, str]:
    llmdiag = Path(sys.executable).parent / "llmdiag"
    argv = [str(llmdiag) if llmdiag.exists() else sys.executable, *([] if llmdiag.exists() else ["-m", "llmdiag"])]
    run = measured([*argv, "trace", str(trace_dir), "--hta-compat", "--json"])
    try:
        data = json.loads(run.stdout)
    except ValueError:
        return run, None, (run.stderr.strip().splitlines() or [f"exit {run.returncode}, no JSON"])[0]
    per_rank = {}
    for r in data.get("ranks", []):
        if r.get("rank") is None:
            continue
        span = r.get("span_seconds")
        per_rank[int(r["rank"])] = {
            "comm_share": r.get("comm_share_ratio"),
            "overlap": r.get("overlap_ratio"),
            "idle_share": None if r.get("busy_ratio") is None else 1 - r["busy_ratio"],
            "compute_share_of_span": r["compute_seconds"] / span
            if span and r.get("compute_seconds") is not None
            else None,
        }
    return run, {"ranks": per_rank, "parse_seconds": data.get("parse_seconds"), "exit": run.returncode}, ""


# ---------------------------------------------------------------------------------------------------------------
# the report


def pct(v: float | None) -> str:
    return "  -   " if v is None else f"{100 * v:6.2f}"


def pp(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else abs(a - b) * 100


def compare(name: str, trace_dir: Path, hta_python_path: Path, size_bytes: int) -> dict:
    log(f"{name}: HTA …")
    hta_run, hta, hta_err = run_hta(hta_python_path, trace_dir)
    log(f"{name}: llmdiag trace …")
    our_run, ours, our_err = run_ours(trace_dir)
    result = {
        "set": name,
        "dir": str(trace_dir),
        "json_bytes": size_bytes,
        "hta_error": hta_err,
        "our_error": our_err,
        "hta": vars(hta_run) | {"stdout": "", "stderr": hta_run.stderr[-2000:]},
        "ours": vars(our_run) | {"stdout": "", "stderr": our_run.stderr[-2000:]},
        "hta_numbers": hta,
        "our_numbers": ours,
        "ranks": [],
    }
    if hta and ours:
        for rank in sorted(set(hta["ranks"]) | set(ours["ranks"])):
            h, o = hta["ranks"].get(rank, {}), ours["ranks"].get(rank, {})
            result["ranks"].append(
                {
                    "rank": rank,
                    **{f"hta_{k}": h.get(k) for k in ("comm_share", "overlap", "idle_share", "compute_share_of_span")},
                    **{f"our_{k}": o.get(k) for k in ("comm_share", "overlap", "idle_share", "compute_share_of_span")},
                    "comm_pp": pp(h.get("comm_share"), o.get("comm_share")),
                    "overlap_pp": pp(h.get("overlap"), o.get("overlap")),
                    "idle_pp": pp(h.get("idle_share"), o.get("idle_share")),
                }
            )
    result["speedup"] = hta_run.wall_seconds / our_run.wall_seconds if our_run.wall_seconds else None
    api = (hta or {}).get("api_seconds", 0)
    result["speedup_vs_api"] = api / our_run.wall_seconds if our_run.wall_seconds else None
    result["memory_share"] = (
        our_run.peak_tree_rss_bytes / hta_run.peak_tree_rss_bytes if hta_run.peak_tree_rss_bytes else None
    )
    return result


def print_set(r: dict) -> None:
    mb = r["json_bytes"] / 1e6
    print(f"\n== {r['set']} ({mb:.0f} MB of JSON)")
    if r["hta_error"]:
        print(f"   HTA failed: {r['hta_error']}")
    if r["our_error"]:
        print(f"   llmdiag trace failed: {r['our_error']}")
    if r["ranks"]:
        print(
            f"   {'rank':>4}  {'comm% HTA':>9} {'ours':>6} {'|pp|':>5}   {'overlap% HTA':>12} {'ours':>6} {'|pp|':>5}"
            f"   {'idle% HTA':>9} {'ours':>6}"
        )
        for x in r["ranks"]:

            def d(v: float | None) -> str:
                return "  -  " if v is None else f"{v:5.2f}"

            print(
                f"   {x['rank']:>4}  {pct(x['hta_comm_share']):>9} {pct(x['our_comm_share'])} {d(x['comm_pp'])}"
                f"   {pct(x['hta_overlap']):>12} {pct(x['our_overlap'])} {d(x['overlap_pp'])}"
                f"   {pct(x['hta_idle_share']):>9} {pct(x['our_idle_share'])}"
            )
    h, o = r["hta"], r["ours"]
    api = (r["hta_numbers"] or {}).get("api_seconds")
    print(
        f"   wall: HTA {h['wall_seconds']:.2f} s (its API calls {api or 0:.2f} s, CPU {h['cpu_seconds']:.1f} s), "
        f"ours {o['wall_seconds']:.2f} s (CPU {o['cpu_seconds']:.1f} s): "
        f"{r['speedup'] or 0:.1f}x faster ({r['speedup_vs_api'] or 0:.1f}x against HTA's API time alone)"
    )
    print(
        f"   peak memory (process tree): HTA {h['peak_tree_rss_bytes'] / 1e6:.0f} MB, ours "
        f"{o['peak_tree_rss_bytes'] / 1e6:.0f} MB: {100 * (r['memory_share'] or 0):.1f} % of HTA's "
        f"(largest single process: HTA {h['max_rss_bytes'] / 1e6:.0f} MB, ours {o['max_rss_bytes'] / 1e6:.0f} MB)"
    )


def targets(results: list[dict]) -> list[str]:
    lines = []
    diffs = [
        (r["set"], x["rank"], k, x[k])
        for r in results
        for x in r["ranks"]
        for k in ("comm_pp", "overlap_pp")
        if x[k] is not None
    ]
    worst = max(diffs, key=lambda d: d[3], default=None)
    over = [d for d in diffs if d[3] > TARGET_PP]
    lines.append(
        f"agreement within {TARGET_PP} pp: {'MET' if diffs and not over else 'NOT MET'} "
        f"({len(diffs) - len(over)}/{len(diffs)} figures; worst {worst[3]:.2f} pp, {worst[0]} rank "
        f"{worst[1]} {worst[2]})"
        if worst
        else "agreement: no figures to compare"
    )
    for d in over:
        lines.append(f"   over: {d[0]} rank {d[1]} {d[2]} {d[3]:.2f} pp")
    ok = [r for r in results if r["speedup"] and r["memory_share"] is not None and not r["our_error"]]
    slow = [r for r in ok if r["speedup"] < TARGET_SPEEDUP]
    lines.append(
        f"≥ {TARGET_SPEEDUP:.0f}x faster (wall): {'MET' if ok and not slow else 'NOT MET'}, met on "
        f"{len(ok) - len(slow)} of {len(ok)} sets"
        + ("; below: " + ", ".join(f"{r['set']} {r['speedup']:.1f}x" for r in slow) if slow else "")
    )
    fat = [r for r in ok if r["memory_share"] > TARGET_MEMORY_SHARE]
    lines.append(
        f"≤ {TARGET_MEMORY_SHARE:.0%} of HTA's peak memory: {'MET' if ok and not fat else 'NOT MET'}, met on "
        f"{len(ok) - len(fat)} of {len(ok)} sets"
        + ("; above: " + ", ".join(f"{r['set']} {r['memory_share']:.0%}" for r in fat) if fat else "")
    )
    return lines


def dir_bytes(path: Path) -> int:
    import gzip

    total = 0
    for p in sorted(path.glob("*.json*")):
        if p.suffix == ".gz":
            with gzip.open(p, "rb") as fh:
                while chunk := fh.read(1 << 22):
                    total += len(chunk)
        else:
            total += p.stat().st_size
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default=",".join(REAL_SETS), help="comma list of sets under ../shared/traces")
    parser.add_argument("--no-large", action="store_true", help="skip the large set")
    parser.add_argument("--large-mb", type=float, default=500, help="MB of JSON per rank of the large set")
    parser.add_argument("--large-dir", type=Path, default=LARGE_OUT, help="where the large set is built")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    ns = parser.parse_args()
    names = [s.strip() for s in ns.sets.split(",") if s.strip()]
    missing = [s for s in names if not (SHARED_TRACES / s).is_dir()]
    if missing or ns.large_mb <= 0:
        print(
            f"ERROR: no trace set {', '.join(missing)} under {SHARED_TRACES}"
            if missing
            else "ERROR: --large-mb must be positive",
            file=sys.stderr,
        )
        print(f"HINT: sets are folders of {SHARED_TRACES}: {', '.join(REAL_SETS)}", file=sys.stderr)
        return 2
    python = ensure_hta()
    stamp = json.loads((hta_venv() / HTA_STAMP).read_text())
    print(
        f"HTA {HTA_VERSION} venv: {hta_venv()} (built in {stamp.get('seconds', 0):.0f} s, "
        f"{stamp.get('bytes', 0) / 1e6:.0f} MB); llmdiag: {sys.executable}"
    )
    sets = [(name, SHARED_TRACES / name) for name in names]
    if not ns.no_large:
        started = time.perf_counter()
        written = ensure_large(ns.large_dir, ns.large_mb)
        how = "reused" if all(w.get("reused") for w in written) else f"built in {time.perf_counter() - started:.0f} s"
        print(
            f"large set: {ns.large_dir}: {len(written)} ranks x {written[0]['copies']} copies of a real DLRM step, "
            f"{sum(w['bytes'] for w in written) / 1e6:.0f} MB of JSON ({how})"
        )
        sets.append((f"large ({ns.large_mb:.0f} MB/rank)", ns.large_dir))
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (shared: wall-time ratios are noisy)")
    results = []
    for name, path in sets:
        result = compare(name, path, python, dir_bytes(path))
        print_set(result)
        results.append(result)
    print("\n== targets")
    for line in targets(results):
        print(line)
    if ns.json:
        ns.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
