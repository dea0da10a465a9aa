"""Bombs are refused at a cap, in plain words (issue 19 §2): a gzip trace that decompresses without end, an event
that never closes, a page of 10^6 series and a page where one label takes 10^5 values. Each ends as one ERROR and
one HINT line at the CLI (exit 2, the exit of every refused input), never a traceback, a swap storm or a hang.

The inputs are built here (a bomb is not something to keep as a fixture); what each test asserts is the refusal and
how much was read before it, never how long it took.
"""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import pytest

from llmdiag.collect.exposition import MAX_LABEL_VALUES, MAX_SERIES, parse_exposition, parse_pasted
from llmdiag.collect.trace import reader as trace_reader
from llmdiag.collect.trace.analysis import classifier
from llmdiag.errors import ResponseTooLargeError, TraceFileError
from tests.conftest import run_cli
from tests.support.required import SHARED_TRACES, TRACES_ENV, require_tool

MiB = 1 << 20


def _gzip_bomb(path: Path, decompressed_bytes: int) -> Path:
    """A trace that opens like Kineto's and then is blanks without end: megabytes of gzip per gigabyte."""
    block = b" " * MiB
    with gzip.open(path, "wb", compresslevel=9) as out:
        out.write(b'{"schemaVersion": 1, "traceEvents": [')
        for _ in range(decompressed_bytes // MiB):
            out.write(block)
    return path


def _lines(cli_output: str, prefix: str) -> list[str]:
    return [line for line in cli_output.splitlines() if line.startswith(prefix)]


def test_a_gzip_bomb_is_refused_at_the_decompression_cap(tmp_path: Path) -> None:
    cap = trace_reader.MIN_GZIP_CAP_BYTES
    bomb = _gzip_bomb(tmp_path / "rank0.json.gz", cap + 16 * MiB)
    compressed = bomb.stat().st_size
    assert (cap + 16 * MiB) / compressed > trace_reader.MAX_GZIP_RATIO  # a bomb by the cap's own measure
    opened = trace_reader._open(bomb, compressed)
    assert isinstance(opened, trace_reader.CappedGzip)
    with opened as stream, pytest.raises(TraceFileError, match="decompression bomb"):
        trace_reader.read_trace_stream(stream, classifier().ops, str(bomb))
    assert stream.given <= stream.cap_bytes + 1  # it stopped at the cap, not at the end of the stream


def test_a_real_trace_is_far_under_the_cap() -> None:
    """The cap's ratio against the real traces: a real gzip trace is read whole, well inside it."""
    traces = sorted(SHARED_TRACES.glob("single/*/*.json.gz"))
    if not traces:
        require_tool(f"{SHARED_TRACES} holds no trace to start from", TRACES_ENV)  # fails in make test
    path = min(traces, key=lambda p: p.stat().st_size)
    size = path.stat().st_size
    with trace_reader._open(path, size) as stream:
        trace = trace_reader.read_trace_stream(stream, classifier().ops, str(path))
        assert trace.events > 0
        assert stream.given < stream.cap_bytes / 4


def test_the_gzip_bomb_at_the_cli_is_one_error_and_one_hint(tmp_path: Path) -> None:
    bomb = _gzip_bomb(tmp_path / "rank0.json.gz", trace_reader.MIN_GZIP_CAP_BYTES + 16 * MiB)
    result = run_cli("trace", str(bomb))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    errors = _lines(result.stderr, "ERROR:")
    assert len(errors) == 1 and "decompression bomb" in errors[0]
    assert len(_lines(result.stderr, "HINT:")) == 1


class _Endless:
    """A stream of one event's opening and then bytes that never close it (a body that never ends)."""

    def __init__(self) -> None:
        self.given = 0

    def read(self, size: int, /) -> bytes:
        first = self.given == 0
        self.given += size
        return b'{"traceEvents": [{"name": "' + b"a" * size if first else b"a" * size


def test_an_event_that_never_closes_is_refused_at_the_event_cap() -> None:
    stream = _Endless()
    with pytest.raises(TraceFileError, match="an event runs past"):
        trace_reader.read_trace_stream(stream, classifier().ops, "rank0.json")
    # the buffer doubles as it reads: it stopped within one doubling of the cap
    assert stream.given <= 4 * trace_reader.MAX_EVENT_BYTES


def _page(series: int, label: str = "i") -> str:
    return "".join(f'vllm:num_requests_running{{{label}="{n}"}} 1\n' for n in range(series))


def test_a_page_of_a_million_series_is_refused_before_it_is_parsed() -> None:
    page = "# TYPE vllm:num_requests_running gauge\n" + _page(10**6)
    for parse in (parse_exposition, parse_pasted):
        with pytest.raises(ResponseTooLargeError, match="1,000,000 lines besides comments, over the cap") as caught:
            parse(page, None, origin="big.prom")
        assert f"{MAX_SERIES:,}" in caught.value.message
        assert "per request or user" in caught.value.hint


def test_a_label_with_a_hundred_thousand_values_is_refused() -> None:
    page = "# TYPE vllm:num_requests_running gauge\n" + _page(10**5, label="request_id")
    assert MAX_SERIES > 10**5  # under the series cap: the label's cap refuses it
    # the live reader's parse here; a saved page's (parse_pasted) through the CLI below
    with pytest.raises(ResponseTooLargeError, match="label 'request_id' takes more than") as caught:
        parse_exposition(page, None, origin="ids.prom")
    assert f"{MAX_LABEL_VALUES:,}" in caught.value.message


def test_a_page_just_under_the_caps_is_read() -> None:
    """The caps refuse bombs, not big real pages: as many values of one label as the cap allows is a page."""
    page = "# TYPE vllm:num_requests_running gauge\n" + _page(MAX_LABEL_VALUES)
    scrape = parse_exposition(page, None)
    assert len(scrape.series["vllm:num_requests_running"]) == MAX_LABEL_VALUES


@pytest.mark.parametrize(
    ("lines", "label", "said"),
    [(10**6, "i", "lines besides comments"), (10**5, "request_id", "label 'request_id' takes more than")],
)
def test_the_page_caps_at_the_cli_are_one_error_and_one_hint(tmp_path: Path, lines: int, label: str, said: str) -> None:
    path = tmp_path / "big.prom"
    path.write_text(_page(lines, label), encoding="utf-8")
    result = run_cli("analyze", str(path), "--max-metrics-bytes", str(64 * MiB))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    errors = _lines(result.stderr, "ERROR:")
    assert len(errors) == 1 and said in errors[0]
    assert len(_lines(result.stderr, "HINT:")) == 1


def test_the_live_reader_refuses_the_same_page() -> None:
    """A scrape goes through parse_exposition: the cap holds for a live page as for a file (the byte cap aside)."""
    text = io.StringIO(_page(MAX_SERIES + 1)).getvalue()
    with pytest.raises(ResponseTooLargeError):
        parse_exposition(text, 1.0, origin="http://gpu-7:8000/metrics")
