"""The one base of every catalogue model: unknown keys are refused, so a typo in a TOML file is an error."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
