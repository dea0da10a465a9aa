"""A recorded load (`llmdiag load --save-workload W.json`) that `load --workload W.json` replays exactly, and the
per-request samples a replay keeps so that two runs can be compared with confidence intervals.

The file is this model's JSON (``kind = "llmdiag-workload"``, ``schema_version`` and ``tool_version`` like every
report). What makes two runs "the same workload" is ``Workload.identity()``: the arrival process, the levels, the
window, the length distributions, the seed, the API and the SLOs. The served model and the server's version are
kept beside it: a comparison refuses runs where any of the three differ (llmdiag.engine.abtest).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from llmdiag.errors import InputFileError, option
from llmdiag.model.report import Report, read_json_object

WORKLOAD_KIND = "llmdiag-workload"
MAX_WORKLOAD_BYTES = 4 * 2**20


class Workload(Report):
    """What was sent, not what came back: replaying it sends the same prompts and lengths in the same order."""

    kind: Literal["llmdiag-workload"] = "llmdiag-workload"
    # the arrival process: "closed" (levels are users, each sends its next request when its last one ends,
    # after think_time_seconds) or "open" (levels are Poisson arrival rates per second, drawn from the seed)
    mode: Literal["closed", "open"]
    levels: list[float]
    think_time_seconds: float = 0.0
    duration_seconds: float  # the measured window of each level
    warmup_seconds: float
    max_requests: int  # per level
    # token lengths per request: "256" (fixed), "128:512" (uniform) or "normal:256,64"
    prompt_tokens: str
    output_tokens: str
    seed: int  # lengths, prompts and arrival times are all drawn from it
    chat: bool = False
    slo_ttft_seconds: float | None = None
    slo_tpot_seconds: float | None = None  # goodput counts the requests that meet it
    # what served it when it was recorded (or replayed): compared, not replayed
    model: str = ""
    server_version: str | None = None  # None: the server told no version (see server_version_source)
    server_version_source: str = ""
    target: str = ""  # the URL it ran against (redacted): informational, never compared

    def identity(self) -> dict[str, Any]:
        """The fields that must match for two runs to be comparable (the served model and version aside)."""
        return self.model_dump(
            include={
                "mode",
                "levels",
                "think_time_seconds",
                "duration_seconds",
                "warmup_seconds",
                "max_requests",
                "prompt_tokens",
                "output_tokens",
                "seed",
                "chat",
                "slo_ttft_seconds",
                "slo_tpot_seconds",
            }
        )


class RequestSample(BaseModel):
    """One request that ended in a level's window, as the A/B comparison resamples it. Errors are kept (``ok``
    False, ``error_kind``); requests cancelled at the deadline are not, as in the level's own figures."""

    started_seconds: float  # from the window's start (negative: sent during the warm-up); orders the requests
    ok: bool
    error_kind: str | None = None
    ttft_seconds: float | None = None
    tpot_seconds: float | None = None
    e2e_seconds: float | None = None
    output_tokens: int | None = None
    itl_seconds: list[float] = Field(default_factory=list)


def read_workload(path: Path) -> Workload:
    """A saved workload, or one InputFileError line saying what is wrong with the file."""
    hint = f"give a file that `llmdiag load` wrote with {option('save_workload')}"
    data = read_json_object(Path(path), MAX_WORKLOAD_BYTES, hint, what="an llmdiag workload")
    if data.get("kind") != WORKLOAD_KIND:
        raise InputFileError(f'{path} holds JSON, but not an llmdiag workload (no "kind": "{WORKLOAD_KIND}")', hint)
    try:
        return Workload.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top)"
        raise InputFileError(f"{path} is not a valid workload: {where}: {first['msg']}", hint) from None
