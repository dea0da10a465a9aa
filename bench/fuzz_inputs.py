"""Hypothesis strategies for the parser fuzz tests: real inputs from tests/fixtures (and ../shared/traces), mutated the
ways pasted and served data goes wrong, and inputs built from scratch.

The mutations (issue 19 §2): truncate, splice two inputs, duplicate a span, reorder lines, flip bytes, huge numbers,
NaN/Inf, odd Unicode, CRLF. Each draws its positions from hypothesis, so a failing example shrinks and replays.
Shared by tests/fuzz/ (a bounded, derandomized run) and bench/fuzz.py (a long one) through ``TARGETS``.
"""

from __future__ import annotations

import gzip
import re
from functools import cache
from pathlib import Path

from hypothesis import strategies as st

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT / "tests" / "fixtures"
SHARED_TRACES = REPO_ROOT.parent / "shared" / "traces"
# a seed larger than this is cut at a line boundary: the fuzz run is about shapes, not bulk
SEED_BYTES = 24 * 1024

HUGE_NUMBERS = [b"1e308", b"1e309", b"-1e309", b"99999999999999999999999999", b"-0", b"4294967295", b"1" * 400]
NON_FINITE = [b"NaN", b"nan", b"+Inf", b"-Inf", b"inf", b"Infinity", b"-nan"]
ODD_UNICODE = [
    "\ufeff",  # a byte-order mark
    "\u202e",  # right-to-left override
    "\u200b",  # zero-width space
    "\u00a0",  # no-break space
    "\u2028",  # line separator (splitlines() breaks there, '\n'-splitting does not)
    "\x85",  # NEL, another splitlines() break
    "\x0b\x0c",  # vertical tab, form feed
    "\u0661\u0662",  # Arabic-Indic digits (str.isdigit() says yes, float() reads them)
    "\uff11",  # a fullwidth digit
    "\U0001f600",
    "é",
    "\u0000",
    "\ufffd",
]
NUMBER_RE = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _cut(data: bytes, limit: int = SEED_BYTES) -> bytes:
    if len(data) <= limit:
        return data
    end = data.rfind(b"\n", 0, limit)
    return data[: end + 1 if end > 0 else limit]


@cache
def seeds(*patterns: str) -> tuple[bytes, ...]:
    """The fixtures matching the glob patterns (under tests/fixtures), each cut to ``SEED_BYTES``."""
    found: list[bytes] = []
    for pattern in patterns:
        for path in sorted(FIXTURES.glob(pattern)):
            if path.is_file() and path.name not in ("README.md", "case.toml", "meta.json"):
                found.append(_cut(path.read_bytes()))
    if not found:
        raise FileNotFoundError(f"no fixture matches {patterns}")
    return tuple(found)


@cache
def repo_files(*patterns: str) -> tuple[tuple[str, bytes], ...]:
    """Files of the repository itself (rules/, probes/, an example llmdiag.toml) with their paths."""
    return tuple(
        (str(p.relative_to(REPO_ROOT)), p.read_bytes())
        for pattern in patterns
        for p in sorted(REPO_ROOT.glob(pattern))
        if p.is_file()
    )


@cache
def trace_seeds() -> tuple[bytes, ...]:
    """Real Kineto traces from ../shared/traces, each cut to its first events and closed again, so the seed is a
    whole trace of real events, small enough to read many times. Empty where the traces are not next to the
    checkout."""
    out: list[bytes] = []
    for path in sorted(SHARED_TRACES.glob("**/*.json.gz"))[:6]:
        with gzip.open(path, "rb") as handle:
            head = handle.read(64 * 1024)
        start = head.find(b'"traceEvents"')
        if start < 0:
            continue
        # the last event boundary in the head: '}' then ',' (events are written one per line or back to back)
        cut = head.rfind(b"},", start)
        if cut < 0:
            continue
        out.append(head[: cut + 1] + b"\n]}\n" if head.lstrip().startswith(b"{") else b"")
    return tuple(s for s in out if s)


# ----------------------------------------------------------------------------------------------------------------
# mutations: each takes hypothesis' draw, the data and the other seeds (for a splice)


def _truncate(draw: st.DrawFn, data: bytes, others: tuple[bytes, ...]) -> bytes:
    return data[: draw(st.integers(0, len(data)))]


def _splice(draw: st.DrawFn, data: bytes, others: tuple[bytes, ...]) -> bytes:
    other = draw(st.sampled_from(others))
    at, frm = draw(st.integers(0, len(data))), draw(st.integers(0, len(other)))
    return data[:at] + other[frm:]


def _duplicate(draw: st.DrawFn, data: bytes, others: tuple[bytes, ...]) -> bytes:
    start = draw(st.integers(0, len(data)))
    end = draw(st.integers(start, min(len(data), start + 4096)))
    times = draw(st.integers(1, 8))
    return data[:end] + data[start:end] * times + data[end:]


def _reorder(draw: st.DrawFn, data: bytes, others: tuple[bytes, ...]) -> bytes:
    """Lines swapped, or a block of lines moved elsewhere (indices drawn, so thousands of lines cost a few draws)."""
    lines = data.split(b"\n")
    if len(lines) < 2:
        return data
    last = len(lines) - 1
    for _ in range(draw(st.integers(1, 8))):
        i, j = draw(st.integers(0, last)), draw(st.integers(0, last))
        if draw(st.booleans()):
            lines[i], lines[j] = lines[j], lines[i]
        else:
            start, end = min(i, j), max(i, j) + 1
            block, rest = lines[start:end], lines[:start] + lines[end:]
            at = draw(st.integers(0, len(rest)))
            lines = rest[:at] + block + rest[at:]
    return b"\n".join(lines)


def _flip(draw: st.DrawFn, data: bytes, others: tuple[bytes, ...]) -> bytes:
    if not data:
        return data
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 8))):
        at = draw(st.integers(0, len(out) - 1))
        out[at] ^= 1 << draw(st.integers(0, 7))
    return bytes(out)


def _numbers(draw: st.DrawFn, data: bytes, others: tuple[bytes, ...], pool: list[bytes]) -> bytes:
    spans = [m.span() for m in NUMBER_RE.finditer(data)]
    if not spans:
        return data + draw(st.sampled_from(pool))
    out = data
    chosen = {spans[draw(st.integers(0, len(spans) - 1))] for _ in range(draw(st.integers(1, 6)))}
    for start, end in sorted(chosen, reverse=True):  # from the end, so the earlier spans stay where they were
        out = out[:start] + draw(st.sampled_from(pool)) + out[end:]
    return out


def _huge(draw: st.DrawFn, data: bytes, others: tuple[bytes, ...]) -> bytes:
    return _numbers(draw, data, others, HUGE_NUMBERS)


def _non_finite(draw: st.DrawFn, data: bytes, others: tuple[bytes, ...]) -> bytes:
    return _numbers(draw, data, others, NON_FINITE)


def _unicode(draw: st.DrawFn, data: bytes, others: tuple[bytes, ...]) -> bytes:
    out = data
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(out)))
        odd = draw(st.sampled_from(ODD_UNICODE) | st.text(min_size=1, max_size=3)).encode("utf-8", "surrogatepass")
        out = out[:at] + odd + out[at:]
    return out


def _crlf(draw: st.DrawFn, data: bytes, others: tuple[bytes, ...]) -> bytes:
    return data.replace(b"\n", draw(st.sampled_from([b"\r\n", b"\r", b"\n\n", b"\r\r\n"])))


def _nest(draw: st.DrawFn, data: bytes, others: tuple[bytes, ...]) -> bytes:
    """Brackets nested deeper than Python's stack (json's decoders recurse), at a drawn position."""
    at = draw(st.integers(0, len(data)))
    opener = draw(st.sampled_from([b"[", b'{"a":', b'{"args":']))
    return data[:at] + opener * draw(st.sampled_from([100, 5000, 100_000])) + data[at:]


MUTATIONS = {
    "truncate": _truncate,
    "splice": _splice,
    "duplicate": _duplicate,
    "reorder": _reorder,
    "flip": _flip,
    "huge": _huge,
    "nonfinite": _non_finite,
    "unicode": _unicode,
    "crlf": _crlf,
    "nest": _nest,
}


@st.composite
def mutated(draw: st.DrawFn, pool: tuple[bytes, ...], max_mutations: int = 3) -> bytes:
    """A seed from ``pool`` with 0 to ``max_mutations`` mutations applied in turn."""
    data = draw(st.sampled_from(pool))
    for name in draw(st.lists(st.sampled_from(sorted(MUTATIONS)), max_size=max_mutations)):
        data = MUTATIONS[name](draw, data, pool)
    return data


# ----------------------------------------------------------------------------------------------------------------
# from scratch: an exposition page made of plausible and implausible lines

NAMES = st.sampled_from(["vllm:num_requests_running", "vllm:e2e_request_latency_seconds_bucket", "a", "_", "a:b"])
LABEL_VALUES = st.text(max_size=8) | st.sampled_from(["+Inf", "0.5", 'x"y', "a\\nb", ""])
VALUES = st.sampled_from([b"0", b"1", b"-1", b"1e308", b"NaN", b"+Inf", b"-Inf", b"0x10", b"1_000", b""]) | st.floats(
    allow_nan=True
).map(lambda f: repr(f).encode())


@st.composite
def exposition_line(draw: st.DrawFn) -> bytes:
    name = draw(NAMES | st.from_regex(r"[A-Za-z_:][A-Za-z0-9_:]{0,12}", fullmatch=True))
    kind = draw(st.sampled_from(["sample", "labelled", "type", "help", "junk", "openmetrics"]))
    if kind == "openmetrics":  # OpenMetrics' own lines: the end marker, units, an exemplar, a _created sample
        return draw(
            st.sampled_from(
                [
                    b"# EOF",
                    f"# UNIT {name} seconds".encode(),
                    f'{name}_bucket{{le="0.5"}} 3 # {{trace_id="4bf92f3577b34da6"}} 0.31 1764547200.123'.encode(),
                    f"{name}_created 1764547200.0".encode(),
                    f"# TYPE {name} stateset".encode(),
                ]
            )
        )
    if kind == "type":
        return (
            f"# TYPE {name} {draw(st.sampled_from(['counter', 'gauge', 'histogram', 'summary', 'info', 'x']))}".encode()
        )
    if kind == "help":
        return f"# HELP {name} {draw(st.text(max_size=20))}".encode("utf-8", "surrogatepass")
    if kind == "junk":
        return draw(st.binary(max_size=40))
    value = draw(VALUES)
    if kind == "sample":
        return name.encode() + b" " + value
    labels = draw(st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True), LABEL_VALUES, max_size=3))
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}} ".encode("utf-8", "surrogatepass") + value


exposition_from_scratch = st.lists(exposition_line(), max_size=30).map(lambda lines: b"\n".join(lines) + b"\n")


def as_text(data: bytes) -> str:
    """What a reader of a saved file sees: the bytes as UTF-8 with bad sequences replaced (read_text's way)."""
    return data.decode("utf-8", errors="replace")


# ----------------------------------------------------------------------------------------------------------------
# Prometheus query API answers, built from a real page's series and values (what a Prometheus scraping that server
# would answer), then mutated as bytes


def _page_series(page: bytes) -> list[tuple[dict[str, str], str]]:
    from llmdiag.collect.exposition import parse_pasted

    scrape = parse_pasted(as_text(page), None)
    out = []
    for name, by_labels in scrape.series.items():
        for key, value in by_labels.items():
            labels = {"__name__": name, "instance": "10.0.0.7:8000", "job": "vllm", "pod": "vllm-0", **dict(key)}
            out.append((labels, repr(value)))
    return out


@cache
def prometheus_answers() -> tuple[bytes, ...]:
    """JSON bodies of /api/v1/series, /query (vector) and /query_range (matrix) over a real vLLM page's series,
    plus the error, warning and empty answers Prometheus, Mimir and Thanos give (their documented shapes)."""
    import json

    series = _page_series(seeds("vllm-0.32.0/memory/scrape-0[12].prom")[0])[:40]
    at = 1764547200.0
    vector = [{"metric": labels, "value": [at, value]} for labels, value in series]
    matrix = [{"metric": labels, "values": [[at - 15 * i, value] for i in range(4)]} for labels, value in series]
    bodies = [
        {"status": "success", "data": [labels for labels, _ in series]},
        {"status": "success", "data": {"resultType": "vector", "result": vector}},
        {"status": "success", "data": {"resultType": "matrix", "result": matrix}},
        {"status": "success", "data": {"resultType": "scalar", "result": [at, "1"]}},
        {
            "status": "success",
            "warnings": ["partial data: store unavailable"],
            "data": {"resultType": "vector", "result": vector[:3]},
        },
        {"status": "error", "errorType": "execution", "error": "query processing would load too many samples"},
        {"status": "success", "data": {"resultType": "vector", "result": []}},
    ]
    return tuple(json.dumps(b).encode() for b in bodies)


class FakeResponse:
    """What PrometheusSource reads of a requests.Response."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status_code = status
        self.reason = "OK" if status == 200 else "Error"
        self.is_redirect = False
        self.headers: dict[str, str] = {}
        self._body = body

    def json(self) -> object:
        import json

        return json.loads(self._body)  # requests raises a ValueError subclass, as json does

    def __enter__(self) -> FakeResponse:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class FakeSession:
    """Answers each query API call with the next of the drawn (status, body) pairs, in turn."""

    def __init__(self, answers: list[tuple[int, bytes]]) -> None:
        self.answers = answers
        self.calls = 0
        self.verify = True

    def _next(self) -> FakeResponse:
        status, body = self.answers[self.calls % len(self.answers)]
        self.calls += 1
        return FakeResponse(status, body)

    def post(self, url: str, data: object = None, timeout: object = None, **options: object) -> FakeResponse:
        return self._next()

    def get(self, url: str, params: object = None, timeout: object = None, **options: object) -> FakeResponse:
        return self._next()

    def close(self) -> None:
        return None


prometheus_exchanges = st.lists(
    st.tuples(st.sampled_from([200, 200, 200, 400, 422, 503]), st.deferred(lambda: mutated(prometheus_answers()))),
    min_size=1,
    max_size=6,
)


# ----------------------------------------------------------------------------------------------------------------
# the targets: name → (strategy, call). A call returns normally or raises an LlmdiagError; anything else is a crash.


def _write(tmp: Path, name: str, data: bytes) -> Path:
    path = tmp / name
    path.write_bytes(data)
    return path


def run_exposition_live(data: bytes, tmp: Path) -> None:
    from llmdiag.collect.exposition import parse_exposition

    parse_exposition(as_text(data), 1764547200.0)


def run_exposition_pasted(data: bytes, tmp: Path) -> None:
    from llmdiag.collect.exposition import parse_pasted

    parse_pasted(as_text(data), None)


def run_analyze(data: bytes, tmp: Path) -> None:
    """`llmdiag analyze FILE`'s library path: the file told apart by what it holds and read by its kind."""
    from llmdiag.collect.evidence import collect_evidence

    collect_evidence([_write(tmp, "evidence.txt", data)])


def run_logs(data: bytes, tmp: Path) -> None:
    from llmdiag.collect.logs import collect_logs

    collect_logs([_write(tmp, "server.log", data)])


def run_trtllm_json(data: bytes, tmp: Path) -> None:
    from llmdiag.collect.servers.trtllm import parse_iteration_stats, signals_from_scrapes

    signals_from_scrapes([parse_iteration_stats(as_text(data), None, origin="stats.json")], "stats.json")


def run_nvidia_smi(data: bytes, tmp: Path) -> None:
    from llmdiag.collect.telemetry.nvidia_smi import collect_nvidia_smi

    collect_nvidia_smi(as_text(data), "nvidia-smi.txt")


def run_nccl_log(data: bytes, tmp: Path) -> None:
    from llmdiag.collect.nccl.logs import collect_nccl_log

    collect_nccl_log(as_text(data), "nccl.log")


def run_nccl_tests(data: bytes, tmp: Path) -> None:
    from llmdiag.collect.nccl.tests_output import collect_nccl_tests

    collect_nccl_tests(as_text(data), "all_reduce_perf.txt")


def run_ib_ports(data: bytes, tmp: Path) -> None:
    from llmdiag.collect.telemetry.ib_ports import collect_ib_ports

    collect_ib_ports(as_text(data), "ibstat.txt")


def _trace(stream: object) -> None:
    from llmdiag.collect.trace.analysis import classifier
    from llmdiag.collect.trace.reader import read_trace_stream

    read_trace_stream(stream, classifier().ops, "rank0.json")  # type: ignore[arg-type]


def run_trace(data: bytes, tmp: Path) -> None:
    """The streaming reader on the plain file, then `llmdiag trace`'s analysis of it as a file."""
    import io

    from llmdiag.collect.trace.analysis import analyze

    _trace(io.BytesIO(data))
    analyze([_write(tmp, "rank0.json", data)])


def run_trace_gzip(data: bytes, tmp: Path) -> None:
    """The gzip path: a compressed trace (the mutations applied to the compressed bytes too, by the strategy)."""
    from llmdiag.collect.trace.analysis import analyze

    analyze([_write(tmp, "rank0.json.gz", data)])


def run_prometheus(exchanges: list[tuple[int, bytes]], tmp: Path) -> None:
    from llmdiag.collect.prometheus.api import PrometheusSource
    from llmdiag.collect.prometheus.build import collect_prometheus

    source = PrometheusSource(url="http://prometheus.invalid:9090")
    source._session = FakeSession(exchanges)  # type: ignore[assignment]
    collect_prometheus(source, '{job="vllm"}', at_unix=1764547200.0, window_seconds=60.0)


def run_config(data: bytes, tmp: Path) -> None:
    from llmdiag.config import load_settings, read_targets_file

    load_settings(_write(tmp, "llmdiag.toml", data))
    read_targets_file(_write(tmp, "targets.txt", data))


def run_rule_spec(data: bytes, tmp: Path) -> None:
    from llmdiag.schema.loader import parse_rule

    parse_rule("rules/memory/MEM001-kv-cache-saturated.toml", as_text(data))


def run_probe_spec(data: bytes, tmp: Path) -> None:
    from llmdiag.schema.base import parse_toml
    from llmdiag.schema.probes import ProbeSpec

    parse_toml(ProbeSpec, "probes/vllm.toml", as_text(data))


def _readme_toml() -> tuple[bytes, ...]:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```toml\n(.*?)^```", text, flags=re.M | re.S)
    return tuple(b.encode() for b in blocks) or (b"[check]\nwindow_seconds = 10\n",)


def _gzipped(pool: tuple[bytes, ...]) -> st.SearchStrategy[bytes]:
    """Compressed mutated traces, and compressed traces mutated after compression (a cut or flipped gzip)."""
    plain = mutated(pool).map(lambda d: gzip.compress(d, mtime=0))
    return plain | plain.flatmap(lambda z: mutated((z,), max_mutations=1))


PAGES = ("vllm-0.32.0/*/scrape-0[16].prom", "sglang/*.prom", "tgi/*", "llamacpp/*", "dcgm/*.prom", "field/*/*.prom")
LOGS = ("logs/*.log", "field/*/server.log")
EVERYTHING = (
    PAGES
    + LOGS
    + (
        "trtllm/*.json",
        "nvidia-smi/*",
        "nccl/*.txt",
        "nccl/nccl-tests/*",
        "ib/*.txt",
        "field/*/*.txt",
        "field/*/*.md",
        "field/*/*.log",
    )
)


def targets() -> dict[str, tuple[st.SearchStrategy, object]]:
    """Every fuzzed parser: its input strategy (real fixtures mutated, or built from scratch) and its call."""
    pages = mutated(seeds(*PAGES))
    traces = trace_seeds() or (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2}]}',)
    return {
        "exposition-live": (pages | exposition_from_scratch, run_exposition_live),
        "exposition-pasted": (pages | exposition_from_scratch, run_exposition_pasted),
        "analyze": (mutated(seeds(*EVERYTHING)), run_analyze),
        "logs": (mutated(seeds(*LOGS)), run_logs),
        "trtllm-json": (mutated(seeds("trtllm/*.json")), run_trtllm_json),
        "nvidia-smi": (mutated(seeds("nvidia-smi/*")), run_nvidia_smi),
        "nccl-log": (mutated(seeds("nccl/*.txt", "field/nccl-vllm-*/*.log")), run_nccl_log),
        "nccl-tests": (mutated(seeds("nccl/nccl-tests/*", "field/nccl-tests-*/*.log")), run_nccl_tests),
        "ib-ports": (mutated(seeds("ib/*.txt")), run_ib_ports),
        "trace": (mutated(traces), run_trace),
        "trace-gzip": (_gzipped(traces), run_trace_gzip),
        "prometheus-api": (prometheus_exchanges, run_prometheus),
        "config": (mutated(_readme_toml()), run_config),
        "rule-spec": (mutated(tuple(b for _, b in repo_files("rules/*/*.toml"))), run_rule_spec),
        "probe-spec": (mutated(tuple(b for _, b in repo_files("probes/*.toml"))), run_probe_spec),
    }
