"""What a live scan's probes saw, kept read by read (recording), or played back in its place (replay).

A ``Tape`` is active for one scan (a context variable, so a check's targets each have their own in their own thread).
The collect path asks it at a few thin boundaries and is otherwise unchanged:

    page      each HTTP page read (``HttpMetricsSource.fetch_text``): the raw body and when it was read, or the error;
              the parser runs again on replay, so a fixed parser changes a replayed verdict as it would a live one
    json      each JSON answer server detection asked for (``/v1/models``, ``/version``, ``/info`` …) and its headers
    value     one-off answers: llama.cpp's ``/props``, a model's config.json from the Hugging Face cache
    source    a telemetry source that is not a page (NVML, the host): how it opened (or why not) and each read's samples
    canary    the canary requests' results (their client-side timings)
    clock     every reading of the scan window's monotonic clock: replayed, the window loop takes the same path, reads
              the sources in the same order and settles (``--duration auto``) at the same scrape, without sleeping

Replay never reaches the network, NVML or /proc. A replay that asks for a read the recording does not hold (another
llmdiag that reads differently) stops with an InputFileError that says so, never a guess.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from llmdiag import errors
from llmdiag.collect.exposition import Scrape
from llmdiag.errors import InputFileError, LlmdiagError, ProbeError

T = TypeVar("T")
REPLAY_HINT = "the bundle was recorded by another llmdiag version, or edited; record it again with this version"
# response headers never kept: they carry credentials or session state, and detection reads none of them
SECRET_HEADERS = frozenset({"set-cookie", "cookie", "authorization", "proxy-authorization", "x-api-key"})


@dataclass
class Tape:
    """One scan's reads, by channel, in the order they happened. ``replaying``: answers come from ``channels``."""

    replaying: bool = False
    channels: dict[str, list[Any]] = field(default_factory=dict)
    clock_readings: list[float] = field(default_factory=list)
    _cursor: dict[str, int] = field(default_factory=dict)
    _clock_cursor: int = 0

    # --- the raw entries -------------------------------------------------------------------------------------------

    def put(self, channel: str, entry: Any) -> None:
        self.channels.setdefault(channel, []).append(entry)

    def take(self, channel: str) -> Any:
        entries = self.channels.get(channel, [])
        index = self._cursor.get(channel, 0)
        if index >= len(entries):
            raise InputFileError(
                f"replay asked for read {index + 1} of {channel}, and the bundle holds {len(entries)}", REPLAY_HINT
            )
        self._cursor[channel] = index + 1
        return entries[index]

    def to_json(self) -> dict[str, Any]:
        return {"channels": self.channels, "clock": self.clock_readings}

    @classmethod
    def from_json(cls, data: Any) -> Tape:
        if not isinstance(data, dict) or not isinstance(data.get("channels"), dict):
            raise InputFileError("a bundle's tape is not an object with 'channels'", REPLAY_HINT)
        clock = data.get("clock", [])
        if not isinstance(clock, list) or not all(isinstance(v, int | float) for v in clock):
            raise InputFileError("a bundle's tape has a 'clock' that is not a list of numbers", REPLAY_HINT)
        channels = {str(k): v for k, v in data["channels"].items() if isinstance(v, list)}
        return cls(replaying=True, channels=channels, clock_readings=[float(v) for v in clock])

    # --- the window's clock ----------------------------------------------------------------------------------------

    def clock(self, live: Callable[[], float]) -> Callable[[], float]:
        def recorded() -> float:
            value = live()
            self.clock_readings.append(value)
            return value

        def replayed() -> float:
            if self._clock_cursor >= len(self.clock_readings):
                raise InputFileError(
                    f"replay read the window's clock more often than the recording ({len(self.clock_readings)})",
                    REPLAY_HINT,
                )
            self._clock_cursor += 1
            return self.clock_readings[self._clock_cursor - 1]

        return replayed if self.replaying else recorded

    # --- one answer, recorded or replayed --------------------------------------------------------------------------

    def answer(
        self,
        channel: str,
        live: Callable[[], T],
        encode: Callable[[T], Any],
        decode: Callable[[Any], T],
    ) -> T:
        """``live()``'s answer, recorded with ``encode``; on replay the next recorded one, ``decode``d. A ProbeError
        raised live is recorded and raised again on replay."""
        if self.replaying:
            entry = self.take(channel)
            if isinstance(entry, dict) and "error" in entry:
                raise error_from_json(entry["error"])
            if not isinstance(entry, dict) or "value" not in entry:
                raise InputFileError(f"a bundle's read of {channel} holds neither 'value' nor 'error'", REPLAY_HINT)
            try:
                return decode(entry["value"])
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise InputFileError(f"a bundle's read of {channel} cannot be read: {exc}", REPLAY_HINT) from None
        try:
            value = live()
        except ProbeError as exc:
            self.put(channel, {"error": error_to_json(exc), "at_unix": time.time()})
            raise
        self.put(channel, {"value": encode(value), "at_unix": time.time()})
        return value


_ACTIVE: contextvars.ContextVar[Tape | None] = contextvars.ContextVar("llmdiag_tape", default=None)


def active() -> Tape | None:
    return _ACTIVE.get()


@contextlib.contextmanager
def using(tape: Tape | None) -> Iterator[Tape | None]:
    """Make ``tape`` the one this thread's scan records into (or replays from) for the block."""
    token = _ACTIVE.set(tape)
    try:
        yield tape
    finally:
        _ACTIVE.reset(token)


def window_clock(
    clock: Callable[[], float], sleep: Callable[[float], None]
) -> tuple[Callable[[], float], Callable[[float], None]]:
    """The scan window's clock and sleep: as given, recorded, or replayed (a replay does not sleep)."""
    tape = active()
    if tape is None:
        return clock, sleep
    return tape.clock(clock), ((lambda _seconds: None) if tape.replaying else sleep)


def taped_value(channel: str, live: Callable[[], T], encode: Callable[[T], Any], decode: Callable[[Any], T]) -> T:
    """``live()`` when no tape is active; else its answer recorded, or replayed."""
    tape = active()
    return live() if tape is None else tape.answer(channel, live, encode, decode)


def _same(value: Any) -> Any:
    return value


# --- the page boundary ------------------------------------------------------------------------------------------


def taped_fetch(method: Callable[..., tuple[str, float]]) -> Callable[..., tuple[str, float]]:
    """For ``HttpMetricsSource.fetch_text``: the page body and its read time, per page URL as shown (no password)."""

    @functools.wraps(method)
    def fetch(self: Any, *args: Any, **kwargs: Any) -> tuple[str, float]:
        return taped_value(
            f"page {self.display_url}",
            lambda: method(self, *args, **kwargs),
            lambda answer: {"text": answer[0], "read_at_unix": answer[1]},
            lambda value: (str(value["text"]), float(value["read_at_unix"])),
        )

    return fetch


def taped_json(method: Callable[..., object]) -> Callable[..., object]:
    """For detection's ``get_json(path)``: the JSON answer (None: none usable) and the headers it came with."""

    @functools.wraps(method)
    def get_json(self: Any, path: str, *args: Any, **kwargs: Any) -> object:
        before = len(self.headers)

        def live() -> tuple[object, list[Any]]:
            body = method(self, path, *args, **kwargs)
            return body, [h for h in self.headers[before:] if h[1].lower() not in SECRET_HEADERS]

        body, headers = taped_value(
            f"json {errors.redact_url(self.connection.base_url)}{path}",
            live,
            lambda answer: {"body": answer[0], "headers": [list(h) for h in answer[1]]},
            lambda value: (value["body"], [tuple(map(str, h)) for h in value["headers"]]),
        )
        tape = active()
        if tape is not None and tape.replaying:
            self.headers += headers
        return body

    return get_json


# --- errors, as recorded ----------------------------------------------------------------------------------------


def error_to_json(error: LlmdiagError) -> dict[str, Any]:
    entry: dict[str, Any] = {"class": type(error).__name__, "message": error.message, "hint": error.hint}
    if isinstance(getattr(error, "status", None), int):
        entry["status"] = error.status  # type: ignore[attr-defined]
    return entry


def error_from_json(entry: Any) -> ProbeError:
    """The recorded error again, as its own class: only ProbeError's subclasses in llmdiag.errors qualify."""
    if not isinstance(entry, dict):
        raise InputFileError("a bundle's recorded error is not an object", REPLAY_HINT)
    cls = getattr(errors, str(entry.get("class", "")), None)
    if not (isinstance(cls, type) and issubclass(cls, ProbeError)):
        cls = ProbeError
    error = cls.__new__(cls)
    message = str(entry.get("message", ""))
    Exception.__init__(error, message)
    error.message = message
    error.hint = str(entry.get("hint", ""))
    if isinstance(entry.get("status"), int):
        error.status = entry["status"]  # type: ignore[attr-defined]
    return error


# --- scrapes (the telemetry that is not a page: NVML, the host) ---------------------------------------------------


def _number(value: float) -> float | str:
    return value if math.isfinite(value) else repr(value)  # JSON has no NaN or Inf: 'nan', 'inf', '-inf'


def scrape_to_json(scrape: Scrape) -> dict[str, Any]:
    return {
        "at_unix": scrape.at_unix,
        "series": {
            name: [[[list(pair) for pair in labels], _number(value)] for labels, value in by_labels.items()]
            for name, by_labels in scrape.series.items()
        },
        "types": scrape.types,
        "size_bytes": scrape.size_bytes,
        "unavailable": scrape.unavailable,
    }


def scrape_from_json(data: Any) -> Scrape:
    at = data["at_unix"]
    scrape = Scrape(at_unix=None if at is None else float(at), size_bytes=int(data.get("size_bytes", 0)))
    for name, rows in data["series"].items():
        series = scrape.series.setdefault(str(name), {})
        for labels, value in rows:
            series[tuple((str(k), str(v)) for k, v in labels)] = float(value)
    scrape.types = {str(k): str(v) for k, v in data.get("types", {}).items()}
    scrape.unavailable = {str(k): str(v) for k, v in data.get("unavailable", {}).items()}
    return scrape
