"""`llmdiag check` across a large fleet (default 200 targets), some of them dead, slow or hostile.

The targets cycle through ``KINDS``: real vLLM 0.32.0 recordings replayed (healthy, idle, memory, compute,
scheduling), the built-in simulator (``--sims`` child processes of the healthy preset under its own load; the same
URL repeated is a separate target with its own window, scrapes and canary, as in bench/bench_fleet.py), a closed
port, a server that never answers, HTTP 500/503/429/401, a login page, text that is not an exposition, a reset
mid-body, and (``--drip``) servers dripping their headers or their body one byte every 0.5 s. All but the
simulators are played by one scripted server in a child process (bench/fleet_servers.py), which counts the
connections open at once; no server shares the checker's process (its interpreter lock would slow the answers).

The state each kind must get, known without llmdiag's rules: a recorded or simulated healthy or idle server is OK
with that class (a Nagios OK is "healthy or idle, no finding"); a recorded capacity state is WARNING or CRITICAL
with its own class (it was recorded in that state: tests/fixtures/vllm-0.32.0/README.md); anything that cannot be
diagnosed is UNKNOWN with its error.

Printed: wall seconds against the run's deadline (``[check] deadline_seconds``, or its default),
the most connections open at once at the scripted server against concurrency × ``CONNECTIONS_PER_TARGET`` (and
the most requests in flight), the
states per kind with the requests each target of the kind was sent, and every target whose state is not its
kind's. Prints, asserts nothing, exits 0, like the other benches (tests/e2e/test_check_scale.py runs a 40-target
version and asserts).

    .venv/bin/python bench/check_fleet200.py          # 200 targets, concurrency 16, window 2 s, timeout 3 s
    .venv/bin/python bench/check_fleet200.py --targets 60 --concurrency 8 --drip --deadline 120
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script: bench/ imports as a package
    sys.path.insert(0, str(REPO_ROOT))

from bench.fleet_servers import FleetProcess, closed_port  # noqa: E402
from bench.sim_process import SimProcess  # noqa: E402
from llmdiag.api import run_check  # noqa: E402
from llmdiag.api.check import default_deadline_seconds  # noqa: E402
from llmdiag.config import CheckDefaults, Settings, Target  # noqa: E402
from llmdiag.model.check import CheckReport, State, TargetResult  # noqa: E402

# one cycle of the fleet: every kind in turn (twice for the plain healthy ones, the commonest in a real fleet)
KINDS = (
    "replay:healthy",
    "replay:idle",
    "replay:memory",
    "replay:compute",
    "replay:scheduling",
    "sim:healthy",
    "replay:healthy",
    "dead",
    "blackhole",
    "status:500",
    "status:503",
    "status:429",
    "status:401",
    "html",
    "garbage",
    "reset",
)
DRIP_KINDS = ("drip_headers", "drip_body")
CAPACITY_STATES = ("memory", "compute", "scheduling")
# a target holds at most two connections: its metrics page's (detection's is closed before the window's opens; that
# one is kept alive through the window) and the canary's: what bounds the connections open at once to
# concurrency × this (a closed one counts until the server's side sees it close)
CONNECTIONS_PER_TARGET = 2


@dataclass
class Planned:
    target: Target
    kind: str


def plan_fleet(
    server: FleetProcess, count: int, sim_urls: list[str], timeout_seconds: float, drip: bool = False, prefix: str = "t"
) -> list[Planned]:
    """``count`` targets cycling through the kinds (the simulator kind left out without simulators), named
    ``<prefix><number>-<kind>``."""
    kinds = [k for k in KINDS if sim_urls or not k.startswith("sim:")] + (list(DRIP_KINDS) if drip else [])
    dead_url = f"http://127.0.0.1:{closed_port()}"
    planned = []
    for i in range(count):
        kind = kinds[i % len(kinds)]
        name = f"{prefix}{i:03d}-{kind.replace(':', '-').replace('_', '-')}"
        if kind.startswith("sim:"):
            url = sim_urls[i % len(sim_urls)]
        elif kind == "dead":
            url = dead_url
        else:
            url = server.add(name, kind)
        planned.append(Planned(Target(name=name, url=url, timeout_seconds=timeout_seconds, nvml=False), kind))
    return planned


def wrong_state(kind: str, result: TargetResult) -> str | None:
    """Why ``result`` is not what a target of ``kind`` must get; None when it is."""
    got = f"{result.state.name}" + (f" ({result.verdict.bottleneck.value})" if result.verdict else "")
    if kind.startswith(("replay:", "sim:")):
        state = kind.split(":", 1)[1]
        if result.verdict is None:
            return f"{got}: {result.error}"
        if result.verdict.bottleneck.value != state:
            return f"{got}, not class {state}"
        want = (State.WARNING, State.CRITICAL) if state in CAPACITY_STATES else (State.OK,)
        return None if result.state in want else f"{got}, not {'/'.join(s.name for s in want)}"
    if result.state is not State.UNKNOWN or result.verdict is not None or not result.error:
        return f"{got}, not UNKNOWN with an error"
    return None


def states_by_kind(planned: list[Planned], report: CheckReport) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for plan, result in zip(planned, report.targets, strict=True):
        row = table.setdefault(plan.kind, {})
        row[result.state.name] = row.get(result.state.name, 0) + 1
    return table


def check_settings(concurrency: int, deadline_seconds: float | None) -> Settings:
    """Settings with the concurrency and the run's deadline (``[check] deadline_seconds``; None: the default)."""
    return Settings(check=CheckDefaults(concurrency=concurrency, deadline_seconds=deadline_seconds))


@contextmanager
def simulators(count: int) -> Iterator[list[str]]:
    """``count`` healthy simulators under the preset's own load, each in a child process (``llmdiag sim serve
    --load``: its answers do not wait on the checker's threads); their base URLs."""
    with ExitStack() as stack:
        sims = [stack.enter_context(SimProcess("healthy", load=True)) for _ in range(count)]
        if sims:
            time.sleep(3.0)  # as the demo does: the batch fills before the first window
        yield [s.url for s in sims]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--window", type=float, default=2.0, help="each target's window, seconds")
    parser.add_argument("--timeout", type=float, default=3.0, help="each target's read timeout, seconds")
    parser.add_argument("--sims", type=int, default=2, help="simulator instances (0: none)")
    parser.add_argument("--drip", action="store_true", help="add the dripping servers")
    parser.add_argument("--hold", type=float, default=120.0, help="how long a silent or dripping server holds on")
    parser.add_argument("--deadline", type=float, help="the run's deadline, seconds ([check] deadline_seconds)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    settings = check_settings(args.concurrency, args.deadline)
    with simulators(args.sims) as sim_urls, FleetProcess(hold_seconds=args.hold) as server:
        planned = plan_fleet(server, args.targets, sim_urls, args.timeout, drip=args.drip)
        deadline = settings.check.deadline_seconds or default_deadline_seconds(
            [p.target for p in planned], settings, args.window
        )
        started = time.monotonic()
        report = run_check([p.target for p in planned], settings, args.window)
        wall = time.monotonic() - started
        most = server.most_concurrent
        most_in_flight = server.most_in_flight
        asked = server.requests
    table = states_by_kind(planned, report)
    wrong = {
        p.target.name: why for p, r in zip(planned, report.targets, strict=True) if (why := wrong_state(p.kind, r))
    }
    print(
        f"check: {args.targets} targets ({args.sims} simulator instances), concurrency {args.concurrency}, window "
        f"{args.window:g} s, timeout {args.timeout:g} s: {wall:.1f} s wall" + f" (the run's deadline {deadline:g} s)"
    )
    print(
        f"  at the scripted server, at once: at most {most} connections open (bound: concurrency × "
        f"{CONNECTIONS_PER_TARGET} = {args.concurrency * CONNECTIONS_PER_TARGET}), {most_in_flight} requests in flight"
    )
    print(f"  overall state: {report.state.name}")
    for kind, states in table.items():
        counts = [asked.get(p.target.name, 0) for p in planned if p.kind == kind]
        played = kind != "dead" and not kind.startswith("sim:")  # the others are not the scripted server's
        print(f"  {kind:<18} {states}" + (f"; requests per target {min(counts)}-{max(counts)}" if played else ""))
    print(f"  targets whose state is not their kind's: {len(wrong)}")
    for name, why in sorted(wrong.items()):
        print(f"    {name}: {why}")
    if args.json:
        figures = {
            "targets": args.targets,
            "concurrency": args.concurrency,
            "window_seconds": args.window,
            "wall_seconds": round(wall, 2),
            "deadline_seconds": deadline,
            "most_concurrent_connections": most,
            "most_requests_in_flight": most_in_flight,
            "states_by_kind": table,
            "requests_by_target": asked,
            "wrong": wrong,
        }
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
