"""The live sources that are not pages, behind the active tape (``llmdiag.collect.tape``): a telemetry source that
reads a library or /proc (NVML, the host) and the canary requests. Without a tape each is the live one, untouched."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from llmdiag.client.endpoint import Connection
from llmdiag.client.result import RequestResult
from llmdiag.collect.canary import Canary
from llmdiag.collect.exposition import Scrape
from llmdiag.collect.source import Source
from llmdiag.collect.tape import (
    REPLAY_HINT,
    Tape,
    active,
    error_from_json,
    error_to_json,
    scrape_from_json,
    scrape_to_json,
)
from llmdiag.errors import InputFileError, ProbeError
from llmdiag.model import SourceInfo
from llmdiag.schema.loader import load_probe

CANARY_CHANNEL = "canary"


def taped_source(name: str, open_live: Callable[[], Source | SourceInfo]) -> Source | SourceInfo:
    """A telemetry source opened live (and each read recorded), or replayed: how it opened, then its reads."""
    tape = active()
    if tape is None:
        return open_live()
    channel = f"source {name}"
    if tape.replaying:
        return _replayed_source(tape, channel)
    opened = open_live()
    if isinstance(opened, SourceInfo):
        tape.put(channel, {"missing": opened.model_dump(mode="json")})
        return opened
    tape.put(
        channel,
        {
            "open": {
                "spec": opened.spec.name,
                "display_url": opened.display_url,
                "interval_seconds": opened.interval_seconds,
                "required": opened.required,
                "label": opened.label,
                "hint": opened.hint,
                "check_first": opened.check_first,
                "details": dict(opened.details),
            }
        },
    )
    live_read = opened.read

    def read() -> Scrape:
        try:
            scrape = live_read()
        except ProbeError as exc:
            tape.put(channel, {"error": error_to_json(exc)})
            raise
        tape.put(channel, {"scrape": scrape_to_json(scrape)})
        return scrape

    opened.read = read
    return opened


def _replayed_source(tape: Tape, channel: str) -> Source | SourceInfo:
    entry = tape.take(channel)
    try:
        if "missing" in entry:
            return SourceInfo.model_validate(entry["missing"])
        meta = entry["open"]
        spec = load_probe(str(meta["spec"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise InputFileError(f"a bundle's {channel} cannot be read: {exc}", REPLAY_HINT) from None

    def read() -> Scrape:
        reading = tape.take(channel)
        if "error" in reading:
            raise error_from_json(reading["error"])
        try:
            return scrape_from_json(reading["scrape"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InputFileError(f"a bundle's read of {channel} cannot be read: {exc}", REPLAY_HINT) from None

    return Source(
        spec=spec,
        display_url=str(meta["display_url"]),
        read=read,
        interval_seconds=float(meta["interval_seconds"]),
        required=bool(meta.get("required", False)),
        label=str(meta.get("label", "")),
        hint=str(meta.get("hint", "")),
        check_first=bool(meta.get("check_first", True)),
        details={str(k): str(v) for k, v in dict(meta.get("details", {})).items()},
    )


# --- the canary ---------------------------------------------------------------------------------------------------


class RecordingCanary(Canary):
    """The live canary; what it gathered (each request's timings, the model, why it could not start) is recorded
    when it finishes."""

    def __init__(self, tape: Tape, connection: Connection, duration_seconds: float) -> None:
        super().__init__(connection, duration_seconds)
        self.tape = tape

    def finish(self) -> Any:
        outcome = super().finish()
        load = self.load
        client = load.client if load is not None else None
        self.tape.put(
            CANARY_CHANNEL,
            {
                "started": load is not None,
                "failed": self.failed,
                "model": client.model if client is not None else None,
                "results": [dataclasses.asdict(r) for r in load.results] if load is not None else [],
            },
        )
        return outcome


class _ReplayedLoad:
    """What ``Canary.finish`` reads of its load, from the recording."""

    def __init__(self, results: list[RequestResult], model: str | None) -> None:
        self.results = results
        self.client = SimpleNamespace(model=model)

    def stop(self, timeout_seconds: float | None = None) -> None:
        return None  # nothing was started: the live canary's stop takes how long to wait


class ReplayCanary(Canary):
    """The canary's recorded results handed to the live ``finish``: the same signals, no request sent."""

    def __init__(self, tape: Tape, connection: Connection, duration_seconds: float) -> None:
        super().__init__(connection, duration_seconds)
        self.tape = tape

    def start(self) -> None:
        entry = self.tape.take(CANARY_CHANNEL)
        try:
            results = [RequestResult(**r) for r in entry["results"]]
            model = entry.get("model")
        except (KeyError, TypeError) as exc:
            raise InputFileError(f"a bundle's canary results cannot be read: {exc}", REPLAY_HINT) from None
        self.failed = entry.get("failed")
        self.load = _ReplayedLoad(results, model) if entry.get("started") else None  # type: ignore[assignment]


def taped_canary(connection: Connection, duration_seconds: float) -> Canary:
    tape = active()
    if tape is None:
        return Canary(connection, duration_seconds)
    return (ReplayCanary if tape.replaying else RecordingCanary)(tape, connection, duration_seconds)


# --- a telemetry-only recording (bench/gpu_check.py --record) -----------------------------------------------------


def replay_source_reads(name: str, tape: Tape) -> tuple[Source, list[Scrape]]:
    """A recorded telemetry source and every read it recorded, in order: a recording of the source alone (no
    server, no window loop), as ``bench/gpu_check.py --record`` makes one."""
    channel = f"source {name}"
    opened = _replayed_source(tape, channel)
    if isinstance(opened, SourceInfo):
        raise InputFileError(f"the bundle's {name} source did not open: {opened.note}", REPLAY_HINT)
    reads = len(tape.channels.get(channel, [])) - 1
    return opened, [opened.read() for _ in range(reads)]
