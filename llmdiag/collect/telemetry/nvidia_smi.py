"""nvidia-smi output pasted into a bug report, as GPU evidence: the default table, ``nvidia-smi -q``,
``nvidia-smi -q -x`` and ``nvidia-smi nvlink -s`` (each GPU's links), alone or beside the server's own files. A paste
cut short keeps what it shows: a GPU row without its readings is the GPU, its readings unavailable ('cut off').

Each format is read into the same ``nvml_*`` samples NVML gives (one scrape, one label ``gpu`` per GPU and
``process`` per compute process), and probes/nvml.toml turns them into signals: the GPU rules read one vocabulary
whether the numbers came from NVML, dcgm-exporter or a paste. What a format does not print (the table has no clocks
or PCIe link; none has NVLink counters or XIDs) is unavailable with the command that shows it, never zero.

nvidia-smi prints one moment: the window is a ``snapshot``. Gauges are that moment's values; counters (PCIe replays,
ECC errors) have no rate, since a rate needs two readings. The GPU's product name is kept for the hardware the
capacity context prices: ``SourceInfo.config["gpus"]`` as NVML writes it (``2 × NVIDIA H100 80GB HBM3``) and
``config["gpu"]``, the probes/tables/gpus.toml entry it is, where the table has one.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET  # noqa: N817 (the standard alias)
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from llmdiag.collect.exposition import Scrape, label_key
from llmdiag.collect.paste import FENCE_RE, QUOTE_RE, unquote_line
from llmdiag.collect.signals import build_signal_set
from llmdiag.collect.source import catalogue_gpu as catalogue_gpu
from llmdiag.collect.source import gpus_config
from llmdiag.errors import InputFileError
from llmdiag.model import Signal, SignalSet, SourceInfo, Window
from llmdiag.schema.loader import load_probe

MIB = 1024.0**2
PROBE = "nvidia-smi"
FORMATS = {"table": "nvidia-smi", "query": "nvidia-smi -q", "xml": "nvidia-smi -q -x", "nvlink": "nvidia-smi nvlink -s"}
HINT = (
    "paste the whole output of nvidia-smi (the table with its GPU rows), nvidia-smi -q or nvidia-smi -q -x, "
    "as the command printed it"
)

# NVML's clock event reason bits (nvml.h), by the words nvidia-smi -q prints and the XML tag's suffix
EVENT_REASON_BITS = {
    "idle": 0x1,
    "gpu_idle": 0x1,
    "applications clocks setting": 0x2,
    "applications_clocks_setting": 0x2,
    "sw power cap": 0x4,
    "sw_power_cap": 0x4,
    "hw slowdown": 0x8,
    "hw_slowdown": 0x8,
    "sync boost": 0x10,
    "sync_boost": 0x10,
    "sw thermal slowdown": 0x20,
    "sw_thermal_slowdown": 0x20,
    "hw thermal slowdown": 0x40,
    "hw_thermal_slowdown": 0x40,
    "hw power brake slowdown": 0x80,
    "hw_power_brake_slowdown": 0x80,
    "display clock setting": 0x100,
    "display_clocks_setting": 0x100,
}

# nvml_* sample → (scale from the printed unit, paths in -q text, paths in the -q -x XML); the first path found wins
# (several are the same field across driver versions)
FIELDS: dict[str, tuple[float, tuple[str, ...], tuple[str, ...]]] = {
    "nvml_gpu_utilization_percent": (1.0, ("utilization/gpu",), ("utilization/gpu_util",)),
    "nvml_memory_utilization_percent": (1.0, ("utilization/memory",), ("utilization/memory_util",)),
    "nvml_memory_used_bytes": (MIB, ("fb memory usage/used",), ("fb_memory_usage/used",)),
    "nvml_memory_total_bytes": (MIB, ("fb memory usage/total",), ("fb_memory_usage/total",)),
    "nvml_memory_free_bytes": (MIB, ("fb memory usage/free",), ("fb_memory_usage/free",)),
    "nvml_clock_sm_mhz": (1.0, ("clocks/sm",), ("clocks/sm_clock",)),
    "nvml_clock_sm_max_mhz": (1.0, ("max clocks/sm",), ("max_clocks/sm_clock",)),
    "nvml_clock_memory_mhz": (1.0, ("clocks/memory",), ("clocks/mem_clock",)),
    "nvml_clock_memory_max_mhz": (1.0, ("max clocks/memory",), ("max_clocks/mem_clock",)),
    "nvml_power_milliwatts": (
        1000.0,
        ("gpu power readings/power draw", "power readings/power draw"),
        ("gpu_power_readings/power_draw", "power_readings/power_draw"),
    ),
    "nvml_power_limit_milliwatts": (
        1000.0,
        (
            "gpu power readings/current power limit",
            "power readings/enforced power limit",
            "power readings/power limit",
        ),
        (
            "gpu_power_readings/current_power_limit",
            "power_readings/enforced_power_limit",
            "power_readings/power_limit",
        ),
    ),
    "nvml_temperature_celsius": (1.0, ("temperature/gpu current temp",), ("temperature/gpu_temp",)),
    "nvml_pcie_link_generation": (
        1.0,
        ("pci/gpu link info/pcie generation/current",),
        ("pci/pci_gpu_link_info/pcie_gen/current_link_gen",),
    ),
    "nvml_pcie_link_max_generation": (
        1.0,
        ("pci/gpu link info/pcie generation/max",),
        ("pci/pci_gpu_link_info/pcie_gen/max_link_gen",),
    ),
    "nvml_pcie_link_width": (
        1.0,
        ("pci/gpu link info/link width/current",),
        ("pci/pci_gpu_link_info/link_widths/current_link_width",),
    ),
    "nvml_pcie_link_max_width": (
        1.0,
        ("pci/gpu link info/link width/max",),
        ("pci/pci_gpu_link_info/link_widths/max_link_width",),
    ),
    "nvml_pcie_tx_kib_per_second": (1.0, ("pci/tx throughput",), ("pci/tx_util",)),
    "nvml_pcie_rx_kib_per_second": (1.0, ("pci/rx throughput",), ("pci/rx_util",)),
    "nvml_pcie_replay_total": (1.0, ("pci/replays since reset",), ("pci/replay_counter",)),
    "nvml_ecc_uncorrected_volatile_total": (
        1.0,
        ("ecc errors/volatile/dram uncorrectable", "ecc errors/volatile/double bit/total"),
        ("ecc_errors/volatile/dram_uncorrectable", "ecc_errors/volatile/double_bit/total"),
    ),
    "nvml_retired_pages": (
        1.0,
        ("retired pages/double bit ecc",),
        ("retired_pages/double_bit_retirement/retired_count",),
    ),
}
# where each sample is in nvidia-smi's own words, for a signal's source line
FIELD_WORDS = {
    "nvml_gpu_utilization_percent": "GPU-Util / Utilization Gpu",
    "nvml_memory_utilization_percent": "Utilization Memory",
    "nvml_memory_used_bytes": "Memory-Usage / FB Memory Usage Used",
    "nvml_memory_total_bytes": "Memory-Usage / FB Memory Usage Total",
    "nvml_processes": "Processes (type C or C+G) per GPU",
    "nvml_process_memory_bytes": "Processes: GPU Memory Usage per process",
    "nvml_clock_sm_mhz": "Clocks SM",
    "nvml_clock_sm_max_mhz": "Max Clocks SM",
    "nvml_clock_memory_mhz": "Clocks Memory",
    "nvml_clocks_event_reasons": "Clocks Event Reasons (Active)",
    "nvml_power_milliwatts": "Pwr:Usage / Power Draw",
    "nvml_power_limit_milliwatts": "Pwr:Cap / Current Power Limit",
    "nvml_temperature_celsius": "Temp / GPU Current Temp",
    "nvml_pcie_link_generation": "GPU Link Info PCIe Generation Current",
    "nvml_pcie_link_max_generation": "GPU Link Info PCIe Generation Max",
    "nvml_pcie_link_width": "GPU Link Info Link Width Current",
    "nvml_pcie_link_max_width": "GPU Link Info Link Width Max",
    "nvml_pcie_tx_kib_per_second": "PCI Tx Throughput",
    "nvml_pcie_rx_kib_per_second": "PCI Rx Throughput",
    "nvml_retired_pages": "Retired Pages Double Bit ECC",
    "nvml_row_remap_pending": "Remapped Rows Pending",
}
# what no nvidia-smi format here prints, and the command that shows it
NOT_PRINTED = {
    "nvml_nvlink_tx_bytes_per_second": "nvidia-smi nvlink -gt d (run twice, N s apart)",
    "nvml_nvlink_rx_bytes_per_second": "nvidia-smi nvlink -gt d (run twice, N s apart)",
    "nvml_nvlink_active_links": "nvidia-smi nvlink -s",
    "nvml_nvlink_capacity_bytes_per_second": "nvidia-smi nvlink -s",
    "nvml_nvlink_crc_errors_total": "nvidia-smi nvlink -e",
    "nvml_nvlink_replay_errors_total": "nvidia-smi nvlink -e",
    "nvml_nvlink_recovery_errors_total": "nvidia-smi nvlink -e",
    "nvml_xid_errors_total": "dmesg | grep -i xid",
}
# what only the -q formats print (the default table has no row for it)
QUERY_ONLY = (
    "nvml_memory_utilization_percent",
    "nvml_clock_sm_mhz",
    "nvml_clock_sm_max_mhz",
    "nvml_clock_memory_mhz",
    "nvml_clock_memory_max_mhz",
    "nvml_clocks_event_reasons",
    "nvml_pcie_link_generation",
    "nvml_pcie_link_max_generation",
    "nvml_pcie_link_width",
    "nvml_pcie_link_max_width",
    "nvml_pcie_tx_kib_per_second",
    "nvml_pcie_rx_kib_per_second",
    "nvml_pcie_replay_total",
    "nvml_retired_pages",
    "nvml_row_remap_pending",
    "nvml_memory_free_bytes",
)
COUNTERS = ("nvml_pcie_replay_total", "nvml_ecc_uncorrected_volatile_total")
NUMBER_RE = re.compile(r"[-+]?\d+(?:\.\d+)?")
TIME_FORMAT = "%a %b %d %H:%M:%S %Y"


@dataclass
class Process:
    pid: str
    kind: str  # C, G, C+G, M …
    memory_mib: float | None  # None: printed as N/A or cut short ("24670...")


@dataclass
class Gpu:
    index: int
    name: str
    values: dict[str, float] = field(default_factory=dict)  # nvml_* sample → value in its unit
    unavailable: dict[str, str] = field(default_factory=dict)  # nvml_* sample → why there is none
    processes: list[Process] | None = None  # None: the output has no process list


@dataclass
class Snapshot:
    fmt: str  # table, query or xml
    gpus: list[Gpu]
    at_unix: float | None = None
    driver: str = ""
    cuda: str = ""


# ---------------------------------------------------------------------------------------------
# which format


def _format_of(text: str) -> str | None:
    if "<nvidia_smi_log" in text:
        return "xml"
    if NVLINK_GPU_RE.search(text) and NVLINK_LINK_RE.search(text):
        return "nvlink"
    if "NVSMI LOG" in text or re.search(r"^\s*(?:>\s*)*Attached GPUs\s+:", text, re.MULTILINE):
        return "query"
    if re.search(r"\|\s*GPU\s+Name\b.*\|", text) or re.search(r"NVIDIA-SMI \d", text):
        return "table"
    # a table pasted from its middle (header cut off): its GPU rows are still the table's
    if TABLE_GPU_ROW_RE.search(text):
        return "table"
    return None


# one GPU's own line in each format: a table row with its PCI bus id, a -q section head, an XML <gpu> element
TABLE_GPU_ROW_RE = re.compile(r"\|\s*\d+\s+.+?\s(?:On|Off)\s*\|\s*[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d")
# 'nvidia-smi nvlink -s': 'GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-…)', then one 'Link N: 25 GB/s' (or
# '<inactive>') per link; the rate is per direction (NVML's link speed)
NVLINK_GPU_RE = re.compile(r"^[\s>]*GPU (\d+): (.+?) \(UUID: [^)]*\)\s*$", re.MULTILINE)
NVLINK_LINK_RE = re.compile(r"^[\s>]*Link (\d+): (?:([0-9.]+) GB/s|<inactive>)", re.MULTILINE)
CUT_RE = re.compile(r"^[\s>]*(?:\.{3,}|…)\s*$")  # a paste's own 'cut here' line
GPU_MARKERS = {
    "nvlink": NVLINK_GPU_RE,
    "table": re.compile(r"\|\s*\d+\s+.+?\|\s*[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d"),
    "query": re.compile(r"^[\s>]*GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d\s*$", re.MULTILINE),
    "xml": re.compile(r"<gpu[\s>]"),
}


def looks_like_nvidia_smi(text: str) -> bool:
    """Whether the text holds nvidia-smi output, in any of its three formats, with at least one GPU in it (anywhere
    in the text: a bug report's prose around the paste does not matter; a header alone is not evidence)."""
    fmt = _format_of(text)
    return fmt is not None and GPU_MARKERS[fmt].search(text) is not None


# ---------------------------------------------------------------------------------------------
# values as printed


def _number(raw: str) -> float | None:
    """The number in a printed value ('81559MiB', '74.58 W', '16x', '0 %'), or None for N/A and the like."""
    match = NUMBER_RE.search(raw)
    if match is None or raw.strip().startswith(("N/A", "[")):
        return None
    return float(match.group())


def _put(gpu: Gpu, sample: str, raw: str | None, scale: float = 1.0) -> None:
    if raw is None:
        return
    value = _number(raw)
    if value is None:
        gpu.unavailable.setdefault(sample, f"GPU {gpu.index}: nvidia-smi printed '{raw.strip()}'")
    else:
        gpu.values[sample] = value * scale


def _timestamp(text: str) -> float | None:
    """nvidia-smi's own time (local time of the machine, zone unknown: read as UTC)."""
    match = re.search(r"\b([A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})\b", text)
    if match is None:
        return None
    try:
        moment = datetime.strptime(re.sub(r"\s+", " ", match.group(1)), TIME_FORMAT)
    except ValueError:
        return None
    return moment.replace(tzinfo=timezone.utc).timestamp()


# ---------------------------------------------------------------------------------------------
# the default table

# what the table prints for each GPU, on its row and the row below: a paste cut before them has none
TABLE_READINGS = (
    "nvml_ecc_uncorrected_volatile_total",
    "nvml_temperature_celsius",
    "nvml_power_milliwatts",
    "nvml_power_limit_milliwatts",
    "nvml_memory_used_bytes",
    "nvml_memory_total_bytes",
    "nvml_gpu_utilization_percent",
)
GPU_ROW_RE = re.compile(r"^(\d+)\s+(.+?)\s+(On|Off)$")
BUS_RE = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d")
STATS_RE = re.compile(r"^(\S+)\s+(\S+?)C?\s+(P\d+|N/A|ERR!)\s+(\S+?)\s*/\s*(\S+)$")
MEMORY_RE = re.compile(r"^(\S+?)\s*/\s*(\S+)$")
# processes: 'GPU GI CI PID Type Name Memory' (since R450) and the older 'GPU PID Type Name Memory'
PROCESS_RE = re.compile(r"^(\d+)\s+\S+\s+\S+\s+(\d+)\s+([CGM+]+)\s+(.*?)\s+(\S+)$")
OLD_PROCESS_RE = re.compile(r"^(\d+)\s+(\d+)\s+([CGM+]+)\s+(.*?)\s+(\S+)$")


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _parse_table(text: str) -> Snapshot:
    lines = [unquote_line(line) for line in text.splitlines()]
    gpus: dict[int, Gpu] = {}
    current: Gpu | None = None
    processes: dict[int, list[Process]] | None = None
    none_running = False
    for line in lines:
        none_running = none_running or "No running processes found" in line
        if "Processes:" in line:
            processes = {}
            current = None
            continue
        if not line.startswith("|"):
            continue
        cells = _cells(line)
        if processes is not None:
            _table_process(cells[0], processes)
            continue
        head = GPU_ROW_RE.match(cells[0])
        if head and len(cells) >= 2 and BUS_RE.match(cells[1]):
            current = gpus.setdefault(int(head.group(1)), Gpu(index=int(head.group(1)), name=head.group(2)))
            if len(cells) >= 3 and cells[2]:  # a paste cut after the bus id has no ECC cell
                _put(current, "nvml_ecc_uncorrected_volatile_total", cells[2])
            continue
        stats = STATS_RE.match(cells[0]) if current is not None else None
        if current is not None and stats and len(cells) >= 3:
            _table_stats(current, stats, cells)
            current = None
    # an empty list that does not say 'No running processes found': the processes live in another PID namespace
    hidden = processes is not None and not processes and not none_running
    for gpu in gpus.values():
        if hidden:
            for sample in ("nvml_processes", "nvml_process_memory_bytes"):
                gpu.unavailable[sample] = (
                    "the Processes table lists none and does not say 'No running processes found': processes of "
                    "another PID namespace (a container) are not shown"
                )
        elif processes is not None:
            gpu.processes = processes.get(gpu.index, [])
        for sample in QUERY_ONLY:
            gpu.unavailable.setdefault(sample, "the default nvidia-smi table does not show it: nvidia-smi -q does")
        for sample in TABLE_READINGS:
            if sample not in gpu.values:
                gpu.unavailable.setdefault(sample, f"GPU {gpu.index}: the table is cut off before this reading")
    driver = re.search(r"(?:Driver|KMD) Version:\s*(\S+)", text)
    cuda = re.search(r"CUDA (?:UMD )?Version:\s*(\S+)", text)
    return Snapshot(
        fmt="table",
        gpus=[gpus[i] for i in sorted(gpus)],
        at_unix=_timestamp(text),
        driver=driver.group(1) if driver else "",
        cuda=cuda.group(1) if cuda else "",
    )


def _table_stats(gpu: Gpu, stats: re.Match[str], cells: list[str]) -> None:
    _put(gpu, "nvml_temperature_celsius", stats.group(2))
    _put(gpu, "nvml_power_milliwatts", stats.group(4), 1000.0)
    _put(gpu, "nvml_power_limit_milliwatts", stats.group(5), 1000.0)
    memory = MEMORY_RE.match(cells[1])
    if memory:
        _put(gpu, "nvml_memory_used_bytes", memory.group(1), MIB)
        _put(gpu, "nvml_memory_total_bytes", memory.group(2), MIB)
    _put(gpu, "nvml_gpu_utilization_percent", cells[2].split()[0] if cells[2] else None)


def _table_process(cell: str, processes: dict[int, list[Process]]) -> None:
    match = PROCESS_RE.match(cell) or OLD_PROCESS_RE.match(cell)
    if match is None:
        return
    memory = match.group(5)
    # a long figure is cut short ('24670...') where the column is too narrow for it: the number is not known
    mib = None if memory.endswith("...") else _number(memory)
    processes.setdefault(int(match.group(1)), []).append(Process(match.group(2), match.group(3), mib))


# ---------------------------------------------------------------------------------------------
# nvidia-smi -q (text) and -q -x (XML): one GPU's fields as (path, value) pairs


@dataclass
class _Fields:
    pairs: list[tuple[str, str]] = field(default_factory=list)

    def get(self, *paths: str) -> str | None:
        wanted = set(paths)
        found = {path: value for path, value in self.pairs if path in wanted}
        return next((found[p] for p in paths if p in found), None)

    def under(self, prefix: str) -> Iterable[tuple[str, str]]:
        return ((p[len(prefix) :], v) for p, v in self.pairs if p.startswith(prefix))


def _query_sections(text: str) -> tuple[list[tuple[str, _Fields]], dict[str, str]]:
    """The -q text as one list of (path, value) per GPU, paths from the indentation ('pci/gpu link info/…')."""
    gpus: list[tuple[str, _Fields]] = []
    header: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    base: int | None = None
    for raw in text.splitlines():
        line = QUOTE_RE.sub("", raw.rstrip("\r\n"))
        if FENCE_RE.match(line) or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        key, sep, value = line.strip().partition(":")
        key = key.strip().lower()
        gpu_head = re.match(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*$", line.strip())
        if gpu_head:
            gpus.append((gpu_head.group(1), _Fields()))
            base, stack = indent, []
            continue
        if not gpus or base is None or indent <= base:
            if sep:
                header[key] = value.strip()
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "/".join([name for _, name in stack] + [key])
        gpus[-1][1].pairs.append((path, value.strip()))
        stack.append((indent, key))
    return gpus, header


def _xml_sections(text: str) -> tuple[list[tuple[str, _Fields]], dict[str, str]]:
    start = text.find("<?xml")
    start = text.find("<nvidia_smi_log") if start < 0 else start
    body = "\n".join(QUOTE_RE.sub("", line) for line in text[start:].splitlines() if not FENCE_RE.match(line))
    end = body.find("</nvidia_smi_log>")
    body = body[: end + len("</nvidia_smi_log>")] if end >= 0 else body
    try:
        root = ET.fromstring(re.sub(r"<!DOCTYPE[^>]*>", "", body))
    except ET.ParseError as exc:
        raise InputFileError(f"nvidia-smi -q -x output that is not whole XML ({exc})", HINT) from None
    header = {child.tag: (child.text or "").strip() for child in root if len(child) == 0}
    gpus: list[tuple[str, _Fields]] = []
    for element in root.findall("gpu"):
        fields = _Fields()
        _walk(element, "", fields)
        gpus.append((element.get("id", ""), fields))
    return gpus, header


def _walk(element: ET.Element, prefix: str, fields: _Fields) -> None:
    for child in element:
        path = f"{prefix}{child.tag}"
        fields.pairs.append((path, (child.text or "").strip()))
        _walk(child, path + "/", fields)


def _parse_query(text: str, fmt: str) -> Snapshot:
    sections, header = _xml_sections(text) if fmt == "xml" else _query_sections(text)
    gpus = []
    for index, (_bus, fields) in enumerate(sections):
        name = fields.get("product name", "product_name") or "unknown GPU"
        gpu = Gpu(index=index, name=name)
        for sample, (scale, query_paths, xml_paths) in FIELDS.items():
            raw = fields.get(*(xml_paths if fmt == "xml" else query_paths))
            if raw is None:
                gpu.unavailable.setdefault(sample, f"GPU {index}: not in this {FORMATS[fmt]} output")
            _put(gpu, sample, raw, scale)
        _event_reasons(gpu, fields, fmt)
        pending = fields.get("remapped rows/pending", "remapped_rows/remapped_row_pending")
        if pending is not None and pending.strip().lower() in ("yes", "no"):
            gpu.values["nvml_row_remap_pending"] = 1.0 if pending.strip().lower() == "yes" else 0.0
        else:
            gpu.unavailable["nvml_row_remap_pending"] = f"GPU {index}: no remapped-rows field (before Ampere)"
        gpu.processes = _query_processes(fields, fmt)
        gpus.append(gpu)
    return Snapshot(
        fmt=fmt,
        gpus=gpus,
        at_unix=_timestamp(header.get("timestamp", "")),
        # R610 drivers print 'KMD Version' and 'CUDA UMD Version' in the table; read either spelling
        driver=next((header[k] for k in ("driver version", "driver_version", "kmd version") if k in header), ""),
        cuda=next((header[k] for k in ("cuda version", "cuda_version", "cuda umd version") if k in header), ""),
    )


def _event_reasons(gpu: Gpu, fields: _Fields, fmt: str) -> None:
    """The Active clock event reasons as NVML's bitmask (the section was 'Clocks Throttle Reasons' before R535)."""
    mask, seen = 0, False
    if fmt == "xml":
        sections: tuple[str, ...] = ("clocks_event_reasons/", "clocks_throttle_reasons/")
    else:
        sections = ("clocks event reasons/", "clocks throttle reasons/")
    for section in sections:
        for path, value in fields.under(section):
            leaf = path.rsplit("/", 1)[-1]
            leaf = re.sub(r"^clocks_(?:event|throttle)_reason_", "", leaf)
            bit = EVENT_REASON_BITS.get(leaf)
            if bit is None or value not in ("Active", "Not Active"):
                continue
            seen = True
            mask |= bit if value == "Active" else 0
    if seen:
        gpu.values["nvml_clocks_event_reasons"] = float(mask)
    else:
        gpu.unavailable["nvml_clocks_event_reasons"] = f"GPU {gpu.index}: no clock event reasons in this output"


def _query_processes(fields: _Fields, fmt: str) -> list[Process] | None:
    """The GPU's processes; None where the output has no process field at all."""
    processes: list[Process] = []
    found = False
    if fmt == "xml":
        pid, kind = "", ""
        for path, value in fields.under("processes/"):
            found = True
            if path == "process_info/pid":
                pid = value
            elif path == "process_info/type":
                kind = value
            elif path == "process_info/used_memory":
                processes.append(Process(pid, kind, _number(value)))
        return processes if found or fields.get("processes") is not None else None
    for path, value in fields.pairs:
        if path == "processes":
            found = True
        elif path.startswith("processes/") and path.endswith("process id"):
            processes.append(Process(value, "", None))
        elif path.startswith("processes/") and processes and path.endswith("/type"):
            processes[-1].kind = value
        elif path.startswith("processes/") and processes and path.endswith("used gpu memory"):
            processes[-1].memory_mib = _number(value)
    return processes if found else None


# ---------------------------------------------------------------------------------------------
# samples → signals


def parse_nvidia_smi(text: str) -> Snapshot:
    fmt = _format_of(text)
    if fmt is None:
        raise InputFileError("not nvidia-smi output (no GPU table, no 'NVSMI LOG', no <nvidia_smi_log>)", HINT)
    if fmt == "nvlink":
        return _parse_nvlink(text)
    return _parse_table(text) if fmt == "table" else _parse_query(text, fmt)


def _parse_nvlink(text: str) -> Snapshot:
    """Each GPU's active links and their summed per-direction rate. A GPU whose list runs into the paste's own cut
    line ('......') or into a cut line of the text is not whole: its links are unavailable, never counted short."""
    gpus: list[Gpu] = []
    links: dict[int, list[float]] = {}
    whole: dict[int, bool] = {}
    current: Gpu | None = None
    for line in (unquote_line(raw) for raw in text.splitlines()):
        head = NVLINK_GPU_RE.match(line)
        if head:
            current = Gpu(index=int(head.group(1)), name=head.group(2))
            gpus.append(current)
            links[current.index], whole[current.index] = [], True
            continue
        link = NVLINK_LINK_RE.match(line)
        if current is not None and link:
            if link.group(2) is not None:
                links[current.index].append(float(link.group(2)) * 1e9)
            continue
        if current is not None and CUT_RE.match(line):
            whole[current.index] = False
    for gpu in gpus:
        for sample in FIELDS:
            gpu.unavailable[sample] = "nvidia-smi nvlink -s prints the links only: nvidia-smi (or -q) shows the rest"
        if not whole[gpu.index]:
            for sample in ("nvml_nvlink_active_links", "nvml_nvlink_capacity_bytes_per_second"):
                gpu.unavailable[sample] = f"GPU {gpu.index}: its link list is cut off in the paste"
            continue
        gpu.values["nvml_nvlink_active_links"] = float(len(links[gpu.index]))
        gpu.values["nvml_nvlink_capacity_bytes_per_second"] = sum(links[gpu.index])
    return Snapshot(fmt="nvlink", gpus=gpus, at_unix=_timestamp(text))


def _scrape(snapshot: Snapshot) -> Scrape:
    scrape = Scrape(at_unix=snapshot.at_unix)
    for gpu in snapshot.gpus:
        gpu_label = {"gpu": str(gpu.index)}
        for sample, value in gpu.values.items():
            scrape.series.setdefault(sample, {})[label_key(gpu_label)] = value
        for sample, reason in gpu.unavailable.items():
            scrape.unavailable.setdefault(sample, reason)
        if gpu.processes is None:
            for sample in ("nvml_processes", "nvml_process_memory_bytes"):
                scrape.unavailable.setdefault(sample, f"this {FORMATS[snapshot.fmt]} output has no process list")
            continue
        compute = [p for p in gpu.processes if "C" in p.kind or not p.kind]
        scrape.series.setdefault("nvml_processes", {})[label_key(gpu_label)] = float(len(compute))
        for process in compute:
            if process.memory_mib is not None:
                key = label_key({**gpu_label, "process": process.pid})
                scrape.series.setdefault("nvml_process_memory_bytes", {})[key] = process.memory_mib * MIB
    if "nvml_process_memory_bytes" not in scrape.series and "nvml_processes" in scrape.series:
        running = sum(scrape.series["nvml_processes"].values())
        scrape.unavailable.setdefault(
            "nvml_process_memory_bytes",
            "no compute process on any GPU"
            if not running
            else "nvidia-smi printed no figure for the compute processes' memory ('N/A' in containers and WSL, "
            "or cut short as '24670...' in a narrow table)",
        )
    for sample, command in NOT_PRINTED.items():
        if sample in scrape.series:
            continue  # nvidia-smi nvlink -s prints the links
        scrape.unavailable[sample] = f"nvidia-smi's {FORMATS[snapshot.fmt]} output does not print it: {command}"
    return scrape


def _source_info(snapshot: Snapshot, origin: str) -> SourceInfo:
    config = {"format": FORMATS[snapshot.fmt], **gpus_config(gpu.name for gpu in snapshot.gpus)}
    if snapshot.driver:
        config["driver"] = snapshot.driver
    if snapshot.cuda:
        config["cuda"] = snapshot.cuda
    return SourceInfo(
        probe=PROBE, url=origin, server="nvidia-smi", note=f"one {FORMATS[snapshot.fmt]} snapshot", config=config
    )


def collect_nvidia_smi(text: str, origin: str) -> SignalSet:
    """nvidia-smi output (table, -q or -q -x) as a SignalSet in the NVML vocabulary, over a snapshot window.

    Raises ``InputFileError`` when the text holds no GPU at all (the only refusal: every other gap is a signal
    unavailable with its reason).
    """
    snapshot = parse_nvidia_smi(text)
    if not snapshot.gpus:
        raise InputFileError(f"{origin}: nvidia-smi output without a single GPU row", HINT)
    scrape = _scrape(snapshot)
    cut = any("cut off" in why for gpu in snapshot.gpus for why in gpu.unavailable.values())
    signals = build_signal_set(load_probe("nvml"), [scrape], origin)
    command = FORMATS[snapshot.fmt]
    for name, signal in list(signals.signals.items()):
        signals.signals[name] = _as_printed(signal, snapshot, origin, command)
    signals.add(_per_gpu_gauge(snapshot, "gpu_memory_free_bytes", "nvml_memory_free_bytes", "min", origin))
    signals.add(
        Signal(
            name="gpu_count",
            kind="gauge",
            unit="count",
            stats=dict.fromkeys(("last", "mean", "min", "max"), float(len(snapshot.gpus))),
            source=f"{command} ({origin}): GPUs listed"
            + (" (the paste is cut off: at least this many)" if cut else ""),
            verify=f"{command} -L",
        )
    )
    signals.sources = [_source_info(snapshot, origin)]
    signals.window = Window(
        kind="snapshot",
        start_unix=snapshot.at_unix,
        end_unix=snapshot.at_unix,
        scrapes=1,
        note=f"one {command} snapshot: gauges are that moment's values; rates need two readings",
    )
    return signals


def _as_printed(signal: Signal, snapshot: Snapshot, origin: str, command: str) -> Signal:
    """A signal the NVML spec built, with nvidia-smi as its source; a counter has no rate from one reading."""
    if not signal.source.startswith("nvml "):
        return signal
    wire = signal.source.rsplit(": ", 1)[-1].split(" / ")[0]
    words = FIELD_WORDS.get(wire, wire)
    update: dict[str, object] = {"source": f"{command} ({origin}): {words}", "window_seconds": None}
    if not signal.verify or signal.verify.startswith("curl "):
        update["verify"] = command
    if signal.kind == "counter":
        update |= {"stats": {}, "samples": [], "by_series": {}}
        update["unavailable"] = f"{command} prints one moment: a rate needs two readings N s apart"
    return signal.model_copy(update=update)


def _per_gpu_gauge(snapshot: Snapshot, name: str, sample: str, aggregate: str, origin: str) -> Signal:
    values = {f"gpu={gpu.index}": gpu.values[sample] for gpu in snapshot.gpus if sample in gpu.values}
    command = FORMATS[snapshot.fmt]
    if not values:
        reasons = [gpu.unavailable.get(sample, "") for gpu in snapshot.gpus]
        why = next((r for r in reasons if r), f"not in this {command} output")
        return Signal.missing(name, "gauge", "bytes", why, source=f"{command} ({origin})")
    pick = min(values.values()) if aggregate == "min" else max(values.values())
    return Signal(
        name=name,
        kind="gauge",
        unit="bytes",
        stats=dict.fromkeys(("last", "mean", "min", "max"), pick),
        source=f"{command} ({origin}): FB Memory Usage Free",
        verify=command,
        by_series=values,
    )
