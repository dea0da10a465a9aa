"""A full or read-only disk under one folder, for the fault-matrix tests, in two ways.

Where this machine lets the tests mount (root with CAP_SYS_ADMIN, as here), ``faulty_folder`` mounts a real tmpfs:
``full`` has no free block left, ``nearly_full`` a few KiB (a report does not fit: the write itself fails with
ENOSPC), ``read_only`` is remounted read-only (EROFS). The kernel refuses the writes, SQLite included.

Where it does not (an unprivileged container), the same folder is an ordinary one and the CLI's subprocess gets
``LLMDIAG_TEST_OSERROR=ERRNO:FOLDER``: ``tests/support/oserrors_site/sitecustomize.py`` (first on PYTHONPATH) then
calls ``install()``, which makes every write under FOLDER fail at the ``os`` boundary with that errno: ``os.open``
and ``open`` for writing, ``os.replace``/``os.rename`` into it, and SQLite's ``connect`` (whose own writes are in C,
below ``os``: it fails as SQLite fails on such a disk, "disk I/O error" or "unable to open database file").
The tests run as root, so ``chmod`` cannot stand in for either.
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ENV = "LLMDIAG_TEST_OSERROR"
NO_MOUNT_ENV = "LLMDIAG_TEST_NO_MOUNT"  # =1: the injection even where a tmpfs could be mounted (to test it)
SITE = Path(__file__).resolve().parent / "oserrors_site"
KINDS = {"full": errno.ENOSPC, "nearly_full": errno.ENOSPC, "read_only": errno.EROFS}
SQLITE_WORDS = {errno.ENOSPC: "disk I/O error", errno.EROFS: "unable to open database file"}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


@dataclass
class FaultyFolder:
    path: Path
    kind: str
    mounted: bool
    env: dict[str, str] = field(default_factory=dict)  # what the CLI's subprocess needs (the injection's switch)


def _under(path: object, folder: str) -> bool:
    try:
        return os.path.abspath(os.fsdecode(path)).startswith(folder + os.sep)  # type: ignore[arg-type]
    except TypeError:
        return False  # a file descriptor, not a path


def install(spec: str) -> None:
    """Make every write under the folder of ``spec`` (``ERRNO:FOLDER``) fail with that errno."""
    code_text, folder = spec.split(":", 1)
    code, folder = int(code_text), os.path.abspath(folder)

    def refuse(path: object) -> OSError:
        return OSError(code, os.strerror(code), os.fsdecode(path))  # type: ignore[arg-type]

    real_os_open, real_open, real_replace, real_rename = os.open, builtins.open, os.replace, os.rename
    real_connect = sqlite3.connect

    def os_open(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        if flags & WRITE_FLAGS and _under(path, folder):
            raise refuse(path)
        return real_os_open(path, flags, *args, **kwargs)

    def open_(file, mode="r", *args, **kwargs):  # type: ignore[no-untyped-def]
        if any(c in mode for c in "wax+") and _under(file, folder):
            raise refuse(file)
        return real_open(file, mode, *args, **kwargs)

    def moved(real):  # type: ignore[no-untyped-def]
        def move(src, dst, *args, **kwargs):  # type: ignore[no-untyped-def]
            if _under(dst, folder):
                raise refuse(dst)
            return real(src, dst, *args, **kwargs)

        return move

    def connect(database, *args, **kwargs):  # type: ignore[no-untyped-def]
        if _under(database, folder):
            raise sqlite3.OperationalError(SQLITE_WORDS.get(code, os.strerror(code)))
        return real_connect(database, *args, **kwargs)

    os.open, builtins.open, io.open = os_open, open_, open_  # type: ignore[assignment]
    os.replace, os.rename, sqlite3.connect = moved(real_replace), moved(real_rename), connect  # type: ignore[assignment]


def activate_from_environment() -> None:
    spec = os.environ.get(ENV)
    if spec:
        install(spec)


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True, check=False).returncode == 0


@contextmanager
def faulty_folder(base: Path, kind: str, keep: dict[str, bytes]) -> Iterator[FaultyFolder]:
    """A folder holding the files ``keep`` (name: bytes, written while it still could be) whose disk is ``kind``."""
    path = base / kind
    path.mkdir()
    may_mount = os.environ.get(NO_MOUNT_ENV) != "1"
    if may_mount and _mount("-t", "tmpfs", "-o", "size=512k,mode=0755", "tmpfs", str(path)):
        try:
            for name, data in keep.items():
                (path / name).write_bytes(data)
            if kind == "read_only":
                assert _mount("-o", "remount,ro", str(path)), "cannot remount the tmpfs read-only"
            else:
                _fill(path, leave_bytes=0 if kind == "full" else 8 * 1024)
            yield FaultyFolder(path, kind, mounted=True)
        finally:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
        return
    for name, data in keep.items():
        (path / name).write_bytes(data)
    pythonpath = os.pathsep.join(p for p in (str(SITE), str(SITE.parents[2]), os.environ.get("PYTHONPATH")) if p)
    env = {ENV: f"{KINDS[kind]}:{path}", "PYTHONPATH": pythonpath}
    yield FaultyFolder(path, kind, mounted=False, env=env)


def _fill(path: Path, leave_bytes: int) -> None:
    """Fill the tmpfs until at most ``leave_bytes`` are free."""
    free = os.statvfs(path).f_bavail * os.statvfs(path).f_frsize
    with open(path / "filler", "wb") as filler:
        try:
            filler.write(b"\0" * max(0, free - leave_bytes))
            filler.flush()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
