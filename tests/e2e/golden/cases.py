"""The golden set: what the CLI answers on every recorded input, pinned byte for byte.

Each case runs ``llmdiag.cli.main`` in this process (argv, stdout and stderr swapped), exactly as the console
script does, and keeps its exit code, its stdout (JSON parsed, less ``tool_version`` and timings) and its ERROR and
HINT lines. Paths are written relative to markers (``FIXTURES/``, ``SHARED/``) so the set holds on any checkout.

    python -m tests.e2e.golden.record     # rewrite tests/e2e/golden/data after an intended output change
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.required import SHARED_TRACES

REPO_ROOT = Path(__file__).resolve().parents[3]
FIXTURES = REPO_ROOT / "tests" / "fixtures"
DATA = Path(__file__).resolve().parent / "data"

# a dump without '# llmdiag-scraped-at' is timed by its mtime, which a fresh clone sets to the clone's time: the
# harness copies the fixtures and pins each file's mtime, one second apart in name order
PINNED_MTIME_UNIX = 1_750_000_000.0
VOLATILE_KEYS = frozenset({"tool_version", "parse_seconds"})

CAPACITY_GPUS = ("H100", "H200", "A100", "L4")
CAPACITY_MODELS = ("llama-3-8b", "llama-3-70b", "qwen2.5-7b", "qwen2.5-72b", "mistral-7b", "mixtral-8x7b")
CAPACITY_USERS = (1, 64, 1000)
CAPACITY_TP = (1, 4)


@dataclass(frozen=True)
class Case:
    name: str  # also the golden file's name: data/<name>.json
    args: tuple[str, ...]


@dataclass
class Outcome:
    exit_code: int
    stdout: Any
    stderr: list[str]

    def as_json(self) -> str:
        return (
            json.dumps(
                {"exit_code": self.exit_code, "stdout": self.stdout, "stderr": self.stderr},
                indent=1,
                sort_keys=False,
                ensure_ascii=False,
            )
            + "\n"
        )


def pinned_fixtures(into: Path) -> Path:
    """A copy of tests/fixtures with every file's mtime pinned (see PINNED_MTIME_UNIX)."""
    copy = into / "fixtures"
    if not copy.exists():
        shutil.copytree(FIXTURES, copy)
        for i, path in enumerate(sorted(p for p in copy.rglob("*") if p.is_file())):
            os.utime(path, (PINNED_MTIME_UNIX + i, PINNED_MTIME_UNIX + i))
    return copy


def _analyze_inputs(fixtures: Path) -> list[tuple[str, list[Path]]]:
    """Every dump, log and record alone, and every folder of two or more dumps as one window. The field corpus
    (fixtures/field/) is left out: tests/e2e/test_field_corpus.py judges it against its threads' conclusions, and
    pinning today's verdicts on pasted excerpts would make every reader change rewrite dozens of golden files."""
    single = sorted(
        p
        for p in fixtures.rglob("*")
        if p.is_file()
        and p.suffix in (".prom", ".log", ".json")
        and p.name != "meta.json"
        and p.parent.name != "nvml"
        and p.relative_to(fixtures).parts[0] not in ("field", "hf-config")  # hf-config: model shapes, not outputs
    )
    inputs = [(str(p.relative_to(fixtures).with_suffix("")), [p]) for p in single]
    folders = sorted({p.parent for p in single if p.suffix == ".prom"})
    for folder in folders:
        dumps = sorted(folder.glob("*.prom"))
        if len(dumps) > 1:
            inputs.append((f"{folder.relative_to(fixtures)}/window", dumps))
    return inputs


def _slug(text: str) -> str:
    return text.replace("/", "__").replace(".", "_")


def analyze_cases(fixtures: Path) -> list[Case]:
    return [
        Case(f"analyze/{_slug(name)}", ("analyze", "--json", *map(str, paths)))
        for name, paths in _analyze_inputs(fixtures)
    ]


def capacity_cases() -> list[Case]:
    grid = itertools.product(CAPACITY_GPUS, CAPACITY_MODELS, CAPACITY_USERS, CAPACITY_TP)
    return [
        Case(
            f"capacity/{gpu}-{model}-u{users}-tp{tp}".replace(".", "_"),
            (
                "capacity",
                "--json",
                "--gpu",
                gpu,
                "--model",
                model,
                "--users",
                str(users),
                "--tp",
                str(tp),
                "--prompt-tokens",
                "512",
                "--output-tokens",
                "256",
            ),
        )
        for gpu, model, users, tp in grid
    ]


def compare_cases() -> list[Case]:
    """``capacity --compare``: the simulator runs in virtual time from a fixed seed, so its figures pin too."""
    return [
        Case(
            "capacity/compare-H100-llama-3-8b-u64-seqs32-batching-kv",
            (
                "capacity",
                "--json",
                "--compare",
                "batching,kv",
                "--gpu",
                "H100",
                "--model",
                "llama-3-8b",
                "--users",
                "64",
                "--max-num-seqs",
                "32",
                "--prompt-tokens",
                "500",
                "--output-tokens",
                "200",
            ),
        )
    ]


def trace_sets() -> list[Path]:
    if not SHARED_TRACES.is_dir():
        return []
    sets = [p for p in sorted(SHARED_TRACES.iterdir()) if p.is_dir() and p.name != "single"]
    sets += sorted(p for p in (SHARED_TRACES / "single").iterdir() if p.is_dir())
    return sets


def trace_cases() -> list[Case]:
    cases = []
    for folder in trace_sets():
        name = _slug(str(folder.relative_to(SHARED_TRACES)))
        cases.append(Case(f"trace/{name}", ("trace", "--json", str(folder))))
        cases.append(Case(f"trace/{name}-hta", ("trace", "--json", "--hta-compat", str(folder))))
    return cases


def all_cases(fixtures: Path) -> list[Case]:
    return analyze_cases(fixtures) + capacity_cases() + compare_cases() + trace_cases()


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _relative(text: str, fixtures: Path) -> str:
    return text.replace(str(fixtures), "FIXTURES").replace(str(SHARED_TRACES), "SHARED")


def run_in_process(args: tuple[str, ...], fixtures: Path) -> Outcome:
    """``llmdiag ARGS`` through the console script's own entry point, in this process."""
    from tests.conftest import run_cli_in_process

    ran = run_cli_in_process(*args)
    stdout_text = _relative(ran.stdout, fixtures)
    try:
        stdout: Any = _strip(json.loads(stdout_text)) if stdout_text.strip() else None
    except json.JSONDecodeError:
        stdout = stdout_text.splitlines()
    stderr = [
        line
        for line in _relative(ran.stderr, fixtures).splitlines()
        if line.startswith(("ERROR:", "HINT:", "WARNING:"))
    ]
    return Outcome(ran.returncode, stdout, stderr)


def golden_path(case: Case) -> Path:
    return DATA / f"{case.name}.json"
