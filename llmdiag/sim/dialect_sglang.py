"""The simulator as SGLang 0.5 with ``--enable-metrics`` (metrics catalog §3), from the same engine state.

Served: ``/metrics`` (SGLang's multiprocess registry: no ``python_*``/``process_*`` collectors, no ``_created``
series), ``/get_model_info``, ``/get_server_info``, and /v1/models with ``owned_by: "sglang"``, behind uvicorn's
``server`` header. Scheduler gauges carry ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank`` and
``moe_ep_rank`` (one scheduler: attention-TP rank 0 exports); tokenizer metrics ``model_name`` and ``engine_type``.

SGLang refreshes its scheduler gauges on log ticks only (a prefill batch, or every ``--decode-log-interval`` = 40
decode steps), so the page holds the numbers of the last tick, not of the scrape's moment. Retractions are the
engine's preemptions. ``sglang:utilization`` reads 0, as in open source. Deviation: histograms use the engine's
(vLLM's) bucket bounds under SGLang's names; the engine records one set of observations.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llmdiag.sim.dialects import Dialect, Page, SimState, json_page, prometheus_page, register
from llmdiag.sim.metrics import _histogram

SGLANG_VERSION = "0.5.23"
DECODE_LOG_INTERVAL = 40  # SGLang's --decode-log-interval default
SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
TOKENIZER_LABELS = ("model_name", "engine_type")
HISTOGRAMS = (
    ("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft"),
    ("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "itl"),
    (
        "sglang:request_time_per_output_token_seconds",
        "Histogram of time per output token per request in seconds.",
        "time_per_output_token",
    ),
    ("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", "e2e"),
    ("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", "queue"),
    ("sglang:prompt_tokens_histogram", "Histogram of prompt token length.", "request_prompt_tokens"),
    ("sglang:generation_tokens_histogram", "Histogram of generation token length.", "request_generation_tokens"),
)


class SglangCollector(Collector):
    """SGLang's scheduler gauges (refreshed on log ticks) and tokenizer counters and histograms."""

    def __init__(self, state: SimState) -> None:
        self.state = state
        self.tick_steps = -DECODE_LOG_INTERVAL
        self.tick_prompt_tokens = -1
        self.gauges: dict[str, float] = {}

    def _refresh(self) -> None:
        """Re-read the scheduler's numbers when a log tick passed since the last read."""
        engine, stats = self.state.engine, self.state.engine.stats
        prefill_batch = stats.prompt_tokens != self.tick_prompt_tokens
        if not prefill_batch and stats.steps - self.tick_steps < DECODE_LOG_INTERVAL:
            return
        self.tick_steps, self.tick_prompt_tokens = stats.steps, stats.prompt_tokens
        capacity = (engine.num_gpu_blocks - 1) * engine.block_size
        used = round(engine.kv_usage * capacity)
        self.gauges = {
            "sglang:num_running_reqs": len(engine.running),
            "sglang:num_queue_reqs": len(engine.waiting),
            "sglang:num_grammar_queue_reqs": 0,
            "sglang:num_used_tokens": used,
            "sglang:token_usage": engine.kv_usage,
            "sglang:kv_used_tokens": used,
            "sglang:kv_available_tokens": capacity - used,
            "sglang:kv_evictable_tokens": 0,
            "sglang:max_total_num_tokens": capacity,
            "sglang:cache_hit_rate": 0.0,
            "sglang:utilization": 0.0,  # open source never sets the SLO cap (issue #22713)
            "sglang:num_retracted_reqs": 0,
            "sglang:num_paused_reqs": 0,
        }

    def collect(self) -> Iterator[Metric]:
        stats, model = self.state.engine.stats, self.state.model
        self._refresh()
        scheduler = [model, "unified", "0", "0", "0"]
        tokenizer = [model, "unified"]
        for name, value in self.gauges.items():
            family = GaugeMetricFamily(
                name, f"The {name.split(':', 1)[1].replace('_', ' ')}.", labels=list(SCHEDULER_LABELS)
            )
            family.add_metric(scheduler, float(value))
            yield family

        def counter(name: str, doc: str, value: float, labels: tuple[str, ...], ids: list[str]) -> Metric:
            family = CounterMetricFamily(name, doc, labels=list(labels))
            family.add_metric(ids, float(value))
            return family

        yield counter(
            "sglang:num_retracted_requests",
            "Total number of retracted requests.",
            stats.preemptions,
            SCHEDULER_LABELS,
            scheduler,
        )
        yield counter(
            "sglang:prompt_tokens",
            "Number of prefill tokens processed.",
            stats.prompt_tokens,
            TOKENIZER_LABELS,
            tokenizer,
        )
        yield counter(
            "sglang:generation_tokens",
            "Number of generation tokens processed.",
            stats.generation_tokens,
            TOKENIZER_LABELS,
            tokenizer,
        )
        cached = CounterMetricFamily(
            "sglang:cached_tokens", "Number of cached prompt tokens.", labels=[*TOKENIZER_LABELS, "cache_source"]
        )
        cached.add_metric([*tokenizer, "device"], 0.0)
        yield cached
        yield counter(
            "sglang:num_requests",
            "Number of requests processed.",
            sum(stats.request_success.values()),
            TOKENIZER_LABELS,
            tokenizer,
        )
        yield counter(
            "sglang:num_aborted_requests",
            "Number of requests aborted.",
            stats.request_success.get("abort", 0),
            TOKENIZER_LABELS,
            tokenizer,
        )
        labels = dict(zip(TOKENIZER_LABELS, tokenizer, strict=True))
        for name, doc, attribute in HISTOGRAMS:
            histogram = _histogram(name, doc, labels, getattr(stats, attribute), 0.0)
            histogram.samples = [s for s in histogram.samples if not s.name.endswith("_created")]  # multiprocess mode
            yield histogram


def _pages(state: SimState) -> dict[str, Page]:
    registry = CollectorRegistry(auto_describe=False)  # multiprocess mode: no GC, platform or process collectors
    registry.register(SglangCollector(state))
    engine = state.engine
    model_info = {
        "model_path": state.model,
        "tokenizer_path": state.model,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
    }
    server_info = {
        "model_path": state.model,
        "served_model_name": state.model,
        "tp_size": engine.dep.tp,
        "dp_size": 1,
        "enable_metrics": True,
        "max_running_requests": engine.config.seqs,
        "max_total_num_tokens": (engine.num_gpu_blocks - 1) * engine.block_size,
        "context_length": state.model_len,
        "decode_log_interval": DECODE_LOG_INTERVAL,
        "version": SGLANG_VERSION,
    }
    return {
        "/metrics": prometheus_page(registry),
        "/get_model_info": json_page(lambda: model_info),
        "/get_server_info": json_page(lambda: server_info),
    }


SGLANG = register(
    Dialect(
        name="sglang",
        summary=f"SGLang {SGLANG_VERSION} (--enable-metrics)",
        setup=_pages,
        headers={"server": "uvicorn"},
        owned_by="sglang",
    )
)
