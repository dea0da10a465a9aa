"""`llmdiag nccl-bench`: launch ``llmdiag.nccl_bench`` under torchrun on this host and collect its report.

The arguments are checked here first (no torch needed), so a bad one is one ERROR line before anything starts.
torchrun runs as ``python -m torch.distributed.run --nproc-per-node N --rdzv-backend c10d --rdzv-endpoint
127.0.0.1:PORT -m llmdiag.nccl_bench ...`` with a free loopback port; its stderr goes to a log kept only when the
run fails. Multi-node runs are torchrun's own business: run ``torchrun ... -m llmdiag.nccl_bench`` on each node.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmdiag.errors import LlmdiagError, UsageError
from llmdiag.nccl_bench import BenchUsageError, parse_options

DEFAULT_CPU_RANKS = 2
DEFAULT_TIMEOUT_SECONDS = 3600.0


class TorchMissingError(LlmdiagError):
    hint = "pip install 'llmdiag[torch]'  (on a CPU-only machine: torch==2.13.0's CPU wheel)"


class BenchFailedError(LlmdiagError):
    pass


@dataclass
class BenchRun:
    report: dict[str, Any] | None  # None when the report went to stdout as JSON (--json -)
    stdout: str  # rank 0's table (or JSON)
    command: list[str]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def default_nproc() -> int:
    """One rank per visible GPU (NVML), else two CPU ranks (gloo): enough to exercise every collective."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML, no driver, no GPU: the CPU default
        return DEFAULT_CPU_RANKS
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = min(count, len([v for v in visible.split(",") if v.strip()]))
    return count or DEFAULT_CPU_RANKS


def torchrun_command(nproc: int, bench_args: list[str], port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "-m",
        "llmdiag.nccl_bench",
        *bench_args,
    ]


def _failure_line(log: str) -> tuple[str, str]:
    """The ERROR/HINT pair rank 0 printed, else the last line that looks like an exception."""
    error = re.search(r"^ERROR: (.+)$", log, re.M)
    if error:
        hint = re.search(r"^HINT: (.+)$", log, re.M)
        return error[1], hint[1] if hint else ""
    found = re.findall(r"^\s*(?:\[rank\d+\]:\s*)?([A-Za-z_.]+(?:Error|Exception): .+)$", log, re.M)
    return (found[-1] if found else (log.strip().splitlines() or ["(no output)"])[-1]), ""


def run_bench(
    nproc: int | None,
    bench_args: list[str],
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> BenchRun:
    """Check the arguments, launch torchrun, return rank 0's report. Raises UsageError, TorchMissingError or
    BenchFailedError (with the log's path) — never a traceback."""
    try:
        options = parse_options(bench_args)
    except BenchUsageError as exc:
        raise UsageError(exc.message, exc.hint) from None
    if nproc is not None and nproc < 1:
        raise UsageError("--nproc-per-node must be at least 1", "e.g. --nproc-per-node 8 (one rank per GPU)")
    if importlib.util.find_spec("torch") is None:
        raise TorchMissingError("nccl-bench needs PyTorch (torch.distributed), which is not installed")
    nproc = nproc or default_nproc()
    to_stdout = options.json_out == "-"
    with tempfile.TemporaryDirectory(prefix="llmdiag-nccl-") as tmp:
        out = Path(options.json_out) if options.json_out and not to_stdout else Path(tmp) / "report.json"
        args = list(bench_args)
        if not options.json_out:
            args += ["--json", str(out)]
        command = torchrun_command(nproc, args, free_port())
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")  # torchrun warns and sets it anyway; a benchmark wants it quiet
        env.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_seconds, env=env)
        except subprocess.TimeoutExpired:
            raise BenchFailedError(
                f"nccl-bench did not finish in {timeout_seconds:.0f} s",
                "a rank may be stuck in rendezvous or a collective; try fewer --sizes, or NCCL_DEBUG=INFO",
            ) from None
        if proc.returncode != 0:
            with tempfile.NamedTemporaryFile("w", prefix="llmdiag-nccl-bench-", suffix=".log", delete=False) as log:
                log.write(proc.stdout + "\n" + proc.stderr)
            message, hint = _failure_line(proc.stdout + "\n" + proc.stderr)
            if re.search(r"CUDA|NCCL", message) and not hint:
                hint = "rerun with NCCL_DEBUG=INFO to see which transport NCCL chose"
            raise BenchFailedError(
                f"nccl-bench failed (torchrun exit {proc.returncode}): {message}",
                f"{hint + '; ' if hint else ''}full log: {log.name}",
            )
        report = None if to_stdout else json.loads(out.read_text(encoding="utf-8"))
    return BenchRun(report=report, stdout=proc.stdout, command=command)
