"""Collective bandwidth benchmark, run under torchrun: the nccl-tests measurements from inside PyTorch.

    torchrun --nproc-per-node 8 -m llmdiag.nccl_bench [--sizes 1K:1G] [--ops all_reduce,all_gather] [--json OUT]
    llmdiag nccl-bench --nproc-per-node 8 ...        (the same, launched for you on 127.0.0.1)

Per op and message size it measures the time per collective as nccl-tests does (``--warmup`` untimed runs, then
``--iters`` back to back between two synchronisations; time = mean per iteration, averaged over ranks; the median
of ``--trials`` such batches is kept, which tames a noisy host), and derives

    algbw = size / time            busbw = algbw x factor     (nccl-tests doc/PERFORMANCE.md)
    all_reduce 2(n-1)/n    all_gather (n-1)/n    reduce_scatter (n-1)/n    all_to_all (n-1)/n

with ``size`` in nccl-tests' convention: all_reduce the buffer; all_gather the gathered output; reduce_scatter the
input; all_to_all the bytes each rank sends (its whole buffer). busbw is per GPU and per direction, comparable with
the link's expected figure from probes/links.toml. The backend is NCCL when CUDA is available, else gloo on the
CPU (a smoke test of the plumbing: its figures are memory copies through TCP on loopback, not a link).

Sizes are capped by memory (a quarter of free device memory, or of available host memory per local rank, since
the out-of-place collectives hold ~2 buffers of the size), and with gloo by ``--max-size`` (default 64 MiB) so a
CPU run stays small. With one rank there is no inter-GPU link: only the memory-copy bandwidth probe runs.

Rank 0 prints a table (``--json OUT`` also writes the result; ``-`` prints JSON instead) and evaluates the
benchmark's signals with the rule engine. Logic lives in functions that return data; this module imports torch
only inside them, so ``llmdiag`` without the torch extra can import its argument parsing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = 1
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
DEFAULT_SIZES = "1K:1G"
DEFAULT_GLOO_MAX_BYTES = 64 * 1024**2
ELEMENT_BYTES = 4  # float32, as nccl-tests' default
MEMORY_SHARE_FOR_BUFFERS = 0.25
# busbw reaches its plateau only with large messages (NVLink ~64-256 MiB): below this no ratio to the link is given,
# so a short --sizes run cannot read as a slow link
RATIO_MIN_BYTES = 64 * 1024**2
EXIT_OK, EXIT_ERROR = 0, 2
_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


class BenchUsageError(ValueError):
    """A bad argument: one ERROR line and a HINT, exit 2."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.message, self.hint = message, hint


# ---------------------------------------------------------------------------------------------------------------
# arguments (pure: used by the CLI wrapper before it launches anything)


def parse_size(text: str) -> int:
    """'1K' → 1024, '64M', '1G', '4096' (bytes); binary units, as nccl-tests' -b/-e."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    if not match or int(match[1]) <= 0:
        raise BenchUsageError(f"not a message size: {text!r}", "sizes look like 1K, 64M or 1G (binary units)")
    return int(match[1]) * _UNITS[match[2]]


def parse_sizes(text: str) -> list[int]:
    """'1K:1G' → every power-of-two step from 1 KiB to 1 GiB (nccl-tests -f 2); '1M' → one size; 'a,b,c' → those."""
    if ":" in text:
        low_text, _, high_text = text.partition(":")
        low, high = parse_size(low_text), parse_size(high_text)
        if low > high:
            raise BenchUsageError(f"--sizes {text}: the first size is above the last", "write LOW:HIGH, e.g. 1K:1G")
        sizes = []
        size = low
        while size <= high:
            sizes.append(size)
            size *= 2
        return sizes
    return sorted({parse_size(part) for part in text.split(",") if part.strip()}) or [parse_size(text)]


def parse_ops(text: str) -> list[str]:
    ops = [op.strip().replace("-", "_") for op in text.split(",") if op.strip()]
    unknown = [op for op in ops if op not in OPS]
    if unknown or not ops:
        raise BenchUsageError(f"unknown collective {', '.join(unknown) or '(none)'}", f"--ops takes {','.join(OPS)}")
    return list(dict.fromkeys(ops))


def check_link(name: str | None) -> str | None:
    if name is None:
        return None
    from llmdiag.schema.links import describe_link, known_link_names

    if describe_link(name) is None:
        raise BenchUsageError(f"unknown link class {name!r}", f"--link takes one of {', '.join(known_link_names())}")
    return name.lower()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one ERROR line, not argparse's usage block
        raise BenchUsageError(message, "run `python -m llmdiag.nccl_bench --help` for the options")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m llmdiag.nccl_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="LOW:HIGH (powers of two), or a comma list")
    parser.add_argument("--ops", default=",".join(OPS), help="comma list of " + ", ".join(OPS))
    parser.add_argument("--iters", type=int, default=20, help="timed collectives per trial (default 20)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed collectives before each size (default 5)")
    parser.add_argument("--trials", type=int, default=3, help="timed batches per size; the median is kept")
    parser.add_argument("--max-size", default=None, help="cap on the message size (gloo default 64M)")
    parser.add_argument("--link", default=None, help="the link class to compare with, e.g. nvlink4, pcie5x16, ib-ndr")
    parser.add_argument("--json", dest="json_out", default=None, help="write the result as JSON here ('-': stdout)")
    parser.add_argument("--no-check", action="store_true", help="skip the correctness check of each op")
    return parser


@dataclass
class Options:
    sizes: list[int]
    ops: list[str]
    iters: int = 20
    warmup: int = 5
    trials: int = 3
    max_size: int | None = None
    link: str | None = None
    json_out: str | None = None
    check: bool = True


def parse_options(argv: list[str] | None) -> Options:
    parser = build_parser()
    ns = parser.parse_args(argv)
    for name in ("iters", "trials"):
        if getattr(ns, name) < 1:
            raise BenchUsageError(f"--{name} must be at least 1", f"e.g. --{name} 5")
    if ns.warmup < 0:
        raise BenchUsageError("--warmup cannot be negative", "e.g. --warmup 5")
    return Options(
        sizes=parse_sizes(ns.sizes),
        ops=parse_ops(ns.ops),
        iters=ns.iters,
        warmup=ns.warmup,
        trials=ns.trials,
        max_size=parse_size(ns.max_size) if ns.max_size else None,
        link=check_link(ns.link),
        json_out=ns.json_out,
        check=not ns.no_check,
    )


# ---------------------------------------------------------------------------------------------------------------
# the arithmetic (pure)


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' busbw / algbw factor for ``op`` on ``world_size`` ranks."""
    n = world_size
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    raise ValueError(op)


def element_count(op: str, size_bytes: int, world_size: int) -> int:
    """Elements of the op's nccl-tests-sized buffer, rounded down so that every rank's share is whole."""
    count = size_bytes // ELEMENT_BYTES
    if op != "all_reduce":
        count -= count % world_size
    return count


@dataclass
class Measurement:
    op: str
    size_bytes: int
    count: int
    time_seconds: float  # mean per collective, averaged over ranks, median of the trials
    time_max_rank_seconds: float  # the slowest rank's mean (same trial)
    algbw_bytes_per_second: float
    busbw_bytes_per_second: float
    bus_factor: float
    trials_seconds: list[float] = field(default_factory=list)


def measurement(
    op: str, size_bytes: int, count: int, world: int, trial_means: list[tuple[float, float]]
) -> Measurement:
    """From each trial's (mean over ranks, max over ranks) seconds per collective: the median trial's figures."""
    ordered = sorted(trial_means)
    mean, slowest = ordered[(len(ordered) - 1) // 2]
    real_bytes = count * ELEMENT_BYTES
    algbw = real_bytes / mean
    factor = bus_factor(op, world)
    return Measurement(
        op=op,
        size_bytes=real_bytes,
        count=count,
        time_seconds=mean,
        time_max_rank_seconds=slowest,
        algbw_bytes_per_second=algbw,
        busbw_bytes_per_second=algbw * factor,
        bus_factor=factor,
        trials_seconds=[m for m, _ in trial_means],
    )


# ---------------------------------------------------------------------------------------------------------------
# the environment: torch, the devices, the link


@dataclass
class Env:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str
    device: str  # "cuda:N" or "cpu"
    device_name: str
    torch_version: str

    @property
    def nodes(self) -> int:
        return max(1, math.ceil(self.world_size / max(1, self.local_world_size)))


def read_env() -> Env:
    import torch

    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    if cuda:
        if local_rank >= torch.cuda.device_count():
            raise BenchUsageError(
                f"local rank {local_rank} but only {torch.cuda.device_count()} GPU(s) visible",
                "use --nproc-per-node at most the number of GPUs",
            )
        torch.cuda.set_device(local_rank)
        device, name = f"cuda:{local_rank}", torch.cuda.get_device_name(local_rank)
    else:
        import platform

        device, name = "cpu", platform.processor() or platform.machine()
    return Env(
        rank=int(os.environ.get("RANK", "0")),
        world_size=world,
        local_rank=local_rank,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", str(world))),
        backend="nccl" if cuda else "gloo",
        device=device,
        device_name=name,
        torch_version=torch.__version__,
    )


def _nvml_handle(nvml: Any, env: Env) -> Any:
    """This rank's GPU in NVML: by UUID (CUDA_VISIBLE_DEVICES renumbers devices), else by index."""
    import torch

    uuid = str(getattr(torch.cuda.get_device_properties(env.local_rank), "uuid", "") or "")
    if uuid:
        for candidate in (uuid, f"GPU-{uuid}"):
            try:
                return nvml.nvmlDeviceGetHandleByUUID(candidate)
            except Exception:  # noqa: BLE001, S112 - try the other spelling, then the index
                continue
    return nvml.nvmlDeviceGetHandleByIndex(env.local_rank)


@dataclass
class LinkInfo:
    name: str | None
    expected_bus_bandwidth_bytes_per_second: float | None
    how: str  # how it was found, or why it is unavailable
    unavailable: str | None = None
    title: str = ""


def detect_link(env: Env, override: str | None, nvml: Any = None) -> LinkInfo:
    """The link class this benchmark's traffic crosses, and the busbw a healthy one reaches."""
    from llmdiag.collect.telemetry.nvml import link_from_nvml
    from llmdiag.schema.links import describe_link

    def known(name: str, how: str) -> LinkInfo:
        found = describe_link(name)
        assert found is not None
        return LinkInfo(found.name, found.expected_bus_bandwidth_bytes_per_second, how, title=found.title)

    if override:
        return known(override, "--link")
    if env.world_size == 1:
        return LinkInfo(None, None, "", unavailable="one rank: no inter-GPU link to measure")
    if env.nodes > 1:
        why = "several nodes: the network between them is not visible to NVML; pass --link (e.g. ib-ndr)"
        return LinkInfo(None, None, "", unavailable=why)
    if not env.device.startswith("cuda"):
        return LinkInfo(None, None, "", unavailable="no NVML: CPU ranks (gloo over loopback) have no GPU link")
    if nvml is None:
        try:
            import pynvml as nvml  # type: ignore[import-not-found,no-redef]

            nvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - ImportError or NVMLError: both mean no NVML
            why = f"no NVML ({type(exc).__name__}: {exc}); pip install 'llmdiag[gpu]' or pass --link"
            return LinkInfo(None, None, "", unavailable=why)
    try:
        name, how = link_from_nvml(nvml, _nvml_handle(nvml, env))
    except Exception as exc:  # noqa: BLE001
        return LinkInfo(None, None, "", unavailable=f"NVML could not name the link: {exc}")
    if name is None:
        return LinkInfo(None, None, "", unavailable=how)
    return known(name, how)


def size_cap(env: Env, options: Options) -> tuple[int | None, str]:
    """The largest message this run may use, and why."""
    import torch

    caps: list[tuple[int, str]] = []
    if options.max_size:
        caps.append((options.max_size, "--max-size"))
    elif env.backend == "gloo":
        caps.append((DEFAULT_GLOO_MAX_BYTES, "gloo default (--max-size to raise it)"))
    if env.device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(env.local_rank)
        caps.append((int(free * MEMORY_SHARE_FOR_BUFFERS), "a quarter of free GPU memory"))
    else:
        import psutil

        per_rank = psutil.virtual_memory().available // max(1, env.local_world_size)
        caps.append((int(per_rank * MEMORY_SHARE_FOR_BUFFERS), "a quarter of available host memory per local rank"))
    size, why = min(caps)
    return size, why


# ---------------------------------------------------------------------------------------------------------------
# running the collectives (torch)


def _collective(op: str, count: int, env: Env) -> tuple[Any, Any]:
    """(run, check): ``run()`` issues one collective on preallocated buffers; ``check()`` → None or an error."""
    import torch
    import torch.distributed as dist

    n, rank, dev = env.world_size, env.rank, env.device
    fill = float(rank + 1)
    if op == "all_reduce":
        buf = torch.full((count,), fill, dtype=torch.float32, device=dev)

        def run() -> None:
            dist.all_reduce(buf)

        def check() -> str | None:
            buf.fill_(fill)
            dist.all_reduce(buf)
            want = n * (n + 1) / 2
            return None if bool((buf[:16] == want).all()) else f"all_reduce gave {buf[0].item()}, want {want}"

        return run, check
    share = count // n
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if op == "all_gather":
        inp = torch.full((share,), fill, dtype=torch.float32, device=dev)
        out = torch.empty((count,), dtype=torch.float32, device=dev)

        def run() -> None:
            gather(out, inp)

        def check() -> str | None:
            gather(out, inp)
            firsts = out.view(n, share)[:, 0].tolist() if share else []
            want = [float(r + 1) for r in range(n)]
            return None if firsts == want else f"all_gather gave {firsts}, want {want}"

        return run, check
    if op == "reduce_scatter":
        inp = torch.full((count,), fill, dtype=torch.float32, device=dev)
        out = torch.empty((share,), dtype=torch.float32, device=dev)

        def run() -> None:
            scatter(out, inp)

        def check() -> str | None:
            scatter(out, inp)
            want = n * (n + 1) / 2
            return None if share == 0 or out[0].item() == want else f"reduce_scatter gave {out[0].item()}"

        return run, check
    # all_to_all: rank r sends block j (filled r*n + j) to rank j; rank r receives block i = i*n + r
    inp = torch.arange(n, dtype=torch.float32, device=dev).repeat_interleave(share) + rank * n
    out = torch.empty((count,), dtype=torch.float32, device=dev)

    def run() -> None:
        dist.all_to_all_single(out, inp)

    def check() -> str | None:
        dist.all_to_all_single(out, inp)
        firsts = out.view(n, share)[:, 0].tolist() if share else []
        want = [float(i * n + rank) for i in range(n)]
        return None if firsts == want else f"all_to_all gave {firsts}, want {want}"

    return run, check


def _sync(env: Env) -> None:
    if env.device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def time_batch(run: Any, iters: int, env: Env) -> float:
    """Seconds per collective over ``iters`` back to back, between a barrier and a device synchronisation."""
    import torch.distributed as dist

    _sync(env)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        run()
    _sync(env)
    return (time.perf_counter() - start) / iters


def _reduce_over_ranks(values: list[float], env: Env) -> tuple[list[float], list[float]]:
    """(mean over ranks, max over ranks) of each value."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=env.device)
    total, top = t.clone(), t.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    return (total / env.world_size).tolist(), top.tolist()


def run_collectives(env: Env, options: Options, cap: int | None) -> tuple[list[Measurement], dict[str, str], list]:
    """Every op × size within the cap: measurements, per-op failures (op → reason), and the sizes skipped."""
    sizes = [s for s in options.sizes if cap is None or s <= cap]
    skipped = [s for s in options.sizes if s not in sizes]
    if not sizes:  # a cap below the smallest size: still measure something
        sizes = [min(options.sizes)]
    raw: list[tuple[str, int, int, list[float]]] = []
    failed: dict[str, str] = {}
    for op in options.ops:
        if options.check:
            _, check = _collective(op, element_count(op, 4096, env.world_size), env)
            error = check()
            if error:
                failed[op] = f"wrong result: {error}"
                continue
        for size in sizes:
            count = element_count(op, size, env.world_size)
            if count == 0:
                continue
            run, _ = _collective(op, count, env)
            for _ in range(options.warmup):
                run()
            trials = [time_batch(run, options.iters, env) for _ in range(options.trials)]
            raw.append((op, size, count, trials))
            del run
        if env.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()
    flat = [t for *_, trials in raw for t in trials]
    means, tops = _reduce_over_ranks(flat, env) if flat else ([], [])
    results, i = [], 0
    for op, _size, count, trials in raw:
        k = len(trials)
        pairs = list(zip(means[i : i + k], tops[i : i + k], strict=True))
        i += k
        results.append(measurement(op, count * ELEMENT_BYTES, count, env.world_size, pairs))
    return results, failed, skipped


def memory_copy_probe(env: Env, cap: int | None, iters: int = 20) -> dict[str, Any]:
    """Device-memory copy bandwidth (bytes read + written per second), the one-GPU probe; host memory on a CPU."""
    import torch

    size = min(1024**3, cap or 1024**3)
    size -= size % 4096
    n = size // ELEMENT_BYTES
    src = torch.ones(n, dtype=torch.float32, device=env.device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    _sync(env)
    trials = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(iters):
            dst.copy_(src)
        _sync(env)
        trials.append((time.perf_counter() - start) / iters)
    seconds = statistics.median(trials)
    ok = bool((dst[:16] == 1).all())
    peak, peak_how = _memory_peak(env)
    bandwidth = 2 * size / seconds
    return {
        "device": env.device,
        "size_bytes": size,
        "time_seconds": seconds,
        "copy_bandwidth_bytes_per_second": bandwidth,
        "peak_bytes_per_second": peak,
        "peak_how": peak_how,
        "copy_vs_peak_ratio": bandwidth / peak if peak else None,
        "check": "ok" if ok else "wrong result",
    }


def _memory_peak(env: Env) -> tuple[float | None, str]:
    """Theoretical memory bandwidth from NVML: max memory clock x bus width x 2 (double data rate)."""
    if not env.device.startswith("cuda"):
        return None, "unavailable: host memory (no NVML figure)"
    try:
        import pynvml as nvml  # type: ignore[import-not-found]

        nvml.nvmlInit()
        handle = _nvml_handle(nvml, env)
        clock_hz = nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM) * 1e6
        width_bits = nvml.nvmlDeviceGetMemoryBusWidth(handle)
    except Exception as exc:  # noqa: BLE001
        return None, f"unavailable: NVML ({type(exc).__name__}: {exc})"
    peak = clock_hz * 2 * width_bits / 8
    return peak, f"NVML: max memory clock {clock_hz / 1e6:.0f} MHz x {width_bits}-bit bus x 2"


# ---------------------------------------------------------------------------------------------------------------
# signals and verdict (pure but for the rule engine)


def largest_per_op(results: list[Measurement]) -> dict[str, Measurement]:
    best: dict[str, Measurement] = {}
    for m in results:
        if m.op not in best or m.size_bytes > best[m.op].size_bytes:
            best[m.op] = m
    return best


def build_signals(report: dict[str, Any]) -> Any:
    """The benchmark as a SignalSet: busbw at the largest size (all_reduce, else the first op measured), per op in
    ``by_series``; its ratio to the link's expected busbw; the message size it was measured at; the memory probe."""
    from llmdiag.model import Signal, SignalSet, SourceInfo, Window

    ranks = report["world_size"]
    source = f"llmdiag nccl-bench ({report['backend']}, {ranks} rank{'s' if ranks != 1 else ''})"
    verify = "torchrun --nproc-per-node N -m llmdiag.nccl_bench --ops all_reduce --sizes 256M:1G  # or nccl-tests"
    signals = SignalSet(
        window=Window(kind="window", duration_seconds=report.get("elapsed_seconds"), note="active benchmark"),
        sources=[SourceInfo(probe="nccl_bench", server=source, note=report["link"].get("how") or "")],
    )
    results = [Measurement(**m) for m in report["results"]]
    best = largest_per_op(results)
    head = best.get("all_reduce") or (next(iter(best.values())) if best else None)

    def derived(name: str, unit: str, value: float | None, why: str, by: dict[str, float] | None = None) -> None:
        if value is None:
            signals.add(Signal.missing(name, "derived", unit, why, source))
        else:
            signals.add(
                Signal(
                    name=name,
                    kind="derived",
                    unit=unit,
                    stats={"value": value},
                    source=source,
                    verify=verify,
                    by_series=by or {},
                )
            )

    no_run = "unavailable: no collective measured" + (" (one rank)" if ranks == 1 else "")
    derived(
        "collective_bus_bandwidth_bytes_per_second",
        "bytes_per_second",
        head.busbw_bytes_per_second if head else None,
        no_run,
        {op: m.busbw_bytes_per_second for op, m in best.items()},
    )
    derived("collective_message_bytes", "bytes", float(head.size_bytes) if head else None, no_run)
    expected = report["link"].get("expected_bus_bandwidth_bytes_per_second")
    link_why = report["link"].get("unavailable") or "no link class"
    derived("expected_link_bus_bandwidth_bytes_per_second", "bytes_per_second", expected, f"unavailable: {link_why}")
    if head and expected and head.size_bytes < RATIO_MIN_BYTES:
        why = f"the largest message ({head.size_bytes} bytes) is below {RATIO_MIN_BYTES >> 20} MiB: latency-bound"
        derived("collective_bus_bandwidth_vs_link_ratio", "ratio", None, f"unavailable: {why}")
    elif head and expected:
        derived(
            "collective_bus_bandwidth_vs_link_ratio",
            "ratio",
            head.busbw_bytes_per_second / expected,
            "",
            {op: m.busbw_bytes_per_second / expected for op, m in best.items()},
        )
    else:
        why = report["link"].get("unavailable") or no_run
        derived("collective_bus_bandwidth_vs_link_ratio", "ratio", None, f"unavailable: {why}")
    memory = report.get("memory_probe") or {}
    derived(
        "device_memory_copy_bandwidth_bytes_per_second",
        "bytes_per_second",
        memory.get("copy_bandwidth_bytes_per_second"),
        "unavailable: the memory probe runs with one rank",
    )
    derived(
        "device_memory_copy_vs_peak_ratio",
        "ratio",
        memory.get("copy_vs_peak_ratio"),
        f"unavailable: {memory.get('peak_how', 'the memory probe runs with one rank')}",
    )
    return signals


def judge(report: dict[str, Any]) -> dict[str, Any]:
    """Evaluate the rule engine on the benchmark's signals: the network rules that read them can fire."""
    from llmdiag.engine.evaluate import build_verdict

    signals = build_signals(report)
    own = list(signals.signals)  # the engine adds every derived signal it knows; report only the benchmark's
    verdict = build_verdict(signals, target="nccl-bench")
    return {
        "signals": {name: signals.signals[name].model_dump(mode="json") for name in own},
        "findings": [f.model_dump(mode="json") for f in verdict.findings],
    }


# ---------------------------------------------------------------------------------------------------------------
# the run


def run(options: Options) -> dict[str, Any]:
    """Initialise the process group, measure, and return the report (the same dict on every rank)."""
    import torch.distributed as dist

    from llmdiag._version import __version__

    started = time.perf_counter()
    env = read_env()
    link = detect_link(env, options.link)
    cap, cap_why = size_cap(env, options)
    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "tool": "llmdiag nccl-bench",
        "llmdiag_version": __version__,
        "torch_version": env.torch_version,
        "backend": env.backend,
        "world_size": env.world_size,
        "local_world_size": env.local_world_size,
        "nodes": env.nodes,
        "device": env.device_name,
        "dtype": "float32",
        "iters": options.iters,
        "warmup": options.warmup,
        "trials": options.trials,
        "timing": "mean per collective over --iters back to back, averaged over ranks; median of --trials",
        "size_cap_bytes": cap,
        "size_cap_reason": cap_why,
        "link": asdict(link),
        "results": [],
        "failed_ops": {},
        "skipped_sizes_bytes": [],
        "memory_probe": None,
    }
    if env.world_size == 1:
        report["memory_probe"] = memory_copy_probe(env, cap)
    else:
        import torch

        device_id = torch.device(env.device) if env.device.startswith("cuda") else None
        dist.init_process_group(env.backend, device_id=device_id)
        try:
            results, failed, skipped = run_collectives(env, options, cap)
        finally:
            dist.destroy_process_group()
        report["results"] = [asdict(m) for m in results]
        report["failed_ops"] = failed
        report["skipped_sizes_bytes"] = skipped
    report["elapsed_seconds"] = time.perf_counter() - started
    if env.rank == 0:
        report.update(judge(report))
    return report


def _gb(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e9:.3f}"


def format_table(report: dict[str, Any]) -> str:
    lines = [
        f"llmdiag nccl-bench: {report['backend']}, {report['world_size']} rank(s) on {report['nodes']} node(s), "
        f"{report['device']}, torch {report['torch_version']}, float32, {report['iters']} iters x "
        f"{report['trials']} trials",
    ]
    link = report["link"]
    if link.get("name"):
        lines.append(
            f"link: {link['name']} ({link['title']}; {link['how']}), expected busbw "
            f"{_gb(link['expected_bus_bandwidth_bytes_per_second'])} GB/s"
        )
    else:
        lines.append(f"link: unavailable ({link['unavailable']})")
    if report["results"]:
        lines.append(f"{'op':<15}{'size':>12}{'time us':>12}{'algbw GB/s':>12}{'busbw GB/s':>12}")
        for m in report["results"]:
            lines.append(
                f"{m['op']:<15}{m['size_bytes']:>12}{m['time_seconds'] * 1e6:>12.1f}"
                f"{_gb(m['algbw_bytes_per_second']):>12}{_gb(m['busbw_bytes_per_second']):>12}"
            )
    for op, why in report["failed_ops"].items():
        lines.append(f"{op}: FAILED: {why}")
    if report["skipped_sizes_bytes"]:
        lines.append(f"sizes above the cap ({report['size_cap_reason']}) skipped: {report['skipped_sizes_bytes']}")
    memory = report.get("memory_probe")
    if memory:
        lines.append("one rank: no inter-GPU link to measure; memory-copy bandwidth probe instead")
        peak = memory["peak_bytes_per_second"]
        ratio = memory["copy_vs_peak_ratio"]
        lines.append(
            f"memory copy ({memory['device']}, {memory['size_bytes']} bytes): "
            f"{_gb(memory['copy_bandwidth_bytes_per_second'])} GB/s read+write"
            + (
                f", {ratio:.0%} of the {_gb(peak)} GB/s peak ({memory['peak_how']})"
                if ratio
                else f" ({memory['peak_how']})"
            )
            + f", check {memory['check']}"
        )
    signals = report.get("signals", {})
    ratio_signal = signals.get("collective_bus_bandwidth_vs_link_ratio", {})
    if ratio_signal.get("unavailable"):
        lines.append(f"busbw vs link: {ratio_signal['unavailable']}")
    elif ratio_signal:
        lines.append(
            f"busbw vs link: {ratio_signal['stats']['value']:.0%} of the expected busbw (all ops: "
            + ", ".join(f"{k} {v:.0%}" for k, v in ratio_signal["by_series"].items())
            + ")"
        )
    for finding in report.get("findings", []):
        lines.append(f"{finding['severity'].upper()} {finding['code']}: {finding.get('summary', '')}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """torchrun entry point. Rank 0 prints; every rank returns 0 on success, 2 on a bad argument."""
    rank = int(os.environ.get("RANK", "0"))
    try:
        options = parse_options(argv)
        report = run(options)
    except BenchUsageError as exc:
        if rank == 0:
            print(f"ERROR: {exc.message}", file=sys.stderr)
            print(f"HINT: {exc.hint}", file=sys.stderr)
        return EXIT_ERROR
    if rank == 0:
        text = json.dumps(report, indent=2)
        if options.json_out == "-":
            print(text)
        else:
            if options.json_out:
                from pathlib import Path

                from llmdiag.render.files import write_atomic

                write_atomic(Path(options.json_out), text + "\n")
            print(format_table(report))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
