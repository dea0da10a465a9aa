"""Per-rank shares and the straggler across ranks, from the reader's RankTraces (see llmdiag.collect.trace)."""

from __future__ import annotations

import bisect
import json
import math
import re
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from llmdiag.collect.trace.intervals import Interval, intersection_total, merge, total
from llmdiag.collect.trace.reader import CommArgs, CommOp, RankTrace, read_trace
from llmdiag.errors import LlmdiagError, TraceFileError, UsageError, option
from llmdiag.model import (
    CollectiveStats,
    RankStats,
    Straggler,
    TraceProblem,
    TraceReport,
)
from llmdiag.schema.collectives import CollectiveSpec
from llmdiag.schema.loader import load_collectives

# messages at least this large are bandwidth-bound; smaller ones measure latency, not the link
LARGE_MESSAGE_BYTES = 1 << 20
HTA_COMM_RE = re.compile(r"^nccl.*Kernel")
# matched collectives whose ends spread more than this (blocking collectives end together) say the clocks differ
CLOCK_DISAGREE_SECONDS = 0.05


# ---------------------------------------------------------------------------------------------
# classification


@dataclass(frozen=True)
class _Classifier:
    spec: CollectiveSpec
    kernels: tuple[tuple[re.Pattern[str], str, str], ...]
    ops: re.Pattern[str]
    devices: tuple[tuple[re.Pattern[str], str], ...]

    def kernel(self, name: str) -> tuple[str, str] | None:
        """(family, collective from the name or "") for a communication kernel, None for compute."""
        for pattern, family, collective in self.kernels:
            if pattern.search(name):
                return family, collective
        return None

    def collective(self, name: str | None) -> str:
        """A collective type from an op or arg name (c10d::allreduce_, nccl:_all_gather_base, allreduce …)."""
        if not name:
            return ""
        key = name.lower().rsplit("::", 1)[-1].rsplit(":", 1)[-1].replace("_", "")
        for suffix in ("coalesced", "base", "intotensor"):
            if key.endswith(suffix) and key[: -len(suffix)] in self.spec.names:
                key = key[: -len(suffix)]
        return self.spec.names.get(key, "")

    def bus_factor(self, collective: str, n: int | None) -> float | None:
        rule = self.spec.bus_factor.get(collective)
        if rule is None or not n:
            return None
        return {"2(n-1)/n": 2 * (n - 1) / n, "(n-1)/n": (n - 1) / n, "1": 1.0}[rule]

    def link_for_device(self, device: str) -> str | None:
        return next((link for pattern, link in self.devices if pattern.search(device)), None)


@cache
def classifier() -> _Classifier:
    spec = load_collectives()
    return _Classifier(
        spec=spec,
        kernels=tuple((re.compile(k.pattern), k.family, k.collective) for k in spec.kernel),
        ops=re.compile("|".join(f"(?:{o.pattern})" for o in spec.cpu_op)),
        devices=tuple((re.compile(d.pattern), d.link) for d in spec.device_link),
    )


def _dims_elements(raw: bytes) -> int | None:
    """Elements of the first input of an op, from its raw `Input Dims` ([[n, m], …]; a TensorList: [[[n]], …])."""
    if not raw:
        return None
    try:
        dims = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the stack
        return None
    if not isinstance(dims, list) or not dims or not isinstance(dims[0], list) or not dims[0]:
        return None
    first = dims[0]
    shapes = first if isinstance(first[0], list) else [first]
    count = 0
    for shape in shapes:
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            return None
        count += math.prod(shape)
    # no tensor has more elements than a 64-bit count: a larger product is a corrupt shape, not a size
    return count if 0 <= count < 1 << 63 else None


def _first_type(raw: bytes) -> str | None:
    if not raw:
        return None
    try:
        types = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the stack
        return None
    return types[0] if isinstance(types, list) and types and isinstance(types[0], str) else None


@dataclass
class _Comm:
    """One communication kernel (or gloo op) on one rank, resolved."""

    start: float
    end: float
    family: str
    collective: str
    group: str
    bytes: float | None
    group_size: int | None
    size_source: str


def _size(
    c: _Classifier, collective: str, args: CommArgs | None, op: CommOp | None, world: int | None
) -> tuple[float | None, int | None, str]:
    """Message bytes as nccl-tests counts them (the larger of in and out), the group size, and where they came from."""
    dtype_bytes = c.spec.dtype_bytes
    group = None
    for a in (args, op.args if op else None):
        if a is None:
            continue
        group = group or a.group_size or (len(a.pg.strip("[]").split(",")) if a.pg and a.pg.startswith("[") else None)
        nelems = max(a.in_nelems or 0, a.out_nelems or 0)
        if nelems and a.dtype in dtype_bytes:
            source = "kernel args" if a is args else "cpu op args"
            return float(nelems * dtype_bytes[a.dtype]), group or world, source
    if op is not None:
        elements = _dims_elements(op.input_dims)
        dtype = _first_type(op.input_type) or op.args.dtype
        if elements and dtype in dtype_bytes:
            size = float(elements * dtype_bytes[dtype])
            n = group or world
            if collective == "all_gather" and n:
                size *= n  # the input is this rank's shard; nccl-tests counts the gathered output
            return size, n, "input dims × dtype"
    return None, group or world, ""


def _resolve(t: RankTrace, c: _Classifier, hta: bool) -> tuple[list[_Comm], list[Interval], list[Interval], int]:
    """Comm records, the comm and compute intervals, and how many comm kernels stayed untyped."""
    name_class: dict[int, tuple[str, str] | None] = {}
    for idx, name in enumerate(t.names):
        if hta:
            name_class[idx] = ("nccl", "") if HTA_COMM_RE.match(name) else None
        else:
            name_class[idx] = c.kernel(name)
    annotations = sorted(t.gpu_annotations)
    comms: list[_Comm] = []
    comm_iv: list[Interval] = []
    compute_iv: list[Interval] = []
    untyped = 0
    world = t.world_size
    keep = _hta_keep(t) if hta else None
    enclosing = _Enclosing(t.cpu_comm)
    for i in range(len(t.gpu_ts)):
        start, end = t.gpu_ts[i], t.gpu_end[i]
        if hta:
            start, end = math.ceil(start), math.floor(end)
            if keep is not None and not keep(i):
                continue
        if t.gpu_kind[i] != 0:
            continue
        cls = name_class[t.gpu_name[i]]
        if cls is None:
            compute_iv.append((start, end))
            continue
        comm_iv.append((start, end))
        family, collective = cls
        args = t.kernel_args.get(i)
        ops = _ops_for(t, i, enclosing)
        typed = c.collective(args.collective if args else None)
        for op in ops:
            typed = typed or c.collective(op.args.collective) or c.collective(op.name)
        typed = typed or collective
        if not typed:
            typed = _annotation_type(c, annotations, start, end, t.gpu_stream[i])
        if not typed:
            untyped += 1
            typed = "unknown"
        size, group_size, source = None, None, ""
        candidates: Sequence[CommOp | None] = ops or [None]
        for candidate in candidates:
            size, group_size, source = _size(c, typed, args, candidate, world)
            if size:
                break  # the first op that tells the message size
        first = ops[0] if ops else None
        group = (
            (args.pg if args and args.pg else None) or (first.args.pg if first and first.args.pg else None) or "default"
        )
        comms.append(_Comm(start, end, family, typed, group, size, group_size, source))
    return comms, comm_iv, compute_iv, untyped


class _Enclosing:
    """The collective-marking CPU ops on each thread, to find those around a launch call."""

    def __init__(self, ops: list[CommOp]) -> None:
        by_tid: dict[object, list[CommOp]] = defaultdict(list)
        for op in ops:
            by_tid[op.tid].append(op)
        self.ops = {tid: sorted(v, key=lambda o: o.ts) for tid, v in by_tid.items()}
        self.starts = {tid: [o.ts for o in v] for tid, v in self.ops.items()}

    def around(self, tid: object, ts: float) -> list[CommOp]:
        """Ops on ``tid`` that contain ``ts``, innermost (latest start) first."""
        ops = self.ops.get(tid)
        if not ops:
            return []
        i = bisect.bisect_right(self.starts[tid], ts)
        out = []
        for op in reversed(ops[max(0, i - 8) : i]):
            if op.ts <= ts <= op.ts + op.dur:
                out.append(op)
        return out


def _ops_for(t: RankTrace, i: int, enclosing: _Enclosing) -> list[CommOp]:
    """The CPU ops behind kernel ``i``: by External id, then by the launch's correlation, then those around the
    launch call on its thread (older traces, whose runtime External ids do not point at the ops)."""
    found: list[CommOp] = []
    op = t.comm_ops.get(t.gpu_ext[i]) if t.gpu_ext[i] >= 0 else None
    if op is not None:
        found.append(op)
    launch = t.launches.get(t.gpu_corr[i]) if t.gpu_corr[i] >= 0 else None
    if launch is not None:
        op = t.comm_ops.get(launch[1])
        if op is not None and op not in found:
            found.append(op)
        found += [o for o in enclosing.around(launch[2], launch[0]) if o not in found]
    return found


def _annotation_type(c: _Classifier, annotations: list[tuple[float, float, str, object]], start, end, stream) -> str:
    """The nccl:* GPU annotation on the same stream that contains the kernel (RCCL's Generic kernels on ROCm)."""
    for a_start, a_end, name, a_stream in annotations:
        if a_start > start + 1:
            break
        if a_stream == stream and a_start - 1 <= start and end <= a_end + 1:
            return c.collective(name)
    return ""


def _hta_keep(t: RankTrace) -> Callable[[int], bool] | None:
    """HTA, with two or more ProfilerSteps, keeps only GPU work whose launch is in the trace and came before the
    last step (often cut short); a kernel whose launch the trace lacks (launched before the capture) goes too."""
    steps = sorted({s for s in t.steps})
    if len(steps) < 2:
        return None
    cutoff = steps[-1][1]

    def keep(i: int) -> bool:
        launch = t.launches.get(t.gpu_corr[i]) if t.gpu_corr[i] >= 0 else None
        return launch is not None and launch[0] < cutoff

    return keep


def rank_stats(t: RankTrace, hta: bool = False) -> tuple[RankStats, list[_Comm]]:
    c = classifier()
    stats = RankStats(rank=t.rank, path=t.path, device=(t.device_names or [""])[0], gpu_events=len(t.gpu_ts))
    if hta and len({s for s, _, _ in t.steps}) >= 2:
        stats.dropped_step = max(s for s, _, _ in t.steps)
    comms, comm_iv, compute_iv, untyped = _resolve(t, c, hta)
    gloo = _gloo(t, c)
    comms += gloo
    if len(t.gpu_device) > 1:
        stats.notes.append(f"GPU activity from {len(t.gpu_device)} devices in one file; counted as one timeline")
    everything = []
    keep = _hta_keep(t) if hta else None
    for i in range(len(t.gpu_ts)):
        if keep is not None and not keep(i):
            continue
        start, end = t.gpu_ts[i], t.gpu_end[i]
        everything.append((math.ceil(start), math.floor(end)) if hta else (start, end))
    busy = merge(everything)
    comm, compute = merge(comm_iv), merge(compute_iv)
    stats.comm_kernels = len(comm_iv)
    stats.untyped_comm_kernels = untyped
    if busy:
        _fill_shares(stats, busy, comm, compute)
        stats.timeline = "gpu"
    elif gloo or t.cpu_busy:
        stats.timeline = "cpu"
        _cpu_timeline(t, stats, gloo)
    else:
        stats.notes.append("no GPU activity and no CPU op in the trace: shares unavailable")
    stats.collectives = _collective_stats(comms, c)
    stats.large_message_busbw_bytes_per_second = _large_busbw(comms, c)
    if untyped:
        stats.notes.append(f"{untyped} communication kernels whose collective type nothing in the trace tells")
    return stats, comms


# a gloo:* annotation's type → the c10d op types that can have issued it (gloo runs reduce_scatter as an all-reduce)
GLOO_ISSUERS = {"all_reduce": {"all_reduce", "reduce_scatter", "barrier"}, "barrier": {"barrier", "all_reduce"}}
# unpaired issuing ops looked at for each gloo:* range (they queue in issue order on the worker threads)
GLOO_PAIR_WINDOW = 64
# a gloo:* range may be stamped this much (µs) before its issuing op's start on another thread
GLOO_PAIR_SLACK_US = 1.0


def _max_elements(raw: bytes) -> int | None:
    """The largest tensor (or tensor list) among an op's inputs, in elements, from its raw `Input Dims`."""
    try:
        dims = json.loads(raw) if raw else None
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the stack
        return None
    if not isinstance(dims, list):
        return None
    best = None
    for item in dims:
        n = _dims_elements(json.dumps([item]).encode()) if isinstance(item, list) and item else None
        if n and (best is None or n > best):
            best = n
    return best


def _gloo(t: RankTrace, c: _Classifier) -> list[_Comm]:
    """gloo collectives run on the CPU: the gloo:* range on a gloo worker thread spans the real execution.

    The range is typed by the c10d::* op that issued it: the earliest one not yet paired that started before it, of a
    compatible type, preferring one whose largest input has the range's element count."""
    ranges = sorted((op for op in t.cpu_comm if op.name.startswith("gloo:")), key=lambda o: o.ts)
    if not ranges:
        return []
    issuers = sorted((op for op in t.cpu_comm if op.name.startswith("c10d::")), key=lambda o: o.ts)
    issuer_type = [c.collective(op.name) for op in issuers]
    issuer_elems: list[int | None] = [None] * len(issuers)
    paired = [False] * len(issuers)
    first_free = 0
    out = []
    for op in ranges:
        annotated = c.collective(op.name) or "unknown"
        allowed = GLOO_ISSUERS.get(annotated, {annotated})
        elements = _dims_elements(op.input_dims)
        while first_free < len(issuers) and paired[first_free]:
            first_free += 1
        choice = fallback = None
        seen = 0
        for j in range(first_free, len(issuers)):
            if issuers[j].ts > op.ts + GLOO_PAIR_SLACK_US or seen >= GLOO_PAIR_WINDOW:
                break
            if paired[j]:
                continue
            seen += 1
            if issuer_type[j] not in allowed:
                continue
            if issuer_elems[j] is None:
                issuer_elems[j] = _max_elements(issuers[j].input_dims) or 0
            if elements and issuer_elems[j] == elements:
                choice = j
                break
            if fallback is None:
                fallback = j
        choice = choice if choice is not None else fallback
        typed = annotated
        if choice is not None:
            paired[choice] = True
            typed = issuer_type[choice] or annotated
        size, n, source = _size(c, annotated, None, op, t.world_size)  # the range's own tensor, as gloo ran it
        out.append(_Comm(op.ts, op.ts + op.dur, "gloo", typed, "default", size, n, source))
    return out


def _cpu_timeline(t: RankTrace, stats: RankStats, gloo: list[_Comm]) -> None:
    """A CPU-only run: comm = the gloo:* ranges, compute = the cpu_ops on the threads that run no gloo:* range."""
    gloo_threads = {op.tid for op in t.cpu_comm if op.name.startswith("gloo:")}
    comm = merge((x.start, x.end) for x in gloo)
    compute = merge((s, e) for tid, spans in t.cpu_busy.items() if tid not in gloo_threads for s, e in spans)
    busy = merge(comm + compute)
    stats.comm_kernels = len(gloo)
    stats.notes.append(
        "CPU-only trace: busy, comm and compute are CPU time (comm: the gloo:* ranges on the gloo worker threads, "
        "waiting for peers included; compute: the cpu_ops on the other threads)"
    )
    if busy:
        _fill_shares(stats, busy, comm, compute)


def _fill_shares(stats: RankStats, busy: list[Interval], comm: list[Interval], compute: list[Interval]) -> None:
    """The rank's times and shares from merged µs intervals; ``busy`` is not empty."""
    us = 1e-6
    span = busy[-1][1] - busy[0][0]
    busy_t, comm_t, compute_t = total(busy), total(comm), total(compute)
    both = intersection_total(comm, compute)
    stats.span_seconds = span * us
    stats.busy_seconds = busy_t * us
    stats.busy_ratio = busy_t / span if span > 0 else None
    stats.comm_seconds = comm_t * us
    stats.compute_seconds = compute_t * us
    stats.comm_share_ratio = comm_t / busy_t if busy_t > 0 else None
    stats.exposed_comm_seconds = (comm_t - both) * us
    stats.exposed_comm_share_ratio = (comm_t - both) / span if span > 0 else None
    stats.overlap_ratio = both / comm_t if comm_t > 0 else None


def _collective_stats(comms: list[_Comm], c: _Classifier) -> list[CollectiveStats]:
    groups: dict[tuple[str, str], list[_Comm]] = defaultdict(list)
    for x in comms:
        groups[(x.collective, x.family)].append(x)
    out = []
    for (collective, family), items in groups.items():
        sized = [x for x in items if x.bytes]
        s = CollectiveStats(
            collective=collective,
            family=family,
            count=len(items),
            total_seconds=sum(x.end - x.start for x in items) * 1e-6,
            sized_count=len(sized),
        )
        if sized:
            sizes = [x.bytes or 0.0 for x in sized]
            seconds = sum(x.end - x.start for x in sized) * 1e-6
            s.bytes_total = sum(sizes)
            s.message_bytes_min, s.message_bytes_max = min(sizes), max(sizes)
            s.size_source = statistics.mode(x.size_source for x in sized)
            s.group_size = statistics.mode(x.group_size for x in sized) if sized[0].group_size else None
            if seconds > 0:
                s.algbw_bytes_per_second = s.bytes_total / seconds
                factor = c.bus_factor(collective, s.group_size)
                if factor is not None:
                    s.busbw_bytes_per_second = s.algbw_bytes_per_second * factor
        out.append(s)
    return sorted(out, key=lambda s: -s.total_seconds)


def _large_busbw(comms: list[_Comm], c: _Classifier) -> float | None:
    """Bus bandwidth over the large messages: bytes × factor summed, over their kernel time."""
    moved = seconds = 0.0
    for x in comms:
        if x.family == "gloo" or not x.bytes or x.bytes < LARGE_MESSAGE_BYTES:
            continue
        factor = c.bus_factor(x.collective, x.group_size)
        if factor is None or x.end <= x.start:
            continue
        moved += x.bytes * factor
        seconds += (x.end - x.start) * 1e-6
    return moved / seconds if seconds > 0 else None


# ---------------------------------------------------------------------------------------------
# across ranks


def _abs_offset_us(t: RankTrace) -> float:
    """What to add to a rank's ts to put it on the epoch (µs): baseTimeNanoseconds, or 0 when ts already is."""
    base = t.base_time_ns
    return base / 1000.0 if base else 0.0


def find_straggler(
    traces: list[RankTrace], comms: dict[int, list[_Comm]], spans: dict[int, tuple[float, float]]
) -> tuple[Straggler | None, str, list[TraceProblem]]:
    """Match the k-th collective of each (group, type) across ranks; the rank that starts them last is the straggler."""
    problems: list[TraceProblem] = []
    ranks = sorted(comms)
    if len(ranks) < 2:
        return None, "one rank: no cross-rank comparison", problems
    offsets = {t.rank: _abs_offset_us(t) for t in traces if t.rank in comms}
    windows = {r: (spans[r][0] + offsets[r], spans[r][1] + offsets[r]) for r in ranks if r in spans}
    if len(windows) == len(ranks):
        latest_start = max(w[0] for w in windows.values())
        earliest_end = min(w[1] for w in windows.values())
        if latest_start > earliest_end:
            gap = (latest_start - earliest_end) * 1e-6
            problems.append(
                TraceProblem(
                    kind="warning",
                    message=f"the ranks' traces do not overlap in time (apart by {gap:.3g} s): no common time base "
                    "(clock skew between hosts, or captures of different moments); cross-rank analysis skipped",
                    hint="capture all ranks in one profiler window, on hosts with synchronised clocks (NTP/PTP)",
                )
            )
            return None, "no common time base: cross-rank analysis skipped", problems
    per_key: dict[tuple[str, str], dict[int, list[_Comm]]] = defaultdict(lambda: defaultdict(list))
    for r in ranks:
        for x in sorted(comms[r], key=lambda x: x.start):
            per_key[(x.group, x.collective)][r].append(x)
    lateness: dict[int, list[float]] = defaultdict(list)
    latest_count: dict[int, int] = defaultdict(int)
    skew_vs_median: dict[int, list[float]] = defaultdict(list)
    end_spreads: list[float] = []
    spreads: list[float] = []
    matched = 0
    uneven = []
    for key, by_rank in per_key.items():
        if set(by_rank) != set(ranks):
            continue  # a group this set of ranks does not all take part in
        counts = {len(v) for v in by_rank.values()}
        if len(counts) > 1:
            uneven.append(f"{key[1]} ({min(counts)}–{max(counts)})")
        for k in range(min(counts)):
            starts = {r: by_rank[r][k].start + offsets[r] for r in ranks}
            ends = [by_rank[r][k].end + offsets[r] for r in ranks]
            earliest = min(starts.values())
            last = max(starts, key=lambda r: starts[r])
            latest_count[last] += 1
            spreads.append(starts[last] - earliest)
            end_spreads.append(max(ends) - min(ends))
            for r, s in starts.items():
                lateness[r].append(s - earliest)
                skew_vs_median[r].append(s - statistics.median(v for q, v in starts.items() if q != r))
            matched += 1
    if not matched:
        return None, "no collective is common to all the ranks given", problems
    note = f"{matched} collectives matched across {len(ranks)} ranks by process group, type and order"
    if uneven:
        note += f"; counts differ between ranks for {', '.join(uneven)}: matched the common prefix"
    if statistics.median(end_spreads) * 1e-6 > CLOCK_DISAGREE_SECONDS:
        problems.append(
            TraceProblem(
                kind="warning",
                message=f"matched collectives end {statistics.median(end_spreads) * 1e-3:.1f} ms apart across ranks "
                "(they should end together): the ranks' clocks disagree, or the traces hold different collectives "
                "(sampled or cut captures); straggler not named",
                hint="capture on hosts whose clocks are synchronised (NTP/PTP)",
            )
        )
        return None, note, problems
    mean_late = {r: statistics.fmean(v) for r, v in lateness.items()}
    order = sorted(ranks, key=lambda r: (mean_late[r], latest_count[r]), reverse=True)
    worst = order[0]
    straggler = Straggler(
        rank=worst,
        latest_count=latest_count[worst],
        matched=matched,
        skew_seconds=max(0.0, statistics.fmean(skew_vs_median[worst])) * 1e-6,
        max_skew_seconds=max(spreads) * 1e-6,
        lateness_seconds={r: round(v * 1e-6, 9) for r, v in sorted(mean_late.items())},
        runner_up=order[1] if len(order) > 1 else None,
    )
    return straggler, note, problems


# ---------------------------------------------------------------------------------------------
# the whole job


def trace_files(paths: list[Path]) -> list[Path]:
    """Files as given, and every *.json / *.json.gz inside the directories given."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz")))
        elif path.exists():
            found.append(path)
        else:
            raise UsageError(f"{path}: no such file or directory", "give trace files or folders that hold them")
    if not found:
        raise UsageError(
            f"no *.json or *.json.gz trace files in {', '.join(str(p) for p in paths)}",
            "point at the folder torch.profiler wrote to (e.g. VLLM_TORCH_PROFILER_DIR)",
        )
    return found


def _job_key(t: RankTrace) -> tuple:
    devices = t.device_names
    return (t.world_size, str(t.distributed.get("backend", "")), devices[0] if devices else "")


def _group_job(traces: list[RankTrace], problems: list[TraceProblem]) -> list[RankTrace]:
    """Keep one job: the largest group of traces that agree on world size, backend and GPU; one trace per rank."""
    groups: dict[tuple, list[RankTrace]] = defaultdict(list)
    for t in traces:
        groups[_job_key(t)].append(t)
    job = max(groups.values(), key=len)
    if len(groups) > 1:
        for key, members in groups.items():
            if members is job:
                continue
            for t in members:
                problems.append(
                    TraceProblem(
                        kind="error",
                        path=t.path,
                        message=f"{t.path}: from another job (world size {key[0]}, backend '{key[1]}', GPU "
                        f"'{key[2]}'; the others: world size {_job_key(job[0])[0]}, GPU '{_job_key(job[0])[2]}'): "
                        "left out",
                        hint="give one job's traces at a time (one folder per profiling run)",
                    )
                )
    kept: dict[int | None, RankTrace] = {}
    out = []
    for i, t in enumerate(job):
        rank = t.rank if t.rank is not None else -(i + 1)  # no rank in the file: its own slot
        if rank in kept:
            problems.append(
                TraceProblem(
                    kind="error",
                    path=t.path,
                    message=f"{t.path}: rank {rank} again (also {kept[rank].path}): two jobs or two captures mixed; "
                    "the first is kept",
                    hint="give one job's traces at a time (one folder per profiling run)",
                )
            )
            continue
        kept[rank] = t
        out.append(t)
    return out


def analyze(paths: list[Path], link: str | None = None, hta_compat: bool = False) -> TraceReport:
    from llmdiag.schema.links import expected_bus_bandwidth_bytes_per_second

    files = trace_files(paths)
    report = TraceReport(paths=[str(p) for p in paths], hta_compat=hta_compat)
    c = classifier()
    traces: list[RankTrace] = []
    began = time.perf_counter()
    for path in files:
        try:
            traces.append(read_trace(path, c.ops))
        except TraceFileError as error:
            report.problems.append(TraceProblem(kind="error", path=str(path), message=error.message, hint=error.hint))
        report.bytes_read += path.stat().st_size if path.exists() else 0
    report.parse_seconds = time.perf_counter() - began
    if not traces:
        return report
    traces = _group_job(traces, report.problems)
    traces.sort(key=lambda t: (t.rank is None, t.rank if t.rank is not None else 0, t.path))
    world = traces[0].world_size
    report.world_size = world
    present = {t.rank for t in traces if t.rank is not None}
    if world and len(present) < world:
        missing = sorted(set(range(world)) - present)
        shown = ", ".join(map(str, missing[:16])) + (" …" if len(missing) > 16 else "")
        report.problems.append(
            TraceProblem(
                kind="warning",
                message=f"{len(present)} of {world} ranks given (missing: {shown}): the cross-rank analysis covers "
                "only these",
                hint="give every rank's trace (one file per rank) to compare them all",
            )
        )
    comms: dict[int, list[_Comm]] = {}
    spans: dict[int, tuple[float, float]] = {}
    for t in traces:
        stats, rank_comms = rank_stats(t, hta_compat)
        report.ranks.append(stats)
        if t.rank is None:
            continue
        if stats.timeline == "gpu":
            # gloo collectives beside GPU work (vLLM's CPU-side groups) are not on the GPU timeline: left out
            comms[t.rank] = [x for x in rank_comms if x.family != "gloo"]
            spans[t.rank] = (min(t.gpu_ts), max(t.gpu_end))
        elif stats.timeline == "cpu" and rank_comms:
            comms[t.rank] = rank_comms
            ends = [x.end for x in rank_comms] + [e for v in t.cpu_busy.values() for _, e in v]
            starts = [x.start for x in rank_comms] + [s for v in t.cpu_busy.values() for s, _ in v]
            spans[t.rank] = (min(starts), max(ends))
    usable = [t for t in traces if t.rank in comms]
    report.straggler, report.cross_rank, more = find_straggler(usable, comms, spans)
    report.problems += more
    if link:
        report.link, report.link_source = link, option("link")
    else:
        device = next((t.device_names[0] for t in traces if t.device_names), "")
        guessed = c.link_for_device(device) if device else None
        if guessed:
            report.link, report.link_source = guessed, f"deviceProperties: {device}"
    if report.link:
        report.expected_busbw_bytes_per_second = expected_bus_bandwidth_bytes_per_second(report.link)
        if report.expected_busbw_bytes_per_second is None and link:
            raise UsageError(
                f"{option('link')} {link}: not a link class llmdiag knows", "see probes/links.toml for the names"
            )
    return report


def problems_as_error(report: TraceReport) -> LlmdiagError | None:
    """The first error-kind problem as the error the CLI reports (after the partial results)."""
    errors = [p for p in report.problems if p.kind == "error"]
    if not errors:
        return None
    more = f" (and {len(errors) - 1} more problem(s) above)" if len(errors) > 1 else ""
    return TraceFileError(errors[0].message + more, errors[0].hint or None)
