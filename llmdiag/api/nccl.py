"""`llmdiag nccl-bench` as a library call: collective bandwidth under torchrun on this host, judged by the rules.

    report = run_nccl_bench(nproc_per_node=8, sizes="1M:1G", ops="all_reduce")
    report.findings        # NET009 when busbw is far below the link's expected figure

The arguments are checked before anything starts (no torch needed), so a bad one raises BenchUsageError before
torchrun runs. The ranks measure (llmdiag.collect.nccl); the signals and findings are built here, on the report rank
0 wrote.
"""

from __future__ import annotations

from llmdiag._version import __version__
from llmdiag.collect.nccl.launch import DEFAULT_TIMEOUT_SECONDS, launch_bench
from llmdiag.collect.nccl.options import DEFAULT_OPS, DEFAULT_SIZES, bench_options
from llmdiag.collect.nccl.signals import bench_signals
from llmdiag.engine.evaluate import build_verdict
from llmdiag.errors import BenchUsageError, option
from llmdiag.model import NcclBenchReport


def judge_nccl_bench(report: NcclBenchReport) -> NcclBenchReport:
    """Add the benchmark's signals and the findings of the rules that read them (NET009) to a measured report."""
    signals = bench_signals(report)
    own = list(signals.signals)  # the engine adds every derived signal it knows; report only the benchmark's
    verdict = build_verdict(signals, target="nccl-bench")
    report.signals = {name: signals.signals[name] for name in own}
    report.findings = verdict.findings
    report.tool_version = __version__
    return report


def run_nccl_bench(
    nproc_per_node: int | None = None,
    sizes: str = DEFAULT_SIZES,
    ops: str = DEFAULT_OPS,
    iters: int = 20,
    warmup: int = 5,
    trials: int = 3,
    max_size: str | None = None,
    link: str | None = None,
    check: bool = True,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> NcclBenchReport:
    """Measure all_reduce, all_gather, reduce_scatter and all_to_all (nccl-tests' algbw and busbw) with
    ``nproc_per_node`` ranks on this host (default: one per GPU, else 2 CPU ranks with gloo), and judge the result.

    ``sizes``: LOW:HIGH in powers of two ("1K:1G") or a comma list; ``max_size`` caps them ("64M"); ``link`` names
    the link class to compare with (probes/links.toml), else NVML names it. Raises BenchUsageError for a bad
    argument, TorchMissingError without PyTorch, BenchFailedError when the torchrun job fails or times out.
    """
    options = bench_options(sizes, ops, iters, warmup, trials, max_size, link, check)
    if nproc_per_node is not None and nproc_per_node < 1:
        nproc = option("nproc_per_node")
        raise BenchUsageError(f"{nproc} must be at least 1", f"e.g. {nproc} 8 (one rank per GPU)")
    report = launch_bench(options, nproc_per_node, timeout_seconds)
    return judge_nccl_bench(report)
