"""The house's size figures, measured from the code: modules, functions, parameters, imports inside functions.

    python -m tests.support.house    # print the figures and the worst offenders
    lint-imports                     # the layering contract and cycles (pyproject.toml [tool.importlinter])

tests/unit/test_house.py holds the limits: no module over MAX_MODULE_LINES, no function over MAX_FUNCTION_LINES,
no function with more than MAX_PARAMETERS parameters (the CLI's options come in option dataclasses).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "llmdiag"
MAX_MODULE_LINES = 900
MAX_FUNCTION_LINES = 120
MAX_PARAMETERS = 12


@dataclass(frozen=True)
class Function:
    where: str  # path:line name
    lines: int
    parameters: int


@dataclass
class Figures:
    modules: dict[str, int]
    functions: list[Function]
    imports_in_functions: int
    fmt_skips: int


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [p.arg for p in (a.vararg, a.kwarg) if p is not None]
    return len([n for n in names if n not in ("self", "cls")])


def measure(package: Path = PACKAGE) -> Figures:
    modules: dict[str, int] = {}
    functions: list[Function] = []
    imports_in_functions = fmt_skips = 0
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        name = str(path.relative_to(package.parent))
        modules[name] = len(text.splitlines())
        fmt_skips += text.count("# fmt: skip")
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                functions.append(
                    Function(f"{name}:{node.lineno} {node.name}", node.end_lineno - node.lineno + 1, _parameters(node))
                )
                imports_in_functions += sum(
                    1 for inner in ast.walk(node) if isinstance(inner, (ast.Import, ast.ImportFrom))
                )
    return Figures(modules, functions, imports_in_functions, fmt_skips)


def report(figures: Figures, worst: int = 5) -> str:
    by_lines = sorted(figures.modules.items(), key=lambda kv: -kv[1])
    longest = sorted(figures.functions, key=lambda f: -f.lines)
    widest = sorted(figures.functions, key=lambda f: -f.parameters)
    out = [
        f"modules: {len(figures.modules)}, {sum(figures.modules.values())} lines; "
        f"over {MAX_MODULE_LINES} lines: {sum(1 for _, n in by_lines if n > MAX_MODULE_LINES)}",
        *(f"  {n:5d}  {name}" for name, n in by_lines[:worst]),
        f"functions: {len(figures.functions)}; over {MAX_FUNCTION_LINES} lines: "
        f"{sum(1 for f in longest if f.lines > MAX_FUNCTION_LINES)}",
        *(f"  {f.lines:5d}  {f.where}" for f in longest[:worst]),
        f"over {MAX_PARAMETERS} parameters: {sum(1 for f in widest if f.parameters > MAX_PARAMETERS)}",
        *(f"  {f.parameters:5d}  {f.where}" for f in widest[:worst]),
        f"imports inside functions: {figures.imports_in_functions}",
        f"'# fmt: skip' markers: {figures.fmt_skips}",
    ]
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(report(measure()) + "\n")
