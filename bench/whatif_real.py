"""Predicted against measured on the real CPU vLLM (issue 18 §2), the four fixes of test_whatif_real.py.

For each fix: the diagnosed state, its load, `llmdiag scan --json`, `llmdiag whatif scan.json --set …`; then vLLM
restarted with the fix's flags (or two replicas, each pinned to its core), the same load (users, lengths, seed), a
second scan; and the table of predicted against measured (target ±25 %, or ±1 absolute where the measured value is
below 1; the class after predicted right).

The runs are the tests' own: this script runs them with pytest (LLMDIAG_VLLM_TESTS=1) and reads the figures each
writes to $LLMDIAG_WHATIF_REAL_OUT, so the README's table and the tests cannot disagree. Prints; asserts nothing.

    .venv/bin/python bench/whatif_real.py                       # all four (about 3 minutes each here)
    .venv/bin/python bench/whatif_real.py -k max_num_seqs       # a pytest -k expression
    .venv/bin/python bench/whatif_real.py --from DIR            # the table of an earlier run's <fix>.json files
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
TESTS = "tests/realserver/test_whatif_real.py"
RESULTS_ENV = "LLMDIAG_WHATIF_REAL_OUT"  # the harness writes <fix>.json there
WARMUP_ENV = "LLMDIAG_WHATIF_REAL_WARMUP_SECONDS"
ORDER = ("max_num_seqs", "kv_pool", "token_budget", "replicas")
SHORT = {
    "per_user_tokens_per_second_incl_waiting": "per-user tok/s, queue incl.",
    "requests_waiting": "requests waiting",
    "ttft_p50_seconds": "TTFT p50 (s)",
    "requests_running": "requests running",
    "per_user_tokens_per_second": "per-user tok/s, decoding",
    "total_tokens_per_second": "total tok/s",
}
TARGET_RATIO, TARGET_ABSOLUTE_BELOW_ONE = 0.25, 1.0


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def within(predicted: float | None, measured: float | None) -> str:
    if predicted is None or measured is None:
        return "pending" if predicted is None else "-"
    if abs(measured) < 1:
        return "met" if abs(predicted - measured) <= TARGET_ABSOLUTE_BELOW_ONE else "missed"
    return "met" if abs(predicted - measured) <= TARGET_RATIO * abs(measured) else "missed"


def table(results: list[dict]) -> str:
    """One row per fix and figure: measured before, predicted and measured after, their ratio, the target."""
    lines = [
        "| fix | figure | before, measured | after, predicted | after, measured | predicted / measured | target |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        w = r.get("whatif") or {}
        predicted = w.get("after") or {}
        refused = "not modelled" if w and not w.get("modelled") else ""
        for name, label in SHORT.items():
            p, m = predicted.get(name), r["after"].get(name)
            ratio = p / m if p is not None and m else None
            target = (refused or within(p, m)) if name in r["compared"] else ""
            lines.append(
                f"| {r['flag']} | {label} | {_num(r['before'].get(name))} | {_num(p)} | {_num(m)} | {_num(ratio)} | "
                f"{target} |"
            )
        class_after = w.get("class_after") if not refused else None
        verdict = refused or (
            "pending" if class_after is None else ("met" if class_after == r["class_after"] else "missed")
        )
        lines.append(
            f"| {r['flag']} | class | {r['class_before']} | {class_after or '-'} | {r['class_after']} | | {verdict} |"
        )
    return "\n".join(lines)


def load(folder: Path) -> list[dict]:
    found = {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")}
    return [found[name] for name in (*ORDER, *sorted(set(found) - set(ORDER))) if name in found]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", dest="select", default="", help="pytest -k expression (default: all four)")
    parser.add_argument("--from", dest="source", type=Path, help="print the table of a folder of <fix>.json")
    parser.add_argument(
        "--warmup", type=float, default=None, help="seconds of load before each scan (the tests: 8; steady: 60)"
    )
    parser.add_argument("--out", type=Path, help="where the runs write <fix>.json (default: a temporary folder)")
    args = parser.parse_args(argv)
    folder = args.source
    if folder is None:
        folder = args.out or Path(tempfile.mkdtemp(prefix="whatif-real-"))
        env = {**os.environ, "LLMDIAG_VLLM_TESTS": "1", RESULTS_ENV: str(folder)}
        if args.warmup is not None:
            env[WARMUP_ENV] = str(args.warmup)
        cmd = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", TESTS]
        if args.select:
            cmd += ["-k", args.select]
        rc = subprocess.run(cmd, cwd=REPO_ROOT, env=env).returncode
        print(f"pytest exit status {rc}; figures in {folder}", file=sys.stderr)
    results = load(folder)
    if not results:
        print(f"no <fix>.json in {folder}", file=sys.stderr)
        return 1
    print(table(results))
    for r in results:
        w = r.get("whatif") or {}
        note = r["whatif_error"] or w.get("not_modelled_reason") or f"next limit: {w.get('next_limit')}"
        print(f"- {r['flag']}: {r['seconds']:.0f} s; {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
