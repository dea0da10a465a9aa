"""The streaming trace reader gives the same answer whatever its chunk size: cuts that land inside a string or a
nested object fall back (to an earlier boundary, or to the stdlib decoder for one event) and never change a value.

Real fixtures from ../shared/traces, read with chunks of a few hundred bytes (so nearly every event is cut), are
compared with the default 8 MB read: the compact per-rank form field by field, and the whole analysis.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import msgspec
import pytest

import llmdiag.collect.trace.analysis as engine
import llmdiag.collect.trace.reader as tt
from llmdiag.api import analyze_traces
from llmdiag.collect.trace.analysis import classifier
from tests.support.required import SHARED_TRACES as TRACES
from tests.support.required import require_traces

DLRM = TRACES / "param-dlrm-8rank"
FIXTURES = [
    next(DLRM.glob("worker0_*.json.gz"), DLRM / "worker0_*.json.gz"),  # the pattern itself where DLRM is absent
    TRACES / "single/tracelens-mi300x-8gpu-rank0-rccl/resnet_act_checkpoint.json.gz",
    TRACES / "single/tracelens-b200-vllm-tp8-rank0/eager_trace.json.gz",
]
SMALL_CHUNKS = [97, 300, 4093]  # odd sizes, so the cuts wander through every part of the events


@pytest.fixture(autouse=True)
def _shared_traces() -> None:
    require_traces(TRACES)


def _compact(t: tt.RankTrace) -> dict:
    out = dataclasses.asdict(t)
    out.pop("path")
    return out


class _Counting:
    """The events decoder, counting the slices that did not decode (a cut inside a string or nested object)."""

    def __init__(self) -> None:
        self.failed = 0

    def decode(self, data: bytes):
        try:
            return tt.msgspec.json.Decoder(list[tt._Event]).decode(data)
        except msgspec.ValidationError:
            raise
        except msgspec.DecodeError:
            self.failed += 1
            raise


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.parent.name)
@pytest.mark.parametrize("chunk", SMALL_CHUNKS)
def test_small_chunks_read_the_same_trace(path: Path, chunk: int, monkeypatch: pytest.MonkeyPatch):
    ops = classifier().ops
    whole = tt.read_trace(path, ops)
    assert whole.events > 1000
    counting = _Counting()
    monkeypatch.setattr(tt, "_EVENTS", counting)
    cut = tt.read_trace(path, ops, chunk_bytes=chunk)
    assert cut.events == whole.events and len(cut.gpu_ts) == len(whole.gpu_ts)
    assert _compact(cut) == _compact(whole)
    if path.parent == DLRM:  # its args nest objects: some cuts land inside one and are retried earlier
        assert counting.failed > 0


def test_the_one_event_fallback_reads_the_same(monkeypatch: pytest.MonkeyPatch):
    """With a single cut tried per buffer, every badly cut slice goes to the stdlib decoder for one event."""
    ops = classifier().ops
    path = FIXTURES[0]
    whole = tt.read_trace(path, ops)
    calls = 0
    one = tt._decode_one

    def counted(r, sink):
        nonlocal calls
        calls += 1
        return one(r, sink)

    monkeypatch.setattr(tt, "MAX_CUT_TRIES", 1)
    monkeypatch.setattr(tt, "_decode_one", counted)
    cut = tt.read_trace(path, ops, chunk_bytes=300)
    assert calls > 100
    assert _compact(cut) == _compact(whole)


def test_small_chunks_give_the_same_analysis(monkeypatch: pytest.MonkeyPatch):
    def numbers(report) -> dict:
        return report.model_dump(exclude={"parse_seconds"})

    default = analyze_traces([DLRM])
    monkeypatch.setattr(engine, "read_trace", functools.partial(tt.read_trace, chunk_bytes=211))
    small = analyze_traces([DLRM])
    assert [r.rank for r in small.ranks] == list(range(8))
    assert small.straggler is not None and small.straggler.rank == 7
    assert numbers(small) == numbers(default)


def test_an_odd_event_does_not_cost_its_neighbours_their_shapes():
    """An event whose args are not an object sends its slice to the lenient path; the other events keep their raw
    `Input Dims` / `Input type` (the gloo and RCCL message sizes come from them)."""
    import gzip
    import io
    import json

    path = FIXTURES[0]
    ops = classifier().ops
    whole = tt.read_trace(path, ops)
    data = json.loads(gzip.decompress(path.read_bytes()))
    data["traceEvents"].insert(0, {"ph": "X", "cat": "cpu_op", "name": "odd", "ts": 1, "dur": 1, "args": "oops"})
    odd = tt.read_trace_stream(io.BytesIO(json.dumps(data).encode()), ops, "odd")
    assert odd.events == whole.events + 1
    dims = [json.loads(op.input_dims) for op in odd.cpu_comm]
    assert dims == [json.loads(op.input_dims) for op in whole.cpu_comm] and any(dims)


def test_fields_of_unexpected_types_are_read_field_by_field():
    """A kernel whose correlation and stream are written as strings still links to its launch; one whose ts is not a
    number is skipped and counted; neither costs the other events of its slice anything."""
    import gzip
    import io
    import json

    path = FIXTURES[0]
    ops = classifier().ops
    whole = tt.read_trace(path, ops)
    data = json.loads(gzip.decompress(path.read_bytes()))
    events = data["traceEvents"]
    k = next(i for i, e in enumerate(events) if e.get("cat") == "kernel" and "correlation" in e.get("args", {}))
    args = events[k]["args"]
    args["correlation"], args["stream"] = str(args["correlation"]), str(args["stream"])
    events.insert(k + 1, {**events[k], "ts": "soon", "args": dict(args)})
    odd = tt.read_trace_stream(io.BytesIO(json.dumps(data).encode()), ops, "odd")
    assert odd.events == whole.events + 1 and odd.skipped_events == whole.skipped_events + 1
    assert list(odd.gpu_corr) == list(whole.gpu_corr) and list(odd.gpu_stream) == list(whole.gpu_stream)
    assert list(odd.gpu_ts) == list(whole.gpu_ts) and odd.launches == whole.launches
