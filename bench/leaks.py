"""Leak figures: many diagnoses in one process (library use), as a service calling llmdiag in a loop would.

1. ``--analyses`` (default 1,000) consecutive ``diagnose_files`` calls on saved pages: the real vLLM 0.32.0
   recordings of tests/fixtures/vllm-0.32.0, two consecutive pages of one state a call (a window), the states in
   turn;
2. ``--scans`` (default 100) live ``diagnose`` scans with a short window (``--window``, 1 s: three scrapes) against a
   replay server (bench/fleet_servers.py: the recorded pages served in order, rewound before each scan), with what
   a CLI scan opens beside the page: server detection, the host probe (psutil), NVML when a GPU is visible, and the
   canary (which the replay server answers 404: its start and stop run every time);
3. ``--sim-scans`` (default 20) the same scans against the built-in simulator under load, where the canary's
   requests succeed (its client, its streams and its event loop run to the end);
4. ``--checks`` (default 20) ``run_check`` calls over a small mixed fleet (replayed states, a dead port, one that
   never answers, HTTP 500, a reset mid-body), each recorded in a SQLite history: the worker pool, the history's
   connections and the failing targets' error paths.

Measured at the start, the middle and the end of each loop, after a warm-up (the first ``--warmup`` calls, which
load the catalogue, the probes and the rules once): open file descriptors (/proc/self/fd), threads (Python's and
the kernel's count), and the resident set size. Prints the figures and the growth after warm-up; asserts nothing
and exits 0, like the other benches (tests/e2e/test_leaks.py runs a short version and asserts no unbounded growth).

    .venv/bin/python bench/leaks.py                       # 1,000 analyses + 100 scans
    .venv/bin/python bench/leaks.py --analyses 200 --scans 20 --json leaks.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script: bench/ imports as a package
    sys.path.insert(0, str(REPO_ROOT))

import psutil  # noqa: E402

from bench.fleet_servers import RECORDED, FleetProcess, closed_port  # noqa: E402
from llmdiag.api import diagnose, diagnose_files, run_check  # noqa: E402
from llmdiag.client.endpoint import Connection  # noqa: E402
from llmdiag.collect.live import TelemetryOptions  # noqa: E402
from llmdiag.config import CheckDefaults, Settings, Target  # noqa: E402
from llmdiag.history import History  # noqa: E402

STATES = ("healthy", "memory", "compute", "scheduling", "idle")


@dataclass
class Snapshot:
    at: str
    calls: int
    fds: int
    threads: int
    os_threads: int
    rss_bytes: int


def snapshot(at: str, calls: int) -> Snapshot:
    gc.collect()  # what is still reachable, not what the collector has not reached yet
    proc = psutil.Process()
    return Snapshot(
        at=at,
        calls=calls,
        fds=len(os.listdir("/proc/self/fd")),
        threads=threading.active_count(),
        os_threads=proc.num_threads(),
        rss_bytes=proc.memory_info().rss,
    )


def page_windows() -> list[list[Path]]:
    """Two consecutive recorded pages of one state: a window, as `llmdiag analyze a.prom b.prom` reads."""
    windows = []
    for state in STATES:
        pages = sorted((RECORDED / state).glob("scrape-*.prom"))
        windows += [[pages[i], pages[i + 1]] for i in range(len(pages) - 1)]
    return windows


def measured(label: str, calls: int, warmup: int, call: Callable[[int], str]) -> tuple[list[Snapshot], dict[str, int]]:
    """``call(i)`` ``calls`` times (its return value: the verdict's class, counted); snapshots after the warm-up,
    at the middle and at the end."""
    snaps: list[Snapshot] = []
    classes: dict[str, int] = {}
    marks = {warmup: "start", warmup + (calls - warmup) // 2: "middle", calls: "end"}
    for i in range(calls + 1):
        if i in marks:
            snaps.append(snapshot(f"{label} {marks[i]}", i))
        if i == calls:
            break
        bottleneck = call(i)
        classes[bottleneck] = classes.get(bottleneck, 0) + 1
    return snaps, classes


def analyses(calls: int, warmup: int) -> tuple[list[Snapshot], dict[str, int]]:
    windows = page_windows()
    return measured("analyze", calls, warmup, lambda i: diagnose_files(windows[i % len(windows)]).bottleneck.value)


def scan_once(url: str, window_seconds: float) -> str:
    """One live scan as the CLI's `llmdiag scan URL` runs it: detection, the host probe, NVML when a GPU is
    visible, and the canary."""
    verdict = diagnose(
        Connection(base_url=url, timeout_seconds=5.0),
        window_seconds,
        telemetry=TelemetryOptions(nvml="auto", host=True),
        canary=True,
    )
    return verdict.bottleneck.value


LEFT_OPEN = "(scans that left a connection open)"
STILL_OPEN = "(connections still open at the server)"


def open_after(server: FleetProcess, seconds: float) -> int:
    """The connections open at the server once the client's closes have had ``seconds`` to reach it."""
    deadline = time.monotonic() + seconds
    while server.open_now and time.monotonic() < deadline:
        time.sleep(0.02)
    return server.open_now


def scans(calls: int, warmup: int, window_seconds: float, state: str = "healthy") -> tuple[list[Snapshot], dict]:
    """The scans, and two counts from the server's side: the scans after which a connection stayed open (looked
    at before any snapshot runs the garbage collector, which closes what was only unreachable), and the
    connections still open at the end."""
    left_open = 0
    with FleetProcess() as server:
        url = server.add("replay", f"replay:{state}")

        def scan(_: int) -> str:
            nonlocal left_open
            server.rewind("replay")
            bottleneck = scan_once(url, window_seconds)
            left_open += open_after(server, 1.0) > 0
            return bottleneck

        snaps, classes = measured("scan", calls, warmup, scan)
        classes[LEFT_OPEN] = left_open
        classes[STILL_OPEN] = open_after(server, 5.0)
    return snaps, classes


def sim_scans(calls: int, warmup: int, window_seconds: float) -> tuple[list[Snapshot], dict]:
    from bench.check_fleet200 import simulators

    with simulators(1) as urls:
        return measured("sim scan", calls, warmup, lambda _: scan_once(urls[0], window_seconds))


CHECK_KINDS = ("replay:healthy", "replay:memory", "replay:idle", "blackhole", "status:500", "reset")


def checks(calls: int, warmup: int, window_seconds: float, history_path: Path) -> tuple[list[Snapshot], dict]:
    with FleetProcess(hold_seconds=10) as server:
        targets = [
            Target(name=f"{kind.replace(':', '-')}", url=server.add(f"t{i}", kind), timeout_seconds=2.0, nvml=False)
            for i, kind in enumerate(CHECK_KINDS)
        ]
        targets.append(Target(name="dead", url=f"http://127.0.0.1:{closed_port()}", timeout_seconds=2.0, nvml=False))
        settings = Settings(check=CheckDefaults(concurrency=4))
        history = History.open(history_path)

        def check(_: int) -> str:
            for i in range(len(CHECK_KINDS)):
                server.rewind(f"t{i}")
            return run_check(targets, settings, window_seconds, history).state.name

        snaps, states = measured("check", calls, warmup, check)
    return snaps, states


def growth(snaps: list[Snapshot]) -> dict[str, float]:
    first, last = snaps[0], snaps[-1]
    return {
        "fds": last.fds - first.fds,
        "threads": last.threads - first.threads,
        "os_threads": last.os_threads - first.os_threads,
        "rss_ratio": last.rss_bytes / first.rss_bytes - 1,
    }


def show(snaps: list[Snapshot], classes: dict, seconds: float) -> None:
    for s in snaps:
        print(
            f"  {s.at:<14} after {s.calls:>5} calls: {s.fds:>4} fds, {s.threads:>3} threads "
            f"({s.os_threads} in the kernel), RSS {s.rss_bytes / 2**20:7.1f} MiB",
            flush=True,
        )
    g = growth(snaps)
    print(
        f"  growth after warm-up: fds {g['fds']:+d}, threads {g['threads']:+d} ({g['os_threads']:+d} in the kernel), "
        f"RSS {g['rss_ratio']:+.1%}; {seconds:.1f} s; results {classes}",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--analyses", type=int, default=1000)
    parser.add_argument("--scans", type=int, default=100)
    parser.add_argument("--sim-scans", type=int, default=20)
    parser.add_argument("--checks", type=int, default=20)
    parser.add_argument("--window", type=float, default=1.0, help="each scan's window, seconds")
    parser.add_argument("--warmup", type=int, default=5, help="calls before the first snapshot")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    rows: dict[str, object] = {"start": asdict(snapshot("process start", 0))}
    started = time.monotonic()
    snaps, classes = analyses(args.analyses, min(args.warmup, args.analyses))
    print(f"{args.analyses} analyze-path diagnoses (diagnose_files on two recorded pages each):")
    show(snaps, classes, time.monotonic() - started)
    rows["analyses"] = {"snapshots": [asdict(s) for s in snaps], "growth": growth(snaps), "classes": classes}
    started = time.monotonic()
    snaps, classes = scans(args.scans, min(args.warmup, args.scans), args.window)
    print(f"{args.scans} live scans ({args.window:g} s window, detection, host probe, NVML auto, canary):")
    show(snaps, classes, time.monotonic() - started)
    rows["scans"] = {"snapshots": [asdict(s) for s in snaps], "growth": growth(snaps), "classes": classes}
    started = time.monotonic()
    snaps, classes = sim_scans(args.sim_scans, min(args.warmup, args.sim_scans), args.window)
    print(f"{args.sim_scans} live scans of the simulator under load (the canary's requests succeed):")
    show(snaps, classes, time.monotonic() - started)
    rows["sim_scans"] = {"snapshots": [asdict(s) for s in snaps], "growth": growth(snaps), "classes": classes}
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        snaps, states = checks(args.checks, min(args.warmup, args.checks), args.window, Path(folder) / "history.sqlite")
    print(f"{args.checks} checks of {len(CHECK_KINDS) + 1} targets each ({args.window:g} s window, a history):")
    show(snaps, states, time.monotonic() - started)
    rows["checks"] = {"snapshots": [asdict(s) for s in snaps], "growth": growth(snaps), "states": states}
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
