"""The long fuzz run of llmdiag's parsers (issue 19 §2): every target of bench/fuzz_inputs.py for many examples.

    .venv/bin/python bench/fuzz.py                       # 2,000 examples per target, a random seed
    .venv/bin/python bench/fuzz.py --examples 200 --seed 1 --target exposition-live --target trace
    .venv/bin/python bench/fuzz.py --atheris exposition-live --seconds 60   # coverage-guided (atheris installed)

The property, per example: the parser returns or raises one of llmdiag's errors (LlmdiagError: the CLI prints it as
one ERROR and one HINT line); any other exception is a crash. The run does not stop at a crash: each distinct one
(exception type and the innermost llmdiag frame) is kept with its smallest input under --out, ready to become a
regression fixture in tests/fuzz/regressions/. It prints, per target, the examples run, the crashes and the slowest
example against the time bound (``time_bound_seconds``: linear in the input's size).

`make test` runs the same targets for a bounded number of examples (tests/fuzz/test_parsers.py).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import resource
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/fuzz.py` from the checkout's root

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from bench import fuzz_inputs  # noqa: E402
from llmdiag.errors import LlmdiagError  # noqa: E402

# the loose bound every example must meet: a fixed start (imports, the catalogue's first load) and a rate well under
# what the parsers run at on one slow core
BASE_SECONDS = 5.0
SECONDS_PER_MB = 20.0


def time_bound_seconds(size_bytes: int) -> float:
    return BASE_SECONDS + SECONDS_PER_MB * size_bytes / 1e6


def size_of(value: object) -> int:
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(size_of(v) for v in value)
    return 0


@dataclass
class Tally:
    examples: int = 0
    errors: int = 0  # LlmdiagError: refused in plain words, as it should be
    crashes: dict[str, tuple[str, object]] = field(default_factory=dict)  # signature → (traceback, smallest input)
    slowest: tuple[float, int] = (0.0, 0)  # seconds, size
    over_bound: int = 0
    slowest_over: tuple[float, object] | None = None  # the slowest example past the bound, kept like a crash


def signature(exc: BaseException) -> str:
    """The exception type and the innermost frame inside llmdiag: one crash however many inputs set it off."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/llmdiag/" in f.filename]
    where = f"{frames[-1].filename.rsplit('/llmdiag/', 1)[1]}:{frames[-1].lineno}" if frames else "?"
    return f"{type(exc).__name__} at llmdiag/{where}"


def run_target(name: str, examples: int, run_seed: int | None, tally: Tally) -> None:
    strategy, call = fuzz_inputs.targets()[name]
    tmp = Path(tempfile.mkdtemp(prefix=f"llmdiag-fuzz-{name}-"))

    def one(value: object) -> None:
        tally.examples += 1
        began = time.perf_counter()
        try:
            call(value, tmp)  # type: ignore[operator]
        except LlmdiagError:
            tally.errors += 1
        except Exception as exc:  # a crash: keep it (the smallest input per signature) and go on
            key = signature(exc)
            held = tally.crashes.get(key)
            if held is None or size_of(value) < size_of(held[1]):
                tally.crashes[key] = (traceback.format_exc(), value)
        took = time.perf_counter() - began
        size = size_of(value)
        tally.slowest = max(tally.slowest, (took, size))
        if took > time_bound_seconds(size):
            tally.over_bound += 1
            if tally.slowest_over is None or took > tally.slowest_over[0]:
                tally.slowest_over = (took, value)

    test = settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )(given(strategy)(one))
    if run_seed is not None:
        test = seed(run_seed)(test)
    test()


def save(out: Path, name: str, tally: Tally) -> list[Path]:
    saved = []
    for key, (trace, value) in tally.crashes.items():
        digest = hashlib.sha1(key.encode()).hexdigest()[:10]
        path = out / f"{name}-{digest}"
        path.mkdir(parents=True, exist_ok=True)
        (path / "traceback.txt").write_text(f"{key}\n\n{trace}", encoding="utf-8")
        if isinstance(value, bytes):
            (path / "input.bin").write_bytes(value)
        else:
            (path / "input.repr").write_text(repr(value), encoding="utf-8")
        saved.append(path)
    if tally.slowest_over is not None:  # not a crash: a time past the bound, kept to be looked at
        took, value = tally.slowest_over
        path = out / f"{name}-slow"
        path.mkdir(parents=True, exist_ok=True)
        (path / "took.txt").write_text(f"{took:.3f} s for {size_of(value)} bytes\n", encoding="utf-8")
        if isinstance(value, bytes):
            (path / "input.bin").write_bytes(value)
    return saved


def run_atheris(name: str, seconds: int) -> int:
    """Coverage-guided: atheris drives the target with raw bytes (the exposition and trace readers)."""
    try:
        import atheris
    except ImportError:
        print("atheris is not installed (pip install atheris); the hypothesis run covers every target")
        return 2
    _, call = fuzz_inputs.targets()[name]
    tmp = Path(tempfile.mkdtemp(prefix=f"llmdiag-atheris-{name}-"))

    def one(data: bytes) -> None:
        with contextlib.suppress(LlmdiagError):  # refused in plain words; anything else is a crash atheris keeps
            call(data, tmp)  # type: ignore[operator]

    corpus = Path(tempfile.mkdtemp(prefix="llmdiag-atheris-corpus-"))
    pool = fuzz_inputs.trace_seeds() if name.startswith("trace") else fuzz_inputs.seeds(*fuzz_inputs.PAGES)
    for i, data in enumerate(pool):
        (corpus / f"seed-{i}").write_bytes(data)
    # the target's modules imported under instrumentation (llmdiag's and the exposition parser's only: instrumenting
    # everything loaded takes minutes), which gives atheris its coverage
    with atheris.instrument_imports(include=["llmdiag", "prometheus_client"]):
        one(pool[0])
    atheris.Setup([sys.argv[0], f"-max_total_time={seconds}", "-max_len=65536", str(corpus)], one)
    atheris.Fuzz()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=2000, help="examples per target (default 2000)")
    parser.add_argument("--seed", type=int, default=None, help="hypothesis' seed (default: random)")
    parser.add_argument("--target", action="append", help="a target (repeatable; default: all)")
    parser.add_argument("--out", type=Path, default=Path("fuzz-crashes"), help="where crashing inputs are kept")
    parser.add_argument("--atheris", metavar="TARGET", help="run TARGET under atheris instead")
    parser.add_argument("--seconds", type=int, default=60, help="atheris' time budget")
    parser.add_argument(
        "--max-memory-mb", type=int, default=4096, help="address-space cap: a memory bomb is a MemoryError, a crash"
    )
    args = parser.parse_args()
    cap = args.max_memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    if args.atheris:
        return run_atheris(args.atheris, args.seconds)
    names = args.target or list(fuzz_inputs.targets())
    print(f"{'target':<18} {'examples':>8} {'refused':>8} {'crashes':>7} {'slowest':>9} {'size':>8} {'over':>5}")
    total_examples = total_crashes = 0
    began = time.perf_counter()
    for name in names:
        tally = Tally()
        run_target(name, args.examples, args.seed, tally)
        saved = save(args.out, name, tally)
        took, size = tally.slowest
        print(
            f"{name:<18} {tally.examples:>8} {tally.errors:>8} {len(tally.crashes):>7} {took:>8.3f}s "
            f"{size:>8} {tally.over_bound:>5}",
            flush=True,
        )
        for key, path in zip(tally.crashes, saved, strict=True):
            print(f"    crash: {key}  ({path})")
        total_examples += tally.examples
        total_crashes += len(tally.crashes)
    print(f"{total_examples} examples, {total_crashes} crashes, {time.perf_counter() - began:.0f} s")
    return 1 if total_crashes else 0


if __name__ == "__main__":
    sys.exit(main())
