"""How many concurrent streaming clients one simulator process sustains.

Starts the simulator (the ``healthy`` deployment: Llama 3 8B on an H100, max_num_seqs 1024) in its own process,
drives it from ``--client-procs`` other processes with ``--users`` closed-loop streaming clients in all, and prints,
over the measured window: simulated requests/s and tokens/s (from the server's own counters), SSE events the
clients read, the simulator's CPU seconds per second, and how far the simulated engine fell behind real time
(lag: 0 means every step started when the physics said it should).

    .venv/bin/python bench/sim_throughput.py                      # 1000 streams, 15 s
    .venv/bin/python bench/sim_throughput.py --users 200 --seconds 10

Prints results; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

REPO_ROOT = Path(__file__).resolve().parents[1]

SERVER_CODE = """
import sys
from llmdiag.sim.server import SimServer
with SimServer(sys.argv[1]) as server:
    print(server.url, flush=True)
    sys.stdin.read()  # until the bench closes our stdin
"""


def stats(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/sim/stats", timeout=10) as response:
        return json.loads(response.read())


def client(url: str, model: str, users: int, prompt: int, output: int, seconds: float, queue: mp.Queue) -> None:
    from llmdiag.sim.load import ClosedLoopLoad
    from llmdiag.sim.presets import LoadSpec

    load = ClosedLoopLoad(
        url, model, LoadSpec(users, prompt, output, output_spread=0.5), max_seconds=seconds, seed=os.getpid()
    )
    started = time.process_time()
    with load:
        load.wait(seconds + 30)
    s = load.tally
    queue.put(
        {
            "ok": s.ok,
            "rejected": s.rejected,
            "errors": dict(s.errors),
            "tokens": s.completion_tokens,
            "cpu": time.process_time() - started,
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=15.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument("--preset", default="healthy")
    args = parser.parse_args()

    server = subprocess.Popen(
        [sys.executable, "-c", SERVER_CODE, args.preset],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as response:
            model = json.loads(response.read())["data"][0]["id"]
        proc = psutil.Process(server.pid)
        queue: mp.Queue = mp.Queue()
        shares = [
            args.users // args.client_procs + (i < args.users % args.client_procs) for i in range(args.client_procs)
        ]
        total = args.warmup + args.seconds
        clients = [
            mp.Process(target=client, args=(url, model, n, args.prompt_tokens, args.output_tokens, total, queue))
            for n in shares
            if n
        ]
        for c in clients:
            c.start()
        time.sleep(args.warmup)
        before, cpu_before, t0 = stats(url), proc.cpu_times(), time.monotonic()
        peak_running = 0
        while time.monotonic() - t0 < args.seconds:
            time.sleep(1.0)
            peak_running = max(peak_running, stats(url)["running"])
        after, cpu_after, t1 = stats(url), proc.cpu_times(), time.monotonic()
        results = [queue.get(timeout=total + 60) for _ in clients]
        for c in clients:
            c.join(timeout=30)
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=30)

    wall = t1 - t0
    sim_wall = after["clock_seconds"] - before["clock_seconds"]
    finished = sum(after["request_success"].values()) - sum(before["request_success"].values())
    tokens = after["generation_tokens"] - before["generation_tokens"]
    steps = after["steps"] - before["steps"]
    cpu = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
    lag = after["lag_seconds"] - before["lag_seconds"]
    print(
        f"simulator: preset {args.preset}, {args.users} streaming clients in {len(clients)} processes, "
        f"prompt {args.prompt_tokens}, output {args.output_tokens} ± 50 %, {os.cpu_count()} CPUs"
    )
    print(f"window              {wall:.1f} s real, {sim_wall:.1f} s simulated")
    print(f"running (peak)      {peak_running} requests in the batch, {after['waiting']} waiting at the end")
    print(f"requests finished   {finished / wall:.1f} /s")
    print(
        f"tokens generated    {tokens / wall:.0f} /s  ({steps / wall:.1f} engine steps/s, "
        f"{tokens / max(steps, 1):.0f} tokens per step)"
    )
    print(f"simulator CPU       {cpu / wall:.2f} CPU-seconds per second (one process, one event loop)")
    print(f"engine lag          {lag:.2f} s behind the physics over the window ({100 * lag / wall:.1f} %)")
    ok = sum(r["ok"] for r in results)
    print(
        f"clients (whole run) {ok} requests completed, {sum(r['tokens'] for r in results)} tokens read, "
        f"{sum(r['rejected'] for r in results)} rejected, errors {[r['errors'] for r in results if r['errors']]}, "
        f"client CPU {sum(r['cpu'] for r in results) / total:.2f} CPU-s/s"
    )


if __name__ == "__main__":
    main()
