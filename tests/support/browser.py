"""A real headless browser for the HTML report tests: Debian's Chromium driven by Playwright.

    python -m tests.support.browser install     # idempotent: apt-get chromium + chromium-driver, pip playwright

Never ``playwright install``: it downloads its own browsers from the internet. We launch the distribution's
``/usr/bin/chromium`` through ``executable_path`` instead. ``make test`` runs the install and sets
LLMDIAG_BROWSER_TESTS=1, which turns a missing browser into a failure instead of a skip.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.required import require_tool

CHROMIUM = Path(os.environ.get("LLMDIAG_CHROMIUM", "/usr/bin/chromium"))
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
REQUIRED_ENV = "LLMDIAG_BROWSER_TESTS"
OUTPUT_DIR = Path(__file__).resolve().parents[2] / "test-output" / "browser"


def missing() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    if not CHROMIUM.exists():
        return f"{CHROMIUM} not found (python -m tests.support.browser install)"
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (python -m tests.support.browser install)"
    return None


def require() -> None:
    """Skip the test when the browser is missing, or fail when the run asked for the browser tests."""
    require_tool(missing(), REQUIRED_ENV)


@dataclass
class PageVisit:
    """What happened while a page was open: everything a test asserts about."""

    page: Any
    requests: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)


@contextmanager
def open_file(path: Path, width: int = 1280, height: int = 900) -> Iterator[PageVisit]:
    """Open a local file in headless Chromium; record its requests, console errors and dialogs."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            visit = PageVisit(page)
            page.on("request", lambda request: visit.requests.append(request.url))
            page.on("requestfailed", lambda request: visit.failed_requests.append(request.url))
            page.on("console", lambda msg: visit.console_errors.append(msg.text) if msg.type == "error" else None)
            page.on("pageerror", lambda exc: visit.page_errors.append(str(exc)))

            def on_dialog(dialog: Any) -> None:
                visit.dialogs.append(f"{dialog.type}: {dialog.message}")
                dialog.dismiss()

            page.on("dialog", on_dialog)
            page.goto(Path(path).resolve().as_uri())
            page.wait_for_load_state("load")
            yield visit
        finally:
            browser.close()


def screenshot(visit: PageVisit, name: str, full_page: bool = True) -> Path:
    OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
    target = OUTPUT_DIR / f"{name}.png"
    visit.page.screenshot(path=str(target), full_page=full_page)
    return target


def install() -> int:
    """Install what the browser tests need; a no-op when it is all there."""
    if not CHROMIUM.exists():
        if shutil.which("apt-get") is None:
            print(f"{CHROMIUM} is missing and there is no apt-get: install Chromium and set LLMDIAG_CHROMIUM")
            return 1
        sudo = [] if os.geteuid() == 0 else ["sudo"]
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run([*sudo, "apt-get", "update", "-q"], check=True, env=env)
        subprocess.run([*sudo, "apt-get", "install", "-y", "-q", "chromium", "chromium-driver"], check=True, env=env)
    if importlib.util.find_spec("playwright") is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "playwright"], check=True)
    print(f"browser tests ready: {CHROMIUM} and playwright")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["install"]:
        print("usage: python -m tests.support.browser install")
        sys.exit(2)
    sys.exit(install())
