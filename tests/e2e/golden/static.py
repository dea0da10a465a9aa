"""The golden outputs that are text, not a case's JSON: `rules list`, the rule docs and the example report.

The rule docs (docs/rules) and the example report (reports/examples) are committed where readers find them; they
are their own golden copy, regenerated here and compared. `rules list` is a table: kept in data/static.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.e2e.golden.cases import DATA, REPO_ROOT

RULES_LIST = DATA / "static" / "rules-list.txt"
EXAMPLES = REPO_ROOT / "reports" / "examples"
RULE_DOCS = REPO_ROOT / "docs" / "rules"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "llmdiag", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=120,
        check=True,
    )


def rules_list() -> str:
    return cli("rules", "list").stdout


def rule_docs(tmp: Path) -> dict[str, str]:
    out = tmp / "rule-docs"
    cli("rules", "docs", "--out", str(out))
    return {p.name: p.read_text() for p in sorted(out.glob("*.md"))}


def example_report(tmp: Path) -> dict[str, str]:
    html = tmp / "memory.html"
    cli("report", str(EXAMPLES / "memory.json"), "-o", str(html))
    markdown = cli("report", str(EXAMPLES / "memory.json"), "--markdown").stdout
    return {"memory.html": html.read_text(), "memory.md": markdown}


def record_static(tmp: Path) -> None:
    RULES_LIST.parent.mkdir(parents=True, exist_ok=True)
    RULES_LIST.write_text(rules_list())
