"""Where this rank runs, under torchrun: the device, the link its traffic crosses, and how large a message may be.

The backend is NCCL when CUDA is available, else gloo on the CPU (a smoke test of the plumbing: its figures are
memory copies through TCP on loopback, not a link). NVML names the link and the memory's peak bandwidth; where it
cannot, the figure is unavailable with NVML's reason in words, never a number.
"""

from __future__ import annotations

import math
import os
import platform
from dataclasses import dataclass
from typing import Any

import psutil
import torch

from llmdiag.collect.telemetry.nvml import CLOCK_MEM, explain, import_pynvml, link_from_nvml
from llmdiag.errors import BenchUsageError, option
from llmdiag.model import BenchLink, NcclBenchOptions
from llmdiag.schema.links import describe_link

DEFAULT_GLOO_MAX_BYTES = 64 * 1024**2
# the out-of-place collectives hold ~2 buffers of the message size: a quarter of the memory leaves room
MEMORY_SHARE_FOR_BUFFERS = 0.25


@dataclass
class Env:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str
    device: str  # "cuda:N" or "cpu"
    device_name: str
    torch_version: str

    @property
    def nodes(self) -> int:
        return max(1, math.ceil(self.world_size / max(1, self.local_world_size)))

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")


def read_env() -> Env:
    """This rank from torchrun's variables; on CUDA, its device is made the current one."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    if cuda:
        if local_rank >= torch.cuda.device_count():
            raise BenchUsageError(
                f"local rank {local_rank} but only {torch.cuda.device_count()} GPU(s) visible",
                f"use {option('nproc_per_node')} at most the number of GPUs",
            )
        torch.cuda.set_device(local_rank)
        device, name = f"cuda:{local_rank}", torch.cuda.get_device_name(local_rank)
    else:
        device, name = "cpu", platform.processor() or platform.machine()
    return Env(
        rank=int(os.environ.get("RANK", "0")),
        world_size=world,
        local_rank=local_rank,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", str(world))),
        backend="nccl" if cuda else "gloo",
        device=device,
        device_name=name,
        torch_version=torch.__version__,
    )


def size_cap(env: Env, options: NcclBenchOptions) -> tuple[int | None, str]:
    """The largest message this run may use, and why."""
    caps: list[tuple[int, str]] = []
    if options.max_size_bytes:
        caps.append((options.max_size_bytes, option("max_size")))
    elif env.backend == "gloo":
        caps.append((DEFAULT_GLOO_MAX_BYTES, f"gloo default ({option('max_size')} to raise it)"))
    if env.cuda:
        free, _ = torch.cuda.mem_get_info(env.local_rank)
        caps.append((int(free * MEMORY_SHARE_FOR_BUFFERS), "a quarter of free GPU memory"))
    else:
        per_rank = psutil.virtual_memory().available // max(1, env.local_world_size)
        caps.append((int(per_rank * MEMORY_SHARE_FOR_BUFFERS), "a quarter of available host memory per local rank"))
    size, why = min(caps)
    return size, why


# ---------------------------------------------------------------------------------------------------------------
# NVML: the link and the memory's peak


def open_nvml() -> tuple[Any | None, str]:
    """The pynvml module, initialised, or None and why not in words (as `llmdiag scan` says it)."""
    try:
        nvml = import_pynvml()
    except ImportError:
        return None, "nvidia-ml-py is not installed: pip install 'llmdiag[gpu]'"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return None, explain(exc)
    return nvml, ""


def nvml_handle(nvml: Any, local_rank: int) -> Any:
    """This rank's GPU in NVML: by UUID (CUDA_VISIBLE_DEVICES renumbers devices), else by index."""
    uuid = str(getattr(torch.cuda.get_device_properties(local_rank), "uuid", "") or "")
    if uuid:
        for candidate in (uuid, f"GPU-{uuid}"):
            try:
                return nvml.nvmlDeviceGetHandleByUUID(candidate)
            except nvml.NVMLError:
                continue  # the other spelling, then the index
    return nvml.nvmlDeviceGetHandleByIndex(local_rank)


def _known_link(name: str, how: str) -> BenchLink:
    found = describe_link(name)
    assert found is not None  # checked by the caller: --link before the run, NVML's name by link_from_nvml
    return BenchLink(
        name=found.name,
        expected_bus_bandwidth_bytes_per_second=found.expected_bus_bandwidth_bytes_per_second,
        how=how,
        title=found.title,
    )


def _no_link(why: str) -> BenchLink:
    return BenchLink(name=None, expected_bus_bandwidth_bytes_per_second=None, how="", unavailable=why)


def detect_link(env: Env, override: str | None, nvml: Any = None) -> BenchLink:
    """The link class this benchmark's traffic crosses, and the busbw a healthy one reaches.

    ``nvml``: the pynvml module (or a fake with its calls and its NVMLError), initialised; by default the real one.
    """
    if override:
        return _known_link(override, option("link"))
    if env.world_size == 1:
        return _no_link("one rank: no inter-GPU link to measure")
    if env.nodes > 1:
        return _no_link(
            f"several nodes: the network between them is not visible to NVML; pass {option('link')} (e.g. ib-ndr)"
        )
    if not env.cuda:
        return _no_link("no NVML: CPU ranks (gloo over loopback) have no GPU link")
    if nvml is None:
        nvml, why = open_nvml()
        if nvml is None:
            return _no_link(f"no NVML ({why}); pass {option('link')}")
    try:
        name, how = link_from_nvml(nvml, nvml_handle(nvml, env.local_rank))
    except nvml.NVMLError as exc:
        return _no_link(f"NVML could not name the link: {explain(exc)}")
    if name is None:
        return _no_link(how)
    return _known_link(name, how)


def memory_peak(env: Env, nvml: Any = None) -> tuple[float | None, str]:
    """Theoretical memory bandwidth from NVML: max memory clock x bus width x 2 (double data rate), and how."""
    if not env.cuda:
        return None, "unavailable: host memory (no NVML figure)"
    if nvml is None:
        nvml, why = open_nvml()
        if nvml is None:
            return None, f"unavailable: no NVML ({why})"
    try:
        handle = nvml_handle(nvml, env.local_rank)
        clock_hz = nvml.nvmlDeviceGetMaxClockInfo(handle, CLOCK_MEM) * 1e6
        width_bits = nvml.nvmlDeviceGetMemoryBusWidth(handle)
    except nvml.NVMLError as exc:
        return None, f"unavailable: NVML ({explain(exc)})"
    peak = clock_hz * 2 * width_bits / 8
    return peak, f"NVML: max memory clock {clock_hz / 1e6:.0f} MHz x {width_bits}-bit bus x 2"
