"""Which engine a verdict is about, and each finding's fixes for it.

One place for the engine's name and the order fixes are shown in: the evaluator picks the detected engine's fixes
with it, and the terminal, Markdown and HTML renderers all show them through :func:`fix_view` (the detected
engine's first, labelled; the other engines' collapsed or left to ``llmdiag rules show CODE``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from llmdiag.model import Finding, SourceInfo, Verdict
from llmdiag.schema.rules import ENGINES, RuleSpec

ENGINE_TITLES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM", "tgi": "TGI", "llamacpp": "llama.cpp"}
# what a verdict without a recognised server is shown (an analysis of GPU telemetry or traces only)
DEFAULT_ENGINE = "vllm"
# probes whose server takes another engine's options: Triton's TensorRT-LLM backend runs TensorRT-LLM's executor
PROBE_ENGINES = {"triton": "trtllm"}


def engine_of(probe: str) -> str:
    """The engine whose fixes fit a probe's server ('sglang-log' → sglang, 'triton' → trtllm); vLLM when unknown."""
    name = probe.removesuffix("-log")
    name = PROBE_ENGINES.get(name, name)
    return name if name in ENGINES else DEFAULT_ENGINE


def sources_engine(sources: Sequence[SourceInfo]) -> str:
    """The engine of a scan: its first source is the server's probe (llmdiag.collect puts it there)."""
    return engine_of(sources[0].probe) if sources else DEFAULT_ENGINE


def verdict_engine(verdict: Verdict) -> str:
    return sources_engine(verdict.coverage.probes)


def fixes_for(rule: RuleSpec, engine: str) -> list[str]:
    """The finding's ``fixes``: the rule's text for everyone, then the engine's own flags."""
    return [rule.fix.text, *rule.fix.for_engine(engine)]


def engine_fixes(rule: RuleSpec) -> dict[str, list[str]]:
    """Every engine's flags the rule names, in ENGINES order (engines outside ``applies_to`` have none)."""
    return {engine: list(flags) for engine in ENGINES if (flags := rule.fix.for_engine(engine))}


@dataclass
class FixView:
    """A finding's fixes as the renderers show them."""

    text: str
    engine: str
    title: str
    own: list[str]  # the detected engine's flags (empty: the rule names none for it)
    others: list[tuple[str, list[str]]] = field(default_factory=list)  # (engine title, flags), ENGINES order


def fix_view(finding: Finding, engine: str) -> FixView | None:
    if not finding.fixes:
        return None
    # a verdict saved before engine_fixes existed carries only its own engine's flags
    own = finding.engine_fixes.get(engine, []) if finding.engine_fixes else finding.fixes[1:]
    others = [(ENGINE_TITLES[e], flags) for e, flags in finding.engine_fixes.items() if e != engine and flags]
    return FixView(
        text=finding.fixes[0], engine=engine, title=ENGINE_TITLES.get(engine, engine), own=own, others=others
    )
