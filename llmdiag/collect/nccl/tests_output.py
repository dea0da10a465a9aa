"""nccl-tests output (``all_reduce_perf``, ``all_gather_perf``, ``broadcast_perf`` …) as the signals NET009 judges.

nccl-tests prints (src/util.cu, src/common.cu of NVIDIA/nccl-tests) a header, the ranks, then one row per size::

    # nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 …
    #  Rank  0 Group  0 Pid   6899 on ztan-mig-235z device  0 [0000:04:00] NVIDIA H100 80GB HBM3
    #  size       count   type  redop  root   time   algbw   busbw #wrong   time   algbw   busbw #wrong
    8589934592  2147483648  float  sum     -1  47535  180.71  338.82      0  47743  179.92  337.35      0
    # Avg bus bandwidth    : 70.742

(before 2.10 the rows had no ``root`` column and the error column was a float ``0e+00``; with ``-c 0`` it is
``N/A``). busbw is already nccl-tests' own figure (doc/PERFORMANCE.md): per GPU and per direction, comparable with
the link classes of probes/links.toml, as ``llmdiag nccl-bench`` compares its own. The signals are the bench's:
busbw at the largest size (the better of out-of-place and in-place), that size, the link's expected busbw and the
ratio, unavailable below the size where bandwidth, not latency, is measured. The ``Avg bus bandwidth`` line is an
average over every size, small ones included: it is kept in the source's config, never judged.

The link is named only from what the output shows: ranks on more than one host cross a network whose speed nccl-tests
does not print (unavailable, with the reason); on one host, a GPU the tables know with NVLink gives its NVLink class.
NCCL's own INFO lines beside the table are read by the NCCL log reader (a companion kind); their transports are
named in the source's config here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from llmdiag.collect.nccl.logs import parse_nccl_log
from llmdiag.collect.nccl.signals import RATIO_MIN_BYTES
from llmdiag.collect.paste import data_lines
from llmdiag.errors import InputFileError
from llmdiag.model import Signal, SignalSet, SourceInfo, Window

PROBE = "nccl-tests"
GB = 1e9  # nccl-tests prints GB/s as 1e9 bytes/s
HINT = "give nccl-tests' whole output (all_reduce_perf -b 8 -e 1G -f 2 …): its table rows up to the largest size"
VERIFY = "all_reduce_perf -b 256M -e 1G -f 2 -g <GPUs>  # nccl-tests, with NCCL_DEBUG=INFO to see the transport"

HEADER_RE = re.compile(r"#?\s*nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes\s+(\d+)\s+maxBytes\s+(\d+)")
# '#  Rank  0 Group  0 Pid   6899 on host device  0 [0000:04:00] NVIDIA H100 80GB HBM3' ('Group' since 2.x;
# the bus id '[0x04]' in older releases)
RANK_RE = re.compile(
    r"#?\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s+(.+?)\s*$"
)
AVG_RE = re.compile(r"#?\s*Avg bus bandwidth\s*:\s*([0-9.]+(?:e[-+]?\d+)?)")
PROGRAM_RE = re.compile(
    r"\b(all_reduce|all_gather|reduce_scatter|alltoall|broadcast|reduce|sendrecv|gather|scatter|hypercube)_perf\b"
)
# nccl-tests' type and op names (src/common.cu: test_typenames, test_opnames; 'char' and 'int' before NCCL 2.x's
# sized names; 'none' where the collective has no reduction)
TYPES = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16",
    "f8e4m3", "f8e5m2", "char", "int",
}  # fmt: skip
OPS = {"sum", "prod", "max", "min", "avg", "mulsum", "none"}
NUMBER_RE = re.compile(r"^-?[0-9.]+(?:e[-+]?\d+)?$")
# numbers after the root per side: time algbw busbw #wrong, and 4 more with per-iteration timing (-I 1)
SIDE_WIDTHS = (4, 8)
# a launcher's tag on each printed piece: mpirun --tag-output's '[1,0]<stdout>:', or '[0]' before each field group
# of a rank's line (NVIDIA/nccl#1453)
TAG_RE = re.compile(r"\[\d+(?:,\d+)?\](?:<std(?:out|err)>:)?")
OP_NAMES = {"alltoall": "all_to_all"}


@dataclass
class Row:
    size_bytes: int
    redop: str
    root: int | None
    busbw_bytes_per_second: float  # the better of out-of-place and in-place
    wrong: float  # elements wrong (0 when not checked: N/A)


@dataclass
class NcclTestsOutput:
    program: str = ""  # 'all_reduce' … from the binary's name, where the output shows it
    rows: list[Row] = field(default_factory=list)
    hosts: set[str] = field(default_factory=set)
    gpus: dict[str, int] = field(default_factory=dict)  # product name → ranks on it
    ranks: int | None = None
    threads_gpus: tuple[int, int] | None = None
    avg_busbw_bytes_per_second: float | None = None


MAX_SIZE_DIGITS = 18  # bytes: nccl-tests sizes fit in 64 bits


def looks_like_nccl_tests(text: str) -> bool:
    """Whether the text holds nccl-tests results: one whole result row at least. A run that hung before its first
    row (the header, the ranks, NCCL's lines) is an NCCL log, read as one."""
    return any(_row(line) for line in data_lines(text))


def _row(line: str) -> Row | None:
    """One result row: size, count, type, [redop], [root], then out-of-place and in-place figures; None for any
    other line, and for a row cut before its first busbw."""
    tokens = TAG_RE.sub(" ", line).split()
    if len(tokens) < 7 or not (tokens[0].isdigit() and tokens[1].isdigit()) or tokens[2] not in TYPES:
        return None
    at = 3
    redop = ""
    if tokens[at] in OPS:
        redop, at = tokens[at], at + 1
    rest = tokens[at:]
    while rest and not (NUMBER_RE.match(rest[-1]) or rest[-1] == "N/A"):
        rest.pop()  # a timestamp column (-T 1)
    root = None
    if len(rest) % 4 == 1 and rest[0].lstrip("-").isdigit():
        root, rest = int(rest[0]), rest[1:]
    side = next((w for w in SIDE_WIDTHS if len(rest) == 2 * w), 4 if len(rest) == 4 else None)
    if side is None or not all(NUMBER_RE.match(t) or t == "N/A" for t in rest):
        return None
    sides = [rest[:side], rest[side:]] if len(rest) == 2 * side else [rest]
    busbw = [float(part[2]) for part in sides if NUMBER_RE.match(part[2])]
    wrong = [float(part[3]) for part in sides if NUMBER_RE.match(part[3])]
    # a size past 64 bits or a figure past a float (1e309 reads as inf) is a garbled row, not a measurement
    if not busbw or not all(math.isfinite(x) for x in busbw + wrong) or len(tokens[0]) > MAX_SIZE_DIGITS:
        return None
    return Row(int(tokens[0]), redop, root, max(busbw) * GB, max(wrong, default=0.0))


def parse_nccl_tests(text: str) -> NcclTestsOutput:
    out = NcclTestsOutput()
    program = PROGRAM_RE.search(text)
    if program:
        out.program = OP_NAMES.get(program.group(1), program.group(1))
    ranks: set[str] = set()
    for line in data_lines(text):
        row = _row(line)
        if row:
            out.rows.append(row)
            continue
        rank = RANK_RE.search(line)
        if rank:
            ranks.add(rank.group(1))
            out.hosts.add(rank.group(2))
            out.gpus[rank.group(3)] = out.gpus.get(rank.group(3), 0) + 1
        header = HEADER_RE.search(line)
        if header:
            out.threads_gpus = (int(header.group(1)), int(header.group(2)))
        avg = AVG_RE.search(line)
        if avg:
            out.avg_busbw_bytes_per_second = float(avg.group(1)) * GB
    out.ranks = len(ranks) or None
    return out


def _op(out: NcclTestsOutput) -> str:
    """The collective: the binary's name where the output shows it; the columns alone do not tell all_reduce from
    reduce_scatter, so an excerpt without it says 'collective'."""
    return out.program or "collective"


def expected_link(out: NcclTestsOutput, transports: set[str] | None = None) -> tuple[str | None, float | None, str]:
    """The link class the output's traffic crosses, its expected busbw, and how it was named (or why not).

    ``transports``: NCCL's 'via …' transports printed beside the table ('NET/IB/0/GDRDMA', 'SHM/direct/direct'): a
    connection over the network means the ranks span nodes, whatever the rank list shows."""
    from llmdiag.collect.telemetry.nvidia_smi import catalogue_gpu
    from llmdiag.physics.hardware import find_gpu
    from llmdiag.schema.links import describe_link, load_links

    if any(via.upper().startswith("NET/") for via in transports or ()):
        return (
            None,
            None,
            "NCCL's lines show connections over the network ('via NET/…'): the network sets busbw, and neither "
            "nccl-tests nor NCCL prints its speed (ibstat shows each NIC's rate)",
        )
    if not out.hosts:
        return None, None, "the output lists no ranks ('# Using devices'): which link its traffic crosses is not shown"
    if len(out.hosts) > 1:
        return (
            None,
            None,
            f"the ranks run on {len(out.hosts)} hosts: the network between them sets busbw, and nccl-tests does not "
            "print its speed (ibstat shows each NIC's rate)",
        )
    if len(out.gpus) != 1:
        return None, None, f"one host with mixed GPUs ({', '.join(sorted(out.gpus))}): no single link class"
    name = next(iter(out.gpus))
    entry = catalogue_gpu(name)
    if entry is None or "pcie" in name.lower():
        return None, None, f"'{name}' is not a GPU the tables know with NVLink: its link class is not known"
    nvlink = find_gpu(entry).nvlink_bandwidth_bytes_per_second
    link = next((spec for spec in load_links().link if nvlink and spec.raw_bytes_per_second == nvlink), None)
    found = describe_link(link.name) if link else None
    if found is None:
        return None, None, f"the {name} ({entry} in probes/tables/gpus.toml) has no NVLink class in probes/links.toml"
    return found.name, found.expected_bus_bandwidth_bytes_per_second, f"one host of {name}: {found.title}"


def _signal(name: str, unit: str, value: float | None, why: str, source: str) -> Signal:
    if value is None:
        return Signal.missing(name, "derived", unit, why, source=source)
    return Signal(name=name, kind="derived", unit=unit, stats={"value": value}, source=source, verify=VERIFY)


def collect_nccl_tests(text: str, origin: str) -> SignalSet:
    """nccl-tests output as the bench's signals (busbw at the largest size, its ratio to the link).

    Raises ``InputFileError`` when no result row can be read (only a header, or every row cut before its busbw).
    """
    out = parse_nccl_tests(text)
    if not out.rows:
        raise InputFileError(f"{origin}: nccl-tests output without a single whole result row", HINT)
    op = _op(out)
    largest = max(out.rows, key=lambda row: row.size_bytes)
    source = f"nccl-tests ({origin}): {op} busbw at {largest.size_bytes} bytes (better of out-of-place and in-place)"
    transports = set(parse_nccl_log(text).connections.values())
    link, expected, how = expected_link(out, transports)
    signals = SignalSet(
        window=Window(kind="window", note="one nccl-tests run: its rows are averages over its iterations"),
    )
    signals.add(
        _signal(
            "collective_bus_bandwidth_bytes_per_second", "bytes_per_second", largest.busbw_bytes_per_second, "", source
        )
    )
    signals.add(_signal("collective_message_bytes", "bytes", float(largest.size_bytes), "", source))
    signals.add(
        _signal(
            "expected_link_bus_bandwidth_bytes_per_second",
            "bytes_per_second",
            expected,
            f"unavailable: {how}",
            f"probes/links.toml ({link})" if link else source,
        )
    )
    if expected is not None and largest.size_bytes < RATIO_MIN_BYTES:
        why = (
            f"the largest size printed ({largest.size_bytes} bytes) is below {RATIO_MIN_BYTES >> 20} MiB: latency-bound"
        )
        ratio = None
    elif expected is not None:
        why, ratio = "", largest.busbw_bytes_per_second / expected
    else:
        why, ratio = f"unavailable: {how}", None
    signals.add(_signal("collective_bus_bandwidth_vs_link_ratio", "ratio", ratio, why, source))
    signals.sources = [_source_info(out, op, link, how, origin, transports)]
    return signals


def _source_info(
    out: NcclTestsOutput, op: str, link: str | None, how: str, origin: str, transports: set[str]
) -> SourceInfo:
    config = {"collective": op, "rows": str(len(out.rows)), "largest_bytes": str(max(r.size_bytes for r in out.rows))}
    if out.avg_busbw_bytes_per_second is not None:
        config["avg_bus_bandwidth"] = f"{out.avg_busbw_bytes_per_second / GB:g} GB/s (every size, small ones included)"
    if out.ranks:
        config["ranks"] = str(out.ranks)
    if out.hosts:
        config["hosts"] = str(len(out.hosts))
    if out.gpus:
        config["gpus"] = ", ".join(f"{n} × {name}" for name, n in out.gpus.items())
    config["link"] = link or how
    wrong = sum(row.wrong for row in out.rows)
    if wrong:
        config["wrong_elements"] = f"{wrong:g} (a wrong result: the figures are not to be trusted)"
    if transports:
        config["transports"] = ", ".join(sorted(transports))
    note = f"{len(out.rows)} result rows" + (f", {out.ranks} ranks" if out.ranks else "")
    return SourceInfo(probe=PROBE, url=origin, server="nccl-tests", note=note, config=config)
