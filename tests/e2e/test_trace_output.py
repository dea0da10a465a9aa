"""`llmdiag trace -o FILE`: the JSON report written atomically (a new file replaces the old one whole), equal to what
--json prints; an unwritable path is one ERROR/HINT pair, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, run_cli
from tests.support.required import SHARED_TRACES as TRACES
from tests.support.required import require_traces

DLRM = TRACES / "param-dlrm-8rank"


@pytest.fixture(autouse=True)
def _shared_traces() -> None:
    require_traces(DLRM)


RUN_DEPENDENT = ("parse_seconds",)  # the only field that differs between two runs on the same files


def _stable(report: dict) -> dict:
    return {k: v for k, v in report.items() if k not in RUN_DEPENDENT}


def test_output_file_is_the_json_report(tmp_path: Path):
    out = tmp_path / "trace.json"
    both = run_cli("trace", str(DLRM), "--json", "-o", str(out))
    assert both.returncode == 1, both.stderr  # the DLRM set has critical NET findings
    assert out.read_text() == both.stdout  # one run: the very same bytes
    report = json.loads(out.read_text())
    assert report["schema_version"] and [r["rank"] for r in report["ranks"]] == list(range(8))
    assert report["straggler"]["rank"] == 7 and report["verdict"]["findings"]

    # without --json: the terminal view on stdout, the file says where it went, and holds the same report
    out2 = tmp_path / "terminal-run.json"
    table = run_cli("trace", str(DLRM), "-o", str(out2))
    assert table.returncode == 1, table.stderr
    assert "Straggler: rank 7" in table.stdout and "{" not in table.stdout.splitlines()[0]
    assert f"report written to {out2}" in table.stderr.replace("\n", "")
    assert _stable(json.loads(out2.read_text())) == _stable(report)


def test_output_replaces_an_old_file_whole(tmp_path: Path):
    out = tmp_path / "trace.json"
    out.write_text("old report\n")
    kept = tmp_path / "old-link.json"
    kept.hardlink_to(out)  # a reader holding the old file keeps it: the new one is renamed over, not written into
    old_inode = out.stat().st_ino
    result = run_cli("trace", str(DLRM), "-o", str(out))
    assert result.returncode == 1, result.stderr
    assert out.stat().st_ino != old_inode
    assert kept.read_text() == "old report\n"
    assert json.loads(out.read_text())["world_size"] == 8
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old-link.json", "trace.json"]  # no temporary left


def test_an_unwritable_output_is_one_error(tmp_path: Path):
    out = tmp_path / "no-such-dir" / "trace.json"
    result = run_cli("trace", str(DLRM), "-o", str(out))
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines == [f"ERROR: cannot write {out}: No such file or directory", "HINT: pick another --output path"]
    assert not out.parent.exists()


# What `llmdiag trace --json` must not load: the HTTP and load stacks, the other commands, and rich (its terminal
# view is not printed). On a small trace the run is mostly interpreter start and imports (bench/bench_trace.py).
NOT_FOR_TRACE_JSON = ("requests", "aiohttp", "asyncio", "rich.console", "llmdiag.api.scan", "llmdiag.collect.live")


def test_trace_json_loads_only_what_it_uses():
    probe = (
        "import sys\n"
        "from llmdiag.cli import main\n"
        f"sys.argv = ['llmdiag', 'trace', {str(DLRM)!r}, '--json']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print([m for m in {NOT_FOR_TRACE_JSON!r} if m in sys.modules], file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert json.loads(done.stdout)["ranks"], done.stderr  # it did analyse the set
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr
