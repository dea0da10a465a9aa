"""Targets for a multi-target scan: URLs on the command line, or a targets file.

A targets file is either llmdiag.toml's ``[[targets]]`` (the same model `llmdiag check` reads: names, metrics_url,
headers from environment variables …), told by a ``.toml`` name, or a plain list, one target a line::

    # comments and blank lines are skipped
    http://10.0.0.1:8000
    replica-b=http://10.0.0.2:8000

A plain line's name is ``NAME=`` when given, else the URL's host:port (``#2``, ``#3`` … when repeated).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

from llmdiag.client.endpoint import redact_url
from llmdiag.config import Target, load_settings
from llmdiag.errors import UsageError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$")
HINT = "one URL a line (optionally NAME=URL, '#' comments), or a .toml file with [[targets]] name = … url = …"


def url_targets(urls: list[str], taken: set[str] | None = None) -> list[Target]:
    """Command-line URLs as targets named host:port (repeats get #2, #3 …)."""
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
    if path.suffix == ".toml":
        targets = load_settings(path).targets
        if not targets:
            raise UsageError(f"--targets {path}: no [[targets]] in it", HINT)
        return list(targets)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"--targets {path}: no such file", HINT) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--targets {path}: cannot read it: {exc}", HINT) from None
    entries: list[tuple[str, str]] = []  # (name or "", url), in the file's order
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, url = line.partition("=")
        if sep and "://" not in name:
            name, url = name.strip(), url.strip()
            if not NAME_RE.match(name):
                raise UsageError(f"--targets {path}:{number}: bad name {name!r}", "names are letters, digits, _.:/-")
        else:
            name, url = "", line
        if not re.match(r"^https?://[^\s/]+", url):
            raise UsageError(f"--targets {path}:{number}: {redact_url(url)!r} is not an http(s) URL", HINT)
        entries.append((name, url))
    if not entries:
        raise UsageError(f"--targets {path}: no target in it", HINT)
    names = [name for name, _ in entries if name]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UsageError(f"--targets {path}: names repeat: {', '.join(dupes)}", "give each target its own name")
    unnamed = iter(url_targets([url for name, url in entries if not name], taken=set(names)))
    return [Target.model_construct(name=name, url=url) if name else next(unnamed) for name, url in entries]
