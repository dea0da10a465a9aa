"""A real Alertmanager for the alerting-rule tests: Debian's ``prometheus-alertmanager`` package, started on a free
loopback port, clustering off, one receiver that sends nowhere (the alerts stay readable at ``/api/v2/alerts``).

    python -m tests.support.alertmanager_server install
        # idempotent: apt-get install prometheus-alertmanager, skipped when on PATH

    with AlertmanagerServer() as am:
        PrometheusServer(groups, rule_files=[...], alertmanagers=[am.address])
        am.alerts()   # what Alertmanager holds, as its API v2 shows it

``make test`` installs it beside Prometheus and sets LLMDIAG_PROMETHEUS_TESTS=1: there a missing Alertmanager fails
the test that routes to it (``wanted()``); elsewhere that test leaves the Alertmanager part out and says why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from tests.support.prometheus_server import REQUIRED_ENV, free_port

BINARY = os.environ.get("LLMDIAG_ALERTMANAGER", "prometheus-alertmanager")

# one route, one receiver without integrations: Alertmanager keeps and shows the alerts, and notifies no one
CONFIG = {"route": {"receiver": "null", "group_by": ["alertname", "code"]}, "receivers": [{"name": "null"}]}


def missing() -> str | None:
    """Why no Alertmanager can run here, or None when one can."""
    if shutil.which(BINARY) is None:
        return f"{BINARY} not on PATH (python -m tests.support.alertmanager_server install)"
    return None


def wanted() -> bool:
    """Whether a test routes to a real Alertmanager: True where one can run; where none can, a failure when the run
    asked for the Prometheus tests (REQUIRED_ENV=1, as ``make test`` does after installing it), else False (that
    part left out, with the reason printed)."""
    why = missing()
    if why is None:
        return True
    if os.environ.get(REQUIRED_ENV) == "1":
        import pytest

        pytest.fail(f"{REQUIRED_ENV}=1 but {why}")
    print(f"Alertmanager left out: {why}")
    return False


def install() -> int:
    if missing() is None:
        print(f"alertmanager: {shutil.which(BINARY)} (already installed)")
        return 0
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", "prometheus-alertmanager"]
    done = subprocess.run(cmd, env=env, check=False)
    if done.returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, check=False)
        done = subprocess.run(cmd, env=env, check=False)
    if done.returncode != 0 or missing() is not None:
        print("alertmanager: install failed", file=sys.stderr)
        return 1
    print(f"alertmanager: installed {shutil.which(BINARY)}")
    return 0


def version() -> str:
    """The binary's own version line (``alertmanager, version 0.25.0 (...)``)."""
    done = subprocess.run([BINARY, "--version"], capture_output=True, text=True, check=False)
    return (done.stdout or done.stderr).splitlines()[0].strip()


class AlertmanagerServer:
    """Alertmanager on 127.0.0.1:<free port>; stopped (SIGTERM) and its data removed on exit."""

    def __init__(self) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.address}"
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> AlertmanagerServer:
        self._dir = tempfile.TemporaryDirectory(prefix="llmdiag-am-")
        root = Path(self._dir.name)
        (root / "alertmanager.yml").write_text(json.dumps(CONFIG, indent=1))
        self._log = open(root / "alertmanager.log", "wb")  # noqa: SIM115 (closed with the process)
        self._proc = subprocess.Popen(
            [
                BINARY,
                f"--config.file={root / 'alertmanager.yml'}",
                f"--storage.path={root / 'data'}",
                f"--web.listen-address={self.address}",
                "--cluster.listen-address=",  # no gossip port: one instance
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"alertmanager exited: {(root / 'alertmanager.log').read_text()[-2000:]}")
            try:
                if requests.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("alertmanager was not ready within 30 s")

    def alerts(self) -> list[dict]:
        """/api/v2/alerts: the alerts Alertmanager holds, as its API shows them."""
        return requests.get(f"{self.url}/api/v2/alerts", timeout=10).json()

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
            self._log.close()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> AlertmanagerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    if sys.argv[1:] != ["install"]:
        print("usage: python -m tests.support.alertmanager_server install", file=sys.stderr)
        sys.exit(2)
    sys.exit(install())
