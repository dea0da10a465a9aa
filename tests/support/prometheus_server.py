"""A real Prometheus for the fleet tests: Debian's ``prometheus`` package, started on a free loopback port.

    python -m tests.support.prometheus_server install
        # idempotent: apt-get install prometheus (~7 s), skipped when on PATH

``make test`` runs the install and sets LLMDIAG_PROMETHEUS_TESTS=1, which turns a missing Prometheus into a failure
instead of a skip.

    with PrometheusServer({"vllm": [url1, url2], "dcgm": [dcgm1]}) as prom:
        prom.url, prom.wait_for_samples("vllm:num_requests_running", 4)

Each group is one scrape job; targets are ``http://HOST:PORT/path`` URLs, or (URL, {label: value}) pairs whose labels
Prometheus attaches to that target's series (as Kubernetes service discovery attaches ``pod``/``namespace``). Each
URL's path becomes the job's metrics_path, so the targets of one group share a path. Scrapes and evaluates rules
every ``interval_seconds`` (1 s by default). ``rule_files`` are loaded as the config's ``rule_files:`` (the exported
alerting rules), and ``alertmanagers`` (``host:port``) receive the alerts that fire.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self
from urllib.parse import urlsplit

import requests

from tests.support.required import require_tool

REQUIRED_ENV = "LLMDIAG_PROMETHEUS_TESTS"
BINARY = os.environ.get("LLMDIAG_PROMETHEUS", "prometheus")


def missing() -> str | None:
    """Why the Prometheus tests cannot run here, or None when they can."""
    if shutil.which(BINARY) is None:
        return f"{BINARY} not on PATH (python -m tests.support.prometheus_server install)"
    return None


def require() -> None:
    """Skip the test when the Prometheus is missing, or fail when the run asked for the Prometheus tests."""
    require_tool(missing(), REQUIRED_ENV)


def install() -> int:
    return apt_install("prometheus", BINARY, "prometheus")


def apt_install(name: str, binary: str, package: str) -> int:
    """Debian's ``package``, unless ``binary`` is on PATH already (``apt-get update`` once, for a stale index)."""
    if shutil.which(binary) is not None:
        print(f"{name}: {shutil.which(binary)} (already installed)")
        return 0
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", package]
    done = subprocess.run(cmd, env=env, check=False)
    if done.returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, check=False)
        done = subprocess.run(cmd, env=env, check=False)
    if done.returncode != 0 or shutil.which(binary) is None:
        print(f"{name}: install failed", file=sys.stderr)
        return 1
    print(f"{name}: installed {shutil.which(binary)}")
    return 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


Target = str | tuple[str, dict[str, str]]


def scrape_config(
    groups: dict[str, list[Target]],
    interval_seconds: float,
    rule_files: Sequence[str | Path] = (),
    alertmanagers: Sequence[str] = (),
) -> str:
    """prometheus.yml for the groups: one job each, static targets (JSON is valid YAML); with the rule files and the
    Alertmanagers (``host:port``) when given."""
    import json

    jobs = []
    for job, targets in groups.items():
        pairs = [(t, {}) if isinstance(t, str) else t for t in targets]
        parts = [urlsplit(u) for u, _ in pairs]
        paths = {p.path or "/metrics" for p in parts}
        if len(paths) > 1:
            raise ValueError(f"job {job}: its targets must share one metrics path, got {sorted(paths)}")
        jobs.append(
            {
                "job_name": job,
                "metrics_path": paths.pop() if paths else "/metrics",
                "scheme": parts[0].scheme if parts else "http",
                "static_configs": [
                    {"targets": [p.netloc], "labels": labels} for p, (_, labels) in zip(parts, pairs, strict=True)
                ],
            }
        )
    interval = f"{int(interval_seconds * 1000)}ms"
    config: dict[str, object] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "scrape_configs": jobs,
    }
    if rule_files:
        config["rule_files"] = [str(Path(f).resolve()) for f in rule_files]
    if alertmanagers:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": list(alertmanagers)}]}]}
    return json.dumps(config, indent=1)


class LocalDaemon:
    """A daemon of the Prometheus family on 127.0.0.1:<free port>, in its own temporary directory, ready once its
    /-/ready answers 200; stopped (SIGTERM, SIGKILL after 15 s) and its directory removed on exit."""

    name = "daemon"

    def __init__(self) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.address}"
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def _launch(self, config_name: str, config_text: str, argv: Callable[[Path], list[str]]) -> None:
        """Write the config into a fresh directory, start ``argv(directory)`` and wait until it is ready."""
        self._dir = tempfile.TemporaryDirectory(prefix=f"llmdiag-{self.name}-")
        root = Path(self._dir.name)
        (root / config_name).write_text(config_text)
        self._log = open(root / f"{self.name}.log", "wb")  # noqa: SIM115 (closed with the process)
        self._proc = subprocess.Popen(argv(root), stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {(root / f'{self.name}.log').read_text()[-2000:]}")
            try:
                if requests.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} was not ready within 30 s")

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

    def start(self) -> Self:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class PrometheusServer(LocalDaemon):
    """Prometheus on 127.0.0.1:<free port>, scraping ``groups``; stopped (SIGTERM) and its TSDB removed on exit."""

    def __init__(
        self,
        groups: dict[str, list[Target]],
        interval_seconds: float = 1.0,
        extra_args: Sequence[str] = (),
        rule_files: Sequence[str | Path] = (),
        alertmanagers: Sequence[str] = (),
    ):
        self.groups = groups
        self.interval_seconds = interval_seconds
        self.extra_args = list(extra_args)
        self.rule_files = list(rule_files)
        self.alertmanagers = list(alertmanagers)
        super().__init__()

    name = "prometheus"

    def start(self) -> PrometheusServer:
        self._launch(
            "prometheus.yml",
            scrape_config(self.groups, self.interval_seconds, self.rule_files, self.alertmanagers),
            lambda root: [
                BINARY,
                f"--config.file={root / 'prometheus.yml'}",
                f"--storage.tsdb.path={root / 'data'}",
                f"--web.listen-address={self.address}",
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
                *self.extra_args,
            ],
        )
        return self

    def query(self, expr: str) -> list[dict]:
        answer = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10).json()
        return answer.get("data", {}).get("result", [])

    def alerts(self) -> list[dict]:
        """/api/v1/alerts: every alert pending or firing now, with its labels, annotations, state and value."""
        answer = requests.get(f"{self.url}/api/v1/alerts", timeout=10).json()
        return answer.get("data", {}).get("alerts", [])

    def wait_for_samples(self, metric: str, series: int, samples: int = 2, timeout_seconds: float = 30.0) -> None:
        """Until ``series`` series of ``metric`` each hold at least ``samples`` samples."""
        deadline = time.monotonic() + timeout_seconds
        window = max(60, int(samples * self.interval_seconds * 4))
        while time.monotonic() < deadline:
            counts = self.query(f"count_over_time({metric}[{window}s])")
            if len([c for c in counts if float(c["value"][1]) >= samples]) >= series:
                return
            time.sleep(self.interval_seconds / 2)
        raise TimeoutError(f"prometheus did not get {samples} samples of {metric} from {series} series in time")


if __name__ == "__main__":
    if sys.argv[1:] != ["install"]:
        print("usage: python -m tests.support.prometheus_server install", file=sys.stderr)
        sys.exit(2)
    sys.exit(install())
