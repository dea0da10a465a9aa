"""Rule specs (rules/<category>/<CODE>-<slug>.toml): gate, severity ladder, texts and fixes per engine."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from llmdiag.model import Category
from llmdiag.model.whatif import CHANGE_NAMES
from llmdiag.schema.base import _Strict

# ---------------------------------------------------------------------------------------------
# rules

CODE_RE = re.compile(r"^(MEM|CMP|SCH|NET|SAN|REG)\d{3}$")
SLUG_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
# a summary's placeholders: {signal.stat} or {signal.stat:format}, filled in by llmdiag.engine.evaluate
PLACEHOLDER_RE = re.compile(r"\{([a-z0-9_]+)\.([a-z0-9]+)(?::([^}]+))?\}")
CODE_PREFIX = {
    "MEM": "memory",
    "CMP": "compute",
    "SCH": "scheduling",
    "NET": "network",
    "SAN": "sanity",
    "REG": "regression",
}


class SignalRef(_Strict):
    signal: str
    stat: str = "value"


class Condition(SignalRef):
    op: Literal[">", ">=", "<", "<=", "==", "!="]
    value: float
    # a gate whose signal a server does not have: "skip" the rule (the default), or "pass" and judge it on the rest
    # (for a guard another gate or the server's design already covers; the evidence shows it unavailable)
    if_missing: Literal["skip", "pass"] = "skip"

    def holds(self, observed: float) -> bool:
        return {
            ">": observed > self.value,
            ">=": observed >= self.value,
            "<": observed < self.value,
            "<=": observed <= self.value,
            "==": observed == self.value,
            "!=": observed != self.value,
        }[self.op]


class Ladder(SignalRef):
    """Severity from one signal: ``warning`` and ``critical`` thresholds in ``direction``."""

    direction: Literal["above", "below"] = "above"
    warning: float
    critical: float | None = None  # none: the finding never goes past warning

    @model_validator(mode="after")
    def _ordered(self) -> Ladder:
        if self.critical is None:
            return self
        if self.direction == "above" and self.critical < self.warning:
            raise ValueError("with direction 'above', critical must be >= warning")
        if self.direction == "below" and self.critical > self.warning:
            raise ValueError("with direction 'below', critical must be <= warning")
        return self


Engine = Literal["vllm", "sglang", "trtllm", "tgi", "llamacpp"]
ENGINES: tuple[Engine, ...] = ("vllm", "sglang", "trtllm", "tgi", "llamacpp")


class WhatIfFix(_Strict):
    """One way the fix would be applied, as a what-if (llmdiag.engine.whatif): the parameters it sets, each a value
    or a rule on the measured one (``"x2"``: twice the value in use; ``"users"``: the closed-loop users seen), or
    ``not_modelled`` with the reason where it changes nothing the model takes."""

    set: dict[str, int | float | str | bool] = Field(default_factory=dict)
    not_modelled: str = ""

    @model_validator(mode="after")
    def _one_of(self) -> WhatIfFix:
        if bool(self.set) == bool(self.not_modelled.strip()):
            raise ValueError("a what-if fix gives either `set` or `not_modelled`")
        unknown = [name for name in self.set if name not in CHANGE_NAMES]
        if unknown:
            raise ValueError(f"unknown what-if parameter(s) {', '.join(unknown)}; known: {', '.join(CHANGE_NAMES)}")
        return self


class Fix(_Strict):
    """What to change: ``text`` for everyone, then each engine's own flags or options. An engine the rule cannot
    judge (its signals do not exist there) is left out of ``applies_to``; every engine in it needs its fixes."""

    text: str
    vllm: list[str] = Field(default_factory=list)
    sglang: list[str] = Field(default_factory=list)
    trtllm: list[str] = Field(default_factory=list)
    tgi: list[str] = Field(default_factory=list)
    llamacpp: list[str] = Field(default_factory=list)
    applies_to: list[Engine] = Field(default_factory=lambda: list(ENGINES))
    # what the fix would buy, predicted on the window (schema "3": Finding.predicted); empty: not a parameter change
    whatif: list[WhatIfFix] = Field(default_factory=list)

    def for_engine(self, engine: str) -> list[str]:
        return list(getattr(self, engine, [])) if engine in ENGINES else []

    @model_validator(mode="after")
    def _fixes_where_it_applies(self) -> Fix:
        if not self.text.strip():
            raise ValueError("fix text is empty")
        if len(set(self.applies_to)) != len(self.applies_to):
            raise ValueError("applies_to repeats an engine")
        outside = [e for e in ENGINES if getattr(self, e) and e not in self.applies_to]
        if outside:
            raise ValueError(f"fixes for {', '.join(outside)}, which applies_to leaves out")
        empty = [e for e in ENGINES if any(not flag.strip() for flag in getattr(self, e))]
        if empty:
            raise ValueError(f"an empty fix for {', '.join(empty)}")
        return self


class RuleSpec(_Strict):
    code: str
    slug: str
    title: str
    category: Category
    status: Literal["preview", "stable", "deprecated"] = "stable"
    # a fault or a risk worth fixing that does not by itself limit the server (a degraded but idle link, an OOM
    # risk): shown with its evidence, never the verdict's class
    advisory: bool = False
    # the engine made no progress while requests ran or waited: a hang, never a capacity limit. A firing stall rule
    # heads the findings and makes the verdict "stalled"; every capacity class beside it stays below 0.5 confidence
    stall: bool = False
    summary: str
    what: str
    why: str
    verify: str = ""
    severity: Ladder
    gate: list[Condition] = Field(default_factory=list)
    evidence: list[SignalRef] = Field(default_factory=list)
    fix: Fix
    # judged only where that rule is skipped for want of inputs (a stand-in for logs, which lack request counts)
    instead_of: str | None = None
    # what the rule judges: one server's window ("server"), or several replicas side by side ("fleet": judged on the
    # fleet's own signals by llmdiag.engine.fleet, never in a single server's verdict)
    scope: Literal["server", "fleet"] = "server"
    # sanity rules: the signals whose values this rule's finding makes untrustworthy, by name, by kind ("gauge",
    # "counter", "histogram") or "bounded" (gauges with a valid range in their probe spec). The rule export silences
    # the capacity alerts that read them while this rule's condition holds (llmdiag.api.alerting).
    doubts: list[str] = Field(default_factory=list)

    @field_validator("code")
    @classmethod
    def _code(cls, code: str) -> str:
        if not CODE_RE.match(code):
            raise ValueError("must be MEM, CMP, SCH, NET, SAN or REG followed by three digits")
        return code

    @field_validator("slug")
    @classmethod
    def _slug(cls, slug: str) -> str:
        if not SLUG_RE.match(slug):
            raise ValueError("must be lower-case words joined by '-'")
        return slug

    @model_validator(mode="after")
    def _category_matches_code(self) -> RuleSpec:
        if CODE_PREFIX[self.code[:3]] != self.category.value:
            raise ValueError(f"code {self.code} belongs to category '{CODE_PREFIX[self.code[:3]]}'")
        return self

    @model_validator(mode="after")
    def _stall_is_a_verdict(self) -> RuleSpec:
        if self.stall and (self.advisory or self.category.value in ("sanity", "regression")):
            raise ValueError("a stall rule sets the verdict: it can be neither advisory nor sanity/regression")
        return self

    @model_validator(mode="after")
    def _doubts_are_sanity(self) -> RuleSpec:
        if self.doubts and self.category.value != "sanity":
            raise ValueError("only sanity rules doubt other signals")
        return self

    def inputs(self) -> list[SignalRef]:
        return [self.severity, *self.gate, *self.evidence]
