"""The NCCL benchmark's arguments, checked before anything starts (pure: no torch, no process group).

Message sizes are in binary units as nccl-tests' -b/-e/-f 2: ``1K:1G`` is every power of two from 1 KiB to 1 GiB.
"""

from __future__ import annotations

import re

from llmdiag.errors import BenchUsageError, option
from llmdiag.model import NcclBenchOptions
from llmdiag.schema.links import describe_link, known_link_names

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
DEFAULT_SIZES = "1K:1G"
DEFAULT_OPS = ",".join(OPS)
# the options the ranks' texts name (the timing note, the size cap's reason, how the link was found, a usage error):
# the launcher hands the ranks its caller's spelling of them (llmdiag.errors.option)
RANK_OPTION_KEYS = ("iters", "trials", "max_size", "link", "nproc_per_node")
_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


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
            raise BenchUsageError(
                f"{option('sizes')} {text}: the first size is above the last", "write LOW:HIGH, e.g. 1K:1G"
            )
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
        raise BenchUsageError(
            f"unknown collective {', '.join(unknown) or '(none)'}", f"{option('ops')} takes {','.join(OPS)}"
        )
    return list(dict.fromkeys(ops))


def check_link(name: str | None) -> str | None:
    """The link class in its canonical spelling, or None; an unknown class is a usage error."""
    if name is None:
        return None
    if describe_link(name) is None:
        raise BenchUsageError(
            f"unknown link class {name!r}", f"{option('link')} takes one of {', '.join(known_link_names())}"
        )
    return name.lower()


def bench_options(
    sizes: str = DEFAULT_SIZES,
    ops: str = DEFAULT_OPS,
    iters: int = 20,
    warmup: int = 5,
    trials: int = 3,
    max_size: str | None = None,
    link: str | None = None,
    check: bool = True,
) -> NcclBenchOptions:
    """The options as text (what a user types) checked and parsed. Raises BenchUsageError, naming the option."""
    for name, value in (("iters", iters), ("trials", trials)):
        if value < 1:
            raise BenchUsageError(f"{option(name)} must be at least 1", f"e.g. {option(name)} 5")
    if warmup < 0:
        raise BenchUsageError(f"{option('warmup')} cannot be negative", f"e.g. {option('warmup')} 5")
    return NcclBenchOptions(
        sizes=parse_sizes(sizes),
        ops=parse_ops(ops),
        iters=iters,
        warmup=warmup,
        trials=trials,
        max_size_bytes=parse_size(max_size) if max_size else None,
        link=check_link(link),
        check=check,
    )
