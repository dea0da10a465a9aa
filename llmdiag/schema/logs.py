"""The log-line catalogue (probes/logs.toml): how a server's log lines become a time series.

A ``[[prefix]]`` finds a line's time and series tags (anywhere in the line), a ``[[line]]`` recognises a message
(tried only on lines that hold its ``keyword``) and names its numbers (named groups), a ``[[field]]`` says what each
named number becomes (which signal, how it accumulates). The readers are llmdiag.collect.log_lines and
llmdiag.collect.logs; this module only describes and validates the file.
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
# named groups a line may carry beside its fields: the DP engine's number, a batch kind, the seconds a rate covers, the
# record's own time in Unix seconds (llama.cpp's "timestamp=")
SERIES_GROUPS = ("engine", "mode", "over_seconds", "unix_time")


class LogPrefix(_Strict):
    name: str
    pattern: str
    time_format: str
    # a prefix any server's lines may carry (Python logging's own format), not one server's
    any_server: bool = False
    # looked for only in lines that hold this substring (speed)
    keyword: str | None = None
    # a pattern for the text right before the prefix (ending where it begins: "$"), whose groups join the prefix's
    tag: str | None = None

    @field_validator("tag")
    @classmethod
    def _check_tag(cls, tag: str | None) -> str | None:
        return None if tag is None else compiled_pattern(tag)

    _check = field_validator("pattern")(lambda cls, pattern: compiled_pattern(pattern))


class LogLine(_Strict):
    name: str
    # "any": a line that shows up in any server's log (the Mooncake transfer engine's), of the server beside it
    server: Literal["vllm", "sglang", "trtllm", "llamacpp", "tgi", "any"]
    # the prefix (or prefixes: one server's vintages) the line comes after; "iso" for lines with no prefix of their own
    prefix: str | list[str]
    # a plain substring every matching line holds: lines without it are skipped before any regex (speed)
    keyword: str = Field(min_length=1)
    pattern: str
    optional: list[str] = Field(default_factory=list)
    absent_zero: list[str] = Field(default_factory=list)
    itl_estimate: bool = False
    # its counts cover the interval since the series' previous line, so the first line's cover time before the log
    interval_counts: bool = False
    # a fallback for a record cut short (the first numbers alone): a line read only by it may be a wrapped line whose
    # rest is on the next line
    cut_short: bool = False

    _check = field_validator("pattern")(lambda cls, pattern: compiled_pattern(pattern))

    @property
    def prefixes(self) -> tuple[str, ...]:
        return (self.prefix,) if isinstance(self.prefix, str) else tuple(self.prefix)

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
    # a count: multiplied by the line's value of this other group (MiB per transfer x transfers)
    times: str | None = None
    # a gauge of one request (its TTFT): in the scrape of its own moment only, not held until the series' next line
    per_request: bool = False


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
    for item in spec.field:
        if item.times is not None and item.times not in fields and item.times not in SERIES_GROUPS:
            raise RuleSpecError(display_path, f"field.{item.name}.times", f"no group named {item.times!r}")
    for line in spec.line:
        for name in line.prefixes:
            if name not in prefixes:
                raise RuleSpecError(display_path, f"line.{line.name}.prefix", f"no prefix named {name!r}")
        if line.keyword not in line.pattern:
            raise RuleSpecError(display_path, f"line.{line.name}.keyword", "not in the line's pattern, as written")
        for pattern in (line.pattern, *line.optional):
            for group in re.compile(pattern).groupindex:
                if group not in fields and group not in SERIES_GROUPS:
                    raise RuleSpecError(display_path, f"line.{line.name}", f"group {group!r} has no [[field]]")
    return spec


@cache
def load_log_spec() -> LogSpec:
    text = (resources.files("llmdiag.probes") / "logs.toml").read_text(encoding="utf-8")
    return parse_log_spec(text)
