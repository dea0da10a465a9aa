"""The short paths llmdiag.collect.log_lines takes for speed (issue: a 100 MB log read in under 10 s with flat
memory) give what the long ones give: a time read without strptime, a line format skipped by its literal text, the
first pass's records spooled to a temporary file and read back (or the file read again when no spool can be kept).
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path

import pytest

from llmdiag.collect import log_lines
from llmdiag.collect.log_lines import required_text, utc
from llmdiag.collect.logs import collect_logs
from tests.conftest import REPO_ROOT

LOGS = REPO_ROOT / "tests" / "fixtures" / "logs"


@pytest.mark.parametrize(
    "text",
    ["2026-05-19 10:29:51", "2024-02-29 23:59:59", "1970-01-01 00:00:00", "2026-12-31T23:59:59", "1969-12-31 23:59:59"],
)
def test_a_time_read_in_short_is_the_utc_time(text: str):
    expected = datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()
    assert utc(text, "%Y-%m-%d %H:%M:%S") == expected


@pytest.mark.parametrize(
    "text",
    ["2023-02-29 00:00:00", "2026-13-01 00:00:00", "2026-05-19 24:00:00", "2026-05-19 10:60:00", "2026-05-19 10:00:61"],
)
def test_a_time_strptime_refuses_is_refused_in_short_too(text: str):
    with pytest.raises(ValueError):
        datetime.strptime(text, "%Y-%m-%d %H:%M:%S")
    with pytest.raises(ValueError):
        utc(text, "%Y-%m-%d %H:%M:%S")


def test_required_text_is_the_literal_text_outside_groups():
    # vLLM V0's stat line needs "Swapped: " and "Pending: ", which a V1 line ("Waiting: ") does not hold
    v0 = re.compile(r"Avg prompt throughput: (?P<p>[\d.]+) tokens/s,.*?Swapped: (?P<s>\d+) reqs,.*?Pending: (?P<w>\d+)")
    assert required_text(v0) == ("Avg prompt throughput: ", " tokens/s,", "Swapped: ", " reqs,", "Pending: ")
    # inside a branch or a repeat nothing is required; a case-insensitive pattern needs no exact text
    assert required_text(re.compile(r"(?:Swapped|Pending): \d+")) == ()
    assert required_text(re.compile(r"(?i)Swapped: \d+")) == ()


def _summary(path: Path) -> dict:
    signals = collect_logs([path])
    return {
        "window": (signals.window.start_unix, signals.window.end_unix, signals.window.scrapes, signals.window.note),
        "signals": {
            name: (s.stats, s.samples, s.by_series, s.unavailable, s.source) for name, s in signals.signals.items()
        },
    }


LOG_FILES = ["vllm-v1-dp2.log", "vllm-v0-glued.log", "sglang-scheduling.log", "trtllm-iterations.log"]


@pytest.mark.parametrize("name", LOG_FILES)
def test_records_read_back_in_many_small_blocks_are_the_same(name: str, monkeypatch: pytest.MonkeyPatch):
    whole = _summary(LOGS / name)
    monkeypatch.setattr(log_lines, "SPOOL_BLOCK", 2)
    assert _summary(LOGS / name) == whole


@pytest.mark.parametrize("name", LOG_FILES)
def test_without_a_temporary_folder_the_file_is_read_again(name: str, monkeypatch: pytest.MonkeyPatch):
    whole = _summary(LOGS / name)

    def refused(*args, **kwargs):
        raise PermissionError("no temporary folder")

    monkeypatch.setattr(log_lines.tempfile, "TemporaryFile", refused)
    assert _summary(LOGS / name) == whole


@pytest.mark.parametrize("name", LOG_FILES)
def test_a_spool_whose_write_fails_is_left_for_the_file(name: str, monkeypatch: pytest.MonkeyPatch):
    whole = _summary(LOGS / name)
    written = []

    class Full:
        def __init__(self):
            self.closed = False

        def write(self, data):
            written.append(len(data))
            raise OSError(28, "No space left on device")

        def close(self):
            self.closed = True

    monkeypatch.setattr(log_lines.tempfile, "TemporaryFile", Full)
    monkeypatch.setattr(log_lines, "SPOOL_BLOCK", 2)
    assert _summary(LOGS / name) == whole
    assert written  # the spool was tried
