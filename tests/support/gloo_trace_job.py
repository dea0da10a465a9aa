"""A tiny gloo job under torchrun that writes one profiler trace per rank (tests/test_trace_gloo.py runs it).

    python -m torch.distributed.run --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT \
        tests/support/gloo_trace_job.py OUTDIR [--straggler RANK] [--delay SECONDS]

Each profiled step: a few matmuls ("compute"), then the straggler rank sleeps ``--delay`` s, then one each of
all_reduce, all_gather (into a list), all_gather_into_tensor, reduce_scatter_tensor and all_to_all_single, of the
sizes in ``SIZES``. gloo on torch 2.13 CPU runs all five (reduce_scatter_tensor as an all-reduce: its profiler range
is named gloo:all_reduce); a collective the backend refuses is left out and listed under "skipped" in ``--plan``,
so the test knows what to expect. The traces go to OUTDIR/rank{R}.json (export_chrome_trace, record_shapes).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

# name → (elements per rank of the input, dtype); bytes as nccl-tests counts them are in the test
SIZES = {
    "all_reduce": (64 * 1024, torch.float32),  # 256 KiB
    "all_gather": (16 * 1024, torch.float32),  # 64 KiB in, world × that out
    "all_gather_into_tensor": (8 * 1024, torch.bfloat16),  # 16 KiB in
    "reduce_scatter_tensor": (32 * 1024, torch.float32),  # 128 KiB in, 1/world out
    "all_to_all_single": (4 * 1024, torch.int64),  # 32 KiB
}
WAIT, WARMUP, ACTIVE = 1, 1, 3


def _ops(world: int):
    """The collectives of one step, as (name, callable); tensors made once."""
    ar = torch.ones(SIZES["all_reduce"][0], dtype=SIZES["all_reduce"][1])
    ag_in = torch.ones(SIZES["all_gather"][0], dtype=SIZES["all_gather"][1])
    ag_out = [torch.empty_like(ag_in) for _ in range(world)]
    agt_in = torch.ones(SIZES["all_gather_into_tensor"][0], dtype=SIZES["all_gather_into_tensor"][1])
    agt_out = torch.empty(agt_in.numel() * world, dtype=agt_in.dtype)
    rs_in = torch.ones(SIZES["reduce_scatter_tensor"][0], dtype=SIZES["reduce_scatter_tensor"][1])
    rs_out = torch.empty(rs_in.numel() // world, dtype=rs_in.dtype)
    a2a_in = torch.arange(SIZES["all_to_all_single"][0], dtype=SIZES["all_to_all_single"][1])
    a2a_out = torch.empty_like(a2a_in)
    return [
        ("all_reduce", lambda: dist.all_reduce(ar)),
        ("all_gather", lambda: dist.all_gather(ag_out, ag_in)),
        ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(agt_out, agt_in)),
        ("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(rs_out, rs_in)),
        ("all_to_all_single", lambda: dist.all_to_all_single(a2a_out, a2a_in)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--straggler", type=int, default=1)
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--plan", type=Path, help="where rank 0 writes what it ran (not in OUTDIR: not a trace)")
    args = parser.parse_args()
    args.outdir.mkdir(parents=True, exist_ok=True)
    warnings.filterwarnings("ignore", category=FutureWarning)  # all_gather_into_tensor's rename, on every call
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    ops = []
    skipped = {}
    for name, fn in _ops(world):
        try:
            fn()  # warm the connection; gloo refuses what it lacks here, on every rank alike
        except (RuntimeError, NotImplementedError, ValueError) as exc:
            skipped[name] = str(exc).splitlines()[0][:200]
            continue
        ops.append((name, fn))
    dist.barrier()
    a = torch.randn(192, 192)
    sched = schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1)
    path = args.outdir / f"rank{rank}.json"
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=sched,
        record_shapes=True,
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
    ) as prof:
        for _ in range(WAIT + WARMUP + ACTIVE):
            for _ in range(4):
                a = torch.tanh(a @ a)  # compute between the collectives
            if rank == args.straggler:
                time.sleep(args.delay)
            for _, fn in ops:
                fn()
            prof.step()
    dist.barrier()
    if rank == 0 and args.plan:
        plan = {
            "world": world,
            "straggler": args.straggler,
            "delay": args.delay,
            "steps": ACTIVE,
            "done": [name for name, _ in ops],
            "skipped": skipped,
            "sizes": {
                k: [n, str(d).removeprefix("torch."), torch.tensor([], dtype=d).element_size()]
                for k, (n, d) in SIZES.items()
            },
            "pid": os.getpid(),
        }
        args.plan.write_text(json.dumps(plan, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
