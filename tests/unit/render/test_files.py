"""Atomic report files: the whole new text or the old file, an ordinary file mode, and no temporary file left over."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from llmdiag.render.files import write_atomic


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_writes_the_text_with_the_umasks_ordinary_mode(tmp_path: Path):
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "report.json", "{}\n")
    finally:
        os.umask(old)
    path = tmp_path / "report.json"
    assert path.read_text(encoding="utf-8") == "{}\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640  # 0666 less the umask, not mkstemp's 0600
    assert leftovers(tmp_path) == []


def test_replaces_an_existing_file_whole(tmp_path: Path):
    path = tmp_path / "report.json"
    path.write_text("old, and longer than the new text\n")
    write_atomic(path, "new ✓\n")
    assert path.read_text(encoding="utf-8") == "new ✓\n"


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path):
    path = tmp_path / "report.json"
    path.write_text("old\n")
    with pytest.raises(UnicodeEncodeError):
        write_atomic(path, "half \ud800 written")  # a lone surrogate cannot be UTF-8: fails mid-write
    assert path.read_text() == "old\n"
    assert leftovers(tmp_path) == []


def test_a_missing_folder_is_an_os_error(tmp_path: Path):
    with pytest.raises(OSError):
        write_atomic(tmp_path / "no" / "such" / "report.json", "x")
