"""What every rank runs under torchrun: the environment, the link, the size cap, then the collectives (or, with one
rank, the memory-copy probe). The report comes back without signals or findings: the caller judges it.

    python -m torch.distributed.run --nproc-per-node N ... -m llmdiag.collect.nccl.bench OPTIONS_JSON OUT NAMES_JSON

is how ``llmdiag nccl-bench`` (llmdiag.collect.nccl.launch) starts it: OPTIONS_JSON an NcclBenchOptions already
checked, OUT where rank 0 writes the report, NAMES_JSON how the launcher's caller names the options the report's
texts name (``llmdiag.errors.option``). Users run ``torchrun ... -m llmdiag.nccl_bench`` instead, which takes
the options as flags and prints the judged table.

Sizes are capped by memory (a quarter of free device memory, or of available host memory per local rank), and with
gloo by ``max_size_bytes`` (default 64 MiB) so a CPU run stays small. With one rank there is no inter-GPU link: only
the memory-copy bandwidth probe runs.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from llmdiag.collect.nccl.collectives import memory_copy_probe, run_collectives
from llmdiag.collect.nccl.env import detect_link, memory_peak, read_env, size_cap
from llmdiag.errors import use_option_spelling
from llmdiag.model import NcclBenchOptions, NcclBenchReport


def measure(options: NcclBenchOptions) -> NcclBenchReport:
    """Initialise the process group, measure, and return the report (the same on every rank)."""
    started = time.perf_counter()
    env = read_env()
    link = detect_link(env, options.link)
    cap, cap_why = size_cap(env, options)
    report = NcclBenchReport(
        torch_version=env.torch_version,
        backend=env.backend,
        world_size=env.world_size,
        local_world_size=env.local_world_size,
        nodes=env.nodes,
        device=env.device_name,
        iters=options.iters,
        warmup=options.warmup,
        trials=options.trials,
        size_cap_bytes=cap,
        size_cap_reason=cap_why,
        link=link,
    )
    if env.world_size == 1:
        report.memory_probe = memory_copy_probe(env, cap, memory_peak(env))
    else:
        device_id = torch.device(env.device) if env.cuda else None
        dist.init_process_group(env.backend, device_id=device_id)
        try:
            report.results, report.failed_ops, report.skipped_sizes_bytes = run_collectives(env, options, cap)
        finally:
            dist.destroy_process_group()
    report.elapsed_seconds = time.perf_counter() - started
    return report


def main(argv: list[str] | None = None) -> int:
    """The launcher's torchrun entry (``OPTIONS_JSON OUT [NAMES_JSON]``): every rank measures, rank 0 writes the report.

    A failure raises: torchrun keeps the traceback in the log, where the launcher reads its last error line.
    """
    options_json, out, *names = sys.argv[1:] if argv is None else argv
    if names:
        spelled: dict[str, str] = json.loads(names[0])
        use_option_spelling(lambda key: spelled.get(key, key))
    report = measure(NcclBenchOptions.model_validate_json(options_json))
    if int(os.environ.get("RANK", "0")) == 0:
        Path(out).write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
