"""What a what-if prediction needs from a measured window (``WhatIfInputs``, carried on every verdict since
schema "3"), and what it answers (``WhatIf``: the figures before and after a set of changes; ``FixEffect``: the
same, in short, on a finding whose fix changes a parameter).

Missing is never zero: a field the window could not give is ``None`` and ``unavailable[field]`` says why.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from llmdiag.model.report import Report

# the names a change may set: vLLM's flags with `_`, and llmdiag's own `replicas`
CHANGE_NAMES = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "gpu_memory_utilization",
    "kv_cache_dtype",
    "num_gpu_blocks",
    "max_model_len",
    "tensor_parallel_size",
    "enable_prefix_caching",
    "enforce_eager",
    "replicas",
)

ChangeValue = int | float | str | bool


class WhatIfInputs(BaseModel):
    """The measured window as a prediction reads it: the closed loop seen, the step against the batch, the KV
    geometry and the lengths. Each figure is over the window; ``None`` with ``unavailable[name]`` when not seen."""

    server: str = ""
    window_seconds: float | None = None
    scrapes: int = 0
    # (requests running, decode step seconds) per interval with a steady batch (llmdiag.engine.stepwall)
    step_samples: list[tuple[float, float]] = Field(default_factory=list)
    # step(b) = intercept + slope · b, least squares over step_samples
    step_intercept_seconds: float | None = None
    step_slope_seconds_per_request: float | None = None
    step_fit_r2: float | None = None
    # where the fit's points came from: the window's intervals, or the levels of a `llmdiag load` sweep
    step_fit_source: str = ""
    # the step at the batch seen, from the output rate: running / tokens per second (always there when both are)
    step_seconds_at_mean_batch: float | None = None
    kv_block_size_tokens: float | None = None
    kv_gpu_blocks: float | None = None
    # the KV dtype and memory share the server reports (vLLM's cache_config_info: cache_dtype, gpu_memory_utilization)
    kv_cache_dtype: str | None = None
    gpu_memory_utilization: float | None = None
    kv_usage_mean_ratio: float | None = None
    kv_usage_peak_ratio: float | None = None
    prompt_tokens_mean: float | None = None
    output_tokens_mean: float | None = None
    # requests finished per second: in a steady closed loop, the arrival rate
    arrival_rate_per_second: float | None = None
    # the closed-loop users seen: the most requests running + waiting at one reading
    users_seen: float | None = None
    requests_running_mean: float | None = None
    requests_running_max: float | None = None
    requests_waiting_mean: float | None = None
    ttft_p50_seconds: float | None = None
    ttft_p90_seconds: float | None = None
    # scheduled to first token (vLLM's request_prefill_time_seconds), mean over the window
    prefill_seconds_mean: float | None = None
    # its median: a request preempted and recomputed counts its prefill again, which the mean takes in
    prefill_seconds_p50: float | None = None
    queue_seconds_mean: float | None = None
    generation_tokens_per_second: float | None = None
    preemptions_per_second: float | None = None
    # the most tokens one engine step took (iteration_tokens' largest bucket seen): the step budget in use, at least
    step_tokens_max: float | None = None
    prefix_cache_hit_ratio: float | None = None
    # the deployment, where the verdict placed it on the physics (its roofline): GPU and model names
    gpu: str | None = None
    model: str | None = None
    tensor_parallel_size: float | None = None
    unavailable: dict[str, str] = Field(default_factory=dict)


class Figures(BaseModel):
    """What users and the server see in one state; ``None``: the model cannot give it (never 0 for unknown)."""

    requests_running: float | None = None
    requests_waiting: float | None = None
    per_user_tokens_per_second: float | None = None  # while decoding
    per_user_tokens_per_second_incl_waiting: float | None = None  # the queue included
    ttft_p50_seconds: float | None = None
    ttft_p90_seconds: float | None = None
    total_tokens_per_second: float | None = None
    kv_peak_ratio: float | None = None
    preemptions_per_second: float | None = None


class WhatIf(Report):
    """``llmdiag whatif``: a saved verdict re-predicted with a set of changes."""

    source: str = ""
    changes: dict[str, ChangeValue] = Field(default_factory=dict)
    modelled: bool
    not_modelled_reason: str = ""
    basis: list[str] = Field(default_factory=list)
    class_before: str = ""
    class_after: str | None = None
    next_limit: str = ""
    before: Figures = Field(default_factory=Figures)
    after: Figures = Field(default_factory=Figures)
    band_ratio: float | None = None  # ± relative uncertainty of `after`
    # the measured window's figures beside the model's `before` (how well the model reproduces it)
    measured: Figures = Field(default_factory=Figures, exclude=True)


class FixEffect(BaseModel):
    """A fix's predicted effect on a finding: the changes it stands for and what they would buy, or why not."""

    changes: dict[str, ChangeValue] = Field(default_factory=dict)
    modelled: bool
    not_modelled_reason: str = ""
    class_after: str | None = None
    next_limit: str = ""
    # None when not modelled: nothing predicted, nothing to show
    before: Figures | None = None
    after: Figures | None = None
    band_ratio: float | None = None
