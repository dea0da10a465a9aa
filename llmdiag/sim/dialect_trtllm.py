"""The simulator as TensorRT-LLM ``trtllm-serve`` and as Triton with the TensorRT-LLM backend (catalog §2).

Both render the one simulated engine. Each completed engine step becomes one iteration record, as TensorRT-LLM's
executor writes them (§2.1):

    iter, timestamp, iterLatencyMS          the step's index, its end (server start + simulated seconds), its length
    numActiveRequests                       requests scheduled in the step (context + generation)
    numQueuedRequests                       requests waiting after it
    numNewActiveRequests, newActiveRequestsQueueLatencyMS
                                            requests scheduled for the first time, their mean wait (ms)
    numCompletedRequests                    requests that finished at the step's end
    inflightBatchingStats                   numContextRequests / numCtxTokens (prefill chunks, including recompute
                                            after a pause), numGenRequests (one-token decodes), numPausedRequests
                                            (the engine's preemptions in the step: it evicts as MAX_UTILIZATION does)
    kvCacheStats                            maxNumBlocks, freeNumBlocks, usedNumBlocks, tokensPerBlock
    maxNumActiveRequests, maxBatchSize*, maxNumTokens*   --max-num-seqs and --max-num-batched-tokens

``trtllm`` serves, on the OpenAI port:
    GET /metrics              the JSON array of records; **reading removes them**, and the queue keeps the newest
                              1000 (``iter_stats_max_iterations``' default): two scrapers steal from each other
    GET /prometheus/metrics   the ``trtllm_`` page (§2.2): iteration gauges from the last record, counters and
                              per-request histograms from the engine's stats (vLLM's buckets, as TensorRT-LLM's
                              defaults are where named alike)
``triton`` serves Triton's metrics page at /metrics (§2.3, §2.4): ``nv_trt_llm_*`` gauges from the last record
(labels model="tensorrt_llm", version="1"), the core ``nv_inference_*`` counters in µs (the core queue is empty: the
backend takes requests at once and queues them itself, ``request_type="waiting"``), the first-response histogram
in ms (as with ``--metrics-config histogram_latencies=true``) and the input/output token-length histograms.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from llmdiag.sim.dialects import Dialect, Page, PageResult, SimState, json_page, prometheus_page, register
from llmdiag.sim.engine import Engine, Histogram, Step

TRTLLM_VERSION = "1.2.0+llmdiag.sim"
MAX_RECORDS = 1000  # iter_stats_max_iterations' default
MODEL, VERSION = "tensorrt_llm", "1"


class IterationLog:
    """Iteration records of the simulated engine, one per completed step, in a bounded queue drained on read."""

    def __init__(self, engine: Engine, wall_start: float, max_records: int = MAX_RECORDS) -> None:
        self.engine = engine
        self.wall_start = wall_start
        self.queue: deque[dict[str, Any]] = deque(maxlen=max_records)
        self.last: dict[str, Any] | None = None
        self._preemptions = engine.stats.preemptions
        self._finished = sum(engine.stats.request_success.values())
        engine.step_listeners.append(self.on_step)

    def on_step(self, step: Step) -> None:
        engine, stats, config = self.engine, self.engine.stats, self.engine.config
        paused = stats.preemptions - self._preemptions
        finished = sum(stats.request_success.values())
        completed = finished - self._finished
        self._preemptions, self._finished = stats.preemptions, finished
        ctx_requests = ctx_tokens = gen_requests = 0
        new_waits: list[float] = []
        for request, n in step.scheduled:
            decoding = n == 1 and request.first_token_ts is not None and request.first_token_ts < step.end
            if decoding:
                gen_requests += 1
            else:
                ctx_requests += 1
                ctx_tokens += n
            if request.scheduled_ts == step.start:
                new_waits.append(step.start - request.arrival)
        blocks = config.num_gpu_blocks
        record = {
            "cpuMemUsage": 0,
            "gpuMemUsage": 0,
            "inflightBatchingStats": {
                "avgNumDecodedTokensPerIter": 1.0 if gen_requests else 0.0,
                "microBatchId": 0,
                "numContextRequests": ctx_requests,
                "numCtxTokens": ctx_tokens,
                "numGenRequests": gen_requests,
                "numPausedRequests": paused,
                "numScheduledRequests": len(step.scheduled),
            },
            "iter": step.index,
            "iterLatencyMS": step.duration * 1000.0,
            "kvCacheStats": {
                "allocNewBlocks": 0,
                "allocTotalBlocks": 0,
                "cacheHitRate": 0.0,
                "freeNumBlocks": engine.free_blocks,
                "maxNumBlocks": blocks,
                "missedBlocks": 0,
                "reusedBlocks": 0,
                "tokensPerBlock": engine.block_size,
                "usedNumBlocks": blocks - engine.free_blocks,
            },
            "maxBatchSizeRuntime": config.seqs,
            "maxBatchSizeStatic": config.seqs,
            "maxBatchSizeTunerRecommended": 0,
            "maxNumActiveRequests": config.seqs,
            "maxNumTokensRuntime": config.batched_tokens,
            "maxNumTokensStatic": config.batched_tokens,
            "maxNumTokensTunerRecommended": 0,
            "newActiveRequestsQueueLatencyMS": 1000.0 * sum(new_waits) / len(new_waits) if new_waits else 0.0,
            "numActiveRequests": len(step.scheduled),
            "numCompletedRequests": completed,
            "numNewActiveRequests": len(new_waits),
            "numQueuedRequests": len(engine.waiting),
            "pinnedMemUsage": 0,
            "specDecodingStats": None,
            "staticBatchingStats": None,
            "timestamp": _timestamp(self.wall_start + step.end),
        }
        self.queue.append(record)
        self.last = record

    def drain(self) -> list[dict[str, Any]]:
        records = list(self.queue)
        self.queue.clear()
        return records


def _timestamp(unix: float) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(unix).strftime("%m-%d-%Y %H:%M:%S.%f")


def _last(log: IterationLog, *path: str) -> float:
    value: Any = log.last or {}
    for key in path:
        value = value.get(key, 0) if isinstance(value, dict) else 0
    return float(value or 0)


def _histogram(name: str, doc: str, labels: dict[str, str], hist: Histogram, scale: float = 1.0) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=list(labels))
    buckets = [(floatToGoString(bound * scale), float(count)) for bound, count in hist.cumulative()]
    family.add_metric(list(labels.values()), buckets, hist.total * scale)
    return family


# --- trtllm-serve /prometheus/metrics ---------------------------------------------------------------------


class TrtllmCollector(Collector):
    """The trtllm_ page of TensorRT-LLM's MetricsCollector, from the engine's stats and the last record."""

    def __init__(self, state: SimState, log: IterationLog) -> None:
        self.state, self.log = state, log

    def collect(self) -> Iterator[Metric]:
        stats, log = self.state.engine.stats, self.log
        labels = {"model_name": self.state.model, "engine_type": "trtllm"}
        names, values = list(labels), list(labels.values())

        def gauge(name: str, doc: str, value: float) -> Metric:
            family = GaugeMetricFamily(name, doc, labels=names)
            family.add_metric(values, value)
            return family

        def counter(name: str, doc: str, value: float) -> Metric:
            family = CounterMetricFamily(name, doc, labels=names)
            family.add_metric(values, value)
            return family

        success = CounterMetricFamily(
            "trtllm_request_success", "Count of successfully processed requests.", labels=[*names, "finished_reason"]
        )
        for reason, count in stats.request_success.items():
            success.add_metric([*values, reason], float(count))
        yield success
        yield counter("trtllm_prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens)
        yield counter("trtllm_generation_tokens", "Number of generation tokens processed.", stats.generation_tokens)
        for name, doc, hist in (
            ("trtllm_e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", stats.e2e),
            ("trtllm_time_to_first_token_seconds", "Histogram of time to first token in seconds.", stats.ttft),
            (
                "trtllm_time_per_output_token_seconds",
                "Histogram of time per output token in seconds.",
                stats.time_per_output_token,
            ),
            ("trtllm_request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", stats.queue),
            ("trtllm_request_prefill_time_seconds", "Histogram of time spent in PREFILL phase.", stats.prefill),
            ("trtllm_request_decode_time_seconds", "Histogram of time spent in DECODE phase.", stats.decode),
            ("trtllm_request_inference_time_seconds", "Histogram of time spent in RUNNING phase.", stats.inference),
        ):
            yield _histogram(name, doc, labels, hist)
        if log.last is None:
            return  # no iteration yet: the iteration gauges appear with the first record
        yield gauge("trtllm_num_requests_running", "Number of requests running.", _last(log, "numActiveRequests"))
        yield gauge("trtllm_num_requests_waiting", "Number of requests waiting.", _last(log, "numQueuedRequests"))
        yield gauge(
            "trtllm_max_num_active_requests", "Max number of active requests.", _last(log, "maxNumActiveRequests")
        )
        yield gauge(
            "trtllm_iteration_latency_seconds", "Iteration latency in seconds.", _last(log, "iterLatencyMS") / 1000.0
        )
        used, total = _last(log, "kvCacheStats", "usedNumBlocks"), _last(log, "kvCacheStats", "maxNumBlocks")
        yield gauge("trtllm_kv_cache_utilization", "KV cache utilization.", used / total if total else 0.0)
        yield gauge("trtllm_kv_cache_max_blocks", "KV cache max blocks.", total)
        yield gauge("trtllm_kv_cache_free_blocks", "KV cache free blocks.", _last(log, "kvCacheStats", "freeNumBlocks"))
        yield gauge("trtllm_kv_cache_used_blocks", "KV cache used blocks.", used)
        yield gauge(
            "trtllm_kv_cache_tokens_per_block",
            "KV cache tokens per block.",
            _last(log, "kvCacheStats", "tokensPerBlock"),
        )
        for name, key in (
            ("trtllm_num_context_requests", "numContextRequests"),
            ("trtllm_num_generation_requests", "numGenRequests"),
            ("trtllm_num_paused_requests", "numPausedRequests"),
            ("trtllm_num_scheduled_requests", "numScheduledRequests"),
            ("trtllm_total_context_tokens", "numCtxTokens"),
        ):
            yield gauge(
                name, f"inflightBatchingStats.{key} of the last iteration.", _last(log, "inflightBatchingStats", key)
            )


def _trtllm_pages(state: SimState) -> dict[str, Page]:
    log = IterationLog(state.engine, state.wall_start)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TrtllmCollector(state, log))

    def metrics() -> PageResult:
        state.http.add("/metrics", "GET", 200)
        return json_page(log.drain)()

    return {
        "/metrics": metrics,
        "/prometheus/metrics": prometheus_page(registry),
        "/version": json_page(lambda: {"version": TRTLLM_VERSION}),
    }


# --- Triton with the TensorRT-LLM backend -----------------------------------------------------------------


class TritonCollector(Collector):
    def __init__(self, state: SimState, log: IterationLog) -> None:
        self.state, self.log = state, log

    def collect(self) -> Iterator[Metric]:
        stats, log = self.state.engine.stats, self.log
        base = {"model": MODEL, "version": VERSION}

        def family(name: str, doc: str, category: str, rows: dict[str, float]) -> Metric:
            metric = GaugeMetricFamily(name, doc, labels=[category, "model", "version"])
            for key, value in rows.items():
                metric.add_metric([key, MODEL, VERSION], value)
            return metric

        def core(name: str, doc: str, value: float, kind: str = "counter") -> Metric:
            metric = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, doc, labels=list(base))
            metric.add_metric(list(base.values()), value)
            return metric

        finished = float(sum(stats.request_success.values()))
        yield core("nv_inference_request_success", "Number of successful inference requests, all batch sizes", finished)
        yield core("nv_inference_request_failure", "Number of failed inference requests, all batch sizes", 0.0)
        yield core("nv_inference_count", "Number of inferences performed (does not include cached requests)", finished)
        yield core(
            "nv_inference_exec_count",
            "Number of model executions performed (does not include cached requests)",
            finished,
        )
        yield core(
            "nv_inference_request_duration_us",
            "Cumulative inference request duration in microseconds (includes cached requests)",
            stats.e2e.total * 1e6,
        )
        yield core(
            "nv_inference_queue_duration_us",
            "Cumulative inference queuing duration in microseconds (includes cached requests)",
            0.0,
        )
        yield core(
            "nv_inference_pending_request_count",
            "Instantaneous number of pending requests awaiting execution per-model.",
            0.0,
            kind="gauge",
        )
        yield _histogram(
            "nv_inference_first_response_histogram_ms",
            "Duration from request to first response in milliseconds",
            base,
            stats.ttft,
            scale=1000.0,
        )
        for name, kind, hist in (
            ("nv_llm_input_token_len", "total_input_tokens", stats.request_prompt_tokens),
            ("nv_llm_output_token_len", "total_output_tokens", stats.request_generation_tokens),
        ):
            yield _histogram(name, "TRT LLM response metrics", {**base, "response_metric_type": kind}, hist)
        if log.last is None:
            return
        yield family(
            "nv_trt_llm_request_metrics",
            "TRT LLM request metrics",
            "request_type",
            {
                "active": _last(log, "numActiveRequests"),
                "max": _last(log, "maxNumActiveRequests"),
                "scheduled": _last(log, "inflightBatchingStats", "numScheduledRequests"),
                "context": _last(log, "inflightBatchingStats", "numContextRequests"),
                "waiting": _last(log, "numQueuedRequests"),
            },
        )
        yield family(
            "nv_trt_llm_runtime_memory_metrics",
            "TRT LLM runtime memory metrics",
            "memory_type",
            {"gpu": 0.0, "cpu": 0.0, "pinned": 0.0},
        )
        used, total = _last(log, "kvCacheStats", "usedNumBlocks"), _last(log, "kvCacheStats", "maxNumBlocks")
        yield family(
            "nv_trt_llm_kv_cache_block_metrics",
            "TRT LLM KV cache block metrics",
            "kv_cache_block_type",
            {
                "max": total,
                "free": _last(log, "kvCacheStats", "freeNumBlocks"),
                "used": used,
                "tokens_per": _last(log, "kvCacheStats", "tokensPerBlock"),
                "reused": 0.0,
                "fraction": used / total if total else 0.0,
            },
        )
        yield family(
            "nv_trt_llm_inflight_batcher_metrics",
            "TRT LLM inflight batcher specific metrics",
            "inflight_batcher_specific_metric",
            {
                "total_context_tokens": _last(log, "inflightBatchingStats", "numCtxTokens"),
                "generation_requests": _last(log, "inflightBatchingStats", "numGenRequests"),
                "micro_batch_id": 0.0,
                "paused_requests": _last(log, "inflightBatchingStats", "numPausedRequests"),
            },
        )
        yield family(
            "nv_trt_llm_general_metrics",
            "General TRT LLM metrics",
            "general_type",
            {
                "iteration_counter": _last(log, "iter"),
                "timestamp": float(int(self.state.wall_start * 1e6)),
            },
        )


def _triton_pages(state: SimState) -> dict[str, Page]:
    log = IterationLog(state.engine, state.wall_start)
    log.queue = deque(maxlen=1)  # Triton keeps only the last iteration's values
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TritonCollector(state, log))
    return {"/metrics": prometheus_page(registry)}


TRTLLM = register(
    Dialect(
        name="trtllm",
        summary=f"TensorRT-LLM trtllm-serve {TRTLLM_VERSION.split('+')[0]}",
        setup=_trtllm_pages,
        headers={"server": "uvicorn"},
        owned_by="tensorrt_llm",
    )
)
TRITON = register(
    Dialect(
        name="triton",
        summary="Triton Inference Server with the TensorRT-LLM backend",
        setup=_triton_pages,
        owned_by="triton",
    )
)
