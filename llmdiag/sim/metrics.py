"""The simulator's two Prometheus pages, built with prometheus_client collectors from the engine's state.

``vllm_registry`` is vLLM 0.33's ``/metrics`` (metrics catalog §1): the same names, HELP text, types, labels
(``model_name`` and ``engine``; ``admission_rejections_total`` has ``model_name`` and ``reason`` only), histogram
buckets and ``<name>_created`` series as the recorded vLLM 0.32 page (tests/fixtures/vllm-0.32.0), so llmdiag reads
it through probes/vllm.toml like any vLLM. The estimated FLOP and byte counters advance, as with vLLM's
``--enable-mfu-metrics``. ``process_start_time_seconds`` is the simulated server's start, not the host process's.

``dcgm_registry`` is dcgm-exporter's page (catalog §6.1): one series per tensor-parallel rank, all ranks doing the
same work. Every value is derived from the steps of the last second (``Engine.activity``), per GPU:

    DCGM_FI_DEV_GPU_UTIL            % of the window any kernel ran: steps minus host (scheduler) time
    DCGM_FI_PROF_GR_ENGINE_ACTIVE   the same, as a ratio
    DCGM_FI_PROF_SM_ACTIVE          Σ max(compute, memory) time / window: SMs hold warps while the model's kernels
                                    run, whether they wait on math or on HBM; NCCL's few SMs are not counted, so an
                                    all-reduce-bound step shows a busy GPU with idle SMs
    DCGM_FI_PROF_PIPE_TENSOR_ACTIVE FLOPs / (peak FLOP/s · window): the tensor pipes' share at peak rate
    DCGM_FI_PROF_DRAM_ACTIVE        HBM bytes / (peak bandwidth · window)
    DCGM_FI_DEV_MEM_COPY_UTIL       the same, in %
    DCGM_FI_PROF_NVLINK_TX/RX_BYTES all-reduce bytes per second per direction (2 · L · 2(tp−1)/tp · tokens · H · b
                                    per step), on NVLink deployments
    DCGM_FI_PROF_PCIE_TX/RX_BYTES   host traffic (token ids in, sampled ids out: a few bytes per token), plus the
                                    all-reduce bytes when the ranks talk over PCIe
    DCGM_FI_DEV_FB_USED / _FREE     MiB: vLLM preallocates gpu_memory_utilization of the memory (weights, activation
                                    reserve and the whole KV pool) plus ~0.5 GiB of CUDA context; flat under load
    DCGM_FI_DEV_POWER_USAGE         W: idle + (TDP − idle) · min(1, tensor + ½ · DRAM + ⅕ · all-reduce share): a
                                    rough shape (math-bound steps draw the most), not a calibrated model
    DCGM_FI_DEV_SM_CLOCK            MHz: the part's maximum SM clock while anything ran in the last second, 210 MHz
                                    when nothing did (an idle A800 on the recorded page in tests/fixtures/dcgm); the
                                    simulated GPUs never throttle: the power shape above stays within the limit
    DCGM_FI_DEV_GPU_TEMP            °C: 30 °C inlet + 40 °C at the power limit, in proportion to power: a rough shape
    DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter: 0, healthy links (prometheus_client writes the sample as …_total; a real
                                    exporter writes the bare name under '# TYPE … counter', which parses the same)
    DCGM_FI_DEV_XID_ERRORS          the last XID code: 0, none

Only dcgm-exporter's default fields are added beyond the profiling ones above: the maximum SM clock, the enforced
power limit, the clock event reasons and the PCIe link generation and width are not on its default list, so a scan
of the simulator shows how llmdiag reports them missing and how to enable them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from llmdiag.physics.hardware import MIB
from llmdiag.physics.step import kv_bytes_per_token_per_gpu
from llmdiag.sim.engine import FINISH_REASONS, REJECT_REASONS, Engine, Histogram

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ENGINE_INDEX = "0"
CUDA_CONTEXT_BYTES = 512 * MIB
# nvidia-smi's names, and (idle W, board power limit W) from the datasheets
GPU_MODEL_NAMES = {
    "H100": "NVIDIA H100 80GB HBM3",
    "H200": "NVIDIA H200",
    "A100": "NVIDIA A100-SXM4-80GB",
    "L4": "NVIDIA L4",
}
GPU_POWER_WATTS = {"H100": (70.0, 700.0), "H200": (75.0, 700.0), "A100": (60.0, 400.0), "L4": (16.0, 72.0)}
DEFAULT_POWER_WATTS = (60.0, 400.0)
# the maximum SM clock nvidia-smi reports (clocks.max.sm), MHz; an idle GPU drops to a few hundred
GPU_MAX_SM_CLOCK_MHZ = {"H100": 1980.0, "H200": 1980.0, "A100": 1410.0, "L4": 2040.0}
DEFAULT_MAX_SM_CLOCK_MHZ = 1410.0
IDLE_SM_CLOCK_MHZ = 210.0
INLET_CELSIUS, RISE_AT_POWER_LIMIT_CELSIUS = 30.0, 40.0
HOSTNAME = "llmdiag-sim"

Clock = Callable[[], float]


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


# --- vLLM ------------------------------------------------------------------------------------------------

# (wire name, HELP text, EngineStats attribute): the order of a real page
HISTOGRAMS = (
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", "request_prompt_tokens"),
    ("vllm:request_generation_tokens", "Number of generation tokens processed.", "request_generation_tokens"),
    ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", "iteration_tokens"),
    (
        "vllm:request_max_num_generation_tokens",
        "Histogram of maximum number of requested generation tokens.",
        "request_max_num_generation_tokens",
    ),
    ("vllm:request_params_n", "Histogram of the n request parameter.", "params_n"),
    ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", "request_params_max_tokens"),
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft"),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "itl"),
    (
        "vllm:request_time_per_output_token_seconds",
        "Histogram of time_per_output_token_seconds per request.",
        "time_per_output_token",
    ),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "e2e"),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", "queue"),
    ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", "inference"),
    ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", "prefill"),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", "decode"),
    ("vllm:request_num_preemptions", "Histogram of the number of times a request was preempted.", "num_preemptions"),
    (
        "vllm:request_prefill_kv_computed_tokens",
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
        "request_prefill_kv_computed_tokens",
    ),
)
MFU_HELP = "Estimated number of {} per GPU (for Model Flops Utilization calculations)."
WAITING_BY_REASON_HELP = (
    "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; 'deferred' = "
    "deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all reasons equals "
    "vllm:num_requests_waiting."
)
SLEEP_HELP = (
    "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 "
    "means sleep level 1; discard_all = 1 means sleep level 2."
)
CACHED_BY_SOURCE_HELP = (
    "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to DRAM), "
    "disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at admission; sums to "
    "vllm:prefix_cache_hits + vllm:external_prefix_cache_hits."
)


class HttpCounts:
    """``http_requests_total{handler,method,status}`` as prometheus-fastapi-instrumentator counts them."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, str], int] = {}
        self.created: dict[tuple[str, str, str], float] = {}

    def add(self, handler: str, method: str, status: int) -> None:
        key = (handler, method, f"{status // 100}xx")
        if key not in self.counts:
            self.counts[key] = 0
            self.created[key] = time.time()
        self.counts[key] += 1


def _histogram(name: str, doc: str, labels: Mapping[str, str], hist: Histogram, created: float) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=list(labels))
    buckets = [(floatToGoString(bound), float(count)) for bound, count in hist.cumulative()]
    family.add_metric(list(labels.values()), buckets, hist.total)
    family.samples.append(Sample(f"{name}_created", dict(labels), created))
    return family


def _counter(
    name: str, doc: str, label_names: Iterable[str], rows: Iterable[tuple[list[str], float]], created: float
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=list(label_names))
    for values, value in rows:
        family.add_metric(values, float(value), created=created)
    return family


class VllmCollector(Collector):
    """vLLM 0.33's engine metrics, read from the engine at scrape time."""

    def __init__(self, engine: Engine, wall_start: float, http: HttpCounts | None = None) -> None:
        self.engine = engine
        self.wall_start = wall_start  # unix time the simulated server started: every series' _created
        self.http = http

    def collect(self) -> Iterator[Metric]:
        engine, stats, created = self.engine, self.engine.stats, self.wall_start
        model = engine.config.served_model_name
        names = ["engine", "model_name"]
        ids = [ENGINE_INDEX, model]

        def counter(name: str, doc: str, value: float) -> Metric:
            return _counter(name, doc, names, [(ids, value)], created)

        def gauge(name: str, doc: str, value: float) -> Metric:
            family = GaugeMetricFamily(name, doc, labels=names)
            family.add_metric(ids, float(value))
            return family

        def by(name: str, doc: str, label: str, rows: Mapping[str, float], kind: str = "counter") -> Metric:
            if kind == "gauge":
                family = GaugeMetricFamily(name, doc, labels=[*names, label])
                for key, value in rows.items():
                    family.add_metric([*ids, key], float(value))
                return family
            return _counter(name, doc, [*names, label], [([*ids, k], v) for k, v in rows.items()], created)

        yield GaugeMetricFamily(
            "process_start_time_seconds", "Start time of the process since unix epoch in seconds.", value=created
        )
        yield counter("vllm:estimated_flops_per_gpu", MFU_HELP.format("floating point operations"), stats.flops_per_gpu)
        yield counter(
            "vllm:estimated_read_bytes_per_gpu", MFU_HELP.format("bytes read from memory"), stats.read_bytes_per_gpu
        )
        yield counter(
            "vllm:estimated_write_bytes_per_gpu", MFU_HELP.format("bytes written to memory"), stats.write_bytes_per_gpu
        )
        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.", len(engine.running))
        waiting = engine.waiting_after_last_schedule  # as vLLM's scheduler stats: the queue its last step left
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting)
        yield by(
            "vllm:num_requests_waiting_by_reason",
            WAITING_BY_REASON_HELP,
            "reason",
            {"capacity": waiting, "deferred": 0},
            kind="gauge",
        )
        yield by(
            "vllm:engine_sleep_state",
            SLEEP_HELP,
            "sleep_state",
            {"awake": 1, "weights_offloaded": 0, "discard_all": 0},
            kind="gauge",
        )
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", engine.kv_usage)
        yield counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            stats.prefix_cache_queries,
        )
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", 0)
        yield counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector "
            "cross-instance cache sharing, in terms of number of queried tokens.",
            0,
        )
        yield counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector "
            "cross-instance cache sharing, in terms of number of cached tokens.",
            0,
        )
        yield counter("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.", 0)
        yield counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.", 0)
        yield counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", stats.preemptions)
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens)
        yield by(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            "source",
            {"local_compute": stats.prompt_tokens, "local_cache_hit": 0, "external_kv_transfer": 0},
        )
        yield counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).", 0)
        yield by(
            "vllm:prompt_tokens_cached_by_source",
            CACHED_BY_SOURCE_HELP,
            "source",
            dict.fromkeys(("device", "host", "p2p", "disk", "external_unspecified"), 0),
        )
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", stats.generation_tokens)
        yield by(
            "vllm:request_success",
            "Count of successfully processed requests.",
            "finished_reason",
            {reason: stats.request_success[reason] for reason in FINISH_REASONS},
        )
        yield _counter(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            ["model_name", "reason"],
            [([model, reason], stats.admission_rejections[reason]) for reason in REJECT_REASONS],
            created,
        )
        labels = dict(zip(names, ids, strict=True))
        for name, doc, attribute in HISTOGRAMS:
            yield _histogram(name, doc, labels, getattr(stats, attribute), created)
        config = self.cache_config()
        info = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=list(config)
        )
        info.add_metric(list(config.values()), 1.0)
        yield info
        if self.http is not None and self.http.counts:
            family = CounterMetricFamily(
                "http_requests",
                "Total number of requests by method, status and handler.",
                labels=["handler", "method", "status"],
            )
            for key, value in sorted(self.http.counts.items()):
                family.add_metric(list(key), float(value), created=self.http.created[key])
            yield family

    def cache_config(self) -> dict[str, str]:
        """The CacheConfig labels of a vLLM 0.32 page, with this deployment's values."""
        config, dep = self.engine.config, self.engine.config.deployment
        tokens = config.num_gpu_blocks * config.block_size
        block = str(config.block_size)
        return {
            "_block_size_resolved": "True",
            "block_size": block,
            "cache_dtype": "fp8" if dep.kv_dtype_bytes == 1 else "auto",
            "cache_hit_alignment_tokens": "None",
            "effective_attention_block_size": block,
            "enable_mamba_shared_prefix_checkpoint": "False",
            "enable_prefix_caching": "True",
            "engine": ENGINE_INDEX,
            "gpu_memory_utilization": str(dep.gpu_memory_utilization),
            "hash_block_size": "None",
            "is_attention_free": "False",
            "kv_cache_dtype_skip_layers": "[]",
            "kv_cache_layout": "None",
            "kv_cache_max_concurrency": str(tokens / config.model_len),
            "kv_cache_memory_bytes": str(tokens * kv_bytes_per_token_per_gpu(dep)),
            "kv_cache_size_tokens": str(tokens),
            "kv_offloading_backend": "native",
            "kv_offloading_size": "None",
            "kv_sharing_fast_prefill": "False",
            "mamba_block_size": "None",
            "mamba_cache_dtype": "auto",
            "mamba_cache_mode": "none",
            "mamba_page_size_padded": "None",
            "mamba_ssm_cache_dtype": "float32",
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(config.num_gpu_blocks),
            "num_gpu_blocks_override": str(config.num_gpu_blocks_override),
            "prefix_cache_retention_interval": "0",
            "prefix_caching_hash_algo": "sha256",
            "prefix_match_unit": "None",
            "replayssm_buffer_len": "16",
            "skip_page_size_padded": "None",
            "sliding_window": "None",
            "swa_bounded_replay": "True",
            "use_kda_recoverssm": "False",
            "use_replayssm": "False",
            "user_specified_block_size": "False",
        }


def vllm_registry(engine: Engine, wall_start: float, http: HttpCounts | None = None) -> CollectorRegistry:
    """A registry for one simulated vLLM: Python's GC and platform collectors (as on a real page), then vLLM's."""
    registry = CollectorRegistry(auto_describe=False)
    GCCollector(registry=registry)
    PlatformCollector(registry=registry)
    registry.register(VllmCollector(engine, wall_start, http))
    return registry


# --- DCGM ------------------------------------------------------------------------------------------------


def gpu_labels(engine: Engine, hostname: str = HOSTNAME) -> list[dict[str, str]]:
    """dcgm-exporter's default label set, one per tensor-parallel rank; UUIDs are stable per host and index."""
    gpu = engine.dep.gpu
    out = []
    for index in range(engine.dep.tp):
        out.append(
            {
                "gpu": str(index),
                "UUID": f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'llmdiag-sim/{hostname}/{gpu.name}/{index}')}",
                "pci_bus_id": f"00000000:{0x18 + 0x10 * index:02X}:00.0",
                "device": f"nvidia{index}",
                "modelName": GPU_MODEL_NAMES.get(gpu.name, f"NVIDIA {gpu.name}"),
                "Hostname": hostname,
            }
        )
    return out


class DcgmCollector(Collector):
    """dcgm-exporter's GPU fields for the simulated ranks, from the last second of steps."""

    WINDOW_SECONDS = 1.0  # DCGM samples its profiling fields at 1 Hz

    def __init__(self, engine: Engine, now: Clock, hostname: str = HOSTNAME) -> None:
        self.engine = engine
        self.now = now
        self.labels = gpu_labels(engine, hostname)

    def collect(self) -> Iterator[Metric]:
        engine, dep = self.engine, self.engine.dep
        act = engine.activity(self.now(), self.WINDOW_SECONDS)
        window = act.window_seconds
        nvlink = dep.link.name == "nvlink"
        link_rate = act.link_bytes_per_gpu / window
        pcie_rate = act.host_bytes_per_gpu / window + (0.0 if nvlink else link_rate)
        tensor, dram = act.ratio(act.math_seconds), act.ratio(act.hbm_seconds)
        allreduce_share = act.ratio(act.allreduce_seconds)
        idle_w, limit_w = GPU_POWER_WATTS.get(dep.gpu.name, DEFAULT_POWER_WATTS)
        power = idle_w + (limit_w - idle_w) * min(1.0, tensor + 0.5 * dram + 0.2 * allreduce_share)
        total_mib = dep.gpu.memory_bytes / MIB
        used_mib = min(total_mib, round((dep.gpu.memory_bytes * dep.gpu_memory_utilization + CUDA_CONTEXT_BYTES) / MIB))
        busy = act.ratio(act.busy_seconds)
        max_clock = GPU_MAX_SM_CLOCK_MHZ.get(dep.gpu.name, DEFAULT_MAX_SM_CLOCK_MHZ)
        sm_clock = max_clock if busy > 0 else IDLE_SM_CLOCK_MHZ
        temperature = INLET_CELSIUS + RISE_AT_POWER_LIMIT_CELSIUS * power / limit_w
        fields: list[tuple[str, str, float]] = [
            ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", sm_clock),
            ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", round(temperature)),
            ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", 0),
            ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", round(100 * busy)),
            ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", round(100 * dram)),
            ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", total_mib - used_mib),
            ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", used_mib),
            ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", round(power, 3)),
            ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", busy),
            (
                "DCGM_FI_PROF_SM_ACTIVE",
                "The ratio of cycles an SM has at least 1 warp assigned.",
                act.ratio(act.kernel_seconds),
            ),
            ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.", tensor),
            (
                "DCGM_FI_PROF_DRAM_ACTIVE",
                "Ratio of cycles the device memory interface is active sending or receiving data.",
                dram,
            ),
            (
                "DCGM_FI_PROF_PCIE_TX_BYTES",
                "The rate of data transmitted over the PCIe bus - including both protocol "
                "headers and data payloads - in bytes per second.",
                pcie_rate,
            ),
            (
                "DCGM_FI_PROF_PCIE_RX_BYTES",
                "The rate of data received over the PCIe bus - including both protocol "
                "headers and data payloads - in bytes per second.",
                pcie_rate,
            ),
        ]
        if nvlink:
            fields += [
                (
                    "DCGM_FI_PROF_NVLINK_TX_BYTES",
                    "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second.",
                    link_rate,
                ),
                (
                    "DCGM_FI_PROF_NVLINK_RX_BYTES",
                    "The rate of data received over NVLink, not including protocol headers, in bytes per second.",
                    link_rate,
                ),
            ]
        names = list(self.labels[0])
        for name, doc, value in fields:
            family = GaugeMetricFamily(name, doc, labels=names)
            for labels in self.labels:
                family.add_metric(list(labels.values()), float(value))
            yield family
        replays = CounterMetricFamily("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", labels=names)
        for labels in self.labels:
            replays.add_metric(list(labels.values()), 0.0)
        yield replays


def dcgm_registry(engine: Engine, now: Clock, hostname: str = HOSTNAME) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DcgmCollector(engine, now, hostname))
    return registry
