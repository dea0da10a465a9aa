"""The simulator as llama.cpp's ``llama-server --metrics`` (metrics catalog §5), a recent build, from the same
engine state.

Served: ``/metrics`` (no labels; a recent build: no KV-cache gauges, removed by PR #13660), ``/props`` (with
``total_slots`` = the batch cap and ``default_generation_settings.n_ctx``), ``/slots``, /v1/models with
``owned_by: "llamacpp"``, and ``Server: llama.cpp`` on every answer.

Mapping from the engine: slots are the batch cap (``--parallel``), ``requests_processing`` = running,
``requests_deferred`` = waiting; ``prompt_seconds_total`` and ``tokens_predicted_seconds_total`` sum the requests'
prefill and decode times, and ``tokens_predicted_total`` their generated tokens, each added when a request ends (as
llama.cpp's ``on_prediction`` does); ``n_decode_total`` counts engine steps; ``n_busy_slots_per_decode`` is the
lifetime mean of output tokens per step. Deviation: llama.cpp never preempts; the simulated engine may, and the page
does not show it (as on a real llama.cpp).
"""

from __future__ import annotations

from llmdiag.sim.dialects import Dialect, Page, PageResult, SimState, json_page, register, text_family

BUILD = "b6500-llmdiag.sim"
CONTENT_TYPE = "text/plain; version=0.0.4"


def _page(state: SimState) -> PageResult:
    engine, stats = state.engine, state.engine.stats
    rows = [
        ("llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed.", stats.prompt_tokens),
        ("llamacpp:prompt_seconds_total", "counter", "Prompt process time", stats.prefill.total),
        (
            "llamacpp:tokens_predicted_total",
            "counter",
            "Number of generation tokens processed.",
            stats.request_generation_tokens.total,
        ),
        ("llamacpp:tokens_predicted_seconds_total", "counter", "Predict process time", stats.decode.total),
        ("llamacpp:n_decode_total", "counter", "Total number of llama_decode() calls", stats.steps),
        (
            "llamacpp:n_busy_slots_per_decode",
            "counter",
            "Average number of busy slots per llama_decode() call",
            stats.generation_tokens / stats.steps if stats.steps else 0.0,
        ),
        (
            "llamacpp:prompt_tokens_seconds",
            "gauge",
            "Average prompt throughput in tokens/s.",
            stats.prompt_tokens / stats.prefill.total if stats.prefill.total else 0.0,
        ),
        (
            "llamacpp:predicted_tokens_seconds",
            "gauge",
            "Average generation throughput in tokens/s.",
            stats.generation_tokens / stats.decode.total if stats.decode.total else 0.0,
        ),
        ("llamacpp:requests_processing", "gauge", "Number of requests processing.", len(engine.running)),
        ("llamacpp:requests_deferred", "gauge", "Number of requests deferred.", len(engine.waiting)),
    ]
    text = "".join(text_family(name, kind, help_text, [({}, value)]) for name, kind, help_text, value in rows)
    return text.encode(), CONTENT_TYPE


def _pages(state: SimState) -> dict[str, Page]:
    engine = state.engine
    slots = engine.config.seqs
    n_ctx = state.model_len

    def props() -> dict:
        return {
            "default_generation_settings": {"n_ctx": n_ctx, "params": {"n_predict": -1}},
            "total_slots": slots,
            "model_alias": state.model,
            "model_path": f"/models/{state.model}.gguf",
            "modalities": {"vision": False, "audio": False},
            "build_info": BUILD,
            "is_sleeping": False,
        }

    def slots_page() -> list[dict]:
        busy = len(engine.running)
        return [{"id": i, "n_ctx": n_ctx, "is_processing": i < busy} for i in range(slots)]

    return {
        "/metrics": lambda: _page(state),
        "/props": json_page(props),
        "/slots": json_page(slots_page),
        "/health": json_page(lambda: {"status": "ok"}),
    }


LLAMACPP = register(
    Dialect(
        name="llamacpp",
        summary=f"llama.cpp llama-server {BUILD} (--metrics)",
        setup=_pages,
        headers={"Server": "llama.cpp"},
        owned_by="llamacpp",
    )
)
