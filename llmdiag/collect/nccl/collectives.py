"""The collectives themselves, under torchrun: preallocated buffers, timing as nccl-tests does, and the one-rank
memory-copy probe.

Per op and message size: ``warmup`` untimed runs, then ``iters`` back to back between a barrier and a device
synchronisation; time = mean per iteration, averaged over ranks; the median of ``trials`` such batches is kept, which
tames a noisy host. Each op's result is checked once first: a wrong sum is a failed op, not a figure.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from llmdiag.collect.nccl.busbw import ELEMENT_BYTES, element_count, measurement
from llmdiag.collect.nccl.env import Env
from llmdiag.model import CollectiveMeasurement, MemoryCopyProbe, NcclBenchOptions

CHECK_BYTES = 4096  # the correctness check's message: small, every rank's share whole
MEMORY_PROBE_MAX_BYTES = 1024**3

Run = Callable[[], None]
Check = Callable[[], str | None]


def _all_reduce(count: int, env: Env) -> tuple[Run, Check]:
    n, fill = env.world_size, float(env.rank + 1)
    buf = torch.full((count,), fill, dtype=torch.float32, device=env.device)

    def run() -> None:
        dist.all_reduce(buf)

    def check() -> str | None:
        buf.fill_(fill)
        dist.all_reduce(buf)
        want = n * (n + 1) / 2
        return None if bool((buf[:16] == want).all()) else f"all_reduce gave {buf[0].item()}, want {want}"

    return run, check


def _all_gather(count: int, env: Env) -> tuple[Run, Check]:
    n, share = env.world_size, count // env.world_size
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    inp = torch.full((share,), float(env.rank + 1), dtype=torch.float32, device=env.device)
    out = torch.empty((count,), dtype=torch.float32, device=env.device)

    def run() -> None:
        gather(out, inp)

    def check() -> str | None:
        gather(out, inp)
        firsts = out.view(n, share)[:, 0].tolist() if share else []
        want = [float(r + 1) for r in range(n)]
        return None if firsts == want else f"all_gather gave {firsts}, want {want}"

    return run, check


def _reduce_scatter(count: int, env: Env) -> tuple[Run, Check]:
    n, share = env.world_size, count // env.world_size
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    inp = torch.full((count,), float(env.rank + 1), dtype=torch.float32, device=env.device)
    out = torch.empty((share,), dtype=torch.float32, device=env.device)

    def run() -> None:
        scatter(out, inp)

    def check() -> str | None:
        scatter(out, inp)
        want = n * (n + 1) / 2
        return None if share == 0 or out[0].item() == want else f"reduce_scatter gave {out[0].item()}"

    return run, check


def _all_to_all(count: int, env: Env) -> tuple[Run, Check]:
    """Rank r sends block j (filled r*n + j) to rank j; rank r receives block i = i*n + r."""
    n, rank, share = env.world_size, env.rank, count // env.world_size
    inp = torch.arange(n, dtype=torch.float32, device=env.device).repeat_interleave(share) + rank * n
    out = torch.empty((count,), dtype=torch.float32, device=env.device)

    def run() -> None:
        dist.all_to_all_single(out, inp)

    def check() -> str | None:
        dist.all_to_all_single(out, inp)
        firsts = out.view(n, share)[:, 0].tolist() if share else []
        want = [float(i * n + rank) for i in range(n)]
        return None if firsts == want else f"all_to_all gave {firsts}, want {want}"

    return run, check


# op -> (run, check) on preallocated buffers: ``run()`` issues one collective; ``check()`` → None or an error
_COLLECTIVES: dict[str, Callable[[int, Env], tuple[Run, Check]]] = {
    "all_reduce": _all_reduce,
    "all_gather": _all_gather,
    "reduce_scatter": _reduce_scatter,
    "all_to_all": _all_to_all,
}


def _collective(op: str, count: int, env: Env) -> tuple[Run, Check]:
    return _COLLECTIVES[op](count, env)


def _sync(env: Env) -> None:
    if env.cuda:
        torch.cuda.synchronize()


def time_batch(run: Run, iters: int, env: Env) -> float:
    """Seconds per collective over ``iters`` back to back, between a barrier and a device synchronisation."""
    _sync(env)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        run()
    _sync(env)
    return (time.perf_counter() - start) / iters


def _reduce_over_ranks(values: list[float], env: Env) -> tuple[list[float], list[float]]:
    """(mean over ranks, max over ranks) of each value."""
    t = torch.tensor(values, dtype=torch.float64, device=env.device)
    total, top = t.clone(), t.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    return (total / env.world_size).tolist(), top.tolist()


def run_collectives(
    env: Env, options: NcclBenchOptions, cap: int | None
) -> tuple[list[CollectiveMeasurement], dict[str, str], list[int]]:
    """Every op × size within the cap: measurements, per-op failures (op → reason), and the sizes skipped."""
    sizes = [s for s in options.sizes if cap is None or s <= cap]
    skipped = [s for s in options.sizes if s not in sizes]
    if not sizes:  # a cap below the smallest size: still measure something
        sizes = [min(options.sizes)]
    raw: list[tuple[str, int, int, list[float]]] = []
    failed: dict[str, str] = {}
    for op in options.ops:
        if options.check:
            _, check = _collective(op, element_count(op, CHECK_BYTES, env.world_size), env)
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
        if env.cuda:
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


def memory_copy_probe(env: Env, cap: int | None, peak: tuple[float | None, str], iters: int = 20) -> MemoryCopyProbe:
    """Device-memory copy bandwidth (bytes read + written per second), the one-GPU probe; host memory on a CPU."""
    size = min(MEMORY_PROBE_MAX_BYTES, cap or MEMORY_PROBE_MAX_BYTES)
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
    peak_bytes_per_second, peak_how = peak
    bandwidth = 2 * size / seconds
    return MemoryCopyProbe(
        device=env.device,
        size_bytes=size,
        time_seconds=seconds,
        copy_bandwidth_bytes_per_second=bandwidth,
        peak_bytes_per_second=peak_bytes_per_second,
        peak_how=peak_how,
        copy_vs_peak_ratio=bandwidth / peak_bytes_per_second if peak_bytes_per_second else None,
        check="ok" if ok else "wrong result",
    )
