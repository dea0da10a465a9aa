"""The load client's benchmark (issue 5): CPU per streamed token against GuideLLM, client-vs-server timing agreement
at 1000 concurrent streams, and the highest streamed tokens/s one client process ingests.

Every load runs against a server in its OWN process, and every client in its own process too, so that each one's CPU
is measured alone (psutil over each process tree; the rest of the machine is reported as "other"):

1. CPU per token, side by side: GuideLLM 0.8.1 (``guidellm run``, its own venv, built by bench/guidellm_env.py), our
   client as a library (``llmdiag.client``: ``closed_loop`` on an ``OpenAIClient``, in a child process of
   this file) and ``llmdiag load`` (the command: the same client plus its scan of the server during the level) each
   run a closed loop of N concurrent streaming chat requests (prompt P words, output O tokens, ignore_eos) for S
   seconds against the simulator (``python -m llmdiag sim serve``), same preset, same time scale. Two figures each:
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
   and one write per event, so the client is what runs out.

    .venv/bin/python bench/guidellm_env.py           # once: GuideLLM's venv and tokenizer (≈ 1 min, 1.5 GB)
    .venv/bin/python bench/load_client.py            # everything, ≈ 6 min on 2 cores
    .venv/bin/python bench/load_client.py --quick    # 128 users only, shorter runs, ≈ 2 min
    .venv/bin/python bench/load_client.py --only cpu --users 128 --seconds 30 --json out.json
    LOAD_CLIENT_PROFILE=/tmp/client.prof .venv/bin/python bench/load_client.py --only agree   # cProfile our client

Without GuideLLM's venv the comparison prints a note instead of its row. The machine is shared: "other" CPU shows
what else ran. Prints results; asserts nothing; exits 0 (2 on bad arguments).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO_ROOT = Path(__file__).resolve().parents[1]

SAMPLE_SECONDS = 0.5
PRESET = "healthy"  # Llama 3 8B on one H100, max_num_seqs 1024: 1000 users all run in the batch
# Time scales that keep the offered rate near 2k tokens/s (healthy: ~14k tok/s at 128 streams, ~19k at 512, ×1)
DEFAULT_CPU_SCALES = {128: 0.15, 512: 0.1}


# --- the simulator, in its own process ------------------------------------------------------------------------


SIM_WITH_TIMINGS = """
import signal, sys, threading
from llmdiag.sim.server import SimServer
stop = threading.Event()
signal.signal(signal.SIGINT, lambda *_: stop.set())
with SimServer(sys.argv[1], time_scale=float(sys.argv[2]), record_timings=True,
               max_timed_requests=int(sys.argv[3])) as server:
    print("simulated vLLM with timings", server.url, flush=True)
    stop.wait()
"""


class SimProcess:
    """The simulator as a child process: ``python -m llmdiag sim serve --preset P --port 0 --time-scale T``, or,
    with ``record_timings`` (which ``sim serve`` has no flag for), ``SimServer(..., record_timings=True)`` in a
    ``python -c`` child. SIGINT stops either."""

    def __init__(
        self, preset: str = PRESET, time_scale: float = 1.0, record_timings: int = 0, firehose_tick: float | None = None
    ) -> None:
        self.firehose_tick = firehose_tick  # not None: the bench's firehose server instead of the simulator
        self.preset = preset
        self.time_scale = time_scale
        self.record_timings = record_timings  # 0: off; otherwise how many requests' timings the server keeps
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.model = ""
        self.ps: psutil.Process | None = None

    def __enter__(self) -> SimProcess:
        if self.firehose_tick is not None:
            cmd = [sys.executable, str(Path(__file__).resolve()), FIREHOSE_FLAG, f"{self.firehose_tick!r}"]
        elif self.record_timings:
            cmd = [
                sys.executable,
                "-c",
                SIM_WITH_TIMINGS,
                self.preset,
                f"{self.time_scale!r}",
                str(self.record_timings),
            ]
        else:
            cmd = [
                sys.executable,
                "-m",
                "llmdiag",
                "sim",
                "serve",
                "--preset",
                self.preset,
                "--port",
                "0",
                "--time-scale",
                f"{self.time_scale!r}",
            ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO_ROOT,
            env={**os.environ, "COLUMNS": "400"},
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 60
        seen = []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            found = re.search(r"http://127\.0\.0\.1:\d+", line)
            if found:
                self.url = found.group(0)
                break
        if not self.url:
            self.__exit__()
            raise RuntimeError(f"the simulator did not start: {''.join(seen)[-2000:]}")
        # keep draining its stdout so that it never blocks on a full pipe
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        self.model = self.get("/v1/models")["data"][0]["id"]
        self.ps = psutil.Process(self.proc.pid)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def get(self, path: str, timeout: float = 30) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
            return json.loads(response.read())

    def stats(self) -> dict[str, Any]:
        return self.get("/sim/stats")

    def cpu(self) -> float:
        assert self.ps is not None
        t = self.ps.cpu_times()
        return t.user + t.system


# --- CPU accounting -------------------------------------------------------------------------------------------


@dataclass
class Sample:
    t: float  # time.monotonic()
    client_cpu: dict[int, float]  # pid -> user+sys of each live process in the client's tree
    sim_cpu: float
    generation_tokens: int  # the simulator's counters from here on
    prompt_tokens: int
    finished: int  # requests the simulator finished (any reason)
    lag: float  # seconds the simulated engine fell behind the physics
    machine_busy: float  # CPU-seconds every core spent on anything but idle (psutil.cpu_times())


class Sampler(threading.Thread):
    """Every SAMPLE_SECONDS: the client tree's CPU per process, the simulator's CPU and token counter."""

    def __init__(self, pid: int, sim: SimProcess) -> None:
        super().__init__(daemon=True)
        self.root = psutil.Process(pid)
        self.sim = sim
        self.samples: list[Sample] = []
        self.halt = threading.Event()

    def tree_cpu(self) -> dict[int, float]:
        out: dict[int, float] = {}
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return out
        for p in procs:
            try:
                t = p.cpu_times()
                out[p.pid] = t.user + t.system
            except psutil.Error:
                pass
        return out

    def sample(self) -> None:
        try:
            s = self.sim.stats()
            finished = sum(s["request_success"].values())
            self.samples.append(
                Sample(
                    time.monotonic(),
                    self.tree_cpu(),
                    self.sim.cpu(),
                    s["generation_tokens"],
                    s["prompt_tokens"],
                    finished,
                    s["lag_seconds"],
                    machine_busy(),
                )
            )
        except (OSError, ValueError, psutil.Error):
            pass

    def run(self) -> None:
        while not self.halt.wait(SAMPLE_SECONDS):
            self.sample()


def machine_busy() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)


@dataclass
class Window:
    """The steady middle of a run: from ``skip`` seconds after the simulator's first token to ``tail`` seconds
    before its last one."""

    seconds: float = 0.0
    client_cpu: float = 0.0
    sim_cpu: float = 0.0
    tokens: int = 0  # generated by the simulator in the window
    requests: int = 0  # finished by the simulator in the window
    prompt_tokens: int = 0  # of the requests the simulator admitted in the window
    lag: float = 0.0  # seconds the simulator fell behind its physics in the window (its CPU ran short)
    machine_busy: float = 0.0  # CPU-seconds the whole machine was busy in the window

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def client_util(self) -> float:
        return self.client_cpu / self.seconds if self.seconds else 0.0

    @property
    def sim_util(self) -> float:
        return self.sim_cpu / self.seconds if self.seconds else 0.0

    @property
    def other_util(self) -> float:
        """Cores busy with anything but the client and the simulator (this bench, the kernel, other users)."""
        return max(0.0, self.machine_busy - self.client_cpu - self.sim_cpu) / self.seconds if self.seconds else 0.0

    @property
    def cpu_s_per_1k(self) -> float:
        """Client CPU-seconds per 1000 tokens (numerically, CPU-ms per token)."""
        return 1000 * self.client_cpu / self.tokens if self.tokens else float("nan")


def steady_window(samples: list[Sample], skip: float, tail: float) -> Window:
    active = [i for i in range(1, len(samples)) if samples[i].generation_tokens > samples[i - 1].generation_tokens]
    if not active:
        return Window()
    first_t, last_t = samples[active[0] - 1].t, samples[active[-1]].t
    inside = [s for s in samples if first_t + skip <= s.t <= last_t - tail]
    if len(inside) < 2:
        return Window()
    a, b = inside[0], inside[-1]
    cpu = 0.0
    for pid, end in b.client_cpu.items():
        cpu += end - a.client_cpu.get(pid, 0.0)
    for pid, start in a.client_cpu.items():  # processes that ended inside the window: count what was seen
        if pid not in b.client_cpu:
            last = max((s.client_cpu[pid] for s in inside if pid in s.client_cpu), default=start)
            cpu += last - start
    return Window(
        b.t - a.t,
        cpu,
        b.sim_cpu - a.sim_cpu,
        b.generation_tokens - a.generation_tokens,
        b.finished - a.finished,
        b.prompt_tokens - a.prompt_tokens,
        b.lag - a.lag,
        b.machine_busy - a.machine_busy,
    )


@dataclass
class Measured:
    rc: int
    wall: float
    cpu: float  # user+sys of the process and its reaped children, the whole run
    samples: list[Sample]
    stdout: str
    stderr: str


def measure(cmd: list[str], sim: SimProcess, timeout: float, env: dict[str, str] | None = None) -> Measured:
    """Run ``cmd`` (the load client) to the end, sampling its tree's CPU and the simulator's counters."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, cwd=REPO_ROOT, env=env)
        sampler = Sampler(proc.pid, sim)
        sampler.sample()
        sampler.start()
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        sampler.halt.set()
        sampler.join()
        sampler.sample()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Measured(rc, time.monotonic() - started, cpu, sampler.samples, stdout, stderr)


# --- one client run -------------------------------------------------------------------------------------------


@dataclass
class ClientRun:
    client: str  # "guidellm" or "llmdiag"
    users: int
    seconds: float
    prompt_tokens: int
    output_tokens: int
    time_scale: float
    rc: int = 0
    wall: float = 0.0
    cpu_whole: float = 0.0  # CPU-s, whole process tree, start-up included
    tokens_client: int = 0  # output tokens the client counted
    events: int | None = None  # content events the client timestamped (ours only)
    requests_ok: int = 0
    errors: int = 0
    window: Window = field(default_factory=Window)
    itl_ms: float | None = None  # the client's own median inter-token latency
    note: str = ""

    @property
    def cpu_s_per_1k_whole(self) -> float:
        return 1000 * self.cpu_whole / self.tokens_client if self.tokens_client else float("nan")


def _sum_metric(bench: dict[str, Any], name: str, *statuses: str) -> float:
    block = bench["metrics"].get(name) or {}
    return sum((block.get(s) or {}).get("total_sum") or 0.0 for s in statuses)


def run_guidellm(sim: SimProcess, users: int, seconds: float, prompt: int, output: int) -> ClientRun:
    import guidellm_env  # noqa: PLC0415  (bench/ is on sys.path when this file runs)

    run = ClientRun("guidellm", users, seconds, prompt, output, sim.time_scale)
    if not guidellm_env.is_ready():
        run.note = "GuideLLM's venv is missing: run bench/guidellm_env.py"
        return run
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "guidellm.json"
        cmd = guidellm_env.guidellm_command(sim.url, sim.model, users, seconds, prompt, output, out)
        m = measure(cmd, sim, timeout=seconds + 240, env=guidellm_env.offline_env())
        run.rc, run.wall, run.cpu_whole = m.rc, m.wall, m.cpu
        run.window = steady_window(m.samples, skip=max(2.0, seconds * 0.15), tail=max(1.0, seconds * 0.05))
        if m.rc != 0 or not out.exists():
            run.note = f"guidellm exit {m.rc}: {(m.stderr or m.stdout)[-600:]}"
            return run
        bench = json.loads(out.read_text())["benchmarks"][0]
    totals = bench["metrics"]["request_totals"]
    run.requests_ok = int(totals["successful"])
    run.errors = int(totals["errored"])
    run.tokens_client = int(_sum_metric(bench, "output_token_count", "successful", "incomplete", "errored"))
    itl = (bench["metrics"].get("inter_token_latency_ms") or {}).get("successful") or {}
    run.itl_ms = itl.get("median")
    return run


# --- our client, driven in a child process ---------------------------------------------------------------------

DRIVER_FLAG = "--_driver"


def run_ours(
    sim: SimProcess,
    users: int,
    seconds: float,
    prompt: int,
    output: int,
    records: Path | None = None,
    output_spread: float = 0.0,
) -> ClientRun:
    """Our client in a child process (``DRIVER_FLAG``): the closed loop for ``seconds``; a summary on stdout, and
    with ``records`` every request's timings written there after the load ends."""
    run = ClientRun("library", users, seconds, prompt, output, sim.time_scale)
    spec = {
        "url": sim.url,
        "model": sim.model,
        "users": users,
        "seconds": seconds,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "output_spread": output_spread,
        "records": str(records) if records else None,
    }
    cmd = [sys.executable, str(Path(__file__).resolve()), DRIVER_FLAG, json.dumps(spec)]
    m = measure(cmd, sim, timeout=seconds + 120)
    run.rc, run.wall, run.cpu_whole = m.rc, m.wall, m.cpu
    run.window = steady_window(m.samples, skip=max(2.0, seconds * 0.15), tail=max(1.0, seconds * 0.05))
    try:
        summary = json.loads(m.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        run.note = f"driver exit {m.rc}: {(m.stderr or m.stdout)[-1500:]}"
        return run
    run.requests_ok, run.errors, run.tokens_client = summary["ok"], summary["errors"], summary["tokens"]
    run.itl_ms, run.events = summary.get("itl_ms"), summary.get("events")
    if summary.get("error_kinds"):
        run.note = f"errors: {summary['error_kinds']}"
    return run


def run_cli(sim: SimProcess, users: int, seconds: float, prompt: int, output: int | str) -> ClientRun:
    """``llmdiag load URL --users N --duration S --warmup 0 --chat --no-nvml`` as the user would run it: the same
    client plus what the command does beside it (a scan of the server's /metrics during the level, the verdict,
    the report). ``output`` may be a range such as "32:96". Tokens: the simulator's count over the whole run (the
    report gives rates, not totals)."""
    run = ClientRun("load CLI", users, seconds, prompt, output if isinstance(output, int) else 0, sim.time_scale)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "load.json"
        cmd = [
            sys.executable,
            "-m",
            "llmdiag",
            "load",
            sim.url,
            "--users",
            str(users),
            "--duration",
            f"{seconds:g}",
            "--warmup",
            "0",
            "--prompt-tokens",
            str(prompt),
            "--output-tokens",
            str(output),
            "--chat",
            "--no-nvml",
            "--output",
            str(report),
        ]
        m = measure(cmd, sim, timeout=seconds + 180)
        run.rc, run.wall, run.cpu_whole = m.rc, m.wall, m.cpu
        run.window = steady_window(m.samples, skip=max(2.0, seconds * 0.15), tail=max(1.0, seconds * 0.05))
        if m.samples:
            run.tokens_client = m.samples[-1].generation_tokens - m.samples[0].generation_tokens
        if not report.exists():
            run.note = f"llmdiag load exit {m.rc}: {(m.stderr or m.stdout)[-800:]}"
            return run
        point = json.loads(report.read_text())["points"][0]
    run.requests_ok = int(point.get("requests_completed") or 0)
    errors = point.get("errors") or {}
    run.errors = int(sum(errors.values())) if isinstance(errors, dict) else 0
    itl = (point.get("itl_seconds") or {}).get("p50")
    run.itl_ms = 1e3 * itl if itl is not None else None
    if errors:
        run.note = f"errors: {errors}"
    if m.rc not in (0, 1):
        run.note = (run.note + " " if run.note else "") + f"exit {m.rc}"
    return run


def driver_main(spec: dict[str, Any]) -> int:
    """The child process: our client's closed loop (``llmdiag.client``), then one JSON line of totals on
    stdout, and with ``spec["records"]`` every request's id and timestamps written there (after the load)."""
    import asyncio  # noqa: PLC0415
    import random  # noqa: PLC0415

    from llmdiag.client.openai import OpenAIClient
    from llmdiag.client.prompts import PromptFactory
    from llmdiag.client.result import RequestPlan
    from llmdiag.client.runners import closed_loop

    words = PromptFactory(seed=os.getpid()).text  # the simulator counts one token per word
    prompt_words, output, chat = spec["prompt_tokens"], spec["output_tokens"], spec.get("chat", True)
    spread = spec.get("output_spread", 0.0)  # outputs drawn from O·(1 − s) … O·(1 + s): users out of lockstep
    low, high = max(1, round(output * (1 - spread))), max(1, round(output * (1 + spread)))
    draw = random.Random(0).randint

    def plan() -> RequestPlan:
        return RequestPlan(words(prompt_words), draw(low, high) if spread else output, chat=chat)

    async def run() -> list[Any]:
        async with OpenAIClient(spec["url"], model=spec["model"]) as client:
            return await closed_loop(client, spec["users"], plan, duration_seconds=spec["seconds"], max_requests=None)

    profile_path = os.environ.get("LOAD_CLIENT_PROFILE")  # cProfile the client's run into this file
    if profile_path:
        import cProfile  # noqa: PLC0415

        with cProfile.Profile() as profiler:
            results = asyncio.run(run())
        profiler.dump_stats(profile_path)
    else:
        results = asyncio.run(run())
    kinds: dict[str, int] = {}
    for r in results:
        if r.error_kind and r.error_kind != "cancelled":
            kinds[r.error_kind] = kinds.get(r.error_kind, 0) + 1
    gaps = [g for r in results for g in r.itl_seconds]  # cancelled ones too: long outputs may outlast the run
    summary = {
        "requests": len(results),
        "ok": sum(r.ok for r in results),
        "cancelled": sum(r.error_kind == "cancelled" for r in results),
        "errors": sum(kinds.values()),
        "error_kinds": kinds,
        "tokens": sum(r.output_tokens or 0 for r in results),
        "events": sum(len(r.token_times) for r in results),
        "itl_ms": 1e3 * statistics.median(gaps) if gaps else None,
    }
    if spec.get("records"):
        records = [
            {
                "id": r.request_id,
                "ok": r.ok,
                "started": r.started_at,
                "first_token": r.first_token_at,
                "token_times": r.token_times,
                "ended": r.ended_at,
                "output_tokens": r.output_tokens,
            }
            for r in results
        ]
        Path(spec["records"]).write_text(json.dumps(records))
    print(json.dumps(summary), flush=True)
    return 0


# --- client vs server agreement -------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


@dataclass
class Agreement:
    users: int = 0
    seconds: float = 0.0
    spread: float = 0.0
    run: ClientRun | None = None
    after_warmup: Agreement | None = None  # the same, for requests sent after the first ``warmup`` seconds
    warmup: float = 0.0
    requests_compared: int = 0  # successful on the client, with the server's timings under the same id
    requests_without_timings: int = 0
    event_count_mismatches: int = 0  # the client saw a different number of content events than the server wrote
    ttft_diff_ms: list[float] = field(default_factory=list)  # |client TTFT − server TTFT|
    itl_diff_ms: list[float] = field(default_factory=list)  # |client gap − server gap|, event by event
    # the same, only where the client read the two events in different reads (a gap of exactly 0: one read held
    # both, because the client fell more than a gap behind and the kernel merged the packets under one stamp)
    itl_diff_separate_reads_ms: list[float] = field(default_factory=list)
    delivery_ms: list[float] = field(default_factory=list)  # client arrival − server write, same clock
    send_to_handler_ms: list[float] = field(default_factory=list)  # server received_at − client started_at
    first_delivery_ms: list[float] = field(default_factory=list)  # client first token − server first write
    client_ttft_ms: list[float] = field(default_factory=list)
    server_ttft_ms: list[float] = field(default_factory=list)
    client_itl_ms: list[float] = field(default_factory=list)
    server_itl_ms: list[float] = field(default_factory=list)
    note: str = ""

    def summary(self) -> dict[str, Any]:
        q = {"p50": 50, "p99": 99, "max": 100}

        def pct(values: list[float]) -> dict[str, float]:
            return {k: percentile(values, v) for k, v in q.items()}

        return {
            "users": self.users,
            "seconds": self.seconds,
            "output_spread": self.spread,
            "requests_compared": self.requests_compared,
            "requests_without_timings": self.requests_without_timings,
            "event_count_mismatches": self.event_count_mismatches,
            "gaps_compared": len(self.itl_diff_ms),
            "ttft_abs_diff_ms": pct(self.ttft_diff_ms),
            "itl_abs_diff_ms": pct(self.itl_diff_ms),
            "itl_abs_diff_separate_reads_ms": pct(self.itl_diff_separate_reads_ms),
            "gaps_in_one_read": len(self.itl_diff_ms) - len(self.itl_diff_separate_reads_ms),
            "delivery_ms": pct(self.delivery_ms),
            "send_to_handler_ms": pct(self.send_to_handler_ms),
            "first_delivery_ms": pct(self.first_delivery_ms),
            "client_ttft_ms": pct(self.client_ttft_ms),
            "server_ttft_ms": pct(self.server_ttft_ms),
            "client_itl_ms": pct(self.client_itl_ms),
            "server_itl_ms": pct(self.server_itl_ms),
            "note": self.note,
            "warmup_seconds": self.warmup,
            "after_warmup": self.after_warmup.summary() if self.after_warmup else None,
        }


def compare(agree: Agreement, records: list[dict[str, Any]], server: dict[str, dict[str, Any]]) -> None:
    """``records``: the client's requests (id, started, first_token, token_times: time.monotonic() seconds);
    ``server``: /sim/timings' ``requests``, id -> {received_at, event_times, event_tokens, ...}, the same clock."""
    for rec in records:
        if not rec["ok"] or rec["first_token"] is None:
            continue
        srv = server.get(rec["id"])
        if srv is None or not srv.get("event_times"):
            agree.requests_without_timings += 1
            continue
        agree.requests_compared += 1
        c_times, s_times = rec["token_times"], srv["event_times"]
        c_ttft = rec["first_token"] - rec["started"]
        s_ttft = s_times[0] - srv["received_at"]
        agree.client_ttft_ms.append(1e3 * c_ttft)
        agree.server_ttft_ms.append(1e3 * s_ttft)
        agree.ttft_diff_ms.append(1e3 * abs(c_ttft - s_ttft))
        agree.send_to_handler_ms.append(1e3 * (srv["received_at"] - rec["started"]))
        agree.first_delivery_ms.append(1e3 * (rec["first_token"] - s_times[0]))
        if len(c_times) != len(s_times):
            agree.event_count_mismatches += 1
        n = min(len(c_times), len(s_times))
        for i in range(n):
            agree.delivery_ms.append(1e3 * (c_times[i] - s_times[i]))
            if i:
                c_gap, s_gap = c_times[i] - c_times[i - 1], s_times[i] - s_times[i - 1]
                agree.client_itl_ms.append(1e3 * c_gap)
                agree.server_itl_ms.append(1e3 * s_gap)
                agree.itl_diff_ms.append(1e3 * abs(c_gap - s_gap))
                if c_gap > 0.0:
                    agree.itl_diff_separate_reads_ms.append(1e3 * abs(c_gap - s_gap))


def run_agreement(
    preset: str, users: int, seconds: float, prompt: int, output: int, scale: float, spread: float, warmup: float
) -> Agreement:
    """Our client with ``users`` users against the simulator with its timings on; every successful request compared,
    and separately those sent ``warmup`` seconds or more after the first (past the opening burst of ``users``
    simultaneous requests)."""
    agree = Agreement(users=users, seconds=seconds, spread=spread, warmup=warmup)
    keep = max(4096, int(users * seconds * 2))  # more than the requests the run can finish
    with SimProcess(preset, scale, record_timings=keep) as sim, tempfile.TemporaryDirectory() as tmp:
        records_path = Path(tmp) / "records.json"
        agree.run = run_ours(sim, users, seconds, prompt, output, records=records_path, output_spread=spread)
        if not records_path.exists():
            agree.note = agree.run.note or "the driver wrote no records"
            return agree
        timings = sim.get("/sim/timings", timeout=120)
        records = json.loads(records_path.read_text())
    if timings.get("dropped"):
        agree.note = f"the simulator dropped {timings['dropped']} requests' timings (capacity {timings['capacity']})"
    compare(agree, records, timings["requests"])
    if records:
        first = min(r["started"] for r in records)
        agree.after_warmup = Agreement(users=users, seconds=seconds, spread=spread)
        compare(agree.after_warmup, [r for r in records if r["started"] >= first + warmup], timings["requests"])
    return agree


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


# --- the firehose: a minimal SSE server that costs far less per token than the simulator ------------------------

FIREHOSE_FLAG = "--_firehose"
FIREHOSE_MODEL = "firehose"
_MAX_TOKENS_RE = re.compile(rb'"max_(?:completion_)?tokens"\s*:\s*(\d+)')


def firehose_main(tick: float) -> int:
    """vLLM's streaming chat wire format without an engine: every ``tick`` seconds (0: as fast as its one event loop
    goes) each open stream gets one event of one token, in one write, as the simulator sends them. GET /v1/models,
    /health and /sim/stats (generation_tokens, prompt_tokens, request_success, lag_seconds, as the bench reads them)
    are answered too. Bound to 127.0.0.1; SIGINT stops it."""
    import asyncio  # noqa: PLC0415

    stats = {"generation_tokens": 0, "prompt_tokens": 0, "request_success": {"length": 0}, "lag_seconds": 0.0}
    streams: dict[Any, list[Any]] = {}  # protocol -> [tokens left, head bytes, total]
    words = [b" w%d" % i for i in range(64)]
    stop_event = asyncio.Event()

    def chunk(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)

    class Proto(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            self.buffer = b""

        def connection_lost(self, exc: Exception | None) -> None:
            streams.pop(self, None)

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while True:
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = self.buffer[:end].decode("latin-1")
                length = int(re.search(r"(?im)^content-length:\s*(\d+)", head).group(1)) if "ength:" in head else 0
                if len(self.buffer) < end + 4 + length:
                    return
                body, self.buffer = self.buffer[end + 4 : end + 4 + length], self.buffer[end + 4 + length :]
                self.request(head.split(" ", 2)[:2], body)

        def reply(self, payload: bytes, content_type: str = "application/json") -> None:
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
                % (content_type.encode(), len(payload), payload)
            )

        def request(self, line: list[str], body: bytes) -> None:
            method, path = line
            if method == "GET" and path.startswith("/sim/stats"):
                self.reply(json.dumps(stats).encode())
            elif method == "GET" and path.startswith("/v1/models"):
                self.reply(json.dumps({"object": "list", "data": [{"id": FIREHOSE_MODEL, "object": "model"}]}).encode())
            elif method == "GET":
                self.reply(b"")
            else:
                found = _MAX_TOKENS_RE.search(body)
                total = int(found.group(1)) if found else 16
                stats["prompt_tokens"] += len(body.split())
                self.transport.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                )
                head = (
                    b'data: {"id":"chatcmpl-%d","object":"chat.completion.chunk","created":1,"model":"%s",'
                    b'"choices":[{"index":0,' % (id(self), FIREHOSE_MODEL.encode())
                )
                streams[self] = [total, head, total]

    async def ticker() -> None:
        while not stop_event.is_set():
            for proto, state in list(streams.items()):
                left, head, total = state
                i = total - left
                reason = b'"length"' if left == 1 else b"null"
                event = head + b'"delta":{"content":"%s"},"logprobs":null,"finish_reason":%s}]}\n\n' % (
                    words[i % 64],
                    reason,
                )
                if left == 1:
                    usage = (
                        b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":%d,'
                        b'"total_tokens":%d}}\n\n' % (total, total + 1)
                    )
                    proto.transport.write(chunk(event) + chunk(usage + b"data: [DONE]\n\n") + b"0\r\n\r\n")
                    del streams[proto]
                    stats["request_success"]["length"] += 1
                else:
                    proto.transport.write(chunk(event))
                    state[0] = left - 1
                stats["generation_tokens"] += 1
            await asyncio.sleep(tick)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, stop_event.set)
        server = await loop.create_server(Proto, "127.0.0.1", 0, backlog=4096)
        port = server.sockets[0].getsockname()[1]
        print(f"firehose http://127.0.0.1:{port} tick {tick:g} s", flush=True)
        task = asyncio.create_task(ticker())
        await stop_event.wait()
        task.cancel()
        server.close()

    asyncio.run(serve())
    return 0


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


def print_agreement(agreements: list[Agreement]) -> None:
    for a in agreements:
        r = a.run
        if r is None:
            continue
        print(
            f"\n== Client vs server timestamps: llmdiag, {a.users} concurrent streaming users, {a.seconds:g} s, "
            f"prompt {r.prompt_tokens} words, output {r.output_tokens} tokens ± {100 * a.spread:.0f} %, simulator "
            f"time scale {r.time_scale:g} =="
        )
        w = r.window
        print(
            f"completed {r.requests_ok} requests, errors {r.errors}, {r.tokens_client} tokens "
            f"({r.tokens_client / max(r.seconds, 1e-9):.0f}/s); steady window {w.tokens_per_s:.0f} tok/s, "
            f"client CPU {w.client_util:.2f} cores, simulator CPU {w.sim_util:.2f} cores, rest of the machine "
            f"{w.other_util:.2f} cores, simulator lag {w.lag:.2f} s"
        )
        if r.note or a.note:
            print(f"note: {' '.join(x for x in (r.note, a.note) if x)}")
        sm = a.summary()
        print(
            f"compared {sm['requests_compared']} requests ({sm['requests_without_timings']} without server timings, "
            f"{sm['event_count_mismatches']} with a different event count), {sm['gaps_compared']} token gaps"
        )
        late = a.after_warmup.summary() if a.after_warmup else None
        print(f"{'':34} {'every request':^26} | {'sent ≥ ' + format(a.warmup, 'g') + ' s in':^17}")
        print(f"{'':34} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} | {'p50 ms':>8} {'p99 ms':>8}")
        for key, label in (
            ("ttft_abs_diff_ms", "|client TTFT − server TTFT|"),
            ("send_to_handler_ms", "  of which: sent → server reads it"),
            ("first_delivery_ms", "  of which: 1st event write → read"),
            ("itl_abs_diff_ms", "|client gap − server gap| (ITL)"),
            ("itl_abs_diff_separate_reads_ms", "  events read apart (gap > 0)"),
            ("delivery_ms", "every event: write → client read"),
            ("client_ttft_ms", "client TTFT"),
            ("server_ttft_ms", "server TTFT"),
            ("client_itl_ms", "client ITL"),
            ("server_itl_ms", "server ITL"),
        ):
            v = sm[key]
            tail = f" | {late[key]['p50']:>8.2f} {late[key]['p99']:>8.2f}" if late else ""
            print(f"{label:34} {v['p50']:>8.2f} {v['p99']:>8.2f} {v['max']:>8.2f}{tail}")
        if late:
            print(f"{'requests compared':34} {sm['requests_compared']:>26} | {late['requests_compared']:>17}")
        print(
            f"{'gaps whose two events came in one read':40} {sm['gaps_in_one_read']:>20} "
            f"({100 * sm['gaps_in_one_read'] / max(1, sm['gaps_compared']):.2f} % of {sm['gaps_compared']})"
        )
        for name, summary in (("every request", sm), (f"sent ≥ {a.warmup:g} s in", late)):
            if summary is None or not summary["requests_compared"]:
                continue
            ttft, itl = summary["ttft_abs_diff_ms"]["p99"], summary["itl_abs_diff_ms"]["p99"]
            print(
                f"target p99 ≤ 5 ms, {name}: TTFT {'met' if ttft <= 5 else 'NOT met'} ({ttft:.3f} ms), "
                f"ITL {'met' if itl <= 5 else 'NOT met'} ({itl:.3f} ms)"
            )
    if agreements:
        print(
            "sent → server reads it: from the client writing the request to the simulator's stamp of its arrival; "
            "1st event write → read and every event: from the simulator writing an event to the client's stamp "
            "of its arrival (one clock, time.monotonic()). Both sides stamp arrivals with the kernel's receive "
            "time of the read (SO_TIMESTAMPNS, llmdiag/client/rxtime.py), so neither event loop's lag under a "
            "thousand streams counts. Events that pile up unread while the client is more than a gap behind reach "
            "it in one read under the stamp of the last one (the kernel merges them): their gap reads 0, counted "
            "above."
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
    parser.add_argument("--quick", action="store_true", help="shorter runs: 128 users for cpu, 10 s points")
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
    args = parser.parse_args(argv)
    if args.quick:
        args.users = "128"
        args.seconds = min(args.seconds, 15.0)
        args.agree_seconds = min(args.agree_seconds, 10.0)
        args.agree_scales = args.agree_scales.split(",")[0]
        args.ingest_seconds = min(args.ingest_seconds, 8.0)
        args.ingest_scales = "1,16"
        args.firehose_ticks = "0"
    args.only = {x.strip() for x in args.only.split(",") if x.strip()}
    unknown = args.only - {"cpu", "agree", "ingest"}
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    return args


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == DRIVER_FLAG:
        return driver_main(json.loads(sys.argv[2]))
    if len(sys.argv) == 3 and sys.argv[1] == FIREHOSE_FLAG:
        return firehose_main(float(sys.argv[2]))
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
