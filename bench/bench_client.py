"""The load client's benchmark (issue 5): CPU per streamed token against GuideLLM, client-vs-server timing agreement
at 1000 concurrent streams, and the highest streamed tokens/s one client process ingests.

Every load runs against a server in its OWN process, and every client in its own process too, so that each one's CPU
is measured alone (psutil over each process tree; the rest of the machine is reported as "other"):

1. CPU per token, side by side: GuideLLM 0.8.1 (``guidellm run``, its own venv, built by bench/guidellm_env.py), our
   client as a library (``llmdiag.client``: ``closed_loop`` on an ``OpenAIClient``, in a child process,
   bench/client_driver.py) and ``llmdiag load`` (the command: the same client plus its scan of the server during the
   level) each run a closed loop of N concurrent streaming chat requests (prompt P words, output O tokens,
   ignore_eos) for S seconds against the simulator (``python -m llmdiag sim serve``), same preset, same time scale.
   Two figures each:
     steady   CPU of the client's process tree (sampled every 0.5 s) over the middle of the run, divided by the
              tokens the simulator generated in the same window (its /sim/stats counter): start-up and wind-down
              left out, the same token count for both clients;
     whole    user+sys of the whole client process and its reaped children (getrusage(RUSAGE_CHILDREN) around it),
              start-up included, divided by the tokens the client itself counted.
   The simulator is slowed down (``--time-scale``) so that the offered token rate (~2k tokens/s) stays under what
   GuideLLM ingests: a client that falls behind reads several events per socket read and looks cheaper per token.
2. Agreement at 1000 users: our client against the simulator with its per-request timings on (GET /sim/timings,
   keyed by the client's X-Request-Id); per request, client TTFT (first token read − request sent) against server
   TTFT (first token written − request's bytes read), and the client's gaps between events against the server's gaps
   between writes; p50/p99 of the absolute differences (target p99 ≤ 5 ms). The TTFT difference is split into its
   two parts: request sent → the simulator's stamp of its arrival, and first event written → the client's stamp of
   its arrival. Both stamp arrivals with the kernel's receive time of the read (llmdiag/client/rxtime.py).
   Output lengths spread ±50 % so that users do not move in lockstep. Then
   ``llmdiag load`` itself drives the same 1000 users (completed requests, errors, CPU).
3. Max ingest, 1000 users, long outputs: (a) the simulator sped up (``--ingest-scales``); it runs out of CPU first
   (its lag column grows); (b) the bench's own "firehose" SSE server, which sends the same events with no engine
   and one write per event (bench/firehose.py), so the client is what runs out.

The parts: bench/sim_process.py (the server's process), bench/client_runs.py (one measured client run),
bench/client_agreement.py (section 2), this file (the sections, the tables, the command line). Run as a script:
the bench's modules import each other by bare name, from the script's folder that Python puts on sys.path.

    .venv/bin/python bench/guidellm_env.py           # once: GuideLLM's venv and tokenizer (≈ 1 min, 1.5 GB)
    .venv/bin/python bench/bench_client.py           # everything, ≈ 6 min on 2 cores
    .venv/bin/python bench/bench_client.py --quick   # 128 users only, shorter runs, ≈ 2 min
    .venv/bin/python bench/bench_client.py --only cpu --users 128 --seconds 30 --json out.json
    LOAD_CLIENT_PROFILE=/tmp/client.prof .venv/bin/python bench/bench_client.py --only agree   # cProfile our client

Without GuideLLM's venv the comparison prints a note instead of its row. The machine is shared: "other" CPU shows
what else ran. Prints results; asserts nothing; exits 0 (2 on bad arguments).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from client_agreement import Agreement, print_agreement, run_agreement
from client_runs import ClientRun, run_cli, run_guidellm, run_ours
from sim_process import PRESET, SimProcess

# Time scales that keep the offered rate near 2k tokens/s (healthy: ~14k tok/s at 128 streams, ~19k at 512, ×1)
DEFAULT_CPU_SCALES = {128: 0.15, 512: 0.1}
# --quick: one comparison level, shorter runs, one agreement scale, fewer ingest points (≈ 2 min)
QUICK_DEFAULTS = {
    "users": "128",
    "seconds": 15.0,
    "agree_seconds": 10.0,
    "agree_scales": "1",
    "ingest_seconds": 8.0,
    "ingest_scales": "1,16",
    "firehose_ticks": "0",
}


# --- max ingest -----------------------------------------------------------------------------------------------


@dataclass
class IngestPoint:
    time_scale: float  # the simulator's; for the firehose, its tick in ms
    run: ClientRun


def run_ingest(
    preset: str, users: int, seconds: float, prompt: int, output: int, scales: list[float]
) -> list[IngestPoint]:
    points = []
    for scale in scales:
        with SimProcess(preset, scale) as sim:
            run = run_ours(sim, users, seconds, prompt, output)
        points.append(IngestPoint(scale, run))
    return points


def run_firehose(users: int, seconds: float, prompt: int, output: int, ticks_ms: list[float]) -> list[IngestPoint]:
    points = []
    for tick in ticks_ms:
        with SimProcess(firehose_tick=tick / 1000) as server:
            run = run_ours(server, users, seconds, prompt, output)
        points.append(IngestPoint(tick, run))
    return points


# --- printing -------------------------------------------------------------------------------------------------


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "—" if x is None or x != x else format(x, spec)


def cpu_ratio(guidellm: ClientRun, ours: ClientRun) -> tuple[float | None, float | None]:
    """(steady, whole run) ours / GuideLLM CPU per token."""
    g, o = guidellm, ours
    steady = o.window.cpu_s_per_1k / g.window.cpu_s_per_1k if g.window.tokens and o.window.tokens else None
    whole = o.cpu_s_per_1k_whole / g.cpu_s_per_1k_whole if g.tokens_client and o.tokens_client else None
    return steady, whole


def print_cpu_table(groups: list[list[ClientRun]]) -> None:
    if not groups:
        return
    r0 = groups[0][0]
    print(
        f"\n== CPU per streamed token: GuideLLM 0.8.1 vs llmdiag, each in its own process; closed loop of N streaming "
        f"chat requests, prompt {r0.prompt_tokens} words, output {r0.output_tokens} tokens, {r0.seconds:g} s =="
    )
    head = (
        f"{'client':9} {'users':>5} {'scale':>5} {'tok/s':>6} {'ITL ms':>6} {'ok':>6} {'err':>3} {'client':>7} "
        f"{'sim':>6} {'other':>6} {'steady':>7} {'whole':>7} {'whole':>7}"
    )
    print(head)
    print(
        f"{'':9} {'':>5} {'':>5} {'':>6} {'':>6} {'':>6} {'':>3} {'CPU':>7} {'CPU':>6} {'CPU':>6} {'s/1k':>7} "
        f"{'CPU-s':>7} {'s/1k':>7}"
    )
    print("-" * len(head))
    for group in groups:
        for r in group:
            w = r.window
            print(
                f"{r.client:9} {r.users:>5} {r.time_scale:>5g} {w.tokens_per_s:>6.0f} {fmt(r.itl_ms, '.1f'):>6} "
                f"{r.requests_ok:>6} {r.errors:>3} {w.client_util:>6.2f}c {w.sim_util:>5.2f}c {w.other_util:>5.2f}c "
                f"{fmt(w.cpu_s_per_1k, '.4f'):>7} {r.cpu_whole:>7.1f} "
                f"{fmt(r.cpu_s_per_1k_whole, '.4f'):>7}"
            )
            if r.note:
                print(f"          note: {r.note}")
        for ours in group[1:]:
            steady, whole = cpu_ratio(group[0], ours)
            verdict = (
                "" if steady is None else ("   target ≤ 0.50: met" if steady <= 0.5 else "   target ≤ 0.50: NOT met")
            )
            print(
                f"{'ratio':9} {group[0].users:>5}  {ours.client} / GuideLLM CPU per token: steady "
                f"{fmt(steady, '.3f')}, whole run {fmt(whole, '.3f')}{verdict}"
            )
    print(
        "library: llmdiag.client.runners.closed_loop in a child process of this bench; load CLI: `llmdiag load` "
        "(the same client plus its scan of /metrics during the level and its report). scale: the simulator's time "
        "scale; tok/s, client, sim and other CPU (c = cores; other = the rest of the machine: this bench, the kernel, "
        "other users) over the steady window; ITL: each client's own median; steady s/1k: client CPU-seconds per "
        "1000 tokens the simulator generated in that window (= CPU-ms per token); whole: the client's whole run, "
        "start-up included, per token it counted (load CLI: per token the simulator generated)"
    )


def print_ingest(points: list[IngestPoint], label: str, knob: str) -> None:
    if not points:
        return
    r0 = points[0].run
    print(
        f"\n== Max ingest: one llmdiag client process, {r0.users} streaming users, prompt {r0.prompt_tokens}, "
        f"output {r0.output_tokens} tokens, {r0.seconds:g} s per point, {label} =="
    )
    print(
        f"{knob:>7} {'tok/s':>7} {'tok/ev':>6} {'ITL p50':>7} {'client':>7} {'server':>7} {'other':>6} "
        f"{'lag':>6} {'µs/tok':>6} {'errors':>6}"
    )
    for p in points:
        r, w = p.run, p.run.window
        per_event = r.tokens_client / r.events if r.events else float("nan")
        print(
            f"{p.time_scale:>7g} {w.tokens_per_s:>7.0f} {per_event:>6.2f} {fmt(r.itl_ms, '.2f'):>7} "
            f"{w.client_util:>6.2f}c {w.sim_util:>6.2f}c {w.other_util:>5.2f}c {w.lag:>5.1f}s "
            f"{1e3 * w.cpu_s_per_1k:>6.1f} {r.errors:>6}"
        )
        if r.note:
            print(f"        note: {r.note}")
    best = max(points, key=lambda p: p.run.window.tokens_per_s)
    w = best.run.window
    print(
        f"highest: {w.tokens_per_s:.0f} tokens/s at client CPU {w.client_util:.2f} cores "
        f"(server {w.sim_util:.2f} cores, rest of the machine {w.other_util:.2f})"
    )
    print(
        "tok/ev: tokens per SSE event; ITL p50: the client's median gap between events (0: several events came "
        "in one socket read); client, server, other: cores; lag: how far the simulator fell behind its physics; "
        "µs/tok: client CPU per token"
    )


# --- main -----------------------------------------------------------------------------------------------------


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", default="cpu,agree,ingest", help="sections to run: cpu, agree, ingest")
    parser.add_argument(
        "--quick", action="store_true", help="shorter runs: 128 users for cpu, 8-15 s points; options given still win"
    )
    parser.add_argument("--preset", default=PRESET)
    parser.add_argument("--users", default="128,512", help="concurrency of the GuideLLM comparison (comma list)")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each comparison run")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="simulator time scale of the comparison (default: 0.15 at ≤ 128 users, 0.1 above)",
    )
    parser.add_argument("--agree-users", type=int, default=1000)
    parser.add_argument("--agree-seconds", type=float, default=20.0)
    parser.add_argument("--agree-scales", default="1,0.25", help="simulator time scales of the agreement runs")
    parser.add_argument("--agree-spread", type=float, default=0.5, help="output lengths spread ±: users out of step")
    parser.add_argument(
        "--agree-warmup",
        type=float,
        default=5.0,
        help="also compare only the requests sent this many seconds after the first",
    )
    parser.add_argument("--ingest-users", type=int, default=1000)
    parser.add_argument("--ingest-seconds", type=float, default=10.0)
    parser.add_argument("--ingest-scales", default="1,4,16", help="simulator time scales of the ingest points")
    parser.add_argument("--ingest-prompt", type=int, default=16)
    parser.add_argument("--ingest-output", type=int, default=512)
    parser.add_argument(
        "--firehose-ticks",
        default="0,5",
        help="ms between the firehose server's rounds of events (0: as fast as it goes); '' skips it",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    if parser.parse_known_args(argv)[0].quick:
        parser.set_defaults(**QUICK_DEFAULTS)  # options given on the command line still win
    args = parser.parse_args(argv)
    args.only = {x.strip() for x in args.only.split(",") if x.strip()}
    unknown = args.only - {"cpu", "agree", "ingest"}
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    return args


def main() -> int:
    args = parse_args(sys.argv[1:])
    started = time.monotonic()
    print(
        f"load-client bench: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, preset {args.preset}; "
        f"the simulator and each client in their own processes"
    )
    out: dict[str, Any] = {"cpus": os.cpu_count(), "preset": args.preset}
    groups: list[list[ClientRun]] = []
    if "cpu" in args.only:
        for users in (int(u) for u in args.users.split(",")):
            scale = args.time_scale or DEFAULT_CPU_SCALES.get(users) or (0.15 if users <= 128 else 0.1)
            group = []
            for runner in (run_guidellm, run_ours, run_cli):
                with SimProcess(args.preset, scale) as sim:
                    group.append(runner(sim, users, args.seconds, args.prompt_tokens, args.output_tokens))
            groups.append(group)
            print(f"  [cpu] {users} users done ({time.monotonic() - started:.0f} s)", flush=True)
        out["cpu"] = [
            {
                "runs": [asdict(r) for r in group],
                "ratios": {
                    r.client: dict(steady=cpu_ratio(group[0], r)[0], whole=cpu_ratio(group[0], r)[1]) for r in group[1:]
                },
            }
            for group in groups
        ]
    agreements: list[Agreement] = []
    cli_runs: list[ClientRun] = []
    if "agree" in args.only:
        for scale in floats(args.agree_scales):
            agree = run_agreement(
                args.preset,
                args.agree_users,
                args.agree_seconds,
                args.prompt_tokens,
                args.output_tokens,
                scale,
                args.agree_spread,
                args.agree_warmup,
            )
            agreements.append(agree)
            print(f"  [agree] time scale {scale:g} done ({time.monotonic() - started:.0f} s)", flush=True)
        out["agreement"] = [{**a.summary(), "run": asdict(a.run) if a.run else None} for a in agreements]
        low = max(1, round(args.output_tokens * (1 - args.agree_spread)))
        high = max(low, round(args.output_tokens * (1 + args.agree_spread)))
        with SimProcess(args.preset, floats(args.agree_scales)[0]) as sim:
            cli_runs.append(run_cli(sim, args.agree_users, args.agree_seconds, args.prompt_tokens, f"{low}:{high}"))
        print(f"  [agree] llmdiag load with {args.agree_users} users done ({time.monotonic() - started:.0f} s)")
        out["load_cli_users"] = [asdict(r) for r in cli_runs]
    points: list[IngestPoint] = []
    firehose: list[IngestPoint] = []
    if "ingest" in args.only:
        points = run_ingest(
            args.preset,
            args.ingest_users,
            args.ingest_seconds,
            args.ingest_prompt,
            args.ingest_output,
            floats(args.ingest_scales),
        )
        firehose = run_firehose(
            args.ingest_users, args.ingest_seconds, args.ingest_prompt, args.ingest_output, floats(args.firehose_ticks)
        )
        print(f"  [ingest] done ({time.monotonic() - started:.0f} s)", flush=True)
        out["ingest"] = [{"time_scale": p.time_scale, **asdict(p.run)} for p in points]
        out["ingest_firehose"] = [{"tick_ms": p.time_scale, **asdict(p.run)} for p in firehose]
    print_cpu_table(groups)
    print_agreement(agreements)
    for r in cli_runs:
        w = r.window
        print(
            f"\n== `llmdiag load` itself with {r.users} concurrent streaming users, {r.seconds:g} s, simulator time "
            f"scale {r.time_scale:g}: exit {r.rc}, {r.requests_ok} requests completed, {r.errors} errors; steady "
            f"window {w.tokens_per_s:.0f} tok/s, llmdiag CPU {w.client_util:.2f} cores, simulator "
            f"{w.sim_util:.2f}, rest of the machine {w.other_util:.2f} =="
        )
        if r.note:
            print(f"note: {r.note}")
    print_ingest(points, f"the simulator (preset {args.preset}) sped up", "scale")
    print_ingest(firehose, "the bench's firehose server (no engine, one write per event)", "tick ms")
    print(f"\n(bench took {time.monotonic() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str) + "\n")
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
