"""What every catalogue model shares: unknown keys are refused (a typo in a TOML file is an error), and a pattern
field is checked to be a regular expression when the file is loaded, not when it is first matched."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def compiled_pattern(pattern: str) -> str:
    """The pattern as given, or ValueError (pydantic's way to refuse a field) when it does not compile."""
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from None
    return pattern
