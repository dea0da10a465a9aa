"""A bundle: everything a live run's probes saw, in one ``.tar.gz`` to attach to a bug report (``--record FILE``).

Members (JSON, UTF-8)::

    manifest.json          format and version, the llmdiag that wrote it, the command, its options (secrets
                           redacted), and each run: its name, what it was called with, and per channel of its tape
                           how many reads it holds and when the first and last were made
    runs/<n>/tape.json     the run's tape (``llmdiag.collect.tape``): every page as read, detection's answers,
                           NVML and host samples, the canary's timings, the window's clock
    runs/<n>/verdict.json  what the live run concluded (to set beside a replay)

Secrets never enter a bundle: the options keep header *names* and whether an API key was given, URLs lose their
user:password, and every member is scrubbed of the run's secret values (API key, credential headers, URL passwords)
before it is written, whatever echoed them.

Reading one is safe for a file from anywhere: the compressed file and every member are read against caps, the
decompressed total too (a gzip bomb stops at the cap), only regular files with the names above are taken (no
links, devices, absolute paths or ``..``), nothing is extracted to disk, and nothing in it is executed: it is
JSON, decoded into plain data.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import re
import tarfile
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmdiag._version import __version__
from llmdiag.errors import InputFileError, UsageError, option

FORMAT = "llmdiag-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MEMBER_RE = re.compile(r"^(manifest\.json|runs/[0-9]{1,4}/(tape|verdict)\.json)$")
MAX_FILE_BYTES = 64 * 1024 * 1024  # the compressed file
MAX_MEMBER_BYTES = 128 * 1024 * 1024  # one member, decompressed
MAX_TOTAL_BYTES = 256 * 1024 * 1024  # every member together, decompressed (headers included)
MAX_MEMBERS = 2 * 1024 + 1
MIN_SECRET_CHARS = 4  # shorter values would scrub ordinary text; they are never written as options either
REDACTED = "***"
HINT = "give the .tar.gz that `llmdiag scan URL --record FILE` (or demo, load, check) wrote"
GZIP_MAGIC = b"\x1f\x8b"


@dataclass
class Run:
    """One scan of a bundle: its name (the target, or the load level), how it was called, its tape, its verdict."""

    name: str
    call: dict[str, Any]
    tape: dict[str, Any]
    verdict: str | None = None  # the live verdict's JSON


@dataclass
class Bundle:
    command: str
    options: dict[str, Any]
    runs: list[Run] = field(default_factory=list)
    llmdiag_version: str = __version__
    recorded_at_unix: float = 0.0


# --- writing --------------------------------------------------------------------------------------------------


def channel_summary(tape: dict[str, Any]) -> dict[str, Any]:
    """Per channel: how many reads, and when the first and last were made (unix seconds, where recorded)."""
    summary: dict[str, Any] = {}
    for channel, entries in tape.get("channels", {}).items():
        times = [
            e.get("at_unix") or (e.get("value") or {}).get("read_at_unix") or (e.get("scrape") or {}).get("at_unix")
            for e in entries
            if isinstance(e, dict)
        ]
        stamped = [t for t in times if isinstance(t, int | float)]
        summary[channel] = {
            "reads": len(entries),
            "first_unix": min(stamped) if stamped else None,
            "last_unix": max(stamped) if stamped else None,
        }
    return summary


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` without any of the secret values, raw or as JSON writes them."""
    for secret in sorted({s for s in secrets if s and len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True):
        for form in {secret, json.dumps(secret)[1:-1]}:
            text = text.replace(form, REDACTED)
    return text


def _members(bundle: Bundle) -> list[tuple[str, str]]:
    runs = []
    members: list[tuple[str, str]] = []
    for index, run in enumerate(bundle.runs):
        tape_name = f"runs/{index}/tape.json"
        entry: dict[str, Any] = {"name": run.name, "call": run.call, "tape": tape_name}
        entry["reads"] = channel_summary(run.tape)
        members.append((tape_name, json.dumps(run.tape, indent=1)))
        if run.verdict is not None:
            verdict_name = f"runs/{index}/verdict.json"
            entry["verdict"] = verdict_name
            members.append((verdict_name, run.verdict))
        runs.append(entry)
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "llmdiag_version": bundle.llmdiag_version,
        "recorded_at_unix": bundle.recorded_at_unix or time.time(),
        "command": bundle.command,
        "options": bundle.options,
        "runs": runs,
    }
    return [(MANIFEST, json.dumps(manifest, indent=1)), *members]


def write_bundle(path: Path, bundle: Bundle, secrets: Iterable[str] = ()) -> int:
    """Write the bundle atomically (a temporary file beside it, renamed): never half a file. Returns its size."""
    secrets = list(secrets)
    members = [(name, scrub(text, secrets).encode("utf-8")) for name, text in _members(bundle)]
    # a bundle the reader would refuse is not written: say so now, not when someone opens it
    largest, total = max(len(data) for _, data in members), sum(len(data) for _, data in members)
    if largest > MAX_MEMBER_BYTES or total > MAX_TOTAL_BYTES:
        raise UsageError(
            f"the recording is {total // 2**20} MiB, over what a bundle may hold "
            f"({MAX_MEMBER_BYTES // 2**20} MiB a run, {MAX_TOTAL_BYTES // 2**20} MiB in all): not written",
            f"record a shorter {option('duration_seconds')}, or fewer targets",
        )
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as zipped, tarfile.open(fileobj=zipped, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(bundle.recorded_at_unix or time.time())
            tar.addfile(info, io.BytesIO(data))
    if len(raw.getvalue()) > MAX_FILE_BYTES:
        raise UsageError(
            f"the recording compresses to {len(raw.getvalue()) // 2**20} MiB, over the "
            f"{MAX_FILE_BYTES // 2**20} MiB a bundle may be: not written",
            f"record a shorter {option('duration_seconds')}, or fewer targets",
        )
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
        try:
            os.fchmod(fd, 0o644)  # as any file the user writes (mkstemp's is 0600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(raw.getvalue())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        raise UsageError(
            f"cannot write the bundle {path}: {exc.strerror or exc}", f"pick another {option('record')} path"
        ) from None
    return len(raw.getvalue())


# --- reading --------------------------------------------------------------------------------------------------


def is_bundle(path: Path) -> bool:
    """Whether ``path`` looks like a bundle: a gzipped tar (a cheap look at its first header); the reader then says
    plainly when it is a tar but not a bundle."""
    try:
        with path.open("rb") as handle:
            if handle.read(2) != GZIP_MAGIC:
                return False
            handle.seek(0)
            head = gzip.GzipFile(fileobj=handle).read(512)
    except (OSError, EOFError, gzip.BadGzipFile):
        return False
    return head[257:262] == b"ustar"


class _Capped(io.RawIOBase):
    """A decompressed stream that stops at ``cap`` bytes: a gzip bomb ends here, not in memory."""

    def __init__(self, inner: Any, cap: int, where: str) -> None:
        self.inner, self.cap, self.where, self.read_bytes = inner, cap, where, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.inner.read(len(buffer))
        self.read_bytes += len(data)
        if self.read_bytes > self.cap:
            raise InputFileError(
                f"{self.where} decompresses to more than {self.cap // 2**20} MiB: refused (a gzip bomb?)", HINT
            )
        buffer[: len(data)] = data
        return len(data)


def read_members(path: Path, max_file_bytes: int = MAX_FILE_BYTES, max_total_bytes: int = MAX_TOTAL_BYTES) -> dict:
    """The bundle's members by name, as text: every cap and rule of the module docstring enforced."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise InputFileError(f"{path}: {exc.strerror or exc}", HINT) from None
    if size > max_file_bytes:
        raise InputFileError(f"{path} is {size // 2**20} MiB, over the {max_file_bytes // 2**20} MiB bundle cap", HINT)
    members: dict[str, str] = {}
    try:
        with path.open("rb") as handle, gzip.GzipFile(fileobj=handle) as unzipped:
            stream = io.BufferedReader(_Capped(unzipped, max_total_bytes, str(path)))
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                for count, member in enumerate(tar, start=1):
                    if count > MAX_MEMBERS:
                        raise InputFileError(f"{path} holds more than {MAX_MEMBERS} members: refused", HINT)
                    _check_member(path, member, members)
                    if member.isdir():
                        continue
                    handle_member = tar.extractfile(member)
                    assert handle_member is not None  # a regular file, checked above
                    data = handle_member.read(MAX_MEMBER_BYTES + 1)
                    if len(data) > MAX_MEMBER_BYTES:
                        raise InputFileError(f"{path}: {member.name} is over the member cap", HINT)
                    try:
                        members[member.name] = data.decode("utf-8")
                    except UnicodeDecodeError:
                        raise InputFileError(f"{path}: {member.name} is not UTF-8 text", HINT) from None
    except (tarfile.TarError, gzip.BadGzipFile, EOFError, OSError, ValueError) as exc:
        if isinstance(exc, InputFileError):
            raise
        raise InputFileError(f"{path} is not a readable bundle ({type(exc).__name__}: {exc})", HINT) from None
    return members


def _check_member(path: Path, member: tarfile.TarInfo, seen: dict[str, str]) -> None:
    name = member.name
    if member.issym() or member.islnk():
        raise InputFileError(f"{path}: member {name!r} is a link: refused", HINT)
    if not (member.isreg() or member.isdir()):
        raise InputFileError(f"{path}: member {name!r} is not a regular file: refused", HINT)
    if name.startswith(("/", "\\")) or ".." in name.replace("\\", "/").split("/") or "\\" in name or ":" in name:
        raise InputFileError(f"{path}: member {name!r} points outside the bundle: refused", HINT)
    if member.isdir():
        return
    if not MEMBER_RE.match(name):
        raise InputFileError(f"{path}: member {name!r} is not part of a bundle: refused", HINT)
    if name in seen:
        raise InputFileError(f"{path}: member {name!r} appears twice: refused", HINT)
    if member.size > MAX_MEMBER_BYTES:
        raise InputFileError(f"{path}: {name} declares {member.size} bytes, over the member cap", HINT)


def _json(path: Path, name: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InputFileError(f"{path}: {name} is not JSON ({exc})", HINT) from None


def read_bundle(path: Path) -> Bundle:
    """A bundle's manifest, runs and tapes, checked: a file that is not one is an InputFileError with the reason."""
    members = read_members(path)
    if MANIFEST not in members:
        raise InputFileError(f"{path} has no {MANIFEST}: not an llmdiag bundle", HINT)
    manifest = _json(path, MANIFEST, members[MANIFEST])
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise InputFileError(f"{path}: {MANIFEST} does not say format '{FORMAT}'", HINT)
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise InputFileError(
            f"{path} is bundle format {version!r}; this llmdiag reads format {FORMAT_VERSION}",
            f"replay it with llmdiag {manifest.get('llmdiag_version', '?')}, which wrote it",
        )
    runs = manifest.get("runs")
    if not isinstance(runs, list) or not runs:
        raise InputFileError(f"{path}: {MANIFEST} lists no runs", HINT)
    bundle = Bundle(
        command=str(manifest.get("command", "")),
        options=options if isinstance(options := manifest.get("options"), dict) else {},
        llmdiag_version=str(manifest.get("llmdiag_version", "")),
        recorded_at_unix=float(manifest.get("recorded_at_unix") or 0.0),
    )
    for entry in runs:
        if not isinstance(entry, dict) or not isinstance(entry.get("call"), dict):
            raise InputFileError(f"{path}: a run in {MANIFEST} has no 'call'", HINT)
        tape_name = str(entry.get("tape", ""))
        if tape_name not in members:
            raise InputFileError(f"{path}: run {entry.get('name')!r} names a tape it does not hold", HINT)
        verdict_name = entry.get("verdict")
        bundle.runs.append(
            Run(
                name=str(entry.get("name", "")),
                call=entry["call"],
                tape=_json(path, tape_name, members[tape_name]),
                verdict=members.get(str(verdict_name)) if verdict_name else None,
            )
        )
    return bundle
