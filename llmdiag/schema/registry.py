"""The signal registry: every signal llmdiag can make, by name, with its kind, unit, producer and meaning.

Signals are declared where they are defined, as data:

    probes/<server>.toml   a probe spec's [[signal]] and [[by_design]] entries    producer "probe:<server>"
    probes/logs.toml       the signals its [[field]]s become                         producer "logs"
    probes/signals.toml    every signal that code makes, under a [[producer]]        (collector, logs, llamacpp,
                           that names the module making it                           trtllm-records, canary, trace,
                                                                                     nccl-bench, derived, baseline,
                                                                                     fleet)

``build_registry`` joins the three into one ``SignalRegistry`` (llmdiag.schema.loader.load_signal_registry loads
it once). It serves three readers:

- the rule loader: a rule whose gate, severity, evidence or summary reads a signal the registry does not know, or a
  stat that none of that signal's kinds has, is refused at load with a RuleSpecError (``rule_problems``);
- the producers: engine/derived.py takes each derived signal's unit and meaning from probes/signals.toml
  (``SignalCatalogue.declared``, failing at import for a name declared nowhere), and a unit test
  (tests/unit/schema/test_registry.py) runs every producer and compares what it makes with what it declares
  (``produced_problems``). The other producers keep saying kind and unit where they build a Signal, as a Signal
  needs them, and the test holds the two together; the name lists that existed only for the catalogue test are
  gone, and the tables a producer needs for its own work (engine/baseline's history columns, engine/fleet's
  compared values) are checked by the same test;
- the catalogue test, which no longer unions those lists by hand.

One name may have several producers, even of different kinds: a log's ``itl_seconds`` is an estimate per stat
line (a gauge), a server's is a histogram, and a rule may read any stat one of the kinds has. Its unit is the same
everywhere (the unit is part of what a name means), and the registry refuses a second unit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import Field, model_validator

from llmdiag.errors import RuleSpecError
from llmdiag.schema.base import _Strict
from llmdiag.schema.logs import LogSpec
from llmdiag.schema.probes import STAT_NAMES, ProbeSpec
from llmdiag.schema.promql import COUNTER_STATS, REF_RE, WINDOW_REF, DerivedForm, refs_of
from llmdiag.schema.rules import PLACEHOLDER_RE, RuleSpec, SignalRef

SIGNALS_PATH = "probes/signals.toml"
SignalKind = Literal["gauge", "counter", "histogram", "info", "derived"]
DOUBT_KINDS = ("gauge", "counter", "histogram", "bounded")  # what a sanity rule's `doubts` may name beside signals
PRODUCER_NAME = re.compile(r"^[a-z][a-z0-9-]*$")


class Producer(_Strict):
    name: str = Field(pattern=PRODUCER_NAME.pattern)
    module: str = Field(pattern=r"^llmdiag(\.[a-z_][a-z0-9_]*)+$")
    help: str = Field(min_length=1)


class DeclaredSignal(_Strict):
    """One producer's signal: its name, kind and unit as the producer makes it, and what it means."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    kind: SignalKind
    unit: str = Field(min_length=1)
    producer: str
    help: str = Field(min_length=1)
    # derived signals: the PromQL form (llmdiag.schema.promql) over other signals' {signal.stat} and
    # {window_seconds}; a list: the largest of its expressible members (the scan's max of estimates). Or the reason
    # there is none (promql_unavailable). Read by the rule export (llmdiag rules export).
    promql: str | list[str] = ""
    promql_unavailable: str = ""

    @model_validator(mode="after")
    def _counter_rate(self) -> DeclaredSignal:
        if self.kind == "counter" and not self.name.endswith("_per_second"):
            raise ValueError("counter signals become rates: their name must end in _per_second")
        if (self.promql or self.promql_unavailable) and self.kind != "derived":
            raise ValueError("promql and promql_unavailable are for derived signals")
        if self.promql and self.promql_unavailable:
            raise ValueError("give promql or promql_unavailable, not both")
        if isinstance(self.promql, list) and (not self.promql or not all(p.strip() for p in self.promql)):
            raise ValueError("an empty promql form")
        return self

    def promql_forms(self) -> list[str]:
        return [self.promql] if isinstance(self.promql, str) and self.promql else list(self.promql or [])


class SignalCatalogue(_Strict):
    """probes/signals.toml: the producers in code and the signals each makes."""

    producer: list[Producer] = Field(min_length=1)
    signal: list[DeclaredSignal] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> SignalCatalogue:
        names = [p.name for p in self.producer]
        if len(set(names)) != len(names):
            raise ValueError("producer names repeat")
        seen: set[tuple[str, str]] = set()
        for signal in self.signal:
            if signal.producer not in names:
                raise ValueError(f"signal {signal.name}: no [[producer]] named {signal.producer!r}")
            if (signal.name, signal.producer) in seen:
                raise ValueError(f"signal {signal.name} is declared twice by {signal.producer}")
            seen.add((signal.name, signal.producer))
        return self

    def declared(self, producer: str, name: str) -> DeclaredSignal:
        """A code producer's declaration of one of its signals; RuleSpecError when this file lacks it."""
        found = next((s for s in self.signal if s.producer == producer and s.name == name), None)
        if found is None:
            raise RuleSpecError(SIGNALS_PATH, "signal", f"{producer} makes {name}, which is not declared for it")
        return found


class _Made(Protocol):
    """What a produced signal shows the registry (llmdiag.model.Signal has it)."""

    name: str
    kind: str
    unit: str


@dataclass(frozen=True)
class SignalRegistry:
    declared: tuple[DeclaredSignal, ...]
    producers: tuple[Producer, ...]

    def names(self) -> set[str]:
        return {d.name for d in self.declared}

    def of(self, name: str) -> list[DeclaredSignal]:
        return [d for d in self.declared if d.name == name]

    def kinds(self, name: str) -> set[str]:
        return {d.kind for d in self.of(name)}

    def stats(self, name: str) -> set[str]:
        """The stats a rule may read of this signal: those of any kind it is made as."""
        return set().union(*(STAT_NAMES[kind] for kind in self.kinds(name)))

    def produced_by(self, producer: str) -> dict[str, DeclaredSignal]:
        return {d.name: d for d in self.declared if d.producer == producer}

    def ref_problem(self, name: str, stat: str) -> str | None:
        """Why a rule cannot read ``name``'s ``stat``; None when it can."""
        if name not in self.names():
            return f"no signal named {name!r} in probes/*.toml or {SIGNALS_PATH}"
        if stat not in self.stats(name):
            kinds = " or ".join(sorted(self.kinds(name)))
            return f"{name} is a {kinds} signal, whose stats are {', '.join(sorted(self.stats(name)))}; not {stat!r}"
        return None

    def rule_problems(self, rule: RuleSpec) -> list[tuple[str, str]]:
        """(field, reason) for every input of the rule, and every placeholder of its summary, it cannot read."""
        refs: list[tuple[str, SignalRef]] = [("severity", rule.severity)]
        refs += [(f"gate.{i}", ref) for i, ref in enumerate(rule.gate)]
        refs += [(f"evidence.{i}", ref) for i, ref in enumerate(rule.evidence)]
        found = [(field, why) for field, ref in refs if (why := self.ref_problem(ref.signal, ref.stat))]
        for doubt in rule.doubts:
            if doubt not in DOUBT_KINDS and doubt not in self.names():
                found.append(("doubts", f"{doubt!r} is neither a signal nor one of {', '.join(DOUBT_KINDS)}"))
        for name, stat, _ in PLACEHOLDER_RE.findall(rule.summary):
            why = self.ref_problem(name, stat)
            if why:
                found.append(("summary", f"{{{name}.{stat}}}: {why}"))
        return found

    def produced_problems(self, made: Iterable[_Made], producer: str | None = None) -> list[str]:
        """What is wrong with signals a producer made: a name not declared (by that producer, when given), or one
        declared with another kind or unit. Empty when every one matches a declaration."""
        problems = []
        for signal in made:
            declared = self.of(signal.name)
            if producer is not None:
                declared = [d for d in declared if d.producer == producer]
            where = f" for {producer}" if producer else ""
            if not declared:
                problems.append(f"{signal.name} is not declared{where}")
            elif not any(d.kind == signal.kind and d.unit == signal.unit for d in declared):
                said = ", ".join(f"{d.kind} in {d.unit} ({d.producer})" for d in declared)
                problems.append(f"{signal.name} is made as a {signal.kind} in {signal.unit}; declared as {said}")
        return problems


def _probe_declarations(spec: ProbeSpec) -> list[DeclaredSignal]:
    producer = f"probe:{spec.name}"
    made = [DeclaredSignal(name=s.name, kind=s.kind, unit=s.unit, producer=producer, help=s.help) for s in spec.signal]
    made += [
        DeclaredSignal(name=b.name, kind=b.kind, unit=b.unit, producer=producer, help=b.reason) for b in spec.by_design
    ]
    return made


def _log_declarations(logs: LogSpec) -> list[DeclaredSignal]:
    """A log field becomes a gauge (a level) or a counter (rates, counts and running totals all accumulate)."""
    declared: dict[str, DeclaredSignal] = {}
    for field in logs.field:
        kind: SignalKind = "gauge" if field.kind == "gauge" else "counter"
        help_text = f"from server logs: the {field.name!r} field of probes/logs.toml"
        declared.setdefault(
            field.signal, DeclaredSignal(name=field.signal, kind=kind, unit=field.unit, producer="logs", help=help_text)
        )
    return list(declared.values())


def build_registry(code: SignalCatalogue, probes: Iterable[ProbeSpec], logs: LogSpec) -> SignalRegistry:
    """One registry of the three declarations; RuleSpecError where one name is given two units."""
    declared = list(code.signal) + _log_declarations(logs)
    probe_specs = list(probes)
    for spec in probe_specs:
        declared += _probe_declarations(spec)
    units: dict[str, DeclaredSignal] = {}
    for item in declared:
        first = units.setdefault(item.name, item)
        if first.unit != item.unit:
            raise RuleSpecError(
                SIGNALS_PATH,
                item.name,
                f"{item.producer} makes it in {item.unit!r}, {first.producer} in {first.unit!r}: one unit per name",
            )
    registry = SignalRegistry(declared=tuple(declared), producers=tuple(code.producer))
    for spec in probe_specs:
        for estimate in spec.estimate:
            for stat, text in estimate.promql.items():
                why = registry.ref_problem(estimate.name, stat) or next(
                    (f"{{{n}.{st}}}: {p}" for n, st in refs_of(text) if (p := _estimate_ref(registry, spec, n, st))),
                    None,
                )
                if why:
                    raise RuleSpecError(f"probes/{spec.name}.toml", f"estimate.{estimate.name}.{stat}", why)
    for item in code.signal:
        if item.producer == "derived" and not (item.promql or item.promql_unavailable):
            why_not = "a derived signal needs promql, or promql_unavailable (why not)"
            raise RuleSpecError(SIGNALS_PATH, item.name, why_not)
        for text in item.promql_forms():
            for name, stat in refs_of(text):
                why = registry.ref_problem(name, stat)
                if why:
                    raise RuleSpecError(SIGNALS_PATH, f"{item.name}.promql", f"{{{name}.{stat}}}: {why}")
            if "{" in REF_RE.sub("", text.replace(WINDOW_REF, "")):
                raise RuleSpecError(SIGNALS_PATH, f"{item.name}.promql", "a brace that is not a {signal.stat}")
    return registry


def _estimate_ref(registry: SignalRegistry, spec: ProbeSpec, name: str, stat: str) -> str | None:
    """Why an estimate cannot read ``name``'s ``stat``: as a rule, or a monotonic gauge's rate and increase."""
    if stat in COUNTER_STATS and any(s.name == name and s.monotonic for s in spec.signal):
        return None
    return registry.ref_problem(name, stat)


def derived_forms(registry: SignalRegistry) -> dict[str, DerivedForm]:
    """The derived signals' PromQL forms (probes/signals.toml), by name."""
    forms: dict[str, DerivedForm] = {}
    for item in registry.declared:
        if item.kind == "derived" and (item.promql or item.promql_unavailable):
            forms[item.name] = DerivedForm(
                name=item.name,
                promql=tuple(item.promql_forms()),
                is_max=isinstance(item.promql, list),
                unavailable=item.promql_unavailable,
            )
    return forms
