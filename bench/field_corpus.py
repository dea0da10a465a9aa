"""The field corpus: real excerpts from public threads, each judged by `llmdiag analyze` against what its thread
concluded.

Each case is a directory under tests/fixtures/field/ holding the excerpt file(s), verbatim, and a case.toml: title,
server, files (in the order given to analyze); [provenance] repository, thread, posted, excerpt_note; [conclusion]
text, class (what the thread concluded: a capacity class, stalled, metric-bug, healthy, idle or none); [expect] read,
class (the verdict llmdiag should give, "" where none is judged), advisory (finding codes accepted instead where the
excerpt stops before the failure).
This module loads the cases, runs `llmdiag analyze FILES --json` once per case (in threads: each run is its own
process), scores each run and sums the scores per conclusion class. tests/e2e/test_field_corpus.py judges with
the same functions (through tests/support/field_corpus.py), so the README's table and the test cannot disagree.

    .venv/bin/python bench/field_corpus.py           # the per-class table, as Markdown
    .venv/bin/python bench/field_corpus.py --cases   # and one line per case: what llmdiag said, what was expected

Prints results; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

REPO_ROOT = Path(__file__).resolve().parents[1]
FIELD = REPO_ROOT / "tests" / "fixtures" / "field"

SERVERS = {"vllm", "sglang", "tgi", "llamacpp", "trtllm", "triton", "dcgm", "nvidia-smi", "nccl", "mixed"}
CAPACITY = {"memory", "compute", "scheduling", "network"}
# a hang or a wrong metric is not a capacity problem: naming one at this confidence or more is a wrong verdict
NOT_CAPACITY = {"stalled", "metric-bug"}
CONCLUSIONS = CAPACITY | NOT_CAPACITY | {"healthy", "idle", "none"}
CONFIDENT = 0.5
TRACEBACK = "Traceback (most recent call last)"


@dataclass(frozen=True)
class Case:
    name: str  # the directory's name
    directory: Path
    title: str
    server: str
    files: tuple[str, ...]
    thread: str
    posted: str
    conclusion: str  # the thread's conclusion, in words
    conclusion_class: str
    expect_read: bool
    expect_class: str  # "" where the thread concluded no class llmdiag names
    advisory: tuple[str, ...]

    @property
    def paths(self) -> list[Path]:
        return [self.directory / name for name in self.files]


@dataclass(frozen=True)
class Run:
    """One `llmdiag analyze --json` of a case, as the CLI answered."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def verdict(self) -> dict | None:
        try:
            parsed = json.loads(self.stdout)
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None


@dataclass
class Score:
    case: Case
    traceback: bool
    read: bool  # read as expected: a verdict where read = true, a refusal (exit 2, one ERROR, one HINT) where false
    bottleneck: str | None
    confidence: float | None
    codes: tuple[str, ...]
    right_class: bool | None  # None where the case expects no class
    confident_capacity: bool | None  # None where the thread concluded a capacity class or none
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems


class CaseError(ValueError):
    """A case directory that does not follow the corpus format."""


def _need(table: dict, key: str, kind: type, where: str):
    value = table.get(key)
    if not isinstance(value, kind):
        raise CaseError(f"{where}: `{key}` must be a {kind.__name__}, got {value!r}")
    return value


def load_case(directory: Path) -> Case:
    where = str(directory.relative_to(REPO_ROOT) if REPO_ROOT in directory.parents else directory)
    try:
        data = tomllib.loads((directory / "case.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise CaseError(f"{where}/case.toml: {err}") from err
    provenance = _need(data, "provenance", dict, where)
    conclusion = _need(data, "conclusion", dict, where)
    expect = _need(data, "expect", dict, where)
    files = tuple(_need(data, "files", list, where))
    case = Case(
        name=directory.name,
        directory=directory,
        title=_need(data, "title", str, where),
        server=_need(data, "server", str, where),
        files=files,
        thread=_need(provenance, "thread", str, f"{where} [provenance]"),
        posted=_need(provenance, "posted", str, f"{where} [provenance]"),
        conclusion=_need(conclusion, "text", str, f"{where} [conclusion]"),
        conclusion_class=_need(conclusion, "class", str, f"{where} [conclusion]"),
        expect_read=_need(expect, "read", bool, f"{where} [expect]"),
        expect_class=_need(expect, "class", str, f"{where} [expect]"),
        advisory=tuple(expect.get("advisory", [])),
    )
    _check(case, where, provenance)
    return case


def _check(case: Case, where: str, provenance: dict) -> None:
    if case.server not in SERVERS:
        raise CaseError(f"{where}: server {case.server!r} is none of {sorted(SERVERS)}")
    if case.conclusion_class not in CONCLUSIONS:
        raise CaseError(f"{where}: conclusion class {case.conclusion_class!r} is none of {sorted(CONCLUSIONS)}")
    if case.expect_class and case.expect_class not in CONCLUSIONS - {"none", "metric-bug"}:
        raise CaseError(f"{where}: expected class {case.expect_class!r} is no verdict class")
    if not case.files or not all(isinstance(name, str) for name in case.files):
        raise CaseError(f"{where}: `files` names no excerpt")
    missing = [name for name in case.files if not (case.directory / name).is_file()]
    if missing:
        raise CaseError(f"{where}: files {missing} are not in the directory")
    if not str(provenance.get("repository", "")).count("/") == 1:
        raise CaseError(f"{where}: [provenance] repository must be owner/name")
    if not case.thread.startswith("https://"):
        raise CaseError(f"{where}: [provenance] thread must be the thread's URL")


def load_cases(root: Path = FIELD) -> list[Case]:
    """Every case under ROOT, by name; a directory without case.toml is no case (a README, a stray folder)."""
    if not root.is_dir():
        return []
    return [load_case(d) for d in sorted(root.iterdir()) if (d / "case.toml").is_file()]


def run_case(case: Case, timeout: float = 120) -> Run:
    """`python -m llmdiag analyze FILES --json`, as a user runs it (the files in the case's order)."""
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("LLMDIAG_API_KEY", None)
    proc = subprocess.run(
        [sys.executable, "-m", "llmdiag", "analyze", *map(str, case.paths), "--json"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO_ROOT,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


def run_cases(cases: Iterable[Case], workers: int | None = None) -> dict[str, Run]:
    """Each case's run, by case name; runs in parallel (each is its own process, so threads suffice)."""
    cases = list(cases)
    workers = workers or max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(zip((c.name for c in cases), pool.map(run_case, cases), strict=True))


def _refused_as_documented(run: Run) -> bool:
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    hints = [line for line in lines if line.startswith("HINT")]
    return run.returncode == 2 and len(errors) == 1 and len(hints) == 1


def score(case: Case, run: Run) -> Score:
    verdict = run.verdict
    traceback = TRACEBACK in run.stderr or TRACEBACK in run.stdout
    bottleneck = confidence = None
    codes: tuple[str, ...] = ()
    if verdict is not None:
        bottleneck = verdict.get("bottleneck")
        confidence = verdict.get("confidence")
        codes = tuple(f.get("code", "") for f in verdict.get("findings", []) if isinstance(f, dict))
    problems = []
    if traceback:
        problems.append("printed a traceback")
    if case.expect_read:
        read = run.returncode in (0, 1) and verdict is not None
        if not read:
            first = next((line for line in run.stderr.splitlines() if line.strip()), "")
            problems.append(f"not read (exit {run.returncode}): {first[:160]}")
    else:
        read = _refused_as_documented(run)
        if not read:
            problems.append(f"expected a refusal (exit 2, one ERROR, one HINT), got exit {run.returncode}")
    right_class = None
    if case.expect_class:
        right_class = bottleneck == case.expect_class or any(code in case.advisory for code in codes)
        if not right_class:
            wanted = case.expect_class + (f" or one of {list(case.advisory)}" if case.advisory else "")
            problems.append(f"said {bottleneck} ({confidence}) with {list(codes)}; the thread concluded {wanted}")
    confident_capacity = None
    if case.conclusion_class in NOT_CAPACITY:
        confident_capacity = bottleneck in CAPACITY and (confidence or 0.0) >= CONFIDENT
        if confident_capacity:
            problems.append(
                f"named {bottleneck} at confidence {confidence} on a case the thread found {case.conclusion_class}"
            )
    return Score(case, traceback, read, bottleneck, confidence, codes, right_class, confident_capacity, problems)


def score_all(cases: Iterable[Case], workers: int | None = None) -> list[Score]:
    cases = list(cases)
    runs = run_cases(cases, workers)
    return [score(case, runs[case.name]) for case in cases]


@dataclass
class ClassRow:
    conclusion: str
    cases: int = 0
    read: int = 0
    judged: int = 0  # cases that expect a class
    right: int = 0
    confident_capacity: int = 0  # only counted on hang and metric-bug rows
    tracebacks: int = 0


def table(scores: Iterable[Score]) -> list[ClassRow]:
    """One row per conclusion class (in a fixed order), and a last row for all cases."""
    order = ["memory", "compute", "scheduling", "network", "stalled", "metric-bug", "healthy", "idle", "none"]
    rows = {name: ClassRow(name) for name in order}
    total = ClassRow("all")
    for s in scores:
        for row in (rows[s.case.conclusion_class], total):
            row.cases += 1
            row.read += s.read
            row.tracebacks += s.traceback
            if s.right_class is not None:
                row.judged += 1
                row.right += s.right_class
            row.confident_capacity += bool(s.confident_capacity)
    return [row for row in rows.values() if row.cases] + [total]


def class_rate(scores: Iterable[Score]) -> tuple[int, int]:
    """(right, judged) over the cases whose thread concluded a capacity class and that expect one."""
    judged = [s for s in scores if s.case.conclusion_class in CAPACITY and s.right_class is not None]
    return sum(bool(s.right_class) for s in judged), len(judged)


def render_table(rows: list[ClassRow]) -> str:
    def pct(n: int, d: int) -> str:
        return f"{n}/{d} ({100 * n / d:.0f} %)" if d else "-"

    lines = [
        "| thread concluded | cases | read | right class (or advisory) | confident capacity verdict | tracebacks |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        on_hang = row.conclusion in NOT_CAPACITY or row.conclusion == "all"
        confident = str(row.confident_capacity) if on_hang else "-"
        lines.append(
            f"| {row.conclusion} | {row.cases} | {pct(row.read, row.cases)} | {pct(row.right, row.judged)} "
            f"| {confident} | {row.tracebacks} |"
        )
    return "\n".join(lines)


def render_cases(scores: Iterable[Score]) -> str:
    lines = []
    for s in scores:
        said = f"{s.bottleneck} {s.confidence}" if s.bottleneck is not None else "no verdict"
        mark = "ok  " if s.passed else "MISS"
        why = "; ".join(s.problems)
        lines.append(f"{mark} {s.case.name}: {said} {list(s.codes)} (thread: {s.case.conclusion_class}) {why}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", action="store_true", help="also print one line per case")
    parser.add_argument("--root", type=Path, default=FIELD, help="the corpus directory")
    args = parser.parse_args(argv)
    cases = load_cases(args.root)
    scores = score_all(cases)
    if args.cases:
        print(render_cases(scores), end="\n\n")
    print(render_table(table(scores)))
    right, judged = class_rate(scores)
    print(f"\nclass rate over capacity conclusions: {right}/{judged}; cases: {len(cases)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
