"""What the commands print and how they exit: the consoles, ERROR/HINT lines, verdicts, the HTML file, progress bars.

Exit codes (scan, analyze, demo, trace, load …): 0 nothing at or above --fail-on; 1 something is; 2 usage,
configuration or probe error (including "could not probe anything"); 130 interrupted (SIGINT); 143 terminated
(SIGTERM). `check` follows the Nagios plugin conventions instead: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (bad
arguments and unreachable targets included), and the same 130 and 143.
"""

from __future__ import annotations

import errno
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from llmdiag.cli.options import FailOn
from llmdiag.errors import LlmdiagError
from llmdiag.model import Severity, Verdict
from llmdiag.render.files import write_atomic
from llmdiag.render.json import render_json

if TYPE_CHECKING:
    from rich.console import Console

    from llmdiag.model import FleetReport, LoadReport

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
EXIT_NAGIOS_UNKNOWN = 3
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT): 128 + 2, as a shell reports it
EXIT_TERMINATED = 143  # SIGTERM: 128 + 15


class _LazyConsole:
    """A rich Console made on first use (rich.console is a third of a fast command's imports)."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Any = None

    @property
    def console(self) -> Console:
        if self._console is None:
            from rich.console import Console  # on first use: `trace --json` prints without it

            self._console = Console(**self._options)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.console, name)


stdout = _LazyConsole(highlight=False, soft_wrap=False)
stderr = _LazyConsole(stderr=True, highlight=False)


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape  # on first use, as the consoles: `trace --json` needs neither

    return rich_escape(text)


def print_error(message: str, hint: str) -> None:
    # messages carry server text and user paths: escape them so '[...]' is shown, not parsed as markup
    stderr.print(f"[bold red]ERROR:[/] {escape(message)}", highlight=False, soft_wrap=True)
    if hint:
        stderr.print(f"[bold]HINT:[/] {escape(hint)}", highlight=False, soft_wrap=True)


def fail(error: LlmdiagError) -> NoReturn:
    """One ERROR line, one HINT line, exit 2."""
    print_error(error.message, error.hint)
    raise typer.Exit(EXIT_ERROR)


def note(line: str) -> None:
    """A dim progress line on stderr (the text escaped)."""
    stderr.print(f"[dim]{escape(line)}[/]")


def warn(line: str) -> None:
    """A WARNING line on stderr: something was left out, and the run goes on."""
    stderr.print(f"[yellow]WARNING:[/] {escape(line)}", soft_wrap=True)


def exit_for(worst: Severity | None, fail_on: FailOn) -> int:
    """1 when the worst finding is at or above --fail-on, else 0."""
    if fail_on is FailOn.never or worst is None:
        return EXIT_OK
    return EXIT_FINDINGS if worst.rank >= Severity(fail_on.value).rank else EXIT_OK


def exit_code(verdict: Verdict, fail_on: FailOn) -> int:
    return exit_for(verdict.worst_severity(), fail_on)


def print_json(text: str) -> None:
    sys.stdout.write(text + "\n")


def emit(verdict: Verdict, as_json: bool, verbose: bool, markdown: bool = False) -> None:
    if as_json:
        print_json(render_json(verdict))
    elif markdown:
        from llmdiag.render.markdown import render_markdown  # loads rich, which a JSON run does without

        sys.stdout.write(render_markdown(verdict))
    else:
        from llmdiag.render.terminal import render_terminal  # loads rich, which a JSON run does without

        stdout.print(render_terminal(verdict, verbose=verbose))


def write_html(
    path: Path, result: Verdict | LoadReport | FleetReport, quiet: bool = False, flag: str = "--html"
) -> None:
    """The self-contained HTML report, written atomically; says where and how big on stderr."""
    # the HTML renderers load jinja2 and the report's assets, the fleet model its own: only for a run that writes one
    from llmdiag.model import FleetReport
    from llmdiag.render.fleet_html import render_fleet_html
    from llmdiag.render.html import render_html

    text = render_fleet_html(result) if isinstance(result, FleetReport) else render_html(result)
    write_page(path, text, quiet, flag=flag)


def write_page(path: Path, text: str, quiet: bool = False, what: str = "HTML report", flag: str = "--html") -> None:
    """Write an HTML page atomically (one ERROR/HINT pair if it cannot be) and say where, with its size."""
    try:
        write_atomic(path, text)
    except OSError as exc:
        raise cannot_write(path, exc, flag) from None
    if not quiet:
        stderr.print(f"[dim]{what} written to {escape(str(path))} ({len(text.encode()) / 1024:.0f} KB)[/]")


def write_output(path: Path, text: str) -> None:
    """-o/--output: the JSON report, written atomically."""
    try:
        write_atomic(path, text + "\n")
    except OSError as exc:
        raise cannot_write(path, exc, "--output") from None


def cannot_write(path: Path, exc: OSError, flag: str) -> LlmdiagError:
    """A file that could not be written, with what to do about it (the file that was there is left as it was)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return LlmdiagError(
            f"cannot write {path}: {exc.strerror} (the file that was there is left as it was)",
            f"free some space, or pick another {flag} path on another disk",
        )
    if exc.errno == errno.EROFS:
        return LlmdiagError(f"cannot write {path}: {exc.strerror}", f"pick another {flag} path on a writable disk")
    return LlmdiagError(f"cannot write {path}: {exc.strerror or exc}", f"pick another {flag} path")


def written(write: Callable[[], None]) -> LlmdiagError | None:
    """Run a file write that follows a measurement; its error is returned, to be reported after the result is
    printed: a full disk or a read-only folder costs the file, never the window that was measured."""
    try:
        write()
    except LlmdiagError as error:
        return error
    return None


def fail_if(*errors: LlmdiagError | None) -> None:
    """After the result is printed: a file that could not be written is still one ERROR/HINT pair (the first
    file's) and exit 2."""
    for error in errors:
        if error is not None:
            fail(error)


@contextmanager
def recording(path: Path | None, command: str, options: dict[str, Any]) -> Iterator[Any]:
    """--record FILE: a Recorder that this thread's scans record into (None without the option); the bundle is
    written when the block ends, also when the run failed (its reads are what a bug report needs), and a line says
    where. An interrupted run (Ctrl-C) writes nothing: half a window is no recording of one."""
    if path is None:
        yield None
        return
    from llmdiag.api.record import Recorder, recording_to  # the HTTP stack: not for the commands that read files

    recorder = Recorder(path, command, options)
    try:
        with recording_to(recorder):
            yield recorder
    except Exception:  # the run failed: written all the same (KeyboardInterrupt is no Exception: not written)
        _write_recording(recorder, path)
        raise
    _write_recording(recorder, path)


def _write_recording(recorder: Any, path: Path) -> None:
    try:
        recorder.write()
    except LlmdiagError as error:
        print_error(error.message, error.hint)
    else:
        if recorder.written_bytes:
            size = f"{recorder.written_bytes / 1024:.0f} KiB"
            note(f"bundle written to {path} ({size}): attach it to your issue; `llmdiag analyze {path}` replays it")


@contextmanager
def scan_progress(what: str, quiet: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr while scraping, when a person is watching."""
    if quiet or not stderr.is_terminal:
        yield None
        return
    # rich's progress bars load rich.console: only a run that a person watches pays for them
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn("[dim]watching {task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} scrapes"),
        TimeRemainingColumn(),
        console=stderr.console,
        transient=True,
    ) as progress:
        task = progress.add_task(what, total=None)
        yield lambda done, total: progress.update(task, completed=done, total=total)


@contextmanager
def load_progress(total_seconds: float, quiet: bool) -> Iterator[Callable[[str], None]]:
    """A progress bar over the whole sweep on stderr when a person is watching; plain lines otherwise."""
    if quiet:
        yield lambda _: None
        return
    if not stderr.is_terminal:
        yield note
        return
    # rich's progress bars load rich.console: only a run that a person watches pays for them
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(
        TextColumn("[dim]{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=stderr.console,
        transient=True,
    ) as progress:
        task = progress.add_task("starting", total=total_seconds)
        started, done = time.monotonic(), threading.Event()

        def tick() -> None:
            while not done.wait(0.5):
                progress.update(task, completed=min(total_seconds, time.monotonic() - started))

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            yield lambda line: progress.update(task, description=escape(line))
        finally:
            done.set()
            ticker.join()
