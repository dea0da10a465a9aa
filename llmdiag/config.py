"""User settings from llmdiag.toml: the TPOT SLO (``slo_tpot_seconds``), threshold overrides, muted findings (each
with a reason), and what `llmdiag check` watches: named ``[[targets]]`` and the ``[check]`` defaults.

Targets also come from a targets file (a multi-target scan's ``--targets``): either llmdiag.toml's ``[[targets]]``
(the same model `llmdiag check` reads: names, metrics_url, headers from environment variables …), told by a
``.toml`` name, or a plain list, one target a line::

    # comments and blank lines are skipped
    http://10.0.0.1:8000
    replica-b=http://10.0.0.2:8000

A plain line's name is ``NAME=`` when given, else the URL's host:port (``#2``, ``#3`` … when repeated).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from llmdiag.errors import ConfigError, UsageError, option, redact_url

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
# the mean time per output token users accept: 50 ms is 20 tokens/s per user, about twice reading speed; a breach is
# what users feel, not by itself proof of what limits the server (llmdiag.engine.slo)
DEFAULT_SLO_TPOT_SECONDS = 0.05
# a target's name: shown in status lines, perfdata labels and Prometheus labels, and the history's key
TARGET_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$"


class Target(BaseModel):
    """One server that `llmdiag check` watches. Secrets come from the environment, never from the file."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=TARGET_NAME_PATTERN, max_length=100)
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
    # the whole run's deadline; default: llmdiag.api.check.default_deadline_seconds (waves of targets)
    deadline_seconds: float | None = Field(default=None, gt=0)
    textfile: Path | None = None
    pushgateway: str | None = None


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # the time-per-output-token SLO the decode rules judge against (CMP001 fires past it)
    slo_tpot_seconds: float = Field(default=DEFAULT_SLO_TPOT_SECONDS, gt=0, le=60)
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
    except RecursionError:  # tomllib recurses per nested array or table
        raise ConfigError(f"{path}: arrays or tables nested deeper than Python's stack: not a config") from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8 by definition
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}): not a TOML file") from None
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


TARGETS_FILE_HINT = (
    "one URL a line (optionally NAME=URL, '#' comments), or a .toml file with [[targets]] name = … url = …"
)


def url_targets(urls: list[str], taken: set[str] | None = None) -> list[Target]:
    """URLs as targets named host:port (repeats, and names in ``taken``, get #2, #3 …)."""
    targets, seen = [], set(taken or ())
    for url in urls:
        name = urlsplit(redact_url(url)).netloc or redact_url(url)
        base, n = name, 2
        while name in seen:
            name, n = f"{base}#{n}", n + 1
        seen.add(name)
        targets.append(Target.model_construct(name=name, url=url))  # any URL; secrets stay in the connection
    return targets


def read_targets_file(path: Path) -> list[Target]:
    """The targets of a targets file (see the module's docstring), in the file's order."""
    given = f"{option('targets_file')} {path}"
    if path.suffix == ".toml":
        targets = load_settings(path).targets
        if not targets:
            raise UsageError(f"{given}: no [[targets]] in it", TARGETS_FILE_HINT)
        return list(targets)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{given}: no such file", TARGETS_FILE_HINT) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{given}: cannot read it: {exc}", TARGETS_FILE_HINT) from None
    entries = _targets_file_entries(text, given)
    if not entries:
        raise UsageError(f"{given}: no target in it", TARGETS_FILE_HINT)
    names = [name for name, _ in entries if name]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UsageError(f"{given}: names repeat: {', '.join(dupes)}", "give each target its own name")
    unnamed = iter(url_targets([url for name, url in entries if not name], taken=set(names)))
    return [Target.model_construct(name=name, url=url) if name else next(unnamed) for name, url in entries]


def _targets_file_entries(text: str, given: str) -> list[tuple[str, str]]:
    """A plain targets file's (name or "", url) pairs, in the file's order."""
    entries: list[tuple[str, str]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, url = line.partition("=")
        if sep and "://" not in name:
            name, url = name.strip(), url.strip()
            if not re.match(TARGET_NAME_PATTERN, name):
                raise UsageError(f"{given}:{number}: bad name {name!r}", "names are letters, digits, _.:/-")
        else:
            name, url = "", line
        if not re.match(r"^https?://[^\s/]+", url):
            raise UsageError(f"{given}:{number}: {redact_url(url)!r} is not an http(s) URL", TARGETS_FILE_HINT)
        entries.append((name, url))
    return entries
