"""Rewrite the golden set (tests/e2e/golden/data) from what the CLI answers now.

Run it only for an intended output change, in the same commit as that change: the diff shows what changed.

    python -m tests.e2e.golden.record
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from tests.e2e.golden.cases import DATA, all_cases, golden_path, pinned_fixtures, run_in_process
from tests.e2e.golden.static import record_static


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        fixtures = pinned_fixtures(Path(tmp))
        cases = all_cases(fixtures)
        if DATA.exists():
            shutil.rmtree(DATA)
        for case in cases:
            path = golden_path(case)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(run_in_process(case.args, fixtures).as_json())
        record_static(Path(tmp))
    print(f"wrote {len(cases)} cases and the static outputs to {DATA}")


if __name__ == "__main__":
    main()
