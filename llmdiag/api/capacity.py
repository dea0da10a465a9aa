"""`llmdiag capacity` as a library call: name a GPU and a model, plan their capacity, and optionally simulate it.

question = capacity_question("H100", "llama-3-8b", users=1000, prompt_tokens=500, output_tokens=200)
report = run_capacity(question)                        # the roofline plan (llmdiag.engine.capacity)
report = run_capacity(question, simulate_seconds=15)   # and the simulator's measurement of the same case
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from llmdiag.engine.capacity import CapacityQuestion, plan_capacity
from llmdiag.errors import UsageError, option
from llmdiag.model.capacity import CapacityReport
from llmdiag.physics.hardware import GPUS, MODELS, GpuSpec, ModelSpec, find_gpu, find_model, load_model_config
from llmdiag.physics.step import DEFAULT_GPU_MEMORY_UTILIZATION
from llmdiag.planning import simulate_capacity


def resolve_gpu_and_model(
    gpu: str | None, model: str | None, model_config: Path | None = None
) -> tuple[GpuSpec, ModelSpec]:
    """The GPU by name, and the model by name or from a Hugging Face config.json: both given, the model once."""
    if gpu is None:
        raise UsageError("no GPU given", f"{option('gpu')} NAME; known GPUs: {', '.join(GPUS)}")
    if model is not None and model_config is not None:
        raise UsageError(f"both {option('model')} and {option('model_config')} given", "pass one of them")
    if model is None and model_config is None:
        raise UsageError(
            "no model given",
            f"{option('model')} NAME (known: {', '.join(MODELS)}) or {option('model_config')} PATH/config.json",
        )
    gpu_spec = find_gpu(gpu)
    model_spec = load_model_config(model_config) if model_config is not None else find_model(str(model))
    return gpu_spec, model_spec


def capacity_question(
    gpu: str | None,
    model: str | None,
    model_config: Path | None = None,
    *,
    users: int,
    prompt_tokens: int,
    output_tokens: int,
    tp: int = 1,
    interconnect: str | None = None,
    gpu_memory_utilization: float | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> CapacityQuestion:
    """The question by names, as ``llmdiag capacity`` takes it. None (or 0) for ``gpu_memory_utilization`` is vLLM's
    default; None for a batch cap is vLLM's default on that GPU. Raises ``UsageError`` for what cannot be asked."""
    gpu_spec, model_spec = resolve_gpu_and_model(gpu, model, model_config)
    return CapacityQuestion(
        gpu=gpu_spec,
        model=model_spec,
        tp=tp,
        users=users,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        interconnect=interconnect,
        gpu_memory_utilization=gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )


def run_capacity(
    question: CapacityQuestion,
    simulate_seconds: float | None = None,
    on_simulate: Callable[[float], None] | None = None,
) -> CapacityReport:
    """The capacity plan; with ``simulate_seconds``, the simulator also runs the same case for about that long
    (``report.simulated``). ``on_simulate(seconds)`` is called as the simulation starts, after the plan."""
    report = plan_capacity(question)
    if simulate_seconds is not None:
        if on_simulate is not None:
            on_simulate(simulate_seconds)
        report.simulated = simulate_capacity(
            report, question.gpu, question.model, interconnect=question.interconnect, seconds=simulate_seconds
        )
    return report
