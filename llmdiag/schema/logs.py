"""The log-line catalogue (probes/logs.toml): how a server's log lines become a time series.

A ``[[prefix]]`` finds a line's time and series tags, a ``[[line]]`` recognises a message and names its numbers
(named groups), a ``[[field]]`` says what each named number becomes (which signal, how it accumulates). The reader
is llmdiag.collect.logs; this module only describes and validates the file.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Literal

from pydantic import Field, field_validator

from llmdiag.errors import RuleSpecError
from llmdiag.schema.base import _Strict, compiled_pattern, parse_toml

LOG_SPEC_PATH = "probes/logs.toml"
# named groups a line may carry beside its fields: the DP engine's number, SGLang's batch kind
SERIES_GROUPS = ("engine", "mode")


class LogPrefix(_Strict):
    name: str
    pattern: str
    time_format: str

    _check = field_validator("pattern")(lambda cls, pattern: compiled_pattern(pattern))


class LogLine(_Strict):
    name: str
    server: Literal["vllm", "sglang", "trtllm"]
    prefix: str
    pattern: str
    optional: list[str] = Field(default_factory=list)
    absent_zero: list[str] = Field(default_factory=list)
    itl_estimate: bool = False

    _check = field_validator("pattern")(lambda cls, pattern: compiled_pattern(pattern))

    @field_validator("optional")
    @classmethod
    def _check_optional(cls, patterns: list[str]) -> list[str]:
        return [compiled_pattern(p) for p in patterns]


class LogField(_Strict):
    name: str
    signal: str
    kind: Literal["gauge", "rate", "count", "cumulative"]
    unit: str
    scale: float = 1.0
    aggregate: Literal["sum", "mean"] = "sum"


class LogSpec(_Strict):
    prefix: list[LogPrefix]
    line: list[LogLine]
    field: list[LogField]


def parse_log_spec(text: str, display_path: str = LOG_SPEC_PATH) -> LogSpec:
    """The file validated, and its parts checked against each other: every line's prefix exists and every named
    group of its patterns has a [[field]]."""
    spec = parse_toml(LogSpec, display_path, text)
    prefixes = {p.name for p in spec.prefix}
    fields = {f.name for f in spec.field}
    for line in spec.line:
        if line.prefix not in prefixes:
            raise RuleSpecError(display_path, f"line.{line.name}.prefix", f"no prefix named {line.prefix!r}")
        for pattern in (line.pattern, *line.optional):
            for group in re.compile(pattern).groupindex:
                if group not in fields and group not in SERIES_GROUPS:
                    raise RuleSpecError(display_path, f"line.{line.name}", f"group {group!r} has no [[field]]")
    return spec


@cache
def load_log_spec() -> LogSpec:
    text = (resources.files("llmdiag.probes") / "logs.toml").read_text(encoding="utf-8")
    return parse_log_spec(text)
