"""The root group: it knows every command's module, and imports one only when that command is looked up."""

from __future__ import annotations

import subprocess
import sys

from llmdiag.cli import COMMANDS, SUBGROUPS, LazyCommands


def test_importing_the_cli_loads_no_command():
    probe = (
        "import sys, llmdiag.cli; "
        f"print([m for m in sys.modules if m.removeprefix('llmdiag.cli.') in {sorted(set(COMMANDS.values()))!r}])"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_command_resolves_under_its_name():
    commands = LazyCommands(dict(COMMANDS))
    assert list(commands) == list(COMMANDS)
    for name in COMMANDS:
        command = commands[name]
        assert command.name == name
        assert hasattr(command, "commands") == (name in SUBGROUPS), name
    assert sorted(commands["rules"].commands) == ["docs", "export", "list", "show"]  # type: ignore[attr-defined]
    assert list(commands["sim"].commands) == ["serve"]  # type: ignore[attr-defined]
