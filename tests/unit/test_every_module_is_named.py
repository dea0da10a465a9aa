"""Every module of llmdiag/ is named by some test: imported (directly, or through a package's face, as
``from llmdiag.model import Verdict`` names llmdiag.model.verdict), or named in a string (``"llmdiag.api.scan"``,
``llmdiag/render/docs.py``). A module no test names is exercised, at best, through the CLI end to end, where a
failure points at nothing: give it a focused test under tests/unit/<package>/, or, where it truly has nothing to
test on its own, a line in ALLOWED with the reason.

Read statically (ast), so it runs in a fraction of a second and imports nothing.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

from tests.conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "llmdiag"
TESTS = REPO_ROOT / "tests"
DOTTED = re.compile(r"\bllmdiag(?:[./][A-Za-z_][A-Za-z0-9_]*)+")

# modules no test names, and why that is right
ALLOWED = {
    # `python -m llmdiag`: two lines calling llmdiag.cli.main, run by every CLI test (tests/conftest.run_cli)
    "llmdiag.__main__": "run as `python -m llmdiag` by every end-to-end test",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@cache
def face_names(package: str) -> dict[str, str]:
    """What a package's __init__ imports by name from llmdiag: name -> the module it comes from (followed through
    faces further down), including the TYPE_CHECKING imports a lazy face declares."""
    path = PACKAGE.parent.joinpath(*package.split("."), "__init__.py")
    if not path.is_file():
        return {}
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("llmdiag"):
            for alias in node.names:
                found[alias.asname or alias.name] = face_names(node.module).get(alias.name, node.module)  # type: ignore[arg-type]
    return found


def named_in(path: Path) -> set[str]:
    """The llmdiag modules (and module.attribute names) one test file names."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("llmdiag"):
            module = node.module or ""
            names.add(module)
            for alias in node.names:
                names.add(f"{module}.{alias.name}")  # a submodule imported by name
                names.add(face_names(module).get(alias.name, module))  # a name a face re-exports
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.update(m.replace("/", ".").removesuffix(".py") for m in DOTTED.findall(node.value))
    return names


def command_modules() -> set[str]:
    """The CLI's command modules, each resolved under its command name by tests/unit/cli/test_lazy_group.py (through
    llmdiag.cli.COMMANDS, read here as that test reads it) and run as `llmdiag COMMAND` by tests/e2e."""
    tree = ast.parse((PACKAGE / "cli" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "COMMANDS" for t in node.targets):
            return {f"llmdiag.cli.{value}" for value in ast.literal_eval(node.value).values()}
    raise AssertionError("llmdiag.cli has no COMMANDS table")


def unnamed() -> list[str]:
    named: set[str] = set()
    for path in TESTS.rglob("*.py"):
        if path != Path(__file__):  # this file names modules only to allow them
            named |= named_in(path)
    if "llmdiag.cli.COMMANDS" in named:
        named |= command_modules()

    def is_named(module: str) -> bool:
        # a package is named when any module inside it is: importing that module runs the package's __init__
        return any(n == module or n.startswith(module + ".") for n in named)

    return [m for m in modules() if not is_named(m)]


def test_every_module_is_named_by_a_test():
    missing = [m for m in unnamed() if m not in ALLOWED]
    assert missing == [], (
        f"no test names {', '.join(missing)}: add a focused test under tests/unit/, or a reasoned line in ALLOWED"
    )


def test_the_allowlist_holds_only_modules_that_exist_and_no_test_names():
    assert set(ALLOWED) <= set(modules()), "ALLOWED names a module that is gone"
    assert set(ALLOWED) <= set(unnamed()), "a module in ALLOWED is named by a test now: drop its line"


def test_a_face_is_followed_to_the_module_that_defines_the_name():
    assert face_names("llmdiag.model")["Verdict"] == "llmdiag.model.verdict"
    assert face_names("llmdiag")["diagnose"] == "llmdiag.api.scan"  # llmdiag -> llmdiag.api -> llmdiag.api.scan
    assert "llmdiag.cli.scan" in command_modules()


def test_the_check_reads_every_way_of_naming(tmp_path: Path):
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import llmdiag.config\n"
        "from llmdiag.render import nagios\n"
        "from llmdiag.model import FleetReport\n"
        "PATHS = ['llmdiag/render/docs.py', 'see llmdiag.api.scan']\n"
    )
    names = named_in(probe)
    for module in ("llmdiag.config", "llmdiag.render.nagios", "llmdiag.model.fleet", "llmdiag.render.docs"):
        assert module in names, module
    assert "llmdiag.api.scan" in names
