"""`llmdiag check` as a library call, without a server: a target that cannot be reached or configured is UNKNOWN with
the message and hint (never an exception, and the other targets are still checked), every result lands in the
history, a history that cannot be written is said, and a verdict becomes a history row field by field."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmdiag._version import __version__
from llmdiag.api import diagnose_files
from llmdiag.api.check import check_target, history_row, run_check
from llmdiag.config import Mute, Settings, Target
from llmdiag.history import History
from llmdiag.model import State, TargetResult
from tests.conftest import FIXTURES

NOW = 1_800_000_000.0


def unconfigured(name: str) -> Target:
    """A target whose bearer token comes from a variable that is not set: it fails before any request is made."""
    return Target(name=name, url=f"http://user:pw@{name}.example:8000", api_key_env="LLMDIAG_TEST_UNSET_KEY")


@pytest.fixture(autouse=True)
def unset(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("LLMDIAG_TEST_UNSET_KEY", raising=False)


def test_a_target_that_cannot_be_configured_is_unknown_with_the_reason_and_no_credentials():
    settings = Settings(mute=[Mute(code="sch002", reason="known batch cap")])
    result = check_target(unconfigured("a"), settings, 10.0, history=None, now=NOW)
    assert result.state is State.UNKNOWN and result.verdict is None
    assert "LLMDIAG_TEST_UNSET_KEY" in (result.error or "") and "export LLMDIAG_TEST_UNSET_KEY" in result.hint
    assert "pw" not in result.url and result.url.endswith("a.example:8000")
    assert result.muted == ["SCH002: known batch cap"]  # the muted rules are listed even when nothing was judged


def test_every_target_is_checked_and_recorded_in_the_history_at_the_clocks_time(tmp_path: Path):
    history = History.open(tmp_path / "h.sqlite")
    report = run_check([unconfigured("a"), unconfigured("b")], Settings(), 10.0, history=history, clock=lambda: NOW)
    assert report.state is State.UNKNOWN and report.at_unix == NOW
    assert [(t.name, t.state) for t in report.targets] == [("a", State.UNKNOWN), ("b", State.UNKNOWN)]
    assert report.history == str(history.path) and report.output_errors == []
    rows = history.rows()
    assert [(r.target, r.state, r.at_unix, r.bottleneck) for r in rows] == [
        ("a", "UNKNOWN", NOW, None),
        ("b", "UNKNOWN", NOW, None),
    ]
    assert all("LLMDIAG_TEST_UNSET_KEY" in (r.error or "") for r in rows)


def test_a_history_that_cannot_be_written_is_an_output_error_not_a_crash(tmp_path: Path):
    not_a_database = tmp_path / "h.sqlite"
    not_a_database.write_bytes(b"this is not SQLite" * 100)
    report = run_check([unconfigured("a")], Settings(), 10.0, history=History(not_a_database), clock=lambda: NOW)
    assert len(report.output_errors) == 1 and report.output_errors[0].startswith("history not written")
    assert report.state is State.UNKNOWN


def test_without_targets_the_check_is_unknown():
    assert run_check([], Settings(), 10.0, clock=lambda: NOW).state is State.UNKNOWN


def test_a_verdict_becomes_a_history_row_field_by_field():
    verdict = diagnose_files(sorted((FIXTURES / "vllm-0.32.0" / "memory").glob("*.prom")))
    result = TargetResult(name="a", url="http://a:1", state=State.CRITICAL, verdict=verdict)
    row = history_row(result, NOW)
    ex = verdict.experience
    assert (row.target, row.url, row.state, row.at_unix, row.tool_version) == (
        "a",
        "http://a:1",
        "CRITICAL",
        NOW,
        __version__,
    )
    assert (row.bottleneck, row.confidence) == ("memory", verdict.confidence)
    assert row.window_seconds == verdict.window.duration_seconds
    assert (row.ttft_p95_seconds, row.tpot_p95_seconds, row.itl_p50_seconds) == (
        ex.ttft_p95_seconds,
        ex.tpot_p95_seconds,
        ex.itl_p50_seconds,
    )
    assert row.generation_tokens_per_second == ex.generation_tokens_per_second is not None
    assert (row.requests_running_mean, row.requests_waiting_mean) == (
        ex.requests_running_mean,
        ex.requests_waiting_mean,
    )
    # the recorded memory scenario's findings (pinned in tests/e2e/golden): MEM001 is first and critical
    assert row.findings.split()[0] == "MEM001:critical"
    assert row.findings == " ".join(f"{f.code}:{f.severity.value}" for f in verdict.findings)
    assert row.error is None


def test_an_undiagnosed_target_is_a_row_with_its_error_and_no_numbers():
    row = history_row(TargetResult(name="a", url="u", state=State.UNKNOWN, error="refused"), NOW)
    assert (row.state, row.error, row.bottleneck, row.ttft_p95_seconds, row.findings) == (
        "UNKNOWN",
        "refused",
        None,
        None,
        "",
    )


def test_the_default_run_deadline_is_waves_of_the_longest_target():
    """The contract `check` across many targets relies on: the run's default total is ceil(targets / concurrency)
    waves, each as long as the longest target's own deadline (its window + its timeout + margins), plus a margin;
    `[check] deadline_seconds` and the explicit argument replace it."""
    from llmdiag.api.check import RUN_MARGIN_SECONDS, default_deadline_seconds, target_deadline_seconds
    from llmdiag.config import CheckDefaults

    short = [Target(name=f"t{i}", url=f"http://t{i}:8000") for i in range(8)]
    slow = Target(name="slow", url="http://slow:8000", window_seconds=30, timeout_seconds=20)
    settings = Settings(check=CheckDefaults(concurrency=4))
    per_target = target_deadline_seconds(short[0], 10.0)
    assert per_target > 10.0 + 5.0  # more than the window and the timeout
    assert target_deadline_seconds(slow, 10.0) > per_target + 20 + 15 - 1  # its own window and timeout count
    assert default_deadline_seconds(short, settings, 10.0) == 2 * per_target + RUN_MARGIN_SECONDS
    assert default_deadline_seconds(short[:4], settings, 10.0) == per_target + RUN_MARGIN_SECONDS
    with_slow = default_deadline_seconds([*short, slow], settings, 10.0)
    assert with_slow == 3 * target_deadline_seconds(slow, 10.0) + RUN_MARGIN_SECONDS


def test_a_run_past_its_deadline_says_each_target_was_not_checked():
    """A zero-length budget: no target starts, each is UNKNOWN saying so, and the run still returns a report."""
    report = run_check([unconfigured("a"), unconfigured("b")], Settings(), 3.0, deadline_seconds=1e-9)
    assert [r.state for r in report.targets] == [State.UNKNOWN, State.UNKNOWN]
    assert all("not checked" in (r.error or "") and "check's deadline" in (r.error or "") for r in report.targets)
    assert report.state is State.UNKNOWN
