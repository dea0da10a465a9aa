"""Record what NVML said on a real machine, and play it back where there is no GPU.

``RecordingNvml`` wraps the real ``pynvml`` module and keeps every answer, value or NVML error code, per GPU and
call, in order. ``ReplayNvml`` stands in for ``pynvml`` with such a recording: the same function names, the same
return shapes (attributes for structs), the same ``NVMLError`` codes. The sampler cannot tell the difference,
which is the point: a bug report's recording replays a real device at the library boundary (the test
fixtures in tests/fixtures/nvml are hand-assembled in this format, not recorded).

A recording (JSON)::

    {"source": "...", "driver_version": "550.54.15", "init_error": null,
     "devices": [{"calls": {"nvmlDeviceGetName": "NVIDIA H100 80GB HBM3",
                            "nvmlDeviceGetUtilizationRates": {"seq": [{"gpu": 97, "memory": 58}, ...]},
                            "nvmlDeviceGetClockInfo(1)": {"seq": [1980, 1755]},
                            "nvmlDeviceGetEccMode": {"error": 3},
                            "nvmlDeviceGetFieldValues": {"138": {"seq": [10, 20]}, "38": {"error": 3}}}}],
     "events": {"seq": [[], [{"device": 0, "eventData": 79}]]}}

``{"seq": [...]}`` answers successive calls in turn (the last repeats); ``{"error": code}`` raises NVMLError(code);
anything else is a constant answer. ``events`` holds one batch of XID events per drain (one drain per read).
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NoReturn

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
FIELD_VALUES = "nvmlDeviceGetFieldValues"
# device calls that take no handle, or whose answer the replay derives itself
UNRECORDED = frozenset({"nvmlDeviceGetCount", "nvmlDeviceGetIndex"})


class _FallbackNVMLError(Exception):
    """Used only when nvidia-ml-py is absent: same ``value`` attribute as pynvml.NVMLError."""

    def __init__(self, value: int):
        super().__init__(f"NVML error {value}")
        self.value = value


def nvml_error_class() -> type[Exception]:
    try:
        import pynvml

        return pynvml.NVMLError
    except ImportError:
        return _FallbackNVMLError


def call_key(name: str, args: tuple[Any, ...]) -> str:
    if not args or name == FIELD_VALUES:
        return name
    return f"{name}({','.join(str(a) for a in args)})"


def _struct(value: Any) -> Any:
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _struct(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_struct(v) for v in value]
    return value


class _Answers:
    """Successive answers of one recorded call."""

    def __init__(self, entry: Any):
        self.entry = entry
        self.calls = 0

    def next(self) -> Any:
        entry = self.entry
        if isinstance(entry, dict) and "seq" in entry:
            items = entry["seq"]
            entry = items[min(self.calls, len(items) - 1)]
        self.calls += 1
        return entry


class ReplayNvml:
    """A stand-in for the pynvml module, answering from a recording."""

    def __init__(self, recording: dict[str, Any], error_class: type[Exception] | None = None):
        self.recording = recording
        self.NVMLError = error_class or nvml_error_class()
        self.answers: dict[tuple[int, str], _Answers] = {}
        self.field_answers: dict[tuple[int, str], _Answers] = {}
        # events happen once: past the recorded batches, drains find nothing (unlike state, which repeats)
        self.event_batches = list(recording.get("events", {}).get("seq", []))
        self.pending_events: list[dict[str, Any]] | None = None
        self.initialised = False

    @classmethod
    def from_file(cls, path: Path | str) -> ReplayNvml:
        return cls.from_recording(json.loads(Path(path).read_text()))

    @classmethod
    def from_recording(cls, data: Any) -> ReplayNvml:
        if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
            raise ValueError("not an NVML recording (no 'devices' list)")
        return cls(data)

    def _raise(self, code: int) -> NoReturn:
        raise self.NVMLError(code)

    def _answer(self, answers: _Answers) -> Any:
        value = answers.next()
        if isinstance(value, dict) and set(value) == {"error"}:
            self._raise(value["error"])
        return _struct(value)

    # -- library-level calls -------------------------------------------------------------------

    def nvmlInit(self) -> None:  # noqa: N802 (pynvml's names)
        if self.recording.get("init_error") is not None:
            self._raise(self.recording["init_error"])
        self.initialised = True

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.recording["devices"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        if not 0 <= index < len(self.recording["devices"]):
            self._raise(2)  # NVML_ERROR_INVALID_ARGUMENT
        return index

    def nvmlDeviceGetIndex(self, handle: int) -> int:  # noqa: N802
        return handle

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return self.recording.get("driver_version", "unknown")

    def nvmlEventSetCreate(self) -> str:  # noqa: N802
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: int, types: int, events: str) -> None:  # noqa: N802
        entry = self.recording["devices"][handle]["calls"].get("nvmlDeviceRegisterEvents")
        if isinstance(entry, dict) and "error" in entry:
            self._raise(entry["error"])

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> Any:  # noqa: N802
        if self.pending_events is None:
            self.pending_events = list(self.event_batches.pop(0)) if self.event_batches else []
        if not self.pending_events:
            self.pending_events = None  # the next drain reads the next recorded batch
            self._raise(NVML_ERROR_TIMEOUT)
        return _struct(self.pending_events.pop(0))

    def nvmlEventSetFree(self, events: str) -> None:  # noqa: N802
        return None

    # -- per-device calls ------------------------------------------------------------------------

    def nvmlDeviceGetFieldValues(self, handle: int, field_ids: list[Any]) -> list[Any]:  # noqa: N802
        recorded = self.recording["devices"][handle]["calls"].get(FIELD_VALUES)
        if recorded is None:
            raise LookupError(f"the recording has no {FIELD_VALUES} for GPU {handle}")
        if isinstance(recorded, dict) and set(recorded) == {"error"}:
            self._raise(recorded["error"])
        values = []
        for item in field_ids:
            fid, scope = item if isinstance(item, tuple) else (item, 0)
            key = (handle, str(fid))
            if key not in self.field_answers:
                self.field_answers[key] = _Answers(recorded.get(str(fid), {"error": NVML_ERROR_NOT_SUPPORTED}))
            answer = self.field_answers[key].next()
            failed = isinstance(answer, dict) and "error" in answer
            values.append(
                SimpleNamespace(
                    fieldId=fid,
                    scopeId=scope,
                    nvmlReturn=answer["error"] if failed else 0,
                    value=SimpleNamespace(ullVal=0 if failed else int(answer)),
                )
            )
        return values

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("nvmlDevice"):
            raise AttributeError(name)

        def call(handle: int, *args: Any) -> Any:
            key = call_key(name, args)
            calls = self.recording["devices"][handle]["calls"]
            if key not in calls:
                raise LookupError(f"the recording has no answer for {key} on GPU {handle}")
            answers = self.answers.setdefault((handle, key), _Answers(calls[key]))
            return self._answer(answers)

        return call


# ---------------------------------------------------------------------------------------------
# recording on a real machine


def _plain(value: Any) -> Any:
    """A pynvml answer as JSON: ctypes structs by field name, bytes as text."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, SimpleNamespace):  # a replay being recorded again
        return {name: _plain(item) for name, item in vars(value).items()}
    if isinstance(value, ctypes.Structure | ctypes.Union):
        return {name: _plain(getattr(value, name)) for name, *_ in value._fields_}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, ctypes.Array):
        return [_plain(v) for v in value]
    return value


class RecordingNvml:
    """Wraps the real pynvml module and keeps every per-device answer for ``ReplayNvml``."""

    def __init__(self, nvml: Any, source: str = ""):
        self.nvml = nvml
        self.NVMLError = nvml.NVMLError
        self.indices: dict[int, int] = {}
        self.devices: list[dict[str, Any]] = []
        self.events: list[list[dict[str, Any]]] = [[]]
        self.source = source

    @staticmethod
    def _address(handle: Any) -> int:
        try:
            return ctypes.cast(handle, ctypes.c_void_p).value or id(handle)
        except (TypeError, ctypes.ArgumentError):
            return id(handle)

    def _slot(self, handle: Any) -> dict[str, Any]:
        return self.devices[self.indices[self._address(handle)]]

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:  # noqa: N802
        handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
        while len(self.devices) <= index:
            self.devices.append({"calls": {}})
        self.indices[self._address(handle)] = index
        return handle

    def nvmlEventSetWait_v2(self, events: Any, timeout_ms: int) -> Any:  # noqa: N802
        try:
            data = self.nvml.nvmlEventSetWait_v2(events, timeout_ms)
        except self.nvml.NVMLError:
            self.events.append([])
            raise
        index = self.nvml.nvmlDeviceGetIndex(data.device)
        self.events[-1].append({"device": index, "eventData": int(data.eventData)})
        return data

    def __getattr__(self, name: str) -> Any:
        real = getattr(self.nvml, name)
        if not name.startswith("nvmlDevice") or name in UNRECORDED or not callable(real):
            return real

        def call(handle: Any, *args: Any) -> Any:
            calls = self._slot(handle)["calls"]
            try:
                value = real(handle, *args)
                answer = _plain(value)
                if name == FIELD_VALUES:
                    answer = {
                        str(v.fieldId): (int(v.value.ullVal) if v.nvmlReturn == 0 else {"error": v.nvmlReturn})
                        for v in value
                    }
            except self.nvml.NVMLError as exc:
                answer = {"error": exc.value}
            if name == FIELD_VALUES:
                slot = calls.setdefault(FIELD_VALUES, {})
                for fid, item in answer.items() if "error" not in answer else ():
                    slot.setdefault(fid, {"seq": []})["seq"].append(item)
            else:
                calls.setdefault(call_key(name, args), {"seq": []})["seq"].append(answer)
            if isinstance(answer, dict) and set(answer) == {"error"}:
                raise self.nvml.NVMLError(answer["error"])
            return value

        return call

    def recording(self) -> dict[str, Any]:
        try:
            driver = self.nvml.nvmlSystemGetDriverVersion()
        except self.nvml.NVMLError:
            driver = "unknown"
        return {
            "source": self.source,
            "driver_version": driver.decode() if isinstance(driver, bytes) else driver,
            "init_error": None,
            "devices": self.devices,
            # one batch per drain, in order; the last list is the drain still open
            "events": {"seq": self.events[:-1] or [[]]},
        }
