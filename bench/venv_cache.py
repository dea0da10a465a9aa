"""Where the benches build the tools they measure against (GuideLLM's and HTA's virtualenvs), and the lock that
lets one process at a time build each.

The folder is ``${LLMDIAG_CACHE_DIR:-~/.cache/llmdiag}``, the one the real-vLLM tests keep their venv in, so that
one variable moves every large download of the project.
"""

from __future__ import annotations

import fcntl
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def cache_dir() -> Path:
    """The cache folder, made if missing."""
    path = Path(os.environ.get("LLMDIAG_CACHE_DIR") or "~/.cache/llmdiag").expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def build_lock(name: str) -> Iterator[None]:
    """Holds ``<cache>/<name>.lock`` (an exclusive fcntl lock) for the block: two benches started together build
    ``name`` once, the second waiting for the first."""
    path = cache_dir() / f"{name}.lock"
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for {path}: another process is building {name}", file=sys.stderr, flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
