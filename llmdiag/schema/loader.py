"""Load and validate the catalogue: probe specs, the signal registry and rules, shipped as data packages in the wheel.

Every loader is cached: the catalogue is read once per process. A rule is checked against the signal registry
(llmdiag.schema.registry) as it is loaded, so a rule that reads an unknown signal or stat never reaches the engine.
"""

from __future__ import annotations

import sys
from functools import cache, lru_cache
from importlib import resources

from llmdiag.errors import RuleSpecError
from llmdiag.schema.base import parse_toml
from llmdiag.schema.collectives import CollectiveSpec
from llmdiag.schema.logs import load_log_spec
from llmdiag.schema.probes import ProbeSpec
from llmdiag.schema.registry import SIGNALS_PATH, SignalCatalogue, SignalRegistry, build_registry
from llmdiag.schema.rules import RuleSpec

if sys.version_info >= (3, 11):
    from importlib.resources.abc import Traversable
else:  # pragma: no cover
    from importlib.abc import Traversable

# the name the catalogue modules of the first layout imported (schema/links.py, schema/logs.py now use parse_toml)
_parse = parse_toml

# probes/*.toml that are data tables, not probe specs: each is read by its own model and loader
DATA_TABLES = frozenset({"collectives", "links", "logs", "signals"})
# rules/*.toml that are not rules: the fitted confidence model (llmdiag.schema.confidence)
RULE_DATA = frozenset({"confidence.toml"})


def _walk_toml(root: Traversable, prefix: str = "") -> list[tuple[str, Traversable]]:
    found: list[tuple[str, Traversable]] = []
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if entry.is_dir():
            found += _walk_toml(entry, f"{prefix}{entry.name}/")
        elif entry.name.endswith(".toml"):
            found.append((f"{prefix}{entry.name}", entry))
    return found


def parse_rule(display_path: str, text: str, registry: SignalRegistry | None = None) -> RuleSpec:
    """One rule file, validated: its schema, its file name and folder, and every signal and stat it reads (against
    ``registry``, by default the catalogue's own)."""
    rule = parse_toml(RuleSpec, display_path, text)
    stem = display_path.rsplit("/", 1)[-1].removesuffix(".toml")
    expected = f"{rule.code}-{rule.slug}"
    if stem != expected:
        raise RuleSpecError(display_path, "code/slug", f"file must be named {expected}.toml")
    folder = display_path.rsplit("/", 2)[-2] if "/" in display_path else ""
    if folder and folder != rule.category.value:
        where = f"rules/{rule.category.value}/"
        raise RuleSpecError(display_path, "category", f"a '{rule.category.value}' rule lives in {where}")
    for field, reason in (registry or load_signal_registry()).rule_problems(rule)[:1]:
        raise RuleSpecError(display_path, field, reason)
    return rule


@lru_cache(maxsize=1)
def load_rules() -> tuple[RuleSpec, ...]:
    rules: list[RuleSpec] = []
    seen: dict[str, str] = {}
    for rel, entry in _walk_toml(resources.files("llmdiag.rules")):
        if rel in RULE_DATA:
            continue
        path = f"rules/{rel}"
        rule = parse_rule(path, entry.read_text(encoding="utf-8"))
        if rule.code in seen:
            raise RuleSpecError(path, "code", f"{rule.code} is already used by {seen[rule.code]}")
        seen[rule.code] = path
        rules.append(rule)
    return tuple(sorted(rules, key=lambda r: r.code))


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
    return parse_toml(ProbeSpec, f"probes/{name}.toml", entry.read_text(encoding="utf-8"))


@cache
def load_code_signals() -> SignalCatalogue:
    """probes/signals.toml alone: the signals code makes (what a producer reads its declarations from)."""
    entry = resources.files("llmdiag.probes") / "signals.toml"
    return parse_toml(SignalCatalogue, SIGNALS_PATH, entry.read_text(encoding="utf-8"))


@cache
def load_signal_registry() -> SignalRegistry:
    """Every signal: the probe specs', the log fields' and the code's (llmdiag.schema.registry)."""
    return build_registry(load_code_signals(), map(load_probe, probe_names()), load_log_spec())


def find_rule(code: str) -> RuleSpec | None:
    code = code.upper()
    return next((r for r in load_rules() if r.code == code), None)


@cache
def load_collectives() -> CollectiveSpec:
    """probes/collectives.toml: the patterns that tell communication kernels and ops in a profiler trace."""
    entry = resources.files("llmdiag.probes") / "collectives.toml"
    return parse_toml(CollectiveSpec, "probes/collectives.toml", entry.read_text(encoding="utf-8"))
