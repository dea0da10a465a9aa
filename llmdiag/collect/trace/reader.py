"""Streaming reader of PyTorch profiler (Kineto) Chrome-trace JSON, plain or gzip, one file per rank.

The file is never loaded whole: it is read in chunks of ``CHUNK_BYTES``, the ``traceEvents`` list is cut at event
boundaries and each slice is decoded by msgspec into small structs that keep only the fields the analysis reads
(unknown fields are skipped in C). What survives an event is compact: GPU activity as typed arrays, the launch
correlation map, the few CPU ops that mark collectives, and the ProfilerStep ranges. The other top-level keys
(``distributedInfo``, ``deviceProperties``, ``baseTimeNanoseconds`` …) are read in whatever order they come.

Where a cut lands inside a string or a nested object, decoding that slice fails; the reader then cuts at the
previous candidate boundary, so a wrong cut can cost time but never a wrong event (``chunk_bytes`` lets a test
cut everywhere).

CPU-only runs (gloo) have no GPU activity: until the first GPU event, the reader also keeps the union of the
``cpu_op`` ranges per thread (merged as they come, so nested ops cost nothing), the CPU timeline the analysis
uses instead; the first GPU event drops it.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Protocol

import msgspec

from llmdiag.errors import TraceFileError

CHUNK_BYTES = 1 << 20
# cuts tried backwards in one buffer before it is grown: a slice with this many false boundaries is pathological
MAX_CUT_TRIES = 64
# a top-level value other than traceEvents (deviceProperties, distributedInfo …) larger than this is not a trace's
MAX_TOP_VALUE_BYTES = 64 << 20
# a gzip trace decompresses to at most this many times its size (real Kineto traces: 13x to 20x), and never less
# than the floor: past it the file is a decompression bomb, refused before it fills the disk cache or the clock
MAX_GZIP_RATIO = 200
MIN_GZIP_CAP_BYTES = 64 << 20
# one event (a kernel, an op) is a few hundred bytes; a slice without an event's end this long is no trace's
MAX_EVENT_BYTES = 64 << 20
# the largest job a trace can come from: the analysis lists the missing ranks of the world, and a corrupt
# world_size (4294967295) must not make it build a set of billions
MAX_WORLD_SIZE = 1 << 20
# ids are kept in int64 arrays: a value outside that range is no id Kineto writes
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
Int64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]

# keyed by str | None: it is read with an event's category, which the trace may leave out
GPU_CATS: dict[str | None, int] = {"kernel": 0, "gpu_memcpy": 1, "gpu_memset": 2, "Kernel": 0, "Memcpy": 1, "Memset": 2}
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver", "Runtime", "Driver"})
OP_CATS = frozenset({"cpu_op", "user_annotation", "Operator"})
BLANKS = re.compile(rb"[ \t\r\n]*")
STEP_RE = re.compile(r"^ProfilerStep\s*#\s*(\d+)")


# gc=False: hundreds of thousands of these are made per file and none can be in a cycle; tracked, they set off
# the cyclic collector again and again (4x the decode time on a 54 MB trace)
class _Args(msgspec.Struct, gc=False):
    # typed where Kineto always writes one type: msgspec checks them in C (an odd slice takes the lenient path)
    correlation: Int64 | None = None
    external_id: Int64 | None = msgspec.field(default=None, name="External id")
    stream: Int64 | None = None
    collective: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: Any = None
    group_size: Any = msgspec.field(default=None, name="Group size")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    # kept raw: decoded only for the few ops that are collectives
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")


class _Event(msgspec.Struct, gc=False):
    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    ts: float | None = None
    dur: float | None = None
    pid: Any = None
    tid: Any = None
    args: _Args | None = None


_EVENTS = msgspec.json.Decoder(list[_Event])
_ONE_EVENT = msgspec.json.Decoder(_Event)


@dataclass(frozen=True)
class CommArgs:
    """A collective's args, from a kernel or a CPU op: element counts, dtype, group."""

    collective: str | None
    in_nelems: int | None
    out_nelems: int | None
    dtype: str | None
    group_size: int | None
    pg: str | None


@dataclass(frozen=True)
class CommOp:
    """A CPU op or annotation that marks a collective (record_param_comms, c10d::*, nccl:*, gloo:*, symm_mem::*)."""

    name: str
    cat: str
    ts: float
    dur: float
    tid: Any
    args: CommArgs
    input_dims: bytes
    input_type: bytes


@dataclass
class RankTrace:
    """What the analysis needs from one rank's trace file. Times in µs on the trace's own axis."""

    path: str
    size_bytes: int = 0
    top: dict[str, Any] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)
    # GPU activity, one entry per kernel / memcpy / memset, parallel arrays
    gpu_ts: array = field(default_factory=lambda: array("d"))
    gpu_end: array = field(default_factory=lambda: array("d"))
    gpu_name: array = field(default_factory=lambda: array("l"))
    gpu_kind: array = field(default_factory=lambda: array("b"))  # 0 kernel, 1 memcpy, 2 memset
    gpu_stream: array = field(default_factory=lambda: array("q"))
    gpu_corr: array = field(default_factory=lambda: array("q"))
    gpu_ext: array = field(default_factory=lambda: array("q"))
    gpu_device: set = field(default_factory=set)
    # index into the GPU arrays → the kernel's own collective args (NCCL process group, PyTorch 2.4+)
    kernel_args: dict[int, CommArgs] = field(default_factory=dict)
    # launch correlation → (runtime call start µs, External id, CPU thread)
    launches: dict[int, tuple[float, int, Any]] = field(default_factory=dict)
    # External id → the collective-marking CPU op (record_param_comms preferred: the innermost)
    comm_ops: dict[int, CommOp] = field(default_factory=dict)
    # every collective-marking CPU op/annotation in time order (gloo collectives live only here)
    cpu_comm: list[CommOp] = field(default_factory=list)
    # GPU-side nccl:* / gloo:* annotations: (start, end, name, stream)
    gpu_annotations: list[tuple[float, float, str, Any]] = field(default_factory=list)
    # ProfilerStep#N ranges on the CPU: (step, start, end)
    steps: list[tuple[int, float, float]] = field(default_factory=list)
    # CPU-only traces: per thread, the union of cpu_op ranges that do not mark a collective, as [start, end] pairs
    # (kept only while the trace shows no GPU activity)
    cpu_busy: dict[Any, list[list[float]]] = field(default_factory=dict)
    events: int = 0
    skipped_events: int = 0

    @property
    def distributed(self) -> dict[str, Any]:
        info = self.top.get("distributedInfo")
        return info if isinstance(info, dict) else {}

    @property
    def rank(self) -> int | None:
        value = self.distributed.get("rank")
        return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_WORLD_SIZE else None

    @property
    def world_size(self) -> int | None:
        """The job's rank count; a number no job has (0, negative, past ``MAX_WORLD_SIZE``) is unknown."""
        value = self.distributed.get("world_size")
        return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_WORLD_SIZE else None

    @property
    def device_names(self) -> list[str]:
        props = self.top.get("deviceProperties")
        if not isinstance(props, list):
            return []
        return [str(p.get("name")) for p in props if isinstance(p, dict) and p.get("name")]

    @property
    def base_time_ns(self) -> int | None:
        value = self.top.get("baseTimeNanoseconds")
        return value if isinstance(value, int) else None


def _int(value: Any) -> int | None:
    """An id or a count as Kineto writes it (a number, or the number as a string), within int64; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    elif isinstance(value, str) and value.strip().lstrip("-").isascii() and value.strip().lstrip("-").isdigit():
        value = int(value) if len(value) < 24 else None  # isascii: '١٢' is digits to isdigit(), and int() reads it
    return value if isinstance(value, int) and INT64_MIN <= value <= INT64_MAX else None


def _float(value: Any) -> float | None:
    """A JSON number as a float; an integer too large for one (10**400) is None, not an OverflowError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def _stream_id(value: Any) -> int:
    """A stream or thread id for the int64 array; -1 where it is not an integer in range."""
    return value if type(value) is int and INT64_MIN <= value <= INT64_MAX else -1


def _comm_args(a: _Args) -> CommArgs:
    return CommArgs(
        collective=a.collective if isinstance(a.collective, str) else None,
        in_nelems=_int(a.in_nelems),
        out_nelems=_int(a.out_nelems),
        dtype=a.dtype if isinstance(a.dtype, str) else None,
        group_size=_int(a.group_size),
        pg=a.pg_ranks if isinstance(a.pg_ranks, str) else (str(a.pg_name) if a.pg_name is not None else None),
    )


class _Sink:
    """Turns decoded events into a RankTrace's compact form."""

    def __init__(self, trace: RankTrace, op_pattern: re.Pattern[str]) -> None:
        self.t = trace
        self.op_pattern = op_pattern
        self.name_ids: dict[str, int] = {}
        # the CPU timeline is kept until GPU activity shows up (or deviceProperties lists a GPU)
        self.cpu_timeline = True

    def add(self, events: list[_Event]) -> None:
        t = self.t
        t.events += len(events)
        name_ids = self.name_ids
        launches = t.launches
        gpu_ts, gpu_end, gpu_name, gpu_kind = t.gpu_ts.append, t.gpu_end.append, t.gpu_name.append, t.gpu_kind.append
        gpu_stream, gpu_corr, gpu_ext = t.gpu_stream.append, t.gpu_corr.append, t.gpu_ext.append
        for e in events:
            if e.ph != "X":
                continue
            cat = e.cat
            kind = GPU_CATS.get(cat)
            if kind is not None:
                ts, dur, name = e.ts, e.dur, e.name
                if ts is None or dur is None or name is None:
                    t.skipped_events += 1
                    continue
                idx = name_ids.get(name)
                if idx is None:
                    idx = name_ids[name] = len(t.names)
                    t.names.append(name)
                a = e.args
                i = len(t.gpu_ts)
                gpu_ts(ts)
                gpu_end(ts + dur)
                gpu_name(idx)
                gpu_kind(kind)
                if a is None:
                    gpu_stream(_stream_id(e.tid))
                    gpu_corr(-1)
                    gpu_ext(-1)
                else:
                    stream = a.stream if a.stream is not None else e.tid
                    gpu_stream(_stream_id(stream))
                    gpu_corr(-1 if a.correlation is None else a.correlation)
                    gpu_ext(-1 if a.external_id is None else a.external_id)
                    if a.collective is not None:
                        t.kernel_args[i] = _comm_args(a)
                if e.pid is not None:
                    t.gpu_device.add(e.pid)
                if self.cpu_timeline:
                    self.cpu_timeline = False
                    t.cpu_busy.clear()
            elif cat in LAUNCH_CATS:
                a = e.args
                if a is not None and a.correlation is not None and e.ts is not None:
                    launches[a.correlation] = (e.ts, -1 if a.external_id is None else a.external_id, e.tid)
            elif cat in OP_CATS:
                name = e.name
                if name is None:
                    continue
                if name.startswith("ProfilerStep"):
                    m = STEP_RE.match(name)
                    if m and e.ts is not None and e.dur is not None:
                        t.steps.append((int(m.group(1)), e.ts, e.ts + e.dur))
                elif self.op_pattern.search(name):
                    self._comm_op(e, name, cat)
                elif self.cpu_timeline and cat == "cpu_op":
                    self._cpu_op(e)
            elif cat == "gpu_user_annotation":
                name = e.name
                if e.ts is not None and e.dur is not None and name is not None and name.startswith(("nccl:", "gloo:")):
                    t.gpu_annotations.append((e.ts, e.ts + e.dur, name, e.tid))

    def _cpu_op(self, e: _Event) -> None:
        ts, dur = e.ts, e.dur
        if ts is None or dur is None or dur <= 0:
            return
        end = ts + dur
        spans = self.t.cpu_busy.get(e.tid)
        if spans is None:
            self.t.cpu_busy[e.tid] = [[ts, end]]
            return
        last = spans[-1]
        if last[0] <= ts <= last[1]:  # nested in, or running on from, the last range: the union grows in place
            if end > last[1]:
                last[1] = end
        else:
            spans.append([ts, end])

    def _comm_op(self, e: _Event, name: str, cat: str) -> None:
        a = e.args
        if e.ts is None or e.dur is None:
            return
        args = _comm_args(a) if a is not None else CommArgs(None, None, None, None, None, None)
        op = CommOp(
            name=name,
            cat=cat,
            ts=e.ts,
            dur=e.dur,
            tid=e.tid,
            args=args,
            input_dims=bytes(a.input_dims) if a is not None else b"",
            input_type=bytes(a.input_type) if a is not None else b"",
        )
        self.t.cpu_comm.append(op)
        ext = a.external_id if a is not None else None
        if ext is not None:
            # record_param_comms is the innermost op, the one the launch's External id points at
            held = self.t.comm_ops.get(ext)
            if held is None or name == "record_param_comms" or held.name != "record_param_comms":
                self.t.comm_ops[ext] = op


class ByteStream(Protocol):
    """What the reader needs of a trace's stream: a file opened "rb", a GzipFile over one, a BytesIO."""

    def read(self, size: int, /) -> bytes: ...


class CappedGzip:
    """A gzip stream that refuses to give more than ``cap_bytes`` (a decompression bomb ends as a TraceFileError)."""

    def __init__(self, raw: io.BufferedIOBase, path: str, compressed_bytes: int) -> None:
        self.stream = gzip.GzipFile(fileobj=raw, mode="rb")
        self.raw = raw
        self.path = path
        self.compressed_bytes = compressed_bytes
        self.cap_bytes = max(MIN_GZIP_CAP_BYTES, MAX_GZIP_RATIO * compressed_bytes)
        self.given = 0

    def read(self, size: int, /) -> bytes:
        more = self.stream.read(min(size, self.cap_bytes + 1 - self.given))
        self.given += len(more)
        if self.given > self.cap_bytes:
            raise TraceFileError(
                f"{self.path}: {self.compressed_bytes} bytes of gzip decompress past {self.cap_bytes >> 20} MiB "
                f"(over {MAX_GZIP_RATIO}x; profiler traces compress 13x to 20x): a decompression bomb, not a trace",
                "give the trace as torch.profiler wrote it; the other ranks are still analysed",
            )
        return more

    def __enter__(self) -> CappedGzip:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stream.close()
        self.raw.close()


def _open(path: Path, size: int) -> io.BufferedIOBase | CappedGzip:
    raw = path.open("rb")
    magic = raw.read(2)
    raw.seek(0)
    if magic == b"\x1f\x8b":
        return CappedGzip(raw, str(path), size)
    return raw


class _Reader:
    """A byte buffer over the (decompressed) stream with a read position."""

    def __init__(self, stream: ByteStream, path: str, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.stream = stream
        self.path = path
        self.chunk_bytes = chunk_bytes
        self.buf = b""
        self.pos = 0
        self.eof = False

    def fill(self, want: int | None = None) -> bool:
        """Append up to ``want`` (default: a chunk) more bytes; False at end of stream."""
        if self.eof:
            return False
        try:
            more = self.stream.read(want or self.chunk_bytes)
        except EOFError:
            raise TraceFileError(
                f"{self.path}: the gzip stream ends early (the file is truncated)",
                "copy the trace again; the other ranks are still analysed",
            ) from None
        except (gzip.BadGzipFile, zlib.error, OSError) as exc:
            raise TraceFileError(f"{self.path}: not readable as gzip ({exc})") from None
        if not more:
            self.eof = True
            return False
        self.buf = self.buf[self.pos :] + more
        self.pos = 0
        return True

    def skip_ws(self) -> int | None:
        """The next non-blank byte (not consumed), or None at the end."""
        while True:
            buf = self.buf
            # in C: a stream of blanks (a padded or hostile file) costs no Python loop per byte
            pos = self.pos = BLANKS.match(buf, self.pos).end()  # type: ignore[union-attr]
            if pos < len(buf):
                return buf[pos]
            if not self.fill():
                return None

    def expect(self, char: bytes, what: str) -> None:
        got = self.skip_ws()
        if got != char[0]:
            seen = "the end of the file" if got is None else repr(chr(got))
            raise TraceFileError(f"{self.path}: expected {what}, found {seen}")
        self.pos += 1

    def value(self) -> Any:
        """Decode one small JSON value (a top-level key or value) at the position."""
        decoder = json.JSONDecoder()
        window = 1 << 16
        while True:
            self.skip_ws()
            # a growing window: the top-level values other than traceEvents are small
            text = self.buf[self.pos : self.pos + window].decode("utf-8", errors="ignore")
            try:
                obj, end = decoder.raw_decode(text)
            except RecursionError:  # nesting deeper than Python's stack: no trace's top-level value
                raise TraceFileError(f"{self.path}: JSON nested too deep near byte {self.pos}") from None
            except json.JSONDecodeError as exc:
                if self.pos + window < len(self.buf):
                    window *= 8
                    continue
                if len(self.buf) - self.pos < MAX_TOP_VALUE_BYTES and self.fill():
                    continue
                raise TraceFileError(f"{self.path}: not valid JSON ({exc.msg} near byte {self.pos})") from None
            self.pos += len(text[:end].encode("utf-8"))
            return obj


def _events(r: _Reader, sink: _Sink) -> None:
    """Stream the traceEvents list (the reader sits just past its '[')."""
    first = True
    while True:
        c = r.skip_ws()
        if c is None:
            raise TraceFileError(f"{r.path}: the file ends inside traceEvents (truncated)")
        if c == ord("]"):
            r.pos += 1
            return
        if not first:
            if c != ord(","):
                raise TraceFileError(f"{r.path}: not valid JSON: expected ',' between events near byte {r.pos}")
            r.pos += 1
            c = r.skip_ws()
            if c is None:
                raise TraceFileError(f"{r.path}: the file ends inside traceEvents (truncated)")
        first = False
        while not _decode_run(r, sink):
            # no complete event in the buffer: the event is longer than the buffer, or the stream ended
            if len(r.buf) - r.pos > MAX_EVENT_BYTES:
                raise TraceFileError(
                    f"{r.path}: an event runs past {MAX_EVENT_BYTES >> 20} MiB near byte {r.pos}: not a profiler trace"
                )
            if not r.fill(max(r.chunk_bytes, len(r.buf))):
                raise TraceFileError(f"{r.path}: the file ends inside traceEvents (truncated)")


def _decode_run(r: _Reader, sink: _Sink) -> bool:
    """Decode as many whole events as the buffer holds, from the position; False when it holds none."""
    buf, start = r.buf, r.pos
    end = len(buf)
    tries = 0
    while tries < MAX_CUT_TRIES:
        cut = buf.rfind(b"}", start, end)
        if cut < 0:
            return False
        after = cut + 1
        n = len(buf)
        while after < n and buf[after] in b" \t\r\n":
            after += 1
        if after >= n and not r.eof:
            end = cut  # what follows the brace is not read yet: it may be inside an event
            tries += 1
            continue
        if after < n and buf[after] not in b",]":
            end = cut
            tries += 1
            continue
        try:
            events = _EVENTS.decode(b"[" + buf[start : cut + 1] + b"]")
        except msgspec.ValidationError:
            try:
                events = _lenient(buf[start : cut + 1])
            except (msgspec.DecodeError, RecursionError):  # a number out of any range, nesting too deep: one by one
                return _decode_one(r, sink)
        except (msgspec.DecodeError, RecursionError):
            end = cut
            tries += 1
            continue
        sink.add(events)
        r.pos = cut + 1
        return True
    return _decode_one(r, sink)


def _decode_one(r: _Reader, sink: _Sink) -> bool:
    """The slow exact path: one event with the stdlib decoder (for slices full of false boundaries)."""
    text = r.buf[r.pos :].decode("utf-8", errors="ignore")
    try:
        obj, end = json.JSONDecoder().raw_decode(text)
    except (json.JSONDecodeError, RecursionError):
        return False
    size = len(text[:end].encode("utf-8"))
    try:
        # the event's own bytes, now that its end is known: msgspec keeps the raw fields (Input Dims …) as they are
        events = [_ONE_EVENT.decode(r.buf[r.pos : r.pos + size])]
    except (msgspec.DecodeError, RecursionError):  # fields of unexpected types (ValidationError is a DecodeError)
        events = _convert([obj])
    r.pos += size
    sink.add(events)
    return True


def _lenient(chunk: bytes) -> list[_Event]:
    """A slice with an event whose fields have unexpected types: decode it loosely, drop what does not fit."""
    return _convert(msgspec.json.decode(b"[" + chunk + b"]"))


RAW_ARGS = ("Input Dims", "Input type")
INT_ARGS = ("correlation", "External id", "stream")


def _convert(objs: list[Any]) -> list[_Event]:
    """Decoded objects to events, field by field: a field of an unexpected type is dropped (the event is then skipped
    where it needs that field, and counted), an id written as a string is read as the number; the args kept raw are
    re-encoded (a Python list does not convert to msgspec.Raw)."""
    out = []
    for obj in objs:
        if not isinstance(obj, dict):
            continue
        fields: dict[str, Any] = {k: v for k in ("ph", "cat", "name") if isinstance(v := obj.get(k), str)}
        # a JSON number: int or float, not bool (the decoder makes no other subclass)
        fields |= {k: f for k in ("ts", "dur") if (f := _float(obj.get(k))) is not None}
        fields |= {k: obj.get(k) for k in ("pid", "tid")}
        args = obj.get("args")
        if isinstance(args, dict):
            kept = {k: v for k, v in args.items() if k not in INT_ARGS and k not in RAW_ARGS}
            kept |= {k: n for k in INT_ARGS if (n := _int(args.get(k))) is not None}
            kept |= {k: _raw(args[k]) for k in RAW_ARGS if k in args}
            fields["args"] = kept
        try:
            out.append(msgspec.convert(fields, _Event, strict=False))
        except msgspec.ValidationError:  # a field beyond what the struct holds: the event is skipped, as a bad one
            continue
    return out


def _raw(value: Any) -> msgspec.Raw:
    try:
        return msgspec.Raw(msgspec.json.encode(value))
    except (msgspec.EncodeError, OverflowError, RecursionError):  # an int beyond 64 bits, nesting too deep
        return msgspec.Raw(b"")


def read_trace(path: Path, op_pattern: re.Pattern[str], chunk_bytes: int = CHUNK_BYTES) -> RankTrace:
    """Read one rank's trace file. Raises TraceFileError when it is unreadable or not a Kineto trace."""
    try:
        size = path.stat().st_size
        stream = _open(path, size)
    except OSError as exc:
        raise TraceFileError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    with stream:
        trace = read_trace_stream(stream, op_pattern, str(path), chunk_bytes)
    trace.size_bytes = size
    return trace


def read_trace_stream(
    stream: ByteStream, op_pattern: re.Pattern[str], name: str, chunk_bytes: int = CHUNK_BYTES
) -> RankTrace:
    trace = RankTrace(path=name)
    sink = _Sink(trace, op_pattern)
    r = _Reader(stream, name, chunk_bytes)
    c = r.skip_ws()
    if c != ord("{"):
        what = "an empty file" if c is None else "JSON that is not an object"
        if c is not None and c not in b'["-0123456789tfn':
            what = "not JSON"
        raise TraceFileError(f"{name}: {what}, not a PyTorch profiler trace")
    r.pos += 1
    saw_events = False
    while True:
        c = r.skip_ws()
        if c == ord("}"):
            break
        if c is None:
            raise TraceFileError(f"{name}: the file ends early (truncated)")
        if c == ord(","):
            r.pos += 1
            continue
        key = r.value()
        if not isinstance(key, str):
            raise TraceFileError(f"{name}: not valid JSON near byte {r.pos}")
        r.expect(b":", "':' after a key")
        if key == "traceEvents":
            if r.skip_ws() != ord("["):
                raise TraceFileError(f"{name}: traceEvents is not a list, not a PyTorch profiler trace")
            r.pos += 1
            _events(r, sink)
            saw_events = True
        else:
            trace.top[key] = r.value()
            if key == "deviceProperties" and trace.top[key]:
                sink.cpu_timeline = False  # a GPU run: no CPU timeline to keep
    if not saw_events:
        raise TraceFileError(f"{name}: JSON without traceEvents, not a PyTorch profiler (Kineto) trace")
    return trace
