"""torchrun on this host: start the ranks of llmdiag.collect.nccl.bench and read rank 0's report back.

torchrun runs as ``python -m torch.distributed.run --nproc-per-node N --rdzv-backend c10d --rdzv-endpoint
127.0.0.1:PORT -m llmdiag.collect.nccl.bench OPTIONS_JSON OUT NAMES_JSON`` with a free loopback port; its
output goes to a log kept only when the run fails. Multi-node runs are torchrun's own business: ``torchrun ... -m
llmdiag.nccl_bench`` on each node.
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
from pathlib import Path

from pydantic import ValidationError

from llmdiag.collect.nccl.options import RANK_OPTION_KEYS
from llmdiag.collect.telemetry.nvml import import_pynvml
from llmdiag.errors import BenchFailedError, TorchMissingError, option
from llmdiag.model import NcclBenchOptions, NcclBenchReport

BENCH_MODULE = "llmdiag.collect.nccl.bench"
DEFAULT_CPU_RANKS = 2
DEFAULT_TIMEOUT_SECONDS = 3600.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def default_nproc() -> int:
    """One rank per visible GPU (NVML), else two CPU ranks (gloo): enough to exercise every collective."""
    try:
        nvml = import_pynvml()
    except ImportError:
        return DEFAULT_CPU_RANKS
    try:
        nvml.nvmlInit()
        try:
            count = int(nvml.nvmlDeviceGetCount())
        finally:
            nvml.nvmlShutdown()
    except nvml.NVMLError:  # no driver, no GPU: the CPU default
        return DEFAULT_CPU_RANKS
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = min(count, len([v for v in visible.split(",") if v.strip()]))
    return count or DEFAULT_CPU_RANKS


def torchrun_command(nproc: int, module_args: list[str], port: int, module: str = BENCH_MODULE) -> list[str]:
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
        module,
        *module_args,
    ]


def failure_line(log: str) -> str:
    """The last line of the log that looks like an exception (a rank's traceback), in llmdiag's words when it is one
    of llmdiag's errors; else the log's last line."""
    found = re.findall(r"^\s*(?:\[rank\d+\]:\s*)?([A-Za-z_.]+(?:Error|Exception): .+)$", log, re.M)
    if not found:
        return (log.strip().splitlines() or ["(no output)"])[-1]
    return re.sub(r"^llmdiag\.errors\.\w+: ", "", found[-1])


def _keep_log(output: str) -> str:
    with tempfile.NamedTemporaryFile("w", prefix="llmdiag-nccl-bench-", suffix=".log", delete=False) as log:
        log.write(output)
    return log.name


def _failed(returncode: int, output: str) -> BenchFailedError:
    message = failure_line(output)
    hint = "rerun with NCCL_DEBUG=INFO to see which transport NCCL chose; " if re.search(r"CUDA|NCCL", message) else ""
    return BenchFailedError(
        f"nccl-bench failed (torchrun exit {returncode}): {message}", f"{hint}full log: {_keep_log(output)}"
    )


def launch_bench(
    options: NcclBenchOptions, nproc: int | None = None, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
) -> NcclBenchReport:
    """Run the benchmark under torchrun with ``nproc`` ranks (default: one per GPU, else 2 on CPU) and return rank
    0's report, unjudged. Raises TorchMissingError or BenchFailedError (with the log's path), never a traceback."""
    if importlib.util.find_spec("torch") is None:
        raise TorchMissingError("nccl-bench needs PyTorch (torch.distributed), which is not installed")
    nproc = nproc or default_nproc()
    with tempfile.TemporaryDirectory(prefix="llmdiag-nccl-") as tmp:
        out = Path(tmp) / "report.json"
        # the ranks name options as this process's caller does (the report's texts, a rank's usage error)
        names = json.dumps({key: option(key) for key in RANK_OPTION_KEYS})
        command = torchrun_command(nproc, [options.model_dump_json(), str(out), names], free_port())
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")  # torchrun warns and sets it anyway; a benchmark wants it quiet
        env.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_seconds, env=env)
        except subprocess.TimeoutExpired:
            raise BenchFailedError(
                f"nccl-bench did not finish in {timeout_seconds:.0f} s",
                f"a rank may be stuck in rendezvous or a collective; try fewer {option('sizes')}, or NCCL_DEBUG=INFO",
            ) from None
        output = proc.stdout + "\n" + proc.stderr
        if proc.returncode != 0:
            raise _failed(proc.returncode, output)
        try:
            return NcclBenchReport.model_validate_json(out.read_text(encoding="utf-8"))
        except (OSError, ValidationError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else f"{exc.error_count()} field(s) do not fit the model"
            raise BenchFailedError(
                f"nccl-bench finished but rank 0's report is unreadable ({why})", f"full log: {_keep_log(output)}"
            ) from None
