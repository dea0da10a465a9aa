"""A matched A/B: the same recorded workload before and after a change, every metric's difference with a
confidence interval, and (when one was made) `llmdiag whatif`'s prediction beside the measurement.

The prediction is whatif's own ``WhatIf`` (``llmdiag whatif --json``), read back; the comparison shows its
``after`` figures with their band, ``class_after`` and ``next_limit``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from llmdiag.errors import InputFileError
from llmdiag.model.report import Report, read_json_object
from llmdiag.model.whatif import WhatIf

PREDICTION_HINT = "give the JSON that `llmdiag whatif` prints for the change"
MAX_PREDICTION_BYTES = 16 * 2**20


class MetricDiff(BaseModel):
    """One metric before and after, the difference (after − before) and its interval. None: not measured on one
    side (no request completed, say), never zero."""

    name: str  # e.g. "ttft_p50_seconds"
    label: str  # e.g. "TTFT p50"
    unit: Literal["seconds", "tokens/s", "ratio", "requests", "per second"]
    better: Literal["higher", "lower"]
    before: float | None = None
    after: float | None = None
    difference: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    # "better", "worse" (the interval excludes 0 on that side), "no change shown" (it covers 0), "unavailable";
    # "server gauge": read from the server's metrics over the window (one figure per run, so no interval)
    change: Literal["better", "worse", "no change shown", "unavailable", "server gauge"] = "unavailable"
    predicted: float | None = None  # whatif's `after` figure for this metric, where it gives one
    predicted_low: float | None = None  # the prediction's band (predicted × (1 ± band_ratio))
    predicted_high: float | None = None


class LevelComparison(BaseModel):
    users: int | None = None
    rate_per_second: float | None = None
    requests_before: int = 0
    requests_after: int = 0
    metrics: list[MetricDiff] = Field(default_factory=list)
    class_before: str | None = None  # the level's verdict; None: no server-side scan
    class_after: str | None = None
    class_predicted: str | None = None


class Comparison(Report):
    baseline: str = ""  # the baseline file
    prediction_source: str = ""  # the whatif file, when one was given
    prediction_changes: dict[str, object] = Field(default_factory=dict)
    prediction_not_modelled: str = ""  # why whatif made no prediction, when it made none
    next_limit_predicted: str | None = None
    model: str = ""
    server_version: str | None = None
    confidence_level: float = 0.95
    resamples: int = 0
    seed: int = 0
    method: str = ""  # the interval's method in words
    levels: list[LevelComparison] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


def read_prediction(path: Path) -> WhatIf:
    """A saved `whatif --json`, or one InputFileError line."""
    data = read_json_object(
        Path(path), MAX_PREDICTION_BYTES, PREDICTION_HINT, check_version=False, what="a whatif prediction"
    )
    if "class_after" not in data or "after" not in data:
        raise InputFileError(
            f"{path} holds JSON, but not a whatif prediction (no 'class_after' and 'after')", PREDICTION_HINT
        )
    try:
        return WhatIf.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top)"
        raise InputFileError(f"{path} is not a valid prediction: {where}: {first['msg']}", PREDICTION_HINT) from None
