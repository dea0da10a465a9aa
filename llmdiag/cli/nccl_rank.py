"""The NCCL benchmark run by torchrun itself: the command line of each rank, for runs that `llmdiag nccl-bench` does
not launch (several nodes, a scheduler's own torchrun).

    torchrun --nproc-per-node 8 -m llmdiag.nccl_bench [--sizes 1K:1G] [--ops all_reduce,all_gather] [--json OUT]
    torchrun --nnodes 2 --nproc-per-node 8 ... -m llmdiag.nccl_bench --link ib-ndr

Every rank measures (llmdiag.collect.nccl.bench); rank 0 judges the run (llmdiag.api.nccl) and prints the table
(``--json OUT`` also writes the report; ``-`` prints it as JSON instead). A bad argument is one ERROR and one HINT
line from rank 0, exit 2. ``llmdiag/nccl_bench.py`` is the module torchrun runs; this is its command line, with
the CLI's other commands: the one place under torchrun that prints.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn

from llmdiag.api.nccl import judge_nccl_bench
from llmdiag.collect.nccl.options import DEFAULT_OPS, DEFAULT_SIZES, OPS, bench_options
from llmdiag.errors import BenchUsageError, LlmdiagError, use_option_spelling
from llmdiag.model import NcclBenchOptions
from llmdiag.render.files import write_atomic
from llmdiag.render.nccl import render_nccl_bench

EXIT_OK, EXIT_ERROR = 0, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one ERROR line, not argparse's usage block
        raise BenchUsageError(message, "run `python -m llmdiag.nccl_bench --help` for the options")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m llmdiag.nccl_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="LOW:HIGH (powers of two), or a comma list")
    parser.add_argument("--ops", default=DEFAULT_OPS, help="comma list of " + ", ".join(OPS))
    parser.add_argument("--iters", type=int, default=20, help="timed collectives per trial (default 20)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed collectives before each size (default 5)")
    parser.add_argument("--trials", type=int, default=3, help="timed batches per size; the median is kept")
    parser.add_argument("--max-size", default=None, help="cap on the message size (gloo default 64M)")
    parser.add_argument("--link", default=None, help="the link class to compare with, e.g. nvlink4, pcie5x16, ib-ndr")
    parser.add_argument("--json", dest="json_out", default=None, help="write the result as JSON here ('-': stdout)")
    parser.add_argument("--no-check", action="store_true", help="skip the correctness check of each op")
    return parser


def parse_args(argv: list[str] | None) -> tuple[NcclBenchOptions, str | None]:
    """The options, checked, and where the JSON goes (None: nowhere, '-': stdout). Raises BenchUsageError."""
    ns = build_parser().parse_args(argv)
    options = bench_options(
        ns.sizes, ns.ops, ns.iters, ns.warmup, ns.trials, ns.max_size, ns.link, check=not ns.no_check
    )
    return options, ns.json_out


def flag_name(key: str) -> str:
    """How this command line spells an option in messages from below it (llmdiag.errors.option): its flags are the
    keys with dashes (``max_size`` → ``--max-size``); ``nproc_per_node`` is torchrun's ``--nproc-per-node``."""
    return "--" + key.replace("_", "-")


def main(argv: list[str] | None = None) -> int:
    """torchrun entry point. Rank 0 prints; every rank returns 0 on success, 2 on an error."""
    library_spelling = use_option_spelling(flag_name)
    try:
        return _run(argv)
    finally:
        use_option_spelling(library_spelling)


def _run(argv: list[str] | None) -> int:
    rank = int(os.environ.get("RANK", "0"))
    try:
        options, json_out = parse_args(argv)
        from llmdiag.collect.nccl.bench import measure  # torch: only once the arguments are good

        report = measure(options)
    except LlmdiagError as exc:
        if rank == 0:
            print(f"ERROR: {exc.message}", file=sys.stderr)
            print(f"HINT: {exc.hint}", file=sys.stderr)
        return EXIT_ERROR
    if rank != 0:
        return EXIT_OK
    report = judge_nccl_bench(report)
    text = report.model_dump_json(indent=2)
    if json_out == "-":
        print(text)
        return EXIT_OK
    if json_out:
        write_atomic(Path(json_out), text + "\n")
    print(render_nccl_bench(report))
    return EXIT_OK
