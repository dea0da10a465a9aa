"""The command line: a thin typer shell over ``llmdiag.api``, one module per command. The only package that prints.

The root group knows each command's module and imports it only when that command runs (``--help`` imports them all
to list them), so `llmdiag trace --json` loads neither rich, the HTTP stack nor the other commands' code. Each
command module holds its typer ``app``; ``options`` holds the option types and option dataclasses the commands
share, ``output`` the consoles, ERROR/HINT lines, exit codes and progress bars.

``main`` is the console script: typer's usage errors become the same one ERROR + HINT pair as ours (exit 2;
`check`: a Nagios UNKNOWN line and exit 3), Ctrl-C exits 130, SIGTERM exits 143 (both after every `finally` ran:
servers stopped, load threads ended, no half-written file), and an internal error is one line unless LLMDIAG_DEBUG=1
asks for the traceback.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING, Annotated, Any

import typer
import typer.core
import typer.main

from llmdiag._version import __version__
from llmdiag.cli.options import flag_name
from llmdiag.cli.output import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NAGIOS_UNKNOWN,
    EXIT_OK,
    EXIT_TERMINATED,
    print_error,
    stderr,
    stdout,
)
from llmdiag.errors import use_option_spelling

if TYPE_CHECKING:
    from typer._click import Command  # typer's own click, which its groups hold

# command -> its module in llmdiag.cli, in the order `llmdiag --help` lists them
COMMANDS = {
    "scan": "scan",
    "demo": "demo",
    "trace": "trace",
    "analyze": "analyze",
    "load": "load",
    "report": "report",
    "capacity": "capacity",
    "whatif": "whatif",
    "check": "check",
    "history": "history",
    "nccl-bench": "nccl",
    "rules": "rules",
    "sim": "sim",
}
# the modules whose app is a group of subcommands (`rules list`, `sim serve`), kept a group even with one
SUBGROUPS = {"rules", "sim"}


class LazyCommands(MutableMapping[str, "Command"]):
    """The root group's commands: every name is known, a command's module is imported on first lookup."""

    def __init__(self, modules: dict[str, str]) -> None:
        self._modules = modules
        self._loaded: dict[str, Command] = {}

    def __getitem__(self, name: str) -> Command:
        if name not in self._loaded:
            app = importlib.import_module(f"llmdiag.cli.{self._modules[name]}").app
            self._loaded[name] = typer.main.get_group(app) if name in SUBGROUPS else typer.main.get_command(app)
        return self._loaded[name]

    def __setitem__(self, name: str, command: Command) -> None:
        self._loaded[name] = command
        self._modules.setdefault(name, "")

    def __delitem__(self, name: str) -> None:
        del self._modules[name]
        self._loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __len__(self) -> int:
        return len(self._modules)


class LazyGroup(typer.core.TyperGroup):
    """The root group, with its commands loaded on demand (typer's own lookups, help and suggestions included)."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = LazyCommands(dict(COMMANDS))


app = typer.Typer(
    name="llmdiag",
    cls=LazyGroup,
    help="Tells you why your LLM inference server is slow: KV-cache memory, compute, scheduling or network.",
    pretty_exceptions_show_locals=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    add_completion=False,
)


def version_callback(value: bool) -> None:
    if value:
        stdout.print(f"llmdiag {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=version_callback, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """llmdiag: why is my LLM server slow?"""


class Terminated(BaseException):
    """SIGTERM, raised in the main thread like Ctrl-C's KeyboardInterrupt so that every ``finally`` runs. A
    BaseException, so that no ``except Exception`` (nor typer's own handlers) mistakes it for a failure to report."""


def on_sigterm(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
    raise Terminated


def main() -> None:
    library_spelling = use_option_spelling(flag_name)  # messages from below the CLI name options by their flags
    # the default SIGTERM action ends the process at once: no server stopped, no temporary file removed
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous_sigterm = signal.signal(signal.SIGTERM, on_sigterm) if on_main_thread else None
    try:
        code = app(standalone_mode=False)
        if code == EXIT_INTERRUPTED:  # typer turns Ctrl-C into this exit code itself, silently
            stderr.print("interrupted")
    except typer.TyperException as exc:  # typer's own usage errors: same one-line contract as ours
        code = usage_error(exc)
    except (KeyboardInterrupt, typer.Abort):
        stderr.print("interrupted")
        code = EXIT_INTERRUPTED
    except Terminated:
        stderr.print("terminated")
        code = EXIT_TERMINATED
    except Exception as exc:  # a bug: still one line, with a way to get the traceback
        if os.environ.get("LLMDIAG_DEBUG"):
            raise
        print_error(
            f"internal error: {type(exc).__name__}: {exc}",
            "this is a bug in llmdiag; rerun with LLMDIAG_DEBUG=1 for the traceback",
        )
        code = EXIT_ERROR
    finally:
        use_option_spelling(library_spelling)
        if previous_sigterm is not None:
            signal.signal(
                signal.SIGTERM, previous_sigterm
            )  # a caller that runs main() in-process (the golden set) goes on
    sys.exit(code if isinstance(code, int) else EXIT_OK)


def usage_error(exc: typer.TyperException) -> int:
    """typer's usage error as one ERROR + HINT pair (and for `check`, the Nagios UNKNOWN line); its exit code."""
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
        stdout.print(ctx.get_help())
        return EXIT_OK
    command = ctx.command_path if ctx is not None else "llmdiag"
    hint = f"run `{command} --help` for the options"
    message = exc.format_message()
    if ctx is not None and ctx.info_name == "check":  # a Nagios plugin's bad arguments are UNKNOWN
        sys.stdout.write(f"LLMDIAG UNKNOWN - {' '.join(message.split())}\n")
        print_error(message, hint)
        return EXIT_NAGIOS_UNKNOWN
    print_error(message, hint)
    return EXIT_ERROR
