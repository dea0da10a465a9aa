"""The simulator as Text Generation Inference 3.3 (metrics catalog §4), from the same engine state.

Served: ``/metrics`` as TGI's Rust exporter (metrics-exporter-prometheus) writes it: no colon, no model label,
counters under their bare names, no ``_created`` series; ``/info`` (the router's JSON: ``"router":
"text-generation-router"``); /v1/models. TGI sends no ``server`` header of its own.

Mapping from the engine: ``tgi_queue_size`` = waiting, ``tgi_batch_current_size`` = running,
``tgi_batch_max_total_tokens`` = the KV pool in tokens, ``tgi_batch_current_max_tokens`` = the tokens the running
batch holds. Deviations: TGI reserves each request's whole budget (prompt + max new tokens) and never preempts; the
simulated engine allocates on demand and may preempt, so the page shows tokens held, and preemptions are not on it
(as on a real TGI). Histograms use the engine's (vLLM's) bucket bounds under TGI's names; TGI's forward-duration
histograms are not simulated.
"""

from __future__ import annotations

from llmdiag.sim.dialects import Dialect, Page, PageResult, SimState, json_page, register, text_family, text_histogram

TGI_VERSION = "3.3.7"
CONTENT_TYPE = "text/plain; charset=utf-8"
HISTOGRAMS = (
    ("tgi_request_duration", "e2e"),
    ("tgi_request_queue_duration", "queue"),
    ("tgi_request_inference_duration", "inference"),
    ("tgi_request_mean_time_per_token_duration", "time_per_output_token"),
    ("tgi_request_input_length", "request_prompt_tokens"),
    ("tgi_request_generated_tokens", "request_generation_tokens"),
    ("tgi_request_max_new_tokens", "request_params_max_tokens"),
)
FAILURE_KINDS = ("overloaded", "validation", "template", "incomplete", "dropped", "generation")


def _page(state: SimState) -> PageResult:
    engine, stats = state.engine, state.engine.stats
    capacity = (engine.num_gpu_blocks - 1) * engine.block_size
    finished = sum(stats.request_success.values())
    rejected = sum(stats.admission_rejections.values())
    parts = [
        text_family("tgi_request_count", "counter", "", [({}, finished + len(engine.running) + len(engine.waiting))]),
        text_family("tgi_request_success", "counter", "", [({}, finished - stats.request_success.get("abort", 0))]),
        text_family(
            "tgi_request_failure",
            "counter",
            "",
            [({"err": kind}, rejected if kind == "overloaded" else 0) for kind in FAILURE_KINDS],
        ),
        text_family("tgi_queue_size", "gauge", "", [({}, len(engine.waiting))]),
        text_family("tgi_batch_current_size", "gauge", "", [({}, len(engine.running))]),
        text_family("tgi_batch_current_max_tokens", "gauge", "", [({}, round(engine.kv_usage * capacity))]),
        text_family("tgi_batch_max_total_tokens", "gauge", "", [({}, capacity)]),
        text_family("tgi_batch_concat", "counter", "", [({"reason": "backpressure"}, 0), ({"reason": "chunking"}, 0)]),
    ]
    parts += [text_histogram(name, "", [({}, getattr(stats, attribute))]) for name, attribute in HISTOGRAMS]
    return "\n".join(parts).encode(), CONTENT_TYPE


def _pages(state: SimState) -> dict[str, Page]:
    engine = state.engine
    info = {
        "model_id": state.model,
        "model_sha": None,
        "model_pipeline_tag": "text-generation",
        "max_concurrent_requests": 128,
        "max_best_of": 2,
        "max_stop_sequences": 4,
        "max_input_tokens": state.model_len - 1,
        "max_total_tokens": state.model_len,
        "validation_workers": 2,
        "max_client_batch_size": 4,
        "router": "text-generation-router",
        "version": TGI_VERSION,
        "sha": None,
        "docker_label": None,
        "max_batch_total_tokens": (engine.num_gpu_blocks - 1) * engine.block_size,
    }
    return {"/metrics": lambda: _page(state), "/info": json_page(lambda: info)}


TGI = register(
    Dialect(name="tgi", summary=f"Text Generation Inference {TGI_VERSION}", setup=_pages, headers={}, owned_by="tgi")
)
