"""Load and validate the catalogue: probe specs and rules, shipped as data packages in the wheel."""

from __future__ import annotations

import sys
from functools import cache, lru_cache
from importlib import resources
from importlib.resources.abc import Traversable
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from llmdiag.errors import RuleSpecError
from llmdiag.schema.collectives import CollectiveSpec
from llmdiag.schema.probes import ProbeSpec
from llmdiag.schema.rules import RuleSpec

M = TypeVar("M", bound=BaseModel)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _walk_toml(root: Traversable, prefix: str = "") -> list[tuple[str, Traversable]]:
    found: list[tuple[str, Traversable]] = []
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if entry.is_dir():
            found += _walk_toml(entry, f"{prefix}{entry.name}/")
        elif entry.name.endswith(".toml"):
            found.append((f"{prefix}{entry.name}", entry))
    return found


def _parse(model: type[M], display_path: str, text: str) -> M:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RuleSpecError(display_path, "(file)", f"not valid TOML: {exc}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(file)"
        raise RuleSpecError(display_path, field, first["msg"]) from None


def parse_rule(display_path: str, text: str) -> RuleSpec:
    rule = _parse(RuleSpec, display_path, text)
    stem = display_path.rsplit("/", 1)[-1].removesuffix(".toml")
    expected = f"{rule.code}-{rule.slug}"
    if stem != expected:
        raise RuleSpecError(display_path, "code/slug", f"file must be named {expected}.toml")
    folder = display_path.rsplit("/", 2)[-2] if "/" in display_path else ""
    if folder and folder != rule.category.value:
        where = f"rules/{rule.category.value}/"
        raise RuleSpecError(display_path, "category", f"a '{rule.category.value}' rule lives in {where}")
    return rule


@lru_cache(maxsize=1)
def load_rules() -> tuple[RuleSpec, ...]:
    rules: list[RuleSpec] = []
    seen: dict[str, str] = {}
    for rel, entry in _walk_toml(resources.files("llmdiag.rules")):
        path = f"rules/{rel}"
        rule = parse_rule(path, entry.read_text(encoding="utf-8"))
        if rule.code in seen:
            raise RuleSpecError(path, "code", f"{rule.code} is already used by {seen[rule.code]}")
        seen[rule.code] = path
        rules.append(rule)
    return tuple(sorted(rules, key=lambda r: r.code))


# probes/*.toml that are data tables, not probe specs: each is read by its own model and loader
DATA_TABLES = frozenset({"collectives", "links", "logs", "signals"})


@cache
def probe_names() -> tuple[str, ...]:
    """Every probe spec in probes/ (its data tables left out), in file-name order."""
    files = [e.name for e in resources.files("llmdiag.probes").iterdir() if e.is_file() and e.name.endswith(".toml")]
    return tuple(sorted(n for n in (f.removesuffix(".toml") for f in files) if n not in DATA_TABLES))


@cache
def load_probe(name: str) -> ProbeSpec:
    entry = resources.files("llmdiag.probes") / f"{name}.toml"
    if not entry.is_file():
        raise RuleSpecError(f"probes/{name}.toml", "(file)", "no such probe spec")
    return _parse(ProbeSpec, f"probes/{name}.toml", entry.read_text(encoding="utf-8"))


def find_rule(code: str) -> RuleSpec | None:
    code = code.upper()
    return next((r for r in load_rules() if r.code == code), None)


@cache
def load_collectives() -> CollectiveSpec:
    """probes/collectives.toml: the patterns that tell communication kernels and ops in a profiler trace."""
    entry = resources.files("llmdiag.probes") / "collectives.toml"
    return _parse(CollectiveSpec, "probes/collectives.toml", entry.read_text(encoding="utf-8"))
