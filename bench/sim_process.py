"""The simulator as a child process of a bench, so that its CPU is measured apart from the client's: ``llmdiag sim
serve``, or ``SimServer`` with its per-request timings on, or the bench's firehose server (bench/firehose.py).

Shared by bench/bench_client.py (every run of the load client's benchmark) and bench/guidellm_env.py (its check
run of GuideLLM).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
FIREHOSE = Path(__file__).with_name("firehose.py")
PRESET = "healthy"  # Llama 3 8B on one H100, max_num_seqs 1024: 1000 users all run in the batch

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
    ``python -c`` child, or with ``firehose_tick`` the firehose server. SIGINT stops each. Within the block: ``url``,
    ``model``, ``stats()`` (its /sim/stats) and ``cpu()`` (its user+sys seconds so far). With ``load``, ``sim serve
    --load`` also drives the preset's own load."""

    def __init__(
        self,
        preset: str = PRESET,
        time_scale: float = 1.0,
        record_timings: int = 0,
        firehose_tick: float | None = None,
        load: bool = False,
        dialect: str = "vllm",
    ) -> None:
        self.dialect = dialect  # ``sim serve --dialect``: the server whose pages it serves
        self.load = load  # ``sim serve --load``: the preset's own closed-loop load, driven in the child
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
            cmd = [sys.executable, str(FIREHOSE), f"{self.firehose_tick!r}"]
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
                *(["--load"] if self.load else []),
                *(["--dialect", self.dialect] if self.dialect != "vllm" else []),
            ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
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
