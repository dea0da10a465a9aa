"""User settings from llmdiag.toml: threshold overrides and muted findings (each with a reason)."""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmdiag.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_CONFIG_NAME = "llmdiag.toml"


class RuleOverride(BaseModel):
    model_config = ConfigDict(extra="forbid")
    warning: float | None = None
    critical: float | None = None


class Mute(BaseModel):
    model_config = ConfigDict(extra="forbid")
    code: str
    reason: str = Field(min_length=3)


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rules: dict[str, RuleOverride] = Field(default_factory=dict)
    mute: list[Mute] = Field(default_factory=list)

    def mute_reason(self, code: str) -> str | None:
        return next((m.reason for m in self.mute if m.code.upper() == code), None)


def load_settings(path: Path | None) -> Settings:
    """An explicit path must exist; otherwise ./llmdiag.toml is used when present."""
    if path is None:
        path = Path(DEFAULT_CONFIG_NAME)
        if not path.is_file():
            return Settings()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it: {exc}") from None
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{path}: {where}: {first['msg']}") from None
    settings.rules = {code.upper(): o for code, o in settings.rules.items()}
    return settings
