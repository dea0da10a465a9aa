"""User settings from llmdiag.toml: threshold overrides, muted findings (each with a reason), and what
`llmdiag check` watches: named ``[[targets]]`` and the ``[check]`` defaults."""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

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


# headers that carry credentials: a config file names the environment variable that holds them instead
SECRET_HEADERS = {"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie"}
DEFAULT_CHECK_WINDOW_SECONDS = 10.0


class Target(BaseModel):
    """One server that `llmdiag check` watches. Secrets come from the environment, never from the file."""

    model_config = ConfigDict(extra="forbid")
    # shown in status lines, perfdata labels and Prometheus labels, and the history's key
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$", max_length=100)
    url: str
    metrics_url: str | None = None
    dcgm_url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    # header name → the environment variable holding its value (e.g. Authorization → GATEWAY_TOKEN)
    headers_env: dict[str, str] = Field(default_factory=dict)
    # the environment variable holding the bearer token (default: LLMDIAG_API_KEY, as for scan)
    api_key_env: str | None = None
    insecure: bool = False
    timeout_seconds: float = Field(default=5.0, gt=0)
    window_seconds: float | None = Field(default=None, ge=1)
    probe: bool | None = None
    nvml: bool = True
    pids: list[int] = Field(default_factory=list)

    @field_validator("headers")
    @classmethod
    def _no_literal_secrets(cls, headers: dict[str, str]) -> dict[str, str]:
        for name in headers:
            if name.lower() in SECRET_HEADERS:
                raise ValueError(
                    f"'{name}' carries a credential: put it in an environment variable and name that "
                    f"variable in headers_env (or api_key_env for a bearer token)"
                )
        return headers


class CheckDefaults(BaseModel):
    """``[check]``: how `llmdiag check` runs when the command line does not say."""

    model_config = ConfigDict(extra="forbid")
    window_seconds: float = Field(default=DEFAULT_CHECK_WINDOW_SECONDS, ge=1)
    # the SQLite history; default $XDG_STATE_HOME/llmdiag/history.sqlite
    history: Path | None = None
    # the baseline: the median of the target's own checks over these days, once there are enough of them
    baseline_days: float = Field(default=7.0, gt=0)
    baseline_min_checks: int = Field(default=5, ge=1)
    # targets checked at once
    concurrency: int = Field(default=4, ge=1, le=64)
    textfile: Path | None = None
    pushgateway: str | None = None


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rules: dict[str, RuleOverride] = Field(default_factory=dict)
    mute: list[Mute] = Field(default_factory=list)
    targets: list[Target] = Field(default_factory=list)
    check: CheckDefaults = Field(default_factory=CheckDefaults)

    @model_validator(mode="after")
    def _unique_targets(self) -> Settings:
        names = [t.name for t in self.targets]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"target names repeat: {', '.join(dupes)}")
        return self

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
        where = ".".join(str(p) for p in first["loc"]) or "(file)"
        raise ConfigError(f"{path}: {where}: {first['msg']}") from None
    settings.rules = {code.upper(): o for code, o in settings.rules.items()}
    return settings
