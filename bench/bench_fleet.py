"""Fleet figures: how long a fleet view takes.

Direct targets (issue 9 part B): ``diagnose_fleet`` (what ``llmdiag scan URL1 … URL50`` runs) over 50 targets.
Fifty simulator instances do not fit on a small machine (each is an engine loop in a thread of this process), so
the 50 URLs point at ``--instances`` simulator instances (default 5, the healthy preset, ``--users`` closed-loop users
each): the same URL repeated is a separate target (named host:port#2, #3 …) with its own worker, its own window,
its own scrapes and canary requests, exactly as 50 servers would get, but the servers answering are shared, so
the figure is an upper bound for the scanning side and says nothing about 50 real servers' answer times.

Printed: wall seconds per concurrency level, the targets judged, the class counts, and the ideal
(ceil(targets / concurrency) × window). Prints, asserts nothing, exits 0, like the other benches.

Through Prometheus (issue 9 part A, ``--section prometheus``; needs Debian's ``prometheus``): one real Prometheus
scrapes the same simulator instances every second as ``--targets`` scrape jobs (one job per target, so each is its
own instance in PromQL), and ``collect_prometheus`` + a verdict per instance runs for 5, 20 and all targets (a
``job=~`` selector): wall seconds and the number of queries, which must not grow with the targets.

    .venv/bin/python bench/bench_fleet.py                          # 50 targets, window 3 s, concurrency 8 and 50
    .venv/bin/python bench/bench_fleet.py --targets 20 --concurrency 4,20 --window 5
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from local_prometheus import LocalPrometheus, why_missing

from llmdiag.api import diagnose_fleet
from llmdiag.client.endpoint import Connection
from llmdiag.config import url_targets
from llmdiag.sim.load import ClosedLoopLoad
from llmdiag.sim.presets import get_preset
from llmdiag.sim.server import SimServer


@contextmanager
def loaded_simulators(args: argparse.Namespace) -> Iterator[list[SimServer]]:
    """``args.instances`` healthy simulators, each driven by ``args.users`` closed-loop users; stopped on exit."""
    preset = get_preset("healthy")
    load = replace(preset.load, users=args.users)
    servers: list[SimServer] = []
    drivers: list[ClosedLoopLoad] = []
    try:
        for _ in range(args.instances):
            server = SimServer(preset).start()
            servers.append(server)
            driver = ClosedLoopLoad(server.url, server.model, load, max_seconds=3600)
            driver.start()
            drivers.append(driver)
        yield servers
    finally:
        for driver in drivers:
            driver.stop()
        for server in servers:
            server.stop()


def direct_targets(args: argparse.Namespace) -> list[dict]:
    rows: list[dict] = []
    with loaded_simulators(args) as servers:
        time.sleep(2.0)
        urls = [servers[i % len(servers)].url for i in range(args.targets)]
        targets = [(t.name, Connection(base_url=t.url, timeout_seconds=5.0)) for t in url_targets(urls)]
        for concurrency in args.concurrency:
            started = time.monotonic()
            report = diagnose_fleet(
                targets, args.window, concurrency=concurrency, target_timeout_seconds=args.window + 60
            )
            wall = time.monotonic() - started
            ideal = math.ceil(len(targets) / concurrency) * args.window
            row = {
                "section": "direct",
                "targets": len(targets),
                "instances": args.instances,
                "concurrency": concurrency,
                "window_seconds": args.window,
                "wall_seconds": round(wall, 2),
                "ideal_seconds": ideal,
                "judged": report.probed(),
                "class_counts": report.class_counts,
                "errors": sorted({t.error for t in report.targets if t.error})[:3],
            }
            rows.append(row)
            print(
                f"direct: {len(targets)} targets on {args.instances} simulator instances, concurrency "
                f"{concurrency}, window {args.window:g} s: {wall:.1f} s wall (ideal {ideal:g} s); judged "
                f"{report.probed()}/{len(targets)}; classes {report.class_counts}",
                flush=True,
            )
    return rows


def prometheus_targets(args: argparse.Namespace) -> list[dict]:
    from llmdiag.api import diagnose_prometheus
    from llmdiag.collect.prometheus.api import PrometheusSource

    if why_missing():
        print(f"prometheus: skipped ({why_missing()})", flush=True)
        return []
    rows: list[dict] = []
    with loaded_simulators(args) as servers:
        jobs = {f"replica-{i}": [servers[i % len(servers)].metrics_url] for i in range(args.targets)}
        with LocalPrometheus(jobs) as prom:
            prom.wait_for_samples("vllm:num_requests_running", args.targets, samples=4, timeout_seconds=60)
            time.sleep(max(0.0, args.window - 4))
            for count in sorted({min(5, args.targets), min(20, args.targets), args.targets}):
                selector = '{job=~"' + "|".join(f"replica-{i}" for i in range(count)) + '"}'
                source = PrometheusSource(prom.url)
                started = time.monotonic()
                verdicts, result = diagnose_prometheus(source, selector, None, max(args.window, 4.0))
                wall = time.monotonic() - started
                classes: dict[str, int] = {}
                for verdict in verdicts.values():
                    classes[verdict.bottleneck.value] = classes.get(verdict.bottleneck.value, 0) + 1
                row = {
                    "section": "prometheus",
                    "targets": count,
                    "instances": args.instances,
                    "queries": result.queries,
                    "wall_seconds": round(wall, 2),
                    "judged": len(verdicts),
                    "class_counts": classes,
                    "window_seconds": result.window_seconds,
                }
                rows.append(row)
                print(
                    f"prometheus: {count} targets ({args.instances} simulator instances behind {count} scrape "
                    f"jobs): {result.queries} queries, {wall:.2f} s wall; judged {len(verdicts)}; classes "
                    f"{classes}",
                    flush=True,
                )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=50)
    parser.add_argument("--instances", type=int, default=5)
    parser.add_argument("--users", type=int, default=4, help="closed-loop users per simulator instance")
    parser.add_argument("--window", type=float, default=3.0)
    parser.add_argument("--concurrency", default="8,50", help="comma list")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--section", default="direct,prometheus", help="comma list: direct, prometheus")
    args = parser.parse_args()
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        print("ERROR: --concurrency is a comma list of integers", file=sys.stderr)
        return 2
    rows = direct_targets(args) if "direct" in args.section else []
    if "prometheus" in args.section:
        rows += prometheus_targets(args)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
