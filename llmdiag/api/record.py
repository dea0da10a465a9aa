"""Record a live run into a bundle (``--record FILE``), and what a scan was called with, to replay it.

Inside ``recording_to(recorder)``, each scan ``diagnose`` makes (scan, demo, check's targets) or ``run_load`` makes
(a load level) becomes one run of the bundle: its call, its tape, its verdict. The recorder is this thread's (a
context variable, as the tape is): a job that scans on other threads enters it on each. The bundle is written when
the recorder is closed, also after a failure (the reads up to it are what a bug report needs).

``llmdiag.api.scan.replay_bundle`` calls the same entry points with the recorded call while the tape plays back
at the collect path's boundaries (``llmdiag.collect.tape``): detection, the window loop, the parsers, the signal
builders and the rules all run again. The replayed verdict is the recorded one byte for byte where this llmdiag
judges as the recording one did.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from llmdiag.client.endpoint import Connection, redact_url
from llmdiag.collect.bundle import Bundle, Run, write_bundle
from llmdiag.collect.live import TelemetryOptions
from llmdiag.collect.tape import Tape, using
from llmdiag.config import Settings
from llmdiag.engine.baseline import Baseline
from llmdiag.errors import LlmdiagError
from llmdiag.model import TraceReport, Verdict
from llmdiag.physics.hardware import GpuSpec, InterconnectSpec, ModelSpec
from llmdiag.physics.step import Deployment

# the settings that change a verdict (the check targets and their history are not the scan's)
VERDICT_SETTINGS = {"slo_tpot_seconds", "rules", "mute"}
REDACTED = "<redacted>"
CREDENTIAL_HEADER_RE = re.compile(r"auth|token|key|secret|cookie|session|passw|credential", re.IGNORECASE)


def connection_secrets(connection: Connection) -> list[str]:
    """The values a bundle must not hold, wherever they were echoed: the API key, the credential headers' values
    (Authorization, cookies, tokens, keys) and the URLs' passwords. Other header values and user names are left
    out of the options and URLs, but not scrubbed from pages, where a short common word would corrupt them."""
    from urllib.parse import unquote, urlsplit

    secrets = [connection.api_key or ""]
    secrets += [v for k, v in connection.headers.items() if CREDENTIAL_HEADER_RE.search(k)]
    for url in (connection.base_url, connection.metrics_url or ""):
        try:
            password = urlsplit(url).password
        except ValueError:
            continue
        if password:
            secrets += [password, unquote(password)]
    # "Bearer abc…": the token alone may be echoed too
    secrets += [v.split(None, 1)[1] for v in secrets if " " in v.strip()]
    return [s for s in secrets if s]


def connection_to_json(connection: Connection) -> dict[str, Any]:
    return {
        "base_url": redact_url(connection.base_url),
        "metrics_url": redact_url(connection.metrics_url) if connection.metrics_url else None,
        "header_names": sorted(connection.headers),
        "api_key": REDACTED if connection.api_key else None,
        "timeout_seconds": connection.timeout_seconds,
        "insecure": connection.insecure,
        "max_metrics_bytes": connection.max_metrics_bytes,
    }


def connection_from_json(data: dict[str, Any]) -> Connection:
    """The recorded connection, without its secrets: a replay sends nothing, so it needs none."""
    return Connection(
        base_url=str(data["base_url"]),
        metrics_url=data.get("metrics_url"),
        api_key="",
        timeout_seconds=float(data["timeout_seconds"]),
        insecure=bool(data["insecure"]),
        max_metrics_bytes=int(data["max_metrics_bytes"]),
    )


def deployment_to_json(deployment: Deployment) -> dict[str, Any]:
    data = dataclasses.asdict(deployment)
    data["gpu"]["peak_flops_per_second_by_dtype"] = dict(deployment.gpu.peak_flops_per_second_by_dtype)
    return data


def deployment_from_json(data: dict[str, Any]) -> Deployment:
    gpu, model = dict(data["gpu"]), dict(data["model"])
    gpu["aliases"], model["aliases"] = tuple(gpu.get("aliases", ())), tuple(model.get("aliases", ()))
    rest = {k: v for k, v in data.items() if k not in ("gpu", "model", "interconnect")}
    interconnect = InterconnectSpec(**data["interconnect"]) if data.get("interconnect") else None
    return Deployment(GpuSpec(**gpu), model_from_json(model), interconnect=interconnect, **rest)


def model_from_json(data: dict[str, Any]) -> ModelSpec:
    return ModelSpec(**{**data, "aliases": tuple(data.get("aliases", ()))})


@dataclass
class ScanCall:
    """What ``diagnose`` was called with, less the progress callback: what a run replays."""

    connection: Connection
    duration_seconds: float
    settings: Settings | None = None
    telemetry: TelemetryOptions | None = None
    deployment: Deployment | None = None
    canary: bool = False
    canary_off_reason: str = ""
    baseline: Baseline | None = None
    trace: TraceReport | None = None
    server: str | None = None
    auto_duration: bool = False
    # "diagnose": the scan and its verdict; "collect": a load level's window, judged by build_verdict
    kind: str = "diagnose"

    def to_json(self) -> dict[str, Any]:
        telemetry = self.telemetry
        return {
            "kind": self.kind,
            "connection": connection_to_json(self.connection),
            "duration_seconds": self.duration_seconds,
            "settings": self.settings.model_dump(mode="json", include=VERDICT_SETTINGS) if self.settings else None,
            "telemetry": None
            if telemetry is None
            else {
                "dcgm_url": redact_url(telemetry.dcgm_url) if telemetry.dcgm_url else None,
                "nvml": telemetry.nvml,
                "nvml_replay": telemetry.nvml_library is not None,
                "pids": list(telemetry.pids),
                "host": telemetry.host,
            },
            "deployment": deployment_to_json(self.deployment) if self.deployment else None,
            "canary": self.canary,
            "canary_off_reason": self.canary_off_reason,
            "baseline": dataclasses.asdict(self.baseline) if self.baseline else None,
            "trace": self.trace.model_dump(mode="json") if self.trace else None,
            "server": self.server,
            "auto_duration": self.auto_duration,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScanCall:
        telemetry = data.get("telemetry")
        return cls(
            kind=str(data.get("kind", "diagnose")),
            connection=connection_from_json(data["connection"]),
            duration_seconds=float(data["duration_seconds"]),
            settings=Settings.model_validate(data["settings"]) if data.get("settings") else None,
            telemetry=None
            if telemetry is None
            else TelemetryOptions(
                dcgm_url=telemetry.get("dcgm_url"),
                nvml=str(telemetry.get("nvml", "off")),
                pids=[int(p) for p in telemetry.get("pids", [])],
                host=bool(telemetry.get("host", False)),
            ),
            deployment=deployment_from_json(data["deployment"]) if data.get("deployment") else None,
            canary=bool(data.get("canary", False)),
            canary_off_reason=str(data.get("canary_off_reason", "")),
            baseline=Baseline(**data["baseline"]) if data.get("baseline") else None,
            trace=TraceReport.model_validate(data["trace"]) if data.get("trace") else None,
            server=data.get("server"),
            auto_duration=bool(data.get("auto_duration", False)),
        )


@dataclass
class Recorder:
    """Collects the runs of one command and writes them as one bundle at ``path`` when closed."""

    path: Path
    command: str
    options: dict[str, Any] = field(default_factory=dict)
    secrets: list[str] = field(default_factory=list)
    # each scan's taping, turned into a run when written: its verdict may be relabelled or judged after the scan
    runs: list[Taping] = field(default_factory=list)
    written_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def tape(self, name: str, call: ScanCall) -> Taping:
        """A tape for one scan, made this thread's for the block; the run is kept when the block ends."""
        with self._lock:
            self.secrets += connection_secrets(call.connection)
        return Taping(self, name, call)

    def keep(self, taping: Taping) -> None:
        with self._lock:
            self.runs.append(taping)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.write()

    def write(self) -> None:
        with self._lock:
            runs = [taping.run() for taping in self.runs]
        if runs:
            bundle = Bundle(self.command, self.options, runs, recorded_at_unix=time.time())
            self.written_bytes = write_bundle(self.path, bundle, self.secrets)


class Taping:
    """One scan being recorded: its tape is this thread's inside the block. ``verdict`` is what the job concluded,
    ``error`` a failure it kept rather than raised (a load level's scan); both may be set after the block."""

    def __init__(self, recorder: Recorder, name: str, call: ScanCall) -> None:
        self.recorder, self.name, self.call = recorder, name, call
        self.tape = Tape()
        self.verdict: Verdict | None = None
        self.error: dict[str, str] | str | None = None
        self._using = using(self.tape)

    def __enter__(self) -> Taping:
        self._using.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._using.__exit__(kind, exc, tb)
        if isinstance(exc, LlmdiagError):  # the reads up to the failure replay into the same error
            self.error = {"message": exc.message, "hint": exc.hint}
        self.recorder.keep(self)

    def run(self) -> Run:
        call = self.call.to_json()
        if self.error is not None:
            call["error"] = self.error if isinstance(self.error, dict) else {"message": self.error}
        verdict = None
        if self.verdict is not None:
            call["target"] = self.verdict.target
            verdict = self.verdict.model_dump_json(indent=2)
        return Run(self.name, call, self.tape.to_json(), verdict)


_RECORDER: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("llmdiag_recorder", default=None)
# the command's recorder, for the scans its jobs run on worker threads (check's targets), which start with an empty
# context: one recording per process at a time, as one command line makes
_PROCESS_RECORDER: list[Recorder] = []


def active_recorder() -> Recorder | None:
    return _RECORDER.get() or (_PROCESS_RECORDER[-1] if _PROCESS_RECORDER else None)


@contextlib.contextmanager
def recording_to(recorder: Recorder | None) -> Iterator[Recorder | None]:
    """Record the scans of this block (this thread's, and its worker threads') into ``recorder`` (None: none)."""
    token = _RECORDER.set(recorder)
    if recorder is not None:
        _PROCESS_RECORDER.append(recorder)
    try:
        yield recorder
    finally:
        _RECORDER.reset(token)
        if recorder is not None:
            _PROCESS_RECORDER.remove(recorder)
