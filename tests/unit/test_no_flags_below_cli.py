"""Nothing below the CLI names a CLI flag: a message, hint, coverage note or reason that tells the user to change
an option names it through ``llmdiag.errors.option``, so a library caller reads the keyword and the CLI its flag.

The flags are the CLI's own (every option of every command, read from the typer app, so the list keeps in step);
the string literals are every module's outside ``llmdiag/cli/`` (docstrings and comments aside)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer.main

import llmdiag
from llmdiag.cli import COMMANDS, app
from llmdiag.cli.options import flag_name

PACKAGE = Path(llmdiag.__file__).resolve().parent
# the CLI, and the NCCL benchmark's own command line beside it (torchrun runs it; its argparse flags are its own)
CLI_FLOOR = ("cli/",)
# where a literal names another program's flag that is spelled as one of llmdiag's (the servers' other flags,
# --enable-metrics, --parallel, --extra_llm_api_options, curl's --compressed …, are not llmdiag's: nothing to allow)
ALLOWED = {
    # torchrun's --nproc-per-node, in the command line that starts the benchmark's ranks
    ("collect/nccl/launch.py", "--nproc-per-node"),
    # vLLM's --max-num-seqs: the setting of the simulated vLLM a preset describes
    ("sim/presets.py", "--max-num-seqs"),
}
# a whole command line a person runs by hand (a `verify` text, a file to give): its flags are that command's
COMMAND_LINE = re.compile(rf"^\s*(llmdiag ({'|'.join(map(re.escape, COMMANDS))})\b|torchrun |curl |python -m )")
FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")


def cli_flags() -> set[str]:
    """Every --flag of every command (and --no-x of a --x/--no-x pair)."""

    def walk(command) -> Iterator[str]:
        for param in command.params:
            yield from (o for o in (*param.opts, *getattr(param, "secondary_opts", [])) if o.startswith("--"))
        for sub in getattr(command, "commands", {}).values():
            yield from walk(sub)

    return set(walk(typer.main.get_command(app)))


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def string_literals(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, text) of each string literal; an f-string as one text with '{}' for its fields."""
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(part) for part in node.values)
            text = "".join(p.value if isinstance(p, ast.Constant) else "{}" for p in node.values)
            yield node.lineno, text
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.lineno, node.value


def in_command_line(text: str, at: int) -> bool:
    """Whether the flag at ``at`` belongs to a command line: the text since the last backtick starts with one."""
    return bool(COMMAND_LINE.match(text[text.rfind("`", 0, at) + 1 : at]))


def flags_below_cli(flags: set[str], package: Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        module = path.relative_to(package).as_posix()
        if module.startswith(CLI_FLOOR):
            continue
        for line, text in string_literals(ast.parse(path.read_text(encoding="utf-8"))):
            for match in FLAG.finditer(text):
                flag = match.group()
                if flag in flags and (module, flag) not in ALLOWED and not in_command_line(text, match.start()):
                    found.append(f"llmdiag/{module}:{line}: {flag} in {text!r}")
    return found


def test_the_flag_list_is_the_clis():
    flags = cli_flags()
    assert {"--duration", "--dcgm-url", "--pid", "--no-history", "--prometheus-ca", "--max-num-seqs"} <= flags


def test_no_module_below_the_cli_names_a_cli_flag():
    offenders = flags_below_cli(cli_flags())
    assert offenders == [], "name the option with llmdiag.errors.option(key):\n" + "\n".join(offenders)


def test_the_guard_sees_a_flag_put_back(tmp_path):
    (tmp_path / "collect").mkdir()
    (tmp_path / "collect" / "bad.py").write_text(
        "def hint(pid):\n"
        '    """A docstring may say --pid."""\n'
        '    return f"pass --pid {pid}; or run `llmdiag scan URL --pid 1`"  # a comment may say --pid\n'
    )
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "scan.py").write_text('PID = "--pid"\n')  # the CLI names its flags
    assert flags_below_cli({"--pid"}, tmp_path) == [
        "llmdiag/collect/bad.py:3: --pid in 'pass --pid {}; or run `llmdiag scan URL --pid 1`'"
    ]


@pytest.mark.parametrize(
    ("text", "flag", "command_line"),
    [
        ("llmdiag history --target X --since 7d", "--since", True),
        ("give a file written by `llmdiag scan --json`, `llmdiag demo -o FILE`", "--json", True),
        ("torchrun --nproc-per-node N -m llmdiag.nccl_bench --ops all_reduce", "--ops", True),
        ("`llmdiag scan` found no GPU; pass --dcgm-url", "--dcgm-url", False),
        ("llmdiag models dense transformers; pick a built-in --model", "--model", False),
    ],
)
def test_a_flag_in_a_whole_command_line_is_that_commands(text, flag, command_line):
    assert in_command_line(text, text.index(flag)) is command_line


def option_keys(package: Path = PACKAGE) -> dict[str, str]:
    """key -> where, for each ``option('key')`` call with a literal key below the CLI."""
    keys = {}
    for path in sorted(package.rglob("*.py")):
        module = path.relative_to(package).as_posix()
        if module.startswith(CLI_FLOOR):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "option" and node.args:
                key = node.args[0]
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    keys.setdefault(key.value, f"llmdiag/{module}:{node.lineno}")
    return keys


def test_every_option_named_below_the_cli_is_a_cli_flag():
    # a key the CLI spells as no flag of its own (a typo, or a flag spelled otherwise and missing from FLAG_NAMES)
    # would print a flag that does not exist
    flags = cli_flags()
    keys = option_keys()
    assert len(keys) > 40
    assert {
        f"{where}: {key} -> {flag_name(key)}" for key, where in keys.items() if flag_name(key) not in flags
    } == set()
