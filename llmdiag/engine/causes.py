"""The cause graph, and the class a verdict names from the findings that fired.

One table, ``CAUSES``, says which class's root cause explains which other class's findings, with why. A class
explained by another class that also fired, at any severity, is that class's symptom, never the verdict: the
verdict's class is chosen among the classes nothing else explains, by severity, then stable rules before preview
ones, then how far past its threshold the finding is. Two classes neither explains are rivals. A stall (a rule with
``stall = true``) explains every capacity finding beside it: the stall is chosen first, among the stalls by the
same graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

from llmdiag.model import BOTTLENECK_CATEGORIES, Category, Finding
from llmdiag.schema.loader import load_rules

# cause → {symptom: why}: what each class's root cause makes the others' rules see. No cycle (a test checks it).
CAUSES: dict[Category, dict[Category, str]] = {
    Category.memory: {
        Category.scheduling: "a full KV cache leaves no room to admit requests: they wait, are rejected at "
        "admission and get their first token late",
    },
    Category.network: {
        Category.compute: "a step stretched by inter-GPU collectives is a slow step",
        Category.scheduling: "requests queue behind steps that wait on the link",
    },
    Category.compute: {
        Category.scheduling: "requests queue behind slow steps",
    },
    Category.scheduling: {},
}
STALL = "the stall"


@cache
def _preview_codes() -> frozenset[str]:
    return frozenset(r.code for r in load_rules() if r.status == "preview")


def is_preview(finding: Finding) -> bool:
    """A finding of a rule still in preview (``status = "preview"``): it weighs less than a stable rule's."""
    return finding.code in _preview_codes()


def why(cause: Category, symptom: Category) -> str:
    """Why ``cause`` explains ``symptom``'s findings, or "" where it does not."""
    return CAUSES.get(cause, {}).get(symptom, "")


@dataclass
class Choice:
    """The finding that names the verdict's class, and how every other capacity finding stands to it."""

    primary: Finding | None
    findings: list[Finding]  # for the report: the primary first, then by severity
    symptoms: list[tuple[Finding, str]] = field(default_factory=list)  # with the class (or STALL) that explains it
    rivals: list[Finding] = field(default_factory=list)  # classes nothing that fired explains, beside the verdict's


def _rank(finding: Finding) -> tuple[int, bool, float]:
    return (finding.severity.rank, not is_preview(finding), finding.margin)


def _explainers(candidates: list[Finding]) -> dict[Category, list[Category]]:
    """For each class among ``candidates``, the other classes among them whose cause explains it."""
    fired = {f.category for f in candidates}
    return {c: [cause for cause in fired if cause is not c and why(cause, c)] for c in fired}


def choose(findings: list[Finding]) -> Choice:
    capacity = [f for f in findings if f.category in BOTTLENECK_CATEGORIES and not f.advisory]
    stalls = [f for f in capacity if f.stall]
    pool = stalls or capacity
    explained = _explainers(pool)
    roots = [f for f in pool if not explained[f.category]]
    primary = max(roots, key=_rank) if roots else None
    if primary is None:
        return Choice(primary=None, findings=sorted(findings, key=_display_key(None), reverse=True))
    choice = Choice(primary=primary, findings=sorted(findings, key=_display_key(primary), reverse=True))
    ids = {id(f) for f in capacity}
    if primary.stall:  # a stuck engine makes every capacity symptom at once: none competes with the stall
        choice.symptoms = [(f, STALL) for f in choice.findings if id(f) in ids and not f.stall]
        return choice
    others = [f for f in choice.findings if id(f) in ids and f.category is not primary.category]
    explained = _explainers(capacity)
    for finding in others:
        causes = explained[finding.category]
        if primary.category in causes:
            choice.symptoms.append((finding, primary.category.value))
        elif causes:  # explained by another class beside the verdict's: a rival's symptom, not a rival of its own
            choice.symptoms.append((finding, causes[0].value))
        else:
            choice.rivals.append(finding)
    return choice


DisplayKey = tuple[bool, bool, bool, int, bool, bool, float]


def _display_key(primary: Finding | None) -> Callable[[Finding], DisplayKey]:
    """The primary first; then stalls, then what limits the server, by severity; advisories and sanity after."""

    def key(f: Finding) -> DisplayKey:
        same = primary is not None and f.category is primary.category
        return (f is primary, f.stall, not f.advisory, f.severity.rank, same, not is_preview(f), f.margin)

    return key
