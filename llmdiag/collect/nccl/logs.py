"""An NCCL debug log (``NCCL_DEBUG=INFO`` or ``WARN``) and PyTorch's NCCL watchdog lines, as network evidence.

What NCCL prints at start-up says how the ranks talk: each ``Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM`` line is one
connection and its transport (P2P over NVLink or PCIe, SHM through host memory, NET over InfiniBand or sockets, NVLS
on NVSwitch), ``comm … rank 0 nranks 8 … Init COMPLETE`` the communicator's size, ``N coll channels, … M nvls
channels`` the channels it built. What goes wrong is in ``NCCL WARN`` lines and in PyTorch's ``Watchdog caught
collective operation timeout: WorkNCCL(SeqNum=…, OpType=ALLREDUCE, …, Timeout(ms)=600000) ran for 600060
milliseconds before timing out``. The lines are matched anywhere in a line, so a launcher's prefix (Ray's ``(pid=N)``,
torchrun's ``[rank0]:``, a quote or a list marker) and two lines run together by interleaved ranks still count.

A log carries no clock NCCL reads from: counts are of the whole file (window ``lifetime``). A number the log does
not print is unavailable with the reason, never zero: a warning count is zero only where NCCL's own debug lines are
there to show none was printed. The NCCL version, the environment NCCL reports and the ring/tree shape go into the
source's ``config``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from llmdiag.collect.paste import data_lines
from llmdiag.errors import InputFileError
from llmdiag.model import Signal, SignalSet, SourceInfo, Window

PROBE = "nccl-debug"
HINT = (
    "give the whole log of a run with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET shows the transports), from "
    "start-up to the hang or error"
)
VERIFY = "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET <your launch command> 2>&1 | grep -E 'via|nranks|WARN'"

NCCL_LINE_RE = re.compile(r"\bNCCL (?:INFO|WARN)\b")
VERSION_RE = re.compile(r"\bNCCL version (\d+\.\d+\.\d+)(?:\+cuda(\d+(?:\.\d+)*))?")
NRANKS_RE = re.compile(r"\bnranks (\d+)\b")
# 'Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM', 'Channel 00 : 0[2d000] -> 1[2e000] via P2P/IPC' (2.5-2.11),
# 'Ring 04 : 3[3] -> 2[2] via P2P/IPC' (2.4 and older), '… [send] via NET/IBext_v8/0(7)/GDRDMA'
CONNECTION_RE = re.compile(
    r"\b(?:Channel|Ring) (\d+)(?:/\d+)? : (\d+)\[([0-9a-fx]+)\] -> (\d+)\[([0-9a-fx]+)\]"
    r"(?: \[(send|receive)\])? via (\S+(?: pointer)?)"
)
CHANNELS_RE = re.compile(
    r"\b(\d+) coll channels,(?: (\d+) collnet channels,)?(?: (\d+) nvls channels,)? (\d+) p2p channels"
)
RING_RE = re.compile(r"\bChannel \d+/(\d+) :((?:\s+\d+)+)\s*$")  # a ring's ranks in order
WARN_RE = re.compile(r"\bNCCL WARN (.*)$")
ENV_RE = re.compile(r"\b(NCCL_\w+) set by environment to (\S+?)\.?$")
TIMEOUT_RE = re.compile(
    r"(?:\[Rank (\d+)\] )?Watchdog caught collective operation timeout: WorkNCCL\((.*?)\) ran for (\d+) milliseconds"
)
TORCH_NCCL_RE = re.compile(r"ProcessGroupNCCL|WorkNCCL")
# the network NCCL picked says, per NIC, whether GPU memory can be registered with it (GPUDirect RDMA): 'NET/IB :
# GPU Direct RDMA Disabled for HCA 0 'mlx5_0'' (' (no module)' before 2.19), '… (DMABUF) enabled for HCA …'. Sockets
# print it too and never have it: only an RDMA-capable network counts.
GDR_RE = re.compile(
    r"\bNET/([\w ./-]+?)\s*:\s*GPU Direct RDMA (?:\(DMABUF\) )?(Disabled|Enabled) for HCA (\d+) '([^']+)'", re.I
)
# the NICs NCCL's network found: 'NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_2:1/IB [RO]; OOB …'
NICS_RE = re.compile(r"\bNET/(\w+)\s*:\s*Using ((?:\[\d+\]\S+\s*)+)")
DRIVER_RE = re.compile(r"\bcudaDriverVersion (\d+)")
# a WARN about the peer-to-peer path itself (CUDA IPC, peer access, cuMem P2P import)
P2P_WARN_RE = re.compile(r"CUDA IPC|cudaIpc|peer access|\bP2P\b|p2p\.cc|Cuda failure 217|cuMem\w*Import", re.I)
# a WARN from the network transport about a failed transfer or connection (not a missing library at start-up)
NET_WARN_RE = re.compile(
    r"NET/\S+\s*:\s*(?:Got completion|.*\b(?:error|failed|timed out|timeout|closed|reset)\b)"
    r"|Call to (?:ibv_\w+|recv|connect) failed|Connection (?:reset|closed|refused)",
    re.I,
)


@dataclass
class NcclLog:
    """What a log says, line by line."""

    nccl_lines: int = 0  # NCCL INFO / WARN lines: the debug log is there
    torch_lines: int = 0  # PyTorch ProcessGroupNCCL lines
    version: str = ""
    cuda: str = ""
    nranks: int | None = None
    connections: dict[tuple[str, str, str, str], str] = field(default_factory=dict)  # (channel, src, dst, dir) → via
    coll_channels: int | None = None
    nvls_channels: int | None = None
    ring_channels: int | None = None
    ranks_seen: set[str] = field(default_factory=set)  # ranks in ring listings and connection lines
    trees: bool = False
    warnings: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    timeouts: dict[tuple[str, str], tuple[str, float, float | None]] = field(default_factory=dict)
    gdr: dict[str, bool] = field(default_factory=dict)  # NIC → GPUDirect RDMA enabled, on an RDMA network
    nics: dict[str, str] = field(default_factory=dict)  # NIC → the network NCCL found it on ('IB')
    cuda_driver: str = ""

    def has_numbers(self) -> bool:
        """Anything NCCL measured or chose: a version, a size, a transport, a NIC, a setting, a warning, a timeout."""
        return bool(
            self.version
            or self.nranks
            or self.connections
            or self.coll_channels is not None
            or self.ring_channels
            or self.warnings
            or self.timeouts
            or self.env
            or self.gdr
            or self.nics
            or self.cuda_driver
        )


# ranks and channels NCCL counts: a run of digits longer than this (a cut or garbled line) is no count of them
MAX_COUNT_DIGITS = 9


def _number_of(digits: str) -> int | None:
    return int(digits) if len(digits) <= MAX_COUNT_DIGITS else None


def looks_like_nccl_log(text: str) -> bool:
    """Whether the text holds NCCL's debug lines or PyTorch's NCCL watchdog lines (anywhere in it)."""
    return bool(NCCL_LINE_RE.search(text) or VERSION_RE.search(text) or TIMEOUT_RE.search(text))


def parse_nccl_log(text: str) -> NcclLog:
    log = NcclLog()
    for line in data_lines(text):
        _read_line(line, log)
    return log


def _read_line(line: str, log: NcclLog) -> None:
    if NCCL_LINE_RE.search(line):
        log.nccl_lines += 1
    if TORCH_NCCL_RE.search(line):
        log.torch_lines += 1
    version = VERSION_RE.search(line)
    if version and not log.version:
        log.version, log.cuda = version.group(1), version.group(2) or ""
    for ranks in NRANKS_RE.findall(line):
        if (n := _number_of(ranks)) is not None:
            log.nranks = max(log.nranks or 0, n)
    for channel, src, _src_dev, dst, _dst_dev, direction, via in CONNECTION_RE.findall(line):
        log.connections[(channel, src, dst, direction)] = via
        log.ranks_seen |= {src, dst}
    channels = CHANNELS_RE.search(line)
    if channels and (coll := _number_of(channels.group(1))) is not None:
        log.coll_channels = max(log.coll_channels or 0, coll)
        if channels.group(3) is not None and (nvls := _number_of(channels.group(3))) is not None:
            log.nvls_channels = max(log.nvls_channels or 0, nvls)
    ring = RING_RE.search(line)
    if ring and (rings := _number_of(ring.group(1))) is not None:
        log.ring_channels = max(log.ring_channels or 0, rings)
        log.ranks_seen |= set(ring.group(2).split())
    if "Connected all trees" in line or re.search(r"\bTrees \[0\]", line):
        log.trees = True
    warn = WARN_RE.search(line)
    if warn:
        log.warnings.append(warn.group(1).strip())
    env = ENV_RE.search(line)
    if env:
        log.env[env.group(1)] = env.group(2)
    gdr = GDR_RE.search(line)
    if gdr and not gdr.group(1).strip().lower().startswith("socket"):
        log.gdr[gdr.group(4)] = gdr.group(2).lower() == "enabled"
    nics = NICS_RE.search(line)
    if nics:
        for nic in re.findall(r"\[\d+\]([\w.-]+:\d+)/\w+", nics.group(2)):  # a cut 'mlx5_0:1/' is no NIC
            log.nics[nic] = nics.group(1)
    driver = DRIVER_RE.search(line)
    if driver:
        log.cuda_driver = driver.group(1)
    for rank, args, ran_ms in TIMEOUT_RE.findall(line):
        fields = dict(re.findall(r"(\w+(?:\(ms\))?)=([^,]+)", args))
        key = (rank or "?", fields.get("SeqNum", args))
        limit = fields.get("Timeout(ms)")
        log.timeouts[key] = (
            fields.get("OpType", "?"),
            float(ran_ms) / 1000.0,
            float(limit) / 1000.0 if limit and limit.strip().isdigit() else None,
        )


# ---------------------------------------------------------------------------------------------
# signals


def _family(via: str) -> str:
    """P2P, SHM, NET or COLLNET, from NCCL's transport name ('P2P/CUMEM/read', 'NET/IBext_v8/0/GDRDMA')."""
    return via.split("/", 1)[0].upper()


def _count(
    name: str, value: float | None, unit: str, source: str, reason: str, by: dict[str, float] | None = None
) -> Signal:
    if value is None:
        return Signal.missing(name, "derived", unit, reason, source=source)
    return Signal(
        name=name, kind="derived", unit=unit, stats={"value": value}, source=source, verify=VERIFY, by_series=by or {}
    )


def _transport_signals(log: NcclLog, where: str) -> list[Signal]:
    by_family: dict[str, dict[str, float]] = {"P2P": {}, "SHM": {}, "NET": {}}
    for via in log.connections.values():
        counted = by_family.setdefault(_family(via), {})
        counted[via] = counted.get(via, 0.0) + 1.0
    no_lines = "the log has no 'Channel … via …' lines (NCCL_DEBUG=INFO prints one per connection at start-up)"
    names = {"P2P": "nccl_p2p_connections", "SHM": "nccl_shm_connections", "NET": "nccl_net_connections"}
    signals = []
    for kind, name in names.items():
        counts = by_family[kind]
        value = sum(counts.values()) if log.connections else None
        source = f"{where}: 'via {kind}/…' connection lines (channel, sender, receiver)"
        signals.append(_count(name, value, "count", source, no_lines, counts))
    return signals


def _warning_signals(log: NcclLog, where: str) -> list[Signal]:
    # NCCL prints its WARN lines at INFO and WARN level: with its debug lines there, none printed is a real zero
    reason = "no NCCL debug lines in the log: run with NCCL_DEBUG=INFO (or WARN) to see NCCL's warnings"
    known = log.nccl_lines > 0
    p2p = [w for w in log.warnings if P2P_WARN_RE.search(w)]
    net = [w for w in log.warnings if NET_WARN_RE.search(w)]
    return [
        _count(
            "nccl_warnings", float(len(log.warnings)) if known else None, "count", f"{where}: NCCL WARN lines", reason
        ),
        _count(
            "nccl_p2p_failure_warnings",
            float(len(p2p)) if known else None,
            "count",
            f"{where}: NCCL WARN lines about the peer-to-peer path (CUDA IPC, peer access)",
            reason,
        ),
        _count(
            "nccl_network_error_warnings",
            float(len(net)) if known else None,
            "count",
            f"{where}: NCCL WARN lines from the network transport (completion errors, failed connections)",
            reason,
        ),
    ]


def _timeout_signals(log: NcclLog, where: str) -> list[Signal]:
    source = f"{where}: PyTorch 'Watchdog caught collective operation timeout … ran for N milliseconds'"
    if not log.timeouts and not log.torch_lines:
        reason = "no PyTorch ProcessGroupNCCL lines in the log: a watchdog timeout would be printed there"
        return [
            Signal.missing("collective_timeouts", "derived", "count", reason, source=source),
            Signal.missing("collective_timeout_seconds", "derived", "seconds", reason, source=source),
            Signal.missing("collective_timeout_limit_seconds", "derived", "seconds", reason, source=source),
        ]
    ran: dict[str, float] = {}
    for op, seconds, _limit in log.timeouts.values():
        ran[op] = max(ran.get(op, 0.0), seconds)
    limits = [limit for _op, _s, limit in log.timeouts.values() if limit is not None]
    none = "no collective timed out in the log"
    return [
        _count("collective_timeouts", float(len(log.timeouts)), "count", source, none),
        _count("collective_timeout_seconds", max(ran.values()) if ran else None, "seconds", source, none, ran),
        _count("collective_timeout_limit_seconds", max(limits) if limits else None, "seconds", source, none),
    ]


def collect_nccl_log(text: str, origin: str) -> SignalSet:
    """An NCCL debug log (with or without PyTorch's watchdog lines) as network signals.

    Raises ``InputFileError`` for a log with no numbers at all (no version, ranks, connection, channel summary, NIC,
    setting, warning or timeout) and nothing else beside NCCL's lines: the only refusal. NCCL's lines inside a file
    of another kind (a server log, nccl-tests' output) are read as they are, whatever they hold: the file is data.
    """
    log = parse_nccl_log(text)
    if not log.has_numbers():
        raise InputFileError(
            f"{origin}: an NCCL log with no numbers (no version, nranks, 'via' transport, NIC, setting, warning or "
            "timeout line)",
            HINT,
        )
    where = f"NCCL log ({origin})"
    signals = SignalSet()
    signals.add(_ranks(log, where))
    for signal in (*_transport_signals(log, where), *_warning_signals(log, where), *_timeout_signals(log, where)):
        signals.add(signal)
    nvls = float(log.nvls_channels) if log.nvls_channels is not None else None
    signals.add(
        _count(
            "nccl_nvls_channels",
            nvls,
            "count",
            f"{where}: 'N nvls channels' summary",
            "the log has no channel summary with NVLS (NCCL 2.17 and later print 'N nvls channels' at init)",
        )
    )
    signals.add(_gdr_signal(log, where))
    signals.sources = [_source_info(log, origin)]
    signals.window = Window(kind="lifetime", note="an NCCL log has no time base: counts are of the whole file")
    return signals


def _gdr_signal(log: NcclLog, where: str) -> Signal:
    """NICs of NCCL's RDMA network with GPUDirect RDMA off: every byte between nodes is staged through host memory.
    Unavailable where NCCL printed no GDR line, and where its connection lines show no traffic over the network at
    all (GPUs of one host: GDR does not matter there)."""
    name, source = "nccl_gdr_disabled_nics", f"{where}: 'NET/… : GPU Direct RDMA Disabled for HCA N' lines"
    if not log.gdr:
        why = "the log has no 'GPU Direct RDMA … for HCA' line (NCCL_DEBUG=INFO prints one per NIC of an RDMA network)"
        return Signal.missing(name, "derived", "count", why, source=source)
    if log.connections and not any(_family(via) == "NET" for via in log.connections.values()):
        why = "every connection in the log is within one host (no 'via NET/…'): GPUDirect RDMA is not used"
        return Signal.missing(name, "derived", "count", why, source=source)
    off = {nic: 1.0 for nic, enabled in log.gdr.items() if not enabled}
    return _count(name, float(len(off)), "count", source, "", off)


def _ranks(log: NcclLog, where: str) -> Signal:
    """The communicator's size: NCCL's 'nranks N', else the ranks its ring and connection lines name (a lower bound
    for an excerpt, and the source says so)."""
    if log.nranks:
        return _count("nccl_ranks", float(log.nranks), "count", f"{where}: nranks", "")
    if log.ranks_seen:
        source = f"{where}: ranks named in ring and 'via' lines (no 'nranks N' line: at least this many)"
        return _count("nccl_ranks", float(len(log.ranks_seen)), "count", source, "")
    return Signal.missing("nccl_ranks", "derived", "count", "the log prints no 'nranks N' and no ring", source=where)


def _source_info(log: NcclLog, origin: str) -> SourceInfo:
    config: dict[str, str] = {}
    if log.version:
        config["nccl_version"] = log.version + (f"+cuda{log.cuda}" if log.cuda else "")
    if log.nics:
        config["nics"] = ", ".join(f"{nic} ({net})" for nic, net in sorted(log.nics.items()))
    if log.gdr:
        config["gpudirect_rdma"] = ", ".join(f"{nic} {'on' if on else 'off'}" for nic, on in sorted(log.gdr.items()))
    if log.cuda_driver:
        config["cuda_driver"] = log.cuda_driver
    if log.env:
        config["env"] = ", ".join(f"{k}={v}" for k, v in sorted(log.env.items()))
    families = sorted({_family(via) for via in log.connections.values()})
    if families:
        config["transports"] = ", ".join(sorted(set(log.connections.values())))
    shape = []
    if log.ring_channels:
        shape.append(f"{log.ring_channels} ring channels")
    if log.trees:
        shape.append("trees")
    if log.coll_channels is not None:
        shape.append(f"{log.coll_channels} coll channels")
    if shape:
        config["topology"] = ", ".join(shape)
    note = f"{log.nccl_lines} NCCL lines, {len(log.warnings)} WARN"
    return SourceInfo(probe=PROBE, url=origin, server="NCCL", note=note, config=config)
