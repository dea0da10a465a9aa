"""A real Prometheus for bench/bench_fleet.py: Debian's ``prometheus`` binary on a free loopback port, scraping
every second one job per target, its data in a temporary folder removed on exit."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

BINARY = "prometheus"
INTERVAL_SECONDS = 1.0


def why_missing() -> str | None:
    """Why no Prometheus can run here, or None."""
    return None if shutil.which(BINARY) else f"{BINARY} not on PATH (apt-get install prometheus)"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _config(jobs: dict[str, list[str]]) -> str:
    """prometheus.yml (JSON is YAML): each job scrapes its targets' host:port at the first target's path."""
    interval = f"{int(INTERVAL_SECONDS * 1000)}ms"
    scrape_configs = []
    for name, urls in jobs.items():
        parts = [urllib.parse.urlsplit(url) for url in urls]
        scrape_configs.append(
            {
                "job_name": name,
                "metrics_path": parts[0].path or "/metrics",
                "static_configs": [{"targets": [part.netloc for part in parts]}],
            }
        )
    config = {"global": {"scrape_interval": interval, "scrape_timeout": interval}, "scrape_configs": scrape_configs}
    return json.dumps(config, indent=1)


class LocalPrometheus:
    """``with LocalPrometheus({"job": [url, ...]}) as prom:``, then ``prom.url``; SIGTERM on exit."""

    def __init__(self, jobs: dict[str, list[str]]) -> None:
        self.jobs = jobs
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.folder = tempfile.TemporaryDirectory(prefix="llmdiag-bench-prom-")
        self.proc: subprocess.Popen[bytes] | None = None

    def _get(self, path: str, **params: str) -> dict:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as response:
            return json.loads(response.read() or b"{}") if path.startswith("/api/") else {}

    def __enter__(self) -> LocalPrometheus:
        root = Path(self.folder.name)
        (root / "prometheus.yml").write_text(_config(self.jobs))
        with open(root / "prometheus.log", "wb") as log:
            self.proc = subprocess.Popen(
                [
                    BINARY,
                    f"--config.file={root / 'prometheus.yml'}",
                    f"--storage.tsdb.path={root / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                self._get("/-/ready")
                return self
            except OSError:
                time.sleep(0.1)
        log_tail = (root / "prometheus.log").read_text()[-2000:]
        self.__exit__()
        raise RuntimeError(f"prometheus did not become ready in 30 s: {log_tail}")

    def wait_for_samples(self, metric: str, series: int, samples: int, timeout_seconds: float) -> None:
        """Until ``series`` series of ``metric`` hold ``samples`` samples each."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            answer = self._get("/api/v1/query", query=f"count_over_time({metric}[60s])")
            counts = [float(row["value"][1]) for row in answer.get("data", {}).get("result", [])]
            if sum(count >= samples for count in counts) >= series:
                return
            time.sleep(INTERVAL_SECONDS / 2)
        raise TimeoutError(f"prometheus did not get {samples} samples of {metric} from {series} series in time")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        self.folder.cleanup()
