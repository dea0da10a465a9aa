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

import requests

from tests.support.prometheus_server import REQUIRED_ENV, LocalDaemon, apt_install

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
    return apt_install("alertmanager", BINARY, "prometheus-alertmanager")


def version() -> str:
    """The binary's own version line (``alertmanager, version 0.25.0 (...)``)."""
    done = subprocess.run([BINARY, "--version"], capture_output=True, text=True, check=False)
    return (done.stdout or done.stderr).splitlines()[0].strip()


class AlertmanagerServer(LocalDaemon):
    """Alertmanager on 127.0.0.1:<free port>; stopped (SIGTERM) and its data removed on exit."""

    name = "alertmanager"

    def start(self) -> AlertmanagerServer:
        self._launch(
            "alertmanager.yml",
            json.dumps(CONFIG, indent=1),
            lambda root: [
                BINARY,
                f"--config.file={root / 'alertmanager.yml'}",
                f"--storage.path={root / 'data'}",
                f"--web.listen-address={self.address}",
                "--cluster.listen-address=",  # no gossip port: one instance
                "--log.level=warn",
            ],
        )
        return self

    def alerts(self) -> list[dict]:
        """/api/v2/alerts: the alerts Alertmanager holds, as its API shows them."""
        return requests.get(f"{self.url}/api/v2/alerts", timeout=10).json()


if __name__ == "__main__":
    if sys.argv[1:] != ["install"]:
        print("usage: python -m tests.support.alertmanager_server install", file=sys.stderr)
        sys.exit(2)
    sys.exit(install())
