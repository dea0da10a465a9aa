"""The files of one incident, whatever they are: each told apart by what it holds (not by its name or first line),
read by its kind's reader, and combined into one SignalSet.

``KINDS`` is the table: a kind's name, its words, a test on the file's head (unquoted data lines, so a paste's
prose, fences and ``>`` quotes do not matter) and its reader. The first kind whose test passes takes the file;
the files of one kind are read together (two dumps make a window, logs of several processes one timeline).
Combining: the logs give the server's window; the dumps, then the GPU pages add the signals the logs lack (the
first source of a signal wins, an unavailable one gives way to a measured one), and each source's coverage line
says which signals it gave. A file with no data at all is the only refusal.

A reader for another kind of evidence is one row (``Kind``) with a test and a reader of the same shape.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from llmdiag.collect.exposition import ATTEMPT_RE, sample_name
from llmdiag.collect.files import (
    DEFAULT_MAX_BYTES,
    DUMP_HINT,
    collect_dcgm_pages,
    collect_files,
    read_text,
    reading,
)
from llmdiag.collect.merge import COLLECTOR_COUNTS, merge_signal_sets
from llmdiag.collect.paste import data_lines
from llmdiag.errors import InputFileError, UsageError, option
from llmdiag.model import Signal, SignalSet, SourceInfo
from llmdiag.schema.loader import load_probe

HEAD_BYTES = 256 * 1024
LOG_MAX_BYTES = 256 * 1024 * 1024
NO_DATA_HINT = (
    "give what the server printed: its /metrics page (curl -s URL/metrics > metrics.prom), its log with the stat "
    "lines, or a dcgm-exporter page; prose, quotes and code fences around them are fine"
)
# the signal vocabulary a set without any server source lists as unavailable
VOCABULARY_PROBE = "vllm"


@dataclass
class Head:
    """What a kind's test sees of a file: its path, its first bytes and their data lines."""

    path: Path
    text: str
    lines: list[str]
    metric_names: set[str] = field(default_factory=set)


@dataclass
class ReadOptions:
    server: str | None = None  # the server's probe, or None: detected
    since: str | None = None  # logs only
    until: str | None = None
    max_bytes: int | None = None  # None: each kind's own cap


Reader = Callable[[list[Path], ReadOptions], SignalSet]


@dataclass(frozen=True)
class Kind:
    name: str
    words: str
    test: Callable[[Head], bool]
    read: Reader
    server: bool  # gives the server's own signals (not only the GPUs')


def _server_prefixes() -> tuple[str, ...]:
    from llmdiag.collect.detect import server_probes

    return tuple(p for spec in server_probes() for p in spec.detect_prefixes)


def _is_server_page(head: Head) -> bool:
    prefixes = _server_prefixes()
    return any(name.startswith(prefixes) for name in head.metric_names)


def _is_dcgm_page(head: Head) -> bool:
    return any(name.startswith("DCGM_") for name in head.metric_names)


def _is_trtllm_json(head: Head) -> bool:
    # a JSON array opens with '[' alone or '[{'; '[TensorRT-LLM][INFO]' or '[2026-…' opens a log line
    opens = next((i for i, line in enumerate(head.lines) if line == "[" or line.startswith("[{")), None)
    return opens is not None and any('"iter"' in line for line in head.lines[opens:])


def _is_unreadable_page(head: Head) -> bool:
    """Lines that set out to be metric samples (elided labels, cut off) and make up most of the data: a page, whose
    reader then says it has no readable sample."""
    data = [line for line in head.lines if line and not line.startswith("#")]
    attempts = sum(1 for line in data if ATTEMPT_RE.match(line))
    return attempts > 0 and 2 * attempts >= len(data)


def _holds_log_record(head: Head) -> bool:
    from llmdiag.collect.log_lines import holds_record
    from llmdiag.schema.logs import load_log_spec

    return holds_record(head.text, load_log_spec(), json=False)


def _is_log(head: Head) -> bool:
    """Anything else that does not start like a page: read as a log, whose reader then says which stat lines it
    lacks (a stat record was looked for already, by the strict log row)."""
    from llmdiag.collect.logs import starts_like_a_dump

    return not starts_like_a_dump(head.text)


def _is_any_page(head: Head) -> bool:
    return bool(head.metric_names)


def _read_dumps(paths: list[Path], options: ReadOptions) -> SignalSet:
    return collect_files(paths, probe=options.server, max_bytes=options.max_bytes or DEFAULT_MAX_BYTES)


def _read_logs(paths: list[Path], options: ReadOptions) -> SignalSet:
    from llmdiag.collect.logs import collect_logs

    cap = options.max_bytes or LOG_MAX_BYTES
    return collect_logs(paths, since=options.since, until=options.until, max_bytes=cap, server=options.server)


def _read_dcgm(paths: list[Path], options: ReadOptions) -> SignalSet:
    return collect_dcgm_pages(paths, max_bytes=options.max_bytes or DEFAULT_MAX_BYTES)


def _is_nvidia_smi(head: Head) -> bool:
    from llmdiag.collect.telemetry.nvidia_smi import looks_like_nvidia_smi

    return looks_like_nvidia_smi(head.text)


def _is_nccl_log(head: Head) -> bool:
    from llmdiag.collect.nccl.logs import looks_like_nccl_log

    return looks_like_nccl_log(head.text)


def _is_nccl_tests(head: Head) -> bool:
    from llmdiag.collect.nccl.tests_output import looks_like_nccl_tests

    return looks_like_nccl_tests(head.text)


def _read_nccl_tests(paths: list[Path], options: ReadOptions) -> SignalSet:
    from llmdiag.collect.nccl.tests_output import collect_nccl_tests

    return each(collect_nccl_tests)(paths, options)


def _is_ib_ports(head: Head) -> bool:
    from llmdiag.collect.telemetry.ib_ports import looks_like_ib_ports

    return looks_like_ib_ports(head.text)


def _read_ib_ports(paths: list[Path], options: ReadOptions) -> SignalSet:
    from llmdiag.collect.telemetry.ib_ports import collect_ib_ports

    return each(collect_ib_ports)(paths, options)


def _read_nvidia_smi(paths: list[Path], options: ReadOptions) -> SignalSet:
    from llmdiag.collect.telemetry.nvidia_smi import collect_nvidia_smi

    return each(collect_nvidia_smi)(paths, options)


def _read_nccl_logs(paths: list[Path], options: ReadOptions) -> SignalSet:
    from llmdiag.collect.nccl.logs import collect_nccl_log

    return each(collect_nccl_log)(paths, options)


def _nccl_lines_with_numbers(head: Head) -> bool:
    """NCCL's lines inside a file of another kind, read beside it where they say something (a version, a transport,
    a warning): number-free ones (plugin notices) are not worth a source of their own."""
    from llmdiag.collect.nccl.logs import looks_like_nccl_log, parse_nccl_log

    return looks_like_nccl_log(head.text) and parse_nccl_log(head.text).has_numbers()


NCCL_LOG = Kind("nccl-log", "NCCL log", _is_nccl_log, _read_nccl_logs, False)
# in the order they are tried; the first whose test passes takes the file
NVIDIA_SMI = Kind("nvidia-smi", "nvidia-smi output", _is_nvidia_smi, _read_nvidia_smi, False)
NCCL_TESTS = Kind("nccl-tests", "nccl-tests output", _is_nccl_tests, _read_nccl_tests, False)
IB_PORTS = Kind("ib-ports", "InfiniBand port listing (ibstatus, ibstat)", _is_ib_ports, _read_ib_ports, False)
KINDS: tuple[Kind, ...] = (
    Kind("dump", "server /metrics dump", _is_server_page, _read_dumps, True),
    Kind("dcgm", "DCGM exporter page", _is_dcgm_page, _read_dcgm, False),
    Kind("dump", "TensorRT-LLM JSON iteration stats", _is_trtllm_json, _read_dumps, True),
    Kind("dump", "metrics page without a readable sample", _is_unreadable_page, _read_dumps, True),
    Kind("log", "server log", _holds_log_record, _read_logs, True),
    NVIDIA_SMI,
    NCCL_TESTS,
    IB_PORTS,
    NCCL_LOG,
    Kind("dump", "metrics page of an unrecognised server", _is_any_page, _read_dumps, True),
    Kind("log", "server log", _is_log, _read_logs, True),
)
# kinds read from a file beside the kind that took it: one pasted comment often holds the server's log and
# nvidia-smi's table, nccl-tests' rows or NCCL's own lines (transports, watchdog timeouts), each worth its reader
COMPANIONS: tuple[Kind, ...] = (
    NVIDIA_SMI,
    NCCL_TESTS,
    IB_PORTS,
    Kind("nccl-log", "NCCL log", _nccl_lines_with_numbers, _read_nccl_logs, False),
)
# the order sources are combined in: the logs' window first, then the server's pages, then the GPUs and the links
COMBINE_ORDER = ("log", "dump", "dcgm", "nvidia-smi", "nccl-tests", "ib-ports", "nccl-log")


def each(collect: Callable[[str, str], SignalSet]) -> Reader:
    """A reader of kinds read one file at a time (``collect(text, origin)``), their sets merged in file order."""

    def read(paths: list[Path], options: ReadOptions) -> SignalSet:
        merged: SignalSet | None = None
        for path in paths:
            part = collect(read_text(path, options.max_bytes or DEFAULT_MAX_BYTES), os.fspath(path))
            merged = part if merged is None else merge_signal_sets(merged, part)
        assert merged is not None
        return merged

    return read


def read_head(path: Path) -> Head:
    """A file's first bytes as a kind's test sees them; a missing, unreadable or empty file is refused here."""
    with reading(path):
        if path.is_dir():
            raise InputFileError(f"{path} is a directory, not a metrics dump")
        with path.open("rb") as handle:
            raw = handle.read(HEAD_BYTES)
    if b"\0" in raw:
        raise InputFileError(f"{path} is a binary file, not text", NO_DATA_HINT)
    text = raw.decode("utf-8", errors="replace")
    lines = data_lines(text)
    if len(raw) == HEAD_BYTES and lines:
        lines.pop()  # cut at the read size: the last line may be cut off
    names = {name for name in map(sample_name, lines) if name}
    return Head(path=path, text=text, lines=lines, metric_names=names)


def classify(head: Head) -> Kind:
    """The file's kind: the first row of ``KINDS`` whose test passes; a file with no data is refused."""
    if not head.text.strip():
        raise InputFileError(f"{head.path} is empty", DUMP_HINT)
    if not any(ch.isdigit() for line in head.lines for ch in line):
        # every metric and every stat line carries numbers: prose, quotes and fences alone are no evidence
        said = [line[:60] for line in head.lines if line][:2]
        what = f"it starts: {' | '.join(said)}" if said else "only Markdown fences and quote marks"
        raise InputFileError(f"{head.path} holds no metric or log lines ({what})", NO_DATA_HINT)
    for kind in KINDS:
        if kind.test(head):
            return kind
    said = [line[:60] for line in head.lines if line][:2]
    raise InputFileError(f"{head.path} holds no metric or log lines (it starts: {' | '.join(said)})", NO_DATA_HINT)


@dataclass
class Evidence:
    """The given files by kind, in the order given."""

    files: dict[str, list[Path]] = field(default_factory=dict)
    kinds: dict[str, Kind] = field(default_factory=dict)

    def add(self, path: Path, kind: Kind) -> None:
        self.files.setdefault(kind.name, []).append(path)
        self.kinds.setdefault(kind.name, kind)


def sort_files(paths: list[Path]) -> Evidence:
    evidence = Evidence()
    for path in paths:
        head = read_head(path)
        kind = classify(head)
        evidence.add(path, kind)
        for companion in COMPANIONS:
            if companion.name != kind.name and companion.test(head):
                evidence.add(path, companion)
    return evidence


def describe_files(paths: list[Path], evidence: Evidence) -> str:
    """The files as a verdict's target: the one path, or how many of what, first … last."""
    if len(paths) == 1:
        return str(paths[0])
    word = {"dump": "dumps", "log": "logs", "dcgm": "DCGM pages"}.get(next(iter(evidence.files)), "files")
    return f"{len(paths)} {word if len(evidence.files) == 1 else 'files'}: {paths[0]} … {paths[-1]}"


def collect_evidence(
    paths: list[Path], options: ReadOptions | None = None, evidence: Evidence | None = None
) -> SignalSet:
    """Every file read by its kind and the parts combined (see the module docstring); ``evidence``: the files
    already sorted (``sort_files``)."""
    options = options or ReadOptions()
    if not paths:
        raise UsageError("no files given", "llmdiag analyze FILE [FILE …] (logs, /metrics dumps, DCGM pages)")
    evidence = evidence or sort_files(paths)
    if (options.since is not None or options.until is not None) and "log" not in evidence.files:
        raise UsageError(
            f"{option('since')}/{option('until')} apply to server logs, and none of the files is one",
            "leave them out for dumps and GPU pages",
        )
    order = [k for k in COMBINE_ORDER if k in evidence.files] + [k for k in evidence.files if k not in COMBINE_ORDER]
    parts = [evidence.kinds[name].read(evidence.files[name], options) for name in order]
    own = [(dict(part.signals), list(part.sources)) for part in parts]  # before the first set takes the others
    combined = parts[0]
    for part in parts[1:]:
        merge_signal_sets(combined, part)
    if len(parts) > 1:
        _say_what_each_gave(combined, own)
    if not any(evidence.kinds[name].server for name in order):
        no_server(combined, [evidence.kinds[name].words for name in order])
    return combined


SHOWN_SIGNALS = 6


def _say_what_each_gave(combined: SignalSet, parts: list[tuple[dict[str, Signal], list[SourceInfo]]]) -> None:
    """Each source's coverage line names the signals the combined set took from it."""
    for signals, sources in parts:
        gave = sorted(
            name
            for name, s in signals.items()
            if combined.signals.get(name) is s and s.unavailable is None and name not in COLLECTOR_COUNTS
        )
        more = len(gave) - SHOWN_SIGNALS
        shown = ", ".join(gave[:SHOWN_SIGNALS]) + (f" +{more} more" if more > 0 else "")
        said = f"gave {len(gave)} signal{'s' if len(gave) != 1 else ''}" + (f" ({shown})" if gave else "")
        for source in sources:
            source.note = f"{source.note}; {said}" if source.note else said


def no_server(combined: SignalSet, words: list[str]) -> None:
    """Only GPU telemetry: the server's signals are unavailable, and say why (never zero, never idle)."""
    reason = f"no server page or log given (only {', '.join(words)})"
    for spec in load_probe(VOCABULARY_PROBE).signal:
        if spec.name not in combined.signals:
            combined.add(Signal.missing(spec.name, spec.kind, spec.unit, reason))
