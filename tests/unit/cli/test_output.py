"""What the commands print and how they exit, in-process: the exit code for --fail-on, ERROR/HINT lines that show a
message's brackets instead of reading them as markup, the JSON and Markdown verdicts on stdout, report files written
whole (or a clear error naming the option), and no progress bar when nobody watches."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import typer
from rich.console import Console

from llmdiag.api import diagnose_files
from llmdiag.cli import output
from llmdiag.cli.options import FailOn
from llmdiag.engine.fleet import build_fleet
from llmdiag.errors import LlmdiagError, UsageError
from llmdiag.model import FleetTarget, Severity, Verdict
from llmdiag.render.json import render_json
from llmdiag.render.markdown import render_markdown
from tests.conftest import FIXTURES


@pytest.fixture(scope="module")
def verdict() -> Verdict:
    return diagnose_files(sorted((FIXTURES / "vllm-0.32.0" / "memory").glob("*.prom")))


@pytest.fixture
def stderr(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """The commands' stderr console, writing to a buffer (a plain, uncoloured one: no terminal)."""
    buffer = io.StringIO()
    monkeypatch.setattr(output.stderr, "_console", Console(file=buffer, width=200, color_system=None))
    return buffer


@pytest.mark.parametrize(
    "worst, fail_on, code",
    [
        (None, FailOn.warning, 0),
        (Severity.warning, FailOn.warning, 1),
        (Severity.critical, FailOn.warning, 1),
        (Severity.warning, FailOn.critical, 0),
        (Severity.critical, FailOn.critical, 1),
        (Severity.critical, FailOn.never, 0),
    ],
)
def test_exit_code_is_1_when_the_worst_finding_reaches_fail_on(worst: Severity | None, fail_on: FailOn, code: int):
    assert output.exit_for(worst, fail_on) == code


def test_a_verdicts_exit_code_is_its_worst_findings(verdict: Verdict):
    assert verdict.worst_severity() is Severity.critical  # the recorded memory scenario: MEM001 critical
    assert output.exit_code(verdict, FailOn.critical) == output.EXIT_FINDINGS == 1


def test_error_and_hint_lines_show_brackets_as_text(stderr: io.StringIO):
    output.print_error("cannot read [bold]x.prom[/bold]", "pass [red]--server[/red]")
    assert stderr.getvalue() == "ERROR: cannot read [bold]x.prom[/bold]\nHINT: pass [red]--server[/red]\n"
    stderr.truncate(0), stderr.seek(0)
    output.print_error("no hint here", "")
    assert stderr.getvalue() == "ERROR: no hint here\n"


def test_fail_prints_the_pair_and_exits_2(stderr: io.StringIO):
    with pytest.raises(typer.Exit) as info:
        output.fail(UsageError("bad flag", "use --good"))
    assert info.value.exit_code == output.EXIT_ERROR == 2
    assert stderr.getvalue().splitlines() == ["ERROR: bad flag", "HINT: use --good"]


def test_warnings_and_notes_go_to_stderr(stderr: io.StringIO):
    output.warn("left out [x]")
    output.note("watching [y]")
    assert stderr.getvalue().splitlines() == ["WARNING: left out [x]", "watching [y]"]


def test_json_and_markdown_verdicts_go_to_stdout(verdict: Verdict, capsys: pytest.CaptureFixture[str]):
    output.emit(verdict, as_json=True, verbose=False)
    printed = capsys.readouterr().out
    assert printed == render_json(verdict) + "\n" and json.loads(printed)["bottleneck"] == "memory"
    output.emit(verdict, as_json=False, verbose=False, markdown=True)
    assert capsys.readouterr().out == render_markdown(verdict)


def test_the_json_report_file_is_written_whole_or_the_error_names_the_option(tmp_path: Path):
    path = tmp_path / "report.json"
    output.write_output(path, '{"a": 1}')
    assert path.read_text() == '{"a": 1}\n'
    with pytest.raises(LlmdiagError) as info:
        output.write_output(tmp_path / "missing" / "report.json", "{}")
    assert "cannot write" in info.value.message and "--output" in info.value.hint


def test_the_html_report_is_a_fleets_or_a_scans_and_says_where_it_went(
    verdict: Verdict, tmp_path: Path, stderr: io.StringIO
):
    scan = tmp_path / "scan.html"
    output.write_html(scan, verdict)
    assert scan.read_text().startswith("<!DOCTYPE html>") and "llmdiag fleet" not in scan.read_text()
    assert f"HTML report written to {scan}" in stderr.getvalue()
    fleet = tmp_path / "fleet.html"
    output.write_html(fleet, build_fleet([FleetTarget(name="a")], at_unix=0.0), quiet=True)
    assert "llmdiag fleet" in fleet.read_text() and str(fleet) not in stderr.getvalue()
    with pytest.raises(LlmdiagError) as info:
        output.write_html(tmp_path / "missing" / "x.html", verdict)
    assert "--html" in info.value.hint


def test_no_progress_bar_when_quiet_or_not_watched(stderr: io.StringIO):
    with output.scan_progress("h:8000", quiet=True) as update:
        assert update is None
    with output.scan_progress("h:8000", quiet=False) as update:
        assert update is None  # stderr is not a terminal here
    with output.load_progress(10.0, quiet=True) as say:
        say("level 1")
    assert stderr.getvalue() == ""
    with output.load_progress(10.0, quiet=False) as say:
        say("level 2 of 3")  # not a terminal: plain lines
    assert stderr.getvalue() == "level 2 of 3\n"


def test_a_write_that_fails_says_why_and_what_to_do_by_its_errno(tmp_path: Path):
    import errno
    import os

    path = tmp_path / "r.html"
    full = output.cannot_write(path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), "--html")
    assert full.message == f"cannot write {path}: No space left on device (the file that was there is left as it was)"
    assert full.hint == "free some space, or pick another --html path on another disk"
    read_only = output.cannot_write(path, OSError(errno.EROFS, os.strerror(errno.EROFS)), "--output")
    assert read_only.message == f"cannot write {path}: Read-only file system"
    assert read_only.hint == "pick another --output path on a writable disk"
    # after a measurement: the error is handed back to be said after the result, never raised over it
    assert output.written(lambda: output.write_output(tmp_path / "ok.json", "{}")) is None
    late = output.written(lambda: output.write_output(tmp_path / "missing" / "x.json", "{}"))
    assert isinstance(late, LlmdiagError) and "--output" in late.hint
    with pytest.raises(typer.Exit) as ended:
        output.fail_if(None, late)
    assert ended.value.exit_code == 2
    output.fail_if(None, None)  # nothing unwritten: nothing said
