"""`llmdiag load`: client-side measurements per load level, and where adding load stops paying."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Literal

from pydantic import BaseModel, Field

from llmdiag.model.abtest import Comparison
from llmdiag.model.report import Report
from llmdiag.model.verdict import Bottleneck, Verdict
from llmdiag.model.workload import RequestSample, Workload

# ---------------------------------------------------------------------------------------------
# client-side measurements: canary requests in a scan, and `llmdiag load`


class Percentiles(BaseModel):
    """A distribution over requests; ``count`` is how many requests it is over (0: all values None)."""

    count: int = 0
    mean: float | None = None
    p5: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None


def quantile(sorted_values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default), on values sorted ascending."""
    if not sorted_values:
        return None
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def percentiles(values: Iterable[float | None]) -> Percentiles:
    ordered = sorted(v for v in values if v is not None and math.isfinite(v))
    if not ordered:
        return Percentiles()
    return Percentiles(
        count=len(ordered),
        mean=sum(ordered) / len(ordered),
        p5=quantile(ordered, 0.05),
        p50=quantile(ordered, 0.5),
        p90=quantile(ordered, 0.9),
        p95=quantile(ordered, 0.95),
        p99=quantile(ordered, 0.99),
    )


class LoadPoint(BaseModel):
    """One load level (a number of closed-loop users, or an arrival rate) and what it measured."""

    users: int | None = None
    rate_per_second: float | None = None
    window_seconds: float
    requests_completed: int = 0
    requests_cancelled: int = 0
    errors: dict[str, int] = Field(default_factory=dict)  # kind (http 503, timeout, stream …) → count
    error_examples: list[str] = Field(default_factory=list)
    ttft_seconds: Percentiles = Field(default_factory=Percentiles)
    itl_seconds: Percentiles = Field(default_factory=Percentiles)
    tpot_seconds: Percentiles = Field(default_factory=Percentiles)
    e2e_seconds: Percentiles = Field(default_factory=Percentiles)
    output_tokens_per_second: float | None = None
    # what each user gets while its answer streams (1 / TPOT), and over the whole request, wait included
    per_user_decode_tokens_per_second: Percentiles = Field(default_factory=Percentiles)
    per_user_tokens_per_second: Percentiles = Field(default_factory=Percentiles)
    # the seed arithmetic: total tokens/s divided by the users, as if each got an equal slice of a fixed rate
    naive_per_user_tokens_per_second: float | None = None
    goodput_requests_per_second: float | None = None
    goodput_ratio: float | None = None
    verdict: Verdict | None = None
    # every request that ended in the window, kept when a workload is recorded or replayed (for the A/B)
    samples: list[RequestSample] | None = None


class Knee(BaseModel):
    """Where adding load stops paying: the first point whose per-user speed or goodput breaks."""

    users: int | None = None
    rate_per_second: float | None = None
    reason: str
    bottleneck: Bottleneck | None = None


class LoadReport(Report):
    target: str = ""
    model: str = ""
    mode: Literal["closed", "open"] = "closed"
    prompt_tokens: str = ""
    output_tokens: str = ""
    slo_ttft_seconds: float | None = None
    slo_tpot_seconds: float | None = None
    points: list[LoadPoint] = Field(default_factory=list)
    knee: Knee | None = None
    notes: list[str] = Field(default_factory=list)
    # the workload this run recorded or replayed (with the served model and server version); None: a plain load
    workload: Workload | None = None
    # against a baseline run of the same workload (`load --workload W --baseline BEFORE.json`)
    comparison: Comparison | None = None
