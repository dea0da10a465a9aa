"""NVML: this machine's GPUs, sampled over the window through ``pynvml`` (the nvidia-ml-py package).

Each read calls NVML for every GPU and returns the values as a Scrape of ``nvml_*`` samples, so the window
maths and the signal vocabulary are the same as for a dcgm-exporter page (probes/nvml.toml maps them).
A call the device does not support leaves its samples out and says why in ``Scrape.unavailable``: that signal
only is unavailable, in NVML's reason put in plain words. It is never a crash and never a zero.

The library is a parameter: the real ``pynvml`` module, or ``nvml_record.ReplayNvml`` playing back a recording
made on a real device (tests, bug reports). Both raise ``pynvml.NVMLError`` with NVML's own return codes.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llmdiag.collect.exposition import Scrape, label_key
from llmdiag.collect.source import Source, gpus_config, unavailable_source
from llmdiag.errors import ProbeError, option
from llmdiag.model import SourceInfo
from llmdiag.schema.links import describe_link, nvlink_name
from llmdiag.schema.loader import load_probe

SAMPLE_INTERVAL_SECONDS = 0.5

# NVML return codes (nvml.h), in the words a user can act on
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_NO_DATA = 21
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_WORDS = {
    1: "NVML is not initialised",
    NVML_ERROR_NOT_SUPPORTED: "not supported on this GPU",
    NVML_ERROR_NO_PERMISSION: "needs more privileges than llmdiag has (run as root, or ask the admin to allow it)",
    6: "not found on this GPU",
    NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded (is nvidia.ko loaded? try nvidia-smi)",
    NVML_ERROR_TIMEOUT: "NVML timed out",
    NVML_ERROR_LIBRARY_NOT_FOUND: "no NVIDIA driver found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "this driver is older than nvidia-ml-py and lacks the call (update the driver)",
    14: "the GPU's infoROM is corrupted",
    NVML_ERROR_GPU_IS_LOST: "the GPU has fallen off the bus (see dmesg for an XID 79)",
    16: "the GPU needs a reset",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
        "the NVML library and the loaded kernel driver are different versions (driver upgraded without a reboot?)"
    ),
    20: "NVML ran out of memory",
    NVML_ERROR_NO_DATA: "no data yet",
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "this driver does not know the structure version asked for (update it)",
    26: "deprecated in this driver",
    27: "not ready yet",
}
# errors that will not change during a scan: the call is not tried again on that GPU
PERMANENT_ERRORS = frozenset(
    {
        NVML_ERROR_NOT_SUPPORTED,
        NVML_ERROR_NO_PERMISSION,
        NVML_ERROR_FUNCTION_NOT_FOUND,
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        26,
    }
)

# pynvml constants, restated so a replay needs nothing from the real module but its error class
CLOCK_SM, CLOCK_MEM = 1, 2
TEMPERATURE_GPU = 0
PCIE_UTIL_TX_BYTES, PCIE_UTIL_RX_BYTES = 0, 1
MEMORY_ERROR_TYPE_UNCORRECTED, VOLATILE_ECC = 1, 0
PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT, PAGE_RETIREMENT_CAUSE_DOUBLE_BIT = 0, 1
EVENT_TYPE_XID_CRITICAL_ERROR = 0x8
FIELD_NVLINK_CRC_FLIT_ERRORS_TOTAL = 38
FIELD_NVLINK_CRC_DATA_ERRORS_TOTAL = 45
FIELD_NVLINK_REPLAY_ERRORS_TOTAL = 52
FIELD_NVLINK_RECOVERY_ERRORS_TOTAL = 59
FIELD_NVLINK_THROUGHPUT_DATA_TX_KIB = 138
FIELD_NVLINK_THROUGHPUT_DATA_RX_KIB = 139
ALL_LINKS_SCOPE = 0xFFFFFFFF
NVLINK_MAX_LINKS = 18  # Hopper and Blackwell boards; older GPUs report fewer links as not supported
# bytes per second per link per direction, by NVLink version (2: V100, 3: A100, 4: H100/H200, 5: B200)
NVLINK_LINK_BYTES_PER_SECOND = {2: 25e9, 3: 25e9, 4: 25e9, 5: 50e9}
KIB = 1024

NVLINK_FIELDS = {
    FIELD_NVLINK_THROUGHPUT_DATA_TX_KIB: "nvml_nvlink_tx_kib_total",
    FIELD_NVLINK_THROUGHPUT_DATA_RX_KIB: "nvml_nvlink_rx_kib_total",
    FIELD_NVLINK_CRC_FLIT_ERRORS_TOTAL: "nvml_nvlink_crc_errors_total",
    FIELD_NVLINK_CRC_DATA_ERRORS_TOTAL: "nvml_nvlink_crc_errors_total",
    FIELD_NVLINK_REPLAY_ERRORS_TOTAL: "nvml_nvlink_replay_errors_total",
    FIELD_NVLINK_RECOVERY_ERRORS_TOTAL: "nvml_nvlink_recovery_errors_total",
}


def explain(error: BaseException) -> str:
    """An NVMLError in plain words: what it means for the user, with NVML's own name for it."""
    code = getattr(error, "value", None)
    words = NVML_ERROR_WORDS.get(code) if isinstance(code, int) else None
    return f"{words} ({error})" if words else str(error) or type(error).__name__


def error_code(error: BaseException) -> int | None:
    code = getattr(error, "value", None)
    return code if isinstance(code, int) else None


def active_nvlinks(nvml: Any, handle: Any, max_links: int = NVLINK_MAX_LINKS) -> dict[int, Any]:
    """The active NVLink links of one GPU: link index → NVLink version, as NVML reports it."""
    active: dict[int, Any] = {}
    for link in range(max_links):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != 1:
                continue
            active[link] = nvml.nvmlDeviceGetNvLinkVersion(handle, link)
        except nvml.NVMLError as exc:
            if error_code(exc) in PERMANENT_ERRORS:
                break  # no NVLink on this GPU, or no more links
    return active


def link_from_nvml(nvml: Any, handle: Any, max_links: int = NVLINK_MAX_LINKS) -> tuple[str | None, str]:
    """Name the inter-GPU link of one GPU from NVML: (a probes/links.toml name, how it was found) or (None, why not).

    ``nvml`` is the pynvml module (or a replay with the same calls and its ``NVMLError``); ``handle`` a device
    handle. NVLink wins when any link is active; otherwise PCIe, by the most the GPU and its slot support. Only
    NVML's own errors are expected here; each is said in words (``explain``).
    """
    links = active_nvlinks(nvml, handle, max_links)
    if links:
        versions = [int(v) for v in links.values()]
        version = next((v for v in versions if v), versions[0])
        major = None
        with contextlib.suppress(nvml.NVMLError):  # an optional cross-check for an out-of-range version
            major = int(nvml.nvmlDeviceGetCudaComputeCapability(handle)[0])
        name = nvlink_name(version, len(links), major)
        if name:
            return name, f"NVML: {len(links)} active NVLink links, version {version}"
        return None, f"NVML: {len(links)} active NVLink links of unknown version {version}"
    # The maximum the device and this system support, not the current value: an idle GPU drops its PCIe link to
    # gen 1 to save power, and a link trained down by a fault should be judged against what it ought to reach.
    try:
        gen = int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle))
        width = int(nvml.nvmlDeviceGetMaxPcieLinkWidth(handle))
    except nvml.NVMLError as exc:
        return None, f"NVML: no active NVLink and no PCIe link information ({explain(exc)})"
    current = ""
    with contextlib.suppress(nvml.NVMLError):  # the current state is context only
        current = (
            f"; now gen {int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle))}"
            f" x{int(nvml.nvmlDeviceGetCurrPcieLinkWidth(handle))}"
        )
    name = f"pcie{gen}x{width}"
    if describe_link(name) is None:
        return None, f"NVML: PCIe gen {gen} x{width} is not in probes/links.toml"
    return name, f"NVML: no active NVLink; PCIe gen {gen} x{width} (the most the GPU and slot support{current})"


@dataclass
class Gpu:
    index: int
    handle: Any
    name: str
    uuid: str
    nvlink_links: list[int] = field(default_factory=list)
    nvlink_capacity_bytes_per_second: float | None = None
    mig_enabled: bool = False


class NvmlSampler:
    """Reads every GPU once per ``read()``. Calls that fail for good are not tried again on that GPU."""

    def __init__(self, nvml: Any, clock: Callable[[], float] = time.time):
        self.nvml = nvml
        self.clock = clock
        self.permanent: dict[tuple[int, str], str] = {}
        self.counters: dict[tuple[int, str], tuple[float, float]] = {}
        self.xid_totals: dict[int, int] = {}
        self.gpus = [self._open_gpu(i) for i in range(nvml.nvmlDeviceGetCount())]
        self.events = self._open_xid_events()

    # -- opening ---------------------------------------------------------------------------------

    def _open_gpu(self, index: int) -> Gpu:
        nvml = self.nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        gpu = Gpu(
            index=index,
            handle=handle,
            name=_text(nvml.nvmlDeviceGetName(handle)),
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        )
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
            gpu.mig_enabled = current == 1
        except nvml.NVMLError:
            pass  # MIG is a datacenter feature; elsewhere the call is simply not supported
        capacity = 0.0
        for link, version in active_nvlinks(nvml, handle).items():
            gpu.nvlink_links.append(link)
            capacity += NVLINK_LINK_BYTES_PER_SECOND.get(version, NVLINK_LINK_BYTES_PER_SECOND[4])
        gpu.nvlink_capacity_bytes_per_second = capacity or None
        return gpu

    def _open_xid_events(self) -> Any:
        try:
            events = self.nvml.nvmlEventSetCreate()
        except self.nvml.NVMLError:
            return None
        for gpu in self.gpus:
            try:
                self.nvml.nvmlDeviceRegisterEvents(gpu.handle, EVENT_TYPE_XID_CRITICAL_ERROR, events)
                self.xid_totals[gpu.index] = 0
            except self.nvml.NVMLError as exc:
                self.permanent[(gpu.index, "xid")] = f"nvmlDeviceRegisterEvents: {explain(exc)}"
        return events

    def close(self) -> None:
        try:
            if self.events is not None:
                self.nvml.nvmlEventSetFree(self.events)
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass  # closing a library that already failed: nothing left to release

    # -- reading ---------------------------------------------------------------------------------

    def read(self) -> Scrape:
        scrape = Scrape(at_unix=self.clock())
        try:
            for gpu in self.gpus:
                self._read_gpu(gpu, scrape)
            self._drain_xid_events(scrape)
        except self.nvml.NVMLError as exc:  # a failure of the whole library (driver gone), not of one call
            raise ProbeError(f"NVML: {explain(exc)}") from None
        except LookupError as exc:  # a replayed recording that lacks a call
            raise ProbeError(f"NVML recording: {exc}") from None
        return scrape

    def _call(self, scrape: Scrape, gpu: Gpu, metrics: tuple[str, ...], call: str, *args: Any) -> Any:
        """One NVML call; on failure its metrics get the reason and None comes back."""
        key = (gpu.index, call + repr(args))
        reason = self.permanent.get(key)
        if reason is None:
            function = getattr(self.nvml, call, None)
            if function is None:  # an older nvidia-ml-py without this call
                reason = f"{call}: not in this nvidia-ml-py (pip install -U nvidia-ml-py)"
                self.permanent[key] = reason
            else:
                try:
                    return function(gpu.handle, *args)
                except self.nvml.NVMLError as exc:
                    if error_code(exc) == NVML_ERROR_GPU_IS_LOST:
                        raise
                    reason = f"{call}: {explain(exc)}"
                    if error_code(exc) in PERMANENT_ERRORS:
                        self.permanent[key] = reason
        for metric in metrics:
            scrape.unavailable.setdefault(metric, f"GPU {gpu.index}: {reason}")
        return None

    @staticmethod
    def _put(scrape: Scrape, name: str, gpu: Gpu, value: float, **labels: str) -> None:
        scrape.series.setdefault(name, {})[label_key({"gpu": str(gpu.index), **labels})] = float(value)

    def _rate(self, gpu: Gpu, name: str, total: float, at: float) -> float | None:
        """Per-second rate of a counter since the previous read, or None on the first read or a reset."""
        previous = self.counters.get((gpu.index, name))
        self.counters[(gpu.index, name)] = (at, total)
        if previous is None or at <= previous[0] or total < previous[1]:
            return None
        return (total - previous[1]) / (at - previous[0])

    def _read_gpu(self, gpu: Gpu, scrape: Scrape) -> None:
        put, call = self._put, self._call
        at = scrape.at_unix or self.clock()

        util = call(
            scrape,
            gpu,
            ("nvml_gpu_utilization_percent", "nvml_memory_utilization_percent"),
            "nvmlDeviceGetUtilizationRates",
        )
        if util is not None:
            put(scrape, "nvml_gpu_utilization_percent", gpu, util.gpu)
            put(scrape, "nvml_memory_utilization_percent", gpu, util.memory)
        memory = call(scrape, gpu, ("nvml_memory_used_bytes", "nvml_memory_total_bytes"), "nvmlDeviceGetMemoryInfo")
        if memory is not None:
            put(scrape, "nvml_memory_used_bytes", gpu, memory.used)
            put(scrape, "nvml_memory_total_bytes", gpu, memory.total)
        processes = call(
            scrape, gpu, ("nvml_processes", "nvml_process_memory_bytes"), "nvmlDeviceGetComputeRunningProcesses"
        )
        if processes is not None:
            put(scrape, "nvml_processes", gpu, len(processes))
            for process in processes:
                # usedGpuMemory is None where the driver cannot attribute memory (containers, MIG)
                if getattr(process, "usedGpuMemory", None) is not None:
                    put(scrape, "nvml_process_memory_bytes", gpu, process.usedGpuMemory, process=str(process.pid))

        for name, clock_type, which in (
            ("nvml_clock_sm_mhz", CLOCK_SM, "nvmlDeviceGetClockInfo"),
            ("nvml_clock_sm_max_mhz", CLOCK_SM, "nvmlDeviceGetMaxClockInfo"),
            ("nvml_clock_memory_mhz", CLOCK_MEM, "nvmlDeviceGetClockInfo"),
            ("nvml_clock_memory_max_mhz", CLOCK_MEM, "nvmlDeviceGetMaxClockInfo"),
        ):
            value = call(scrape, gpu, (name,), which, clock_type)
            if value is not None:
                put(scrape, name, gpu, value)
        reasons = call(scrape, gpu, ("nvml_clocks_event_reasons",), "nvmlDeviceGetCurrentClocksEventReasons")
        if reasons is not None:
            put(scrape, "nvml_clocks_event_reasons", gpu, reasons)

        for name, which, args in (
            ("nvml_power_milliwatts", "nvmlDeviceGetPowerUsage", ()),
            ("nvml_power_limit_milliwatts", "nvmlDeviceGetEnforcedPowerLimit", ()),
            ("nvml_temperature_celsius", "nvmlDeviceGetTemperature", (TEMPERATURE_GPU,)),
            ("nvml_pcie_link_generation", "nvmlDeviceGetCurrPcieLinkGeneration", ()),
            ("nvml_pcie_link_max_generation", "nvmlDeviceGetMaxPcieLinkGeneration", ()),
            ("nvml_pcie_link_width", "nvmlDeviceGetCurrPcieLinkWidth", ()),
            ("nvml_pcie_link_max_width", "nvmlDeviceGetMaxPcieLinkWidth", ()),
            # NVML samples PCIe throughput over ~20 ms and reports KB/s
            ("nvml_pcie_tx_kib_per_second", "nvmlDeviceGetPcieThroughput", (PCIE_UTIL_TX_BYTES,)),
            ("nvml_pcie_rx_kib_per_second", "nvmlDeviceGetPcieThroughput", (PCIE_UTIL_RX_BYTES,)),
            ("nvml_pcie_replay_total", "nvmlDeviceGetPcieReplayCounter", ()),
            (
                "nvml_ecc_uncorrected_volatile_total",
                "nvmlDeviceGetTotalEccErrors",
                (MEMORY_ERROR_TYPE_UNCORRECTED, VOLATILE_ECC),
            ),
        ):
            value = call(scrape, gpu, (name,), which, *args)
            if value is not None:
                put(scrape, name, gpu, value)
        pages = call(
            scrape, gpu, ("nvml_retired_pages",), "nvmlDeviceGetRetiredPages", PAGE_RETIREMENT_CAUSE_DOUBLE_BIT
        )
        if pages is not None:
            put(scrape, "nvml_retired_pages", gpu, len(pages))
        remapped = call(scrape, gpu, ("nvml_row_remap_pending",), "nvmlDeviceGetRemappedRows")
        if remapped is not None:
            put(scrape, "nvml_row_remap_pending", gpu, 1.0 if remapped[2] else 0.0)
        self._read_nvlink(gpu, scrape, at)

    def _read_nvlink(self, gpu: Gpu, scrape: Scrape, at: float) -> None:
        rates = ("nvml_nvlink_tx_bytes_per_second", "nvml_nvlink_rx_bytes_per_second")
        names = (*rates, *sorted(set(NVLINK_FIELDS.values())))
        if not gpu.nvlink_links:
            for name in (*names, "nvml_nvlink_active_links", "nvml_nvlink_capacity_bytes_per_second"):
                scrape.unavailable.setdefault(name, f"GPU {gpu.index}: no active NVLink links")
            return
        self._put(scrape, "nvml_nvlink_active_links", gpu, len(gpu.nvlink_links))
        if gpu.nvlink_capacity_bytes_per_second:
            self._put(scrape, "nvml_nvlink_capacity_bytes_per_second", gpu, gpu.nvlink_capacity_bytes_per_second)
        values = self._call(
            scrape, gpu, names, "nvmlDeviceGetFieldValues", [(fid, ALL_LINKS_SCOPE) for fid in NVLINK_FIELDS]
        )
        if values is None:
            return
        totals: dict[str, float] = {}
        for fid, value in zip(NVLINK_FIELDS, values, strict=False):
            name = NVLINK_FIELDS[fid]
            if value.nvmlReturn != 0:
                words = NVML_ERROR_WORDS.get(value.nvmlReturn, f"NVML error {value.nvmlReturn}")
                scrape.unavailable.setdefault(name, f"GPU {gpu.index}: NVML field {fid}: {words}")
                continue
            totals[name] = totals.get(name, 0.0) + float(value.value.ullVal)
        for name, total in totals.items():
            if name.endswith("_kib_total"):
                rate = self._rate(gpu, name, total * KIB, at)
                if rate is not None:
                    self._put(scrape, name.replace("_kib_total", "_bytes_per_second"), gpu, rate)
            else:
                self._put(scrape, name, gpu, total)

    def _drain_xid_events(self, scrape: Scrape) -> None:
        """Count the XID events waiting in the event set: a zero timeout never blocks the loop."""
        if self.events is None:
            scrape.unavailable.setdefault("nvml_xid_errors_total", "nvmlEventSetCreate failed: XIDs not watched")
            return
        while True:
            try:
                event = self.nvml.nvmlEventSetWait_v2(self.events, 0)
            except self.nvml.NVMLError:
                break  # NVML_ERROR_TIMEOUT: no event waiting
            try:
                index = self.nvml.nvmlDeviceGetIndex(event.device)
            except self.nvml.NVMLError:
                continue
            if index in self.xid_totals:
                self.xid_totals[index] += 1
        for gpu in self.gpus:
            if gpu.index in self.xid_totals:
                self._put(scrape, "nvml_xid_errors_total", gpu, self.xid_totals[gpu.index])
            else:
                reason = self.permanent.get((gpu.index, "xid"), "XID events not watched")
                scrape.unavailable.setdefault("nvml_xid_errors_total", f"GPU {gpu.index}: {reason}")

    def describe(self) -> dict[str, str]:
        """What the coverage shows about the GPUs read."""
        details = gpus_config(gpu.name for gpu in self.gpus)
        with contextlib.suppress(self.nvml.NVMLError):
            details["driver"] = _text(self.nvml.nvmlSystemGetDriverVersion())
        mig = [str(g.index) for g in self.gpus if g.mig_enabled]
        if mig:
            details["mig"] = (
                f"MIG on GPU {', '.join(mig)}: NVML reports no utilisation per instance; "
                f"dcgm-exporter ({option('dcgm_url')}) has per-instance profiling fields"
            )
        return details


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def driver_library_present() -> bool:
    """Whether libnvidia-ml is installed at all, without importing nvidia-ml-py."""
    return ctypes.util.find_library("nvidia-ml") is not None


def import_pynvml() -> Any:
    import pynvml  # the nvidia-ml-py package: the llmdiag[gpu] extra

    return pynvml


def open_nvml_source(library: Any = None, remote_gpus: bool = False) -> Source | SourceInfo:
    """NVML as a telemetry source, or the coverage line that says why there is none.

    ``remote_gpus``: a DCGM page was given, so a missing local driver is expected rather than a gap.
    """
    if library is None:
        try:
            library = import_pynvml()
        except ImportError:
            if driver_library_present():
                return unavailable_source(
                    "nvml",
                    "NVML",
                    "GPU telemetry: unavailable (an NVIDIA driver is here but nvidia-ml-py is not "
                    "installed: pip install 'llmdiag[gpu]')",
                )
            return unavailable_source("nvml", "NVML", _no_driver_note(remote_gpus))
    try:
        library.nvmlInit()
    except library.NVMLError as exc:
        if error_code(exc) in (NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED):
            return unavailable_source("nvml", "NVML", _no_driver_note(remote_gpus, exc))
        return unavailable_source("nvml", "NVML", f"GPU telemetry (NVML): unavailable ({explain(exc)})")
    try:
        sampler = NvmlSampler(library)
    except (library.NVMLError, LookupError) as exc:
        _shutdown(library)
        return unavailable_source("nvml", "NVML", f"GPU telemetry (NVML): unavailable ({explain(exc)})")
    if not sampler.gpus:
        _shutdown(library)
        return unavailable_source(
            "nvml",
            "NVML",
            "GPU telemetry (NVML): unavailable (the driver sees no GPU; check CUDA_VISIBLE_DEVICES "
            "and the container's --gpus)",
        )
    return Source(
        spec=load_probe("nvml"),
        display_url="nvml://" + ",".join(str(g.index) for g in sampler.gpus),
        read=sampler.read,
        close=sampler.close,
        interval_seconds=SAMPLE_INTERVAL_SECONDS,
        label="GPU telemetry (NVML)",
        check_first=False,
        details=sampler.describe(),
    )


def _no_driver_note(remote_gpus: bool, error: BaseException | None = None) -> str:
    if remote_gpus:
        return f"NVML: no local NVIDIA driver (GPU telemetry comes from {option('dcgm_url')})"
    if error is not None and error_code(error) == NVML_ERROR_DRIVER_NOT_LOADED:
        return f"GPU telemetry: unavailable ({explain(error)}; pass {option('dcgm_url')} for remote GPUs)"
    return no_gpu_note()


def no_gpu_note() -> str:
    """The coverage line of a machine without an NVIDIA driver."""
    return f"GPU telemetry: unavailable (no NVIDIA driver found; pass {option('dcgm_url')} for remote GPUs)"


def _shutdown(library: Any) -> None:
    with contextlib.suppress(library.NVMLError):
        library.nvmlShutdown()
