"""What a run watches, and how to reach each target: a config target's connection (its secrets from the environment
variables the config names), a check's targets (URLs, or the config's ``[[targets]]``), a fleet scan's targets (a
targets file, then URLs)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from llmdiag.client.endpoint import API_KEY_ENV, Connection, parse_header
from llmdiag.config import Settings, Target, read_targets_file, url_targets
from llmdiag.errors import ConfigError, UsageError, option


def connection_for(target: Target, max_metrics_bytes: int | None = None) -> Connection:
    """A target's connection, its secrets read from the environment variables the config file names."""
    headers = dict(target.headers)
    for name, variable in target.headers_env.items():
        value = os.environ.get(variable)
        if not value:
            raise ConfigError(
                f"target '{target.name}': header {name} comes from ${variable}, which is not set",
                f"export {variable}=… in the check's environment (cron, systemd Environment=)",
            )
        headers[name] = value
    api_key = None
    if target.api_key_env:
        api_key = os.environ.get(target.api_key_env)
        if not api_key:
            raise ConfigError(
                f"target '{target.name}': api_key_env ${target.api_key_env} is not set",
                f"export {target.api_key_env}=… in the check's environment",
            )
    # a header given as 'Name: value' in the file is parsed like --header, for the same checks
    headers = dict(parse_header(f"{k}: {v}") for k, v in headers.items())
    kwargs = {"max_metrics_bytes": max_metrics_bytes} if max_metrics_bytes else {}
    return Connection(
        base_url=target.url,
        metrics_url=target.metrics_url,
        headers=headers,
        api_key=api_key if target.api_key_env else os.environ.get(API_KEY_ENV) or None,
        timeout_seconds=target.timeout_seconds,
        insecure=target.insecure,
        **kwargs,
    )


def check_targets(
    settings: Settings,
    urls: list[str] | None = None,
    target_names: list[str] | None = None,
    connect: Callable[[str], Connection] = Connection,
    metrics_url: str | None = None,
    dcgm_url: str | None = None,
    nvml: bool = True,
    probe: bool | None = None,
) -> tuple[list[Target], dict[str, Connection]]:
    """What a check watches: the ``urls`` (named host:port, each reached by ``connect(url)``, with the
    ``metrics_url``, ``dcgm_url``, ``nvml`` and ``probe`` given), or else the config's ``[[targets]]`` (those named
    in ``target_names``, or all), which carry their own settings. Returns the targets and, for the URLs, their
    connections (by target name), for ``run_check``."""
    if not urls:
        return _config_targets(settings, target_names), {}
    if target_names:
        raise UsageError(
            f"{option('target_names')} names a config target; with URLs on the command line it has no meaning",
            f"give URLs, or {option('target_names')} NAME for the [[targets]] of llmdiag.toml",
        )
    if len(urls) > 1 and (metrics_url or dcgm_url):
        raise UsageError(
            f"{option('metrics_url')} and {option('dcgm_url')} belong to one server, and several URLs were given",
            "name each server in llmdiag.toml's [[targets]] with its own metrics_url and dcgm_url",
        )
    targets = url_targets(urls)
    connections = {}
    for target in targets:
        connections[target.name] = connect(target.url)
        target.dcgm_url, target.nvml, target.probe, target.metrics_url = dcgm_url, nvml, probe, metrics_url
    return targets, connections


def _config_targets(settings: Settings, names: list[str] | None) -> list[Target]:
    if not settings.targets:
        raise UsageError(
            "no target: give a URL, or name targets in llmdiag.toml",
            "llmdiag check http://HOST:8000, or [[targets]] name = … url = … in llmdiag.toml",
        )
    known = {t.name: t for t in settings.targets}
    unknown = [name for name in names or [] if name not in known]
    if unknown:
        raise UsageError(f"no target '{unknown[0]}' in the config", f"known: {', '.join(known)}")
    return [known[name] for name in names] if names else list(settings.targets)


def fleet_targets(
    urls: list[str],
    targets_file: Path | None = None,
    connect: Callable[[str], Connection] = Connection,
    max_metrics_bytes: int | None = None,
) -> list[tuple[str, Connection]]:
    """The targets of a multi-target scan, named, with how to reach each: a targets file's
    (``llmdiag.config.read_targets_file``), then the URLs' (named host:port).

    A .toml's targets carry their own connection settings (secrets from the environment, as for check, and
    ``max_metrics_bytes``); plain URLs (given, or a plain list's) are reached by ``connect(url)``."""
    targets = read_targets_file(targets_file) if targets_file is not None else []
    own_settings = len(targets) if targets_file is not None and targets_file.suffix == ".toml" else 0
    targets += url_targets(urls, taken={t.name for t in targets})
    names = [t.name for t in targets]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UsageError(f"target names repeat: {', '.join(dupes)}", "give each target its own name")
    return [
        (t.name, connection_for(t, max_metrics_bytes) if i < own_settings else connect(t.url))
        for i, t in enumerate(targets)
    ]
