"""What every catalogue model shares: unknown keys are refused (a typo in a TOML file is an error), a pattern field
is checked to be a regular expression when the file is loaded (not when it is first matched), and a file that is
not valid TOML or not valid for its model is one RuleSpecError naming the path and the first bad field."""

from __future__ import annotations

import re
import sys
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from llmdiag.errors import RuleSpecError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

M = TypeVar("M", bound=BaseModel)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def compiled_pattern(pattern: str) -> str:
    """The pattern as given, or ValueError (pydantic's way to refuse a field) when it does not compile."""
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from None
    return pattern


def parse_toml(model: type[M], display_path: str, text: str) -> M:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RuleSpecError(display_path, "(file)", f"not valid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses per nested array or table
        raise RuleSpecError(display_path, "(file)", "arrays or tables nested deeper than Python's stack") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(file)"
        raise RuleSpecError(display_path, field, first["msg"]) from None
