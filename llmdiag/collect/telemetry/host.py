"""Host telemetry (psutil): this machine's CPU and memory, and the inference server's own processes.

Why: vLLM's API server and its EngineCore are Python processes. One of them pinned at a full core starves the GPU
of work, and the server's own metrics cannot show it: they only see slow steps and long queues.

Which processes: the pids given with ``--pid``, or the process listening on the server URL's port when the URL
names this machine; each with its children, re-scanned on every read (vLLM V1 starts EngineCore and the
tensor-parallel workers as child processes, and may restart them). A server on another machine is not measured:
this machine's CPU says nothing about it, so the probe is left out with a coverage line instead.

Each read returns a Scrape of ``host_*`` samples that probes/host.toml maps onto signals. CPU is measured from the
cumulative CPU times between two reads (1.0 core = one core busy for the whole interval), never from one instant.
A process seen for the first time, or a read too soon after the last one, has no CPU sample yet: it is left out
of that read, never written as zero.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import psutil

from llmdiag.collect.exposition import LabelKey, Scrape, label_key
from llmdiag.collect.source import Source, unavailable_source
from llmdiag.errors import ProbeError, option
from llmdiag.model import SourceInfo
from llmdiag.schema.loader import load_probe

SAMPLE_INTERVAL_SECONDS = 0.5
# CPU times tick at 10 ms (USER_HZ 100): a shorter interval than this would read a busy process as 0 % or 200 %
MIN_CPU_INTERVAL_SECONDS = 0.2
NOTE = "server process CPU: unavailable ({})"
# processes that hold a port for a server running elsewhere (a container, a tunnel, a proxy): their CPU is not
# the server's, so finding one of these on the port is a coverage line, not a measurement
FORWARDERS = frozenset(
    {
        "docker-proxy",
        "rootlessport",
        "slirp4netns",
        "pasta",
        "kubectl",
        "ssh",
        "sshd",
        "socat",
        "nginx",
        "haproxy",
        "envoy",
        "traefik",
        "caddy",
    }
)
ROLE_MAX_CHARS = 32
# vLLM's title for the API server processes that `vllm serve --api-server-count N` starts as its children
LAUNCHED_API_SERVER = "APIServer"
DEFAULT_PORTS = {"http": 80, "https": 443}

# the Scrape's sample names (probes/host.toml reads them)
HOST_CPU = "host_cpu_utilization_ratio"
HOST_CPUS = "host_logical_cpus"
HOST_MEMORY_USED = "host_memory_used_bytes"
HOST_MEMORY_RATIO = "host_memory_used_ratio"
PROCESS_CPU = "host_process_cpu_cores"
PROCESS_RSS = "host_process_resident_memory_bytes"
PROCESS_THREADS = "host_process_threads"
PROCESS_COUNT = "host_server_processes"
NO_LABELS: LabelKey = ()


def pid_hint() -> str:
    return f"pass {option('pids')} with the server's process id"


def role_name(proc: psutil.Process) -> str:
    """A short name for what the process is: "EngineCore", "vllm serve", "sglang.launch_server", "trtllm-serve".

    vLLM (and SGLang) retitle their workers "VLLM::EngineCore", "VLLM::Worker_TP0", "sglang::scheduler": the part
    after "::" says the role. Python processes are named by their module (-m) or script, plus a subcommand.
    """
    try:
        name = proc.name()
        cmdline = proc.cmdline()
    except psutil.Error:  # gone, a zombie, or not ours to read: the pid still tells it apart
        return "process"
    first = cmdline[0] if cmdline else name
    if "::" in first:
        return first.split()[0].split("::", 1)[1][:ROLE_MAX_CHARS] or first[:ROLE_MAX_CHARS]
    program = os.path.basename(first)
    if program.startswith("python") or name.startswith("python"):
        return _python_role(cmdline[1:]) or program
    return (name or program)[:ROLE_MAX_CHARS]


def _python_role(args: list[str]) -> str:
    for i, arg in enumerate(args):
        if arg == "-m" and i + 1 < len(args):
            module = args[i + 1]
            return (module if len(module) <= ROLE_MAX_CHARS else module.rsplit(".", 1)[-1])[:ROLE_MAX_CHARS]
        if arg == "-c":
            return "python -c"
        if arg.startswith("-"):
            continue
        script = os.path.basename(arg).removesuffix(".py")
        rest = args[i + 1 : i + 2]
        # "vllm serve MODEL": keep a plain-word subcommand, never the model name or a path
        if rest and rest[0].isidentifier() and rest[0].islower():
            return f"{script} {rest[0]}"[:ROLE_MAX_CHARS]
        return script[:ROLE_MAX_CHARS]
    return ""


def _describe(proc: psutil.Process, role: str) -> str:
    return f"{role} ({proc.pid})"


# ---------------------------------------------------------------------------------------------
# finding the server's processes


def _hidepid() -> bool:
    """True when /proc hides other users' processes (mount option hidepid), so a pid can look absent."""
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            return any(line.split()[1:2] == ["/proc"] and "hidepid=" in line for line in mounts)
    except OSError:
        return False


def _from_pid(pid: int) -> psutil.Process | str:
    """The process, or why it cannot be measured, in words a user can act on."""
    if pid <= 0:
        return f"{option('pids')} {pid} is not a process id"
    if pid == os.getpid():
        return f"{option('pids')} {pid} is llmdiag itself"
    try:
        proc = psutil.Process(pid)
        # what every read needs: a process whose times and memory this user cannot read is no use
        with proc.oneshot():
            if proc.status() == psutil.STATUS_ZOMBIE:
                return f"{option('pids')} {pid} has exited (a zombie waiting for its parent)"
            proc.cpu_times()
            proc.memory_info()
    except psutil.NoSuchProcess:
        hidden = " or hidden from this user: /proc is mounted with hidepid" if _hidepid() else ""
        return f"{option('pids')} {pid}: no such process{hidden}"
    except psutil.AccessDenied:
        return f"{option('pids')} {pid} belongs to another user; run llmdiag as that user or as root"
    return proc


def _port(base_url: str) -> tuple[str, int]:
    parts = urlsplit(base_url)
    host = parts.hostname or ""
    try:
        port = parts.port
    except ValueError:
        port = None
    return host, port or DEFAULT_PORTS.get(parts.scheme, 80)


def _local_addresses() -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    found: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            try:
                found.add(ipaddress.ip_address(address.address.split("%", 1)[0]))
            except ValueError:
                continue  # a MAC address
    return found


def is_this_machine(host: str) -> bool | None:
    """Whether the URL's host is this machine; None when its name does not resolve here."""
    host = host.lower().rstrip(".")
    if not host:
        return None
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        addresses = {ipaddress.ip_address(host)}
    except ValueError:
        if host in (socket.gethostname().lower(), socket.gethostname().lower().split(".")[0]):
            return True
        # the HTTP client resolves the same name a moment later, so this costs a lookup, never traffic to the server
        try:
            infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        except (OSError, UnicodeError):
            return None
        addresses = {ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos}
    if any(a.is_loopback or a.is_unspecified for a in addresses):
        return True
    return bool(addresses & _local_addresses())


def _listening(port: int) -> tuple[list[psutil.Process], bool] | str:
    """The processes listening on the port, and whether another user's socket holds it too; or why not known."""
    try:
        connections = psutil.net_connections(kind="inet")
    except psutil.AccessDenied:
        return f"this user may not list the machine's sockets, so the process on port {port} is unknown; {pid_hint()}"
    pids: set[int] = set()
    anonymous = False
    for conn in connections:
        if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.laddr.port != port:
            continue
        if conn.pid is None:
            anonymous = True  # another user's socket: Linux does not say whose
        elif conn.pid != os.getpid():
            pids.add(conn.pid)
    procs = []
    for pid in sorted(pids):
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            continue
    return procs, anonymous


def _server_roots(procs: list[psutil.Process]) -> list[psutil.Process]:
    """The listeners, moved up to the server's launcher where vLLM's API server is a child of it.

    With ``--api-server-count N`` the API servers ("VLLM::APIServer_0" …) are children of the ``vllm serve``
    process, and EngineCore is their sibling: start from the parent so every one of them is measured. Only
    for that title: climbing from any listener could take in a shell and everything else started from it.
    """
    roots: dict[int, psutil.Process] = {}
    for proc in procs:
        chosen = proc
        try:
            parent = proc.parent()
            launched = role_name(proc).startswith(LAUNCHED_API_SERVER)
            if launched and parent is not None and parent.pid > 1 and parent.uids() == proc.uids():
                chosen = parent
        except psutil.Error:
            pass
        roots[chosen.pid] = chosen
    # a root that is a descendant of another root is already covered by it
    covered = set()
    for root in roots.values():
        try:
            covered |= {c.pid for c in root.children(recursive=True)}
        except psutil.Error:
            continue
    return [r for pid, r in sorted(roots.items()) if pid not in covered]


def find_by_port(base_url: str) -> tuple[list[psutil.Process], str] | str:
    """The server's processes from its URL, with how they were found; or, as a string, why they were not."""
    host, port = _port(base_url)
    here = is_this_machine(host)
    if here is None:
        return f"{host} does not resolve here, so whether the server runs on this machine is unknown; {pid_hint()}"
    if not here:
        return f"the server runs on {host}, not on this machine; run llmdiag there or pass {option('pids')}"
    found = _listening(port)
    if isinstance(found, str):
        return found
    procs, anonymous = found
    if not procs:
        if anonymous:
            return (
                f"port {port} is held by another user's process, which this user cannot see; "
                f"run llmdiag as that user or as root, or pass {option('pids')}"
            )
        return f"nothing on this machine listens on port {port} (a container or a port forward?); {pid_hint()}"
    forwarders = [p for p in procs if _name(p) in FORWARDERS]
    if len(forwarders) == len(procs):
        which = ", ".join(_describe(p, _name(p)) for p in forwarders)
        return (
            f"port {port} is forwarded by {which}, not served by it; pass {option('pids')} with the server's own "
            "process "
            "(for a container: its host pid, e.g. from `docker top`)"
        )
    servers = [p for p in procs if p not in forwarders]
    how = f"listening on port {port}"
    if anonymous:
        how += " (another user's socket on the port is not measured)"
    return _server_roots(servers), how


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except psutil.Error:
        return ""


# ---------------------------------------------------------------------------------------------
# sampling


@dataclass
class _Tracked:
    proc: psutil.Process
    key: LabelKey
    description: str
    cpu_seconds: float | None = None
    cpu_at: float = 0.0


class _CpuTimes(Protocol):
    """What psutil.cpu_times() gives on every platform: its fields (seconds) iterate, idle is one of them."""

    @property
    def idle(self) -> float: ...

    def __iter__(self) -> Iterator[float]: ...


def _busy_and_total(times: _CpuTimes) -> tuple[float, float]:
    """psutil.cpu_times() as (busy, total) seconds: guest time is already inside user time on Linux."""
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total


class HostSampler:
    """Samples host CPU and memory and the server's process tree; one instance per scan."""

    def __init__(self, roots: list[psutil.Process], how_found: str, problems: list[str]) -> None:
        self.roots = roots
        self.tracked: dict[int, _Tracked] = {}
        self.seen: list[str] = []
        self.exited: list[str] = []
        # notes shown beside the verdict (processes that exited); open_host_source points it at the source's list
        self.notes: list[str] = []
        self.details = {"found": how_found}
        if problems:
            self.details["skipped"] = "; ".join(problems)
        self.logical_cpus = psutil.cpu_count(logical=True) or 0
        memory = psutil.virtual_memory()
        self.details["host"] = f"{self.logical_cpus} logical CPUs, {memory.total / 2**30:.1f} GiB memory"
        self.host_cpu = _busy_and_total(psutil.cpu_times())
        self.host_cpu_at = time.monotonic()
        self.reads = 0
        self._refresh()  # primes every process's CPU time: the first read then has an interval to measure

    def _current(self) -> dict[int, psutil.Process]:
        current: dict[int, psutil.Process] = {}
        for root in self.roots:
            try:
                if not root.is_running():
                    continue
                current[root.pid] = root
                for child in root.children(recursive=True):
                    current[child.pid] = child
            except psutil.Error:
                continue
        # a child whose parent died is re-parented away from the tree but is still the server's
        for pid, known in self.tracked.items():
            if pid not in current:
                try:
                    if known.proc.is_running():
                        current[pid] = known.proc
                except psutil.Error:
                    continue
        current.pop(os.getpid(), None)
        return current

    def _refresh(self) -> None:
        current = self._current()
        for pid in list(self.tracked):
            known = self.tracked[pid]
            fresh = current.get(pid)
            # the same pid with another start time is a new process that reused the number
            if fresh is None or fresh.create_time() != known.proc.create_time():
                self._exit(pid)
        for pid, proc in current.items():
            if pid not in self.tracked:
                role = role_name(proc)
                description = _describe(proc, role)
                self.tracked[pid] = _Tracked(proc, label_key({"process": f"{role}({pid})"}), description)
                if description not in self.seen:
                    self.seen.append(description)
                    self.details["processes"] = ", ".join(self.seen)

    def _exit(self, pid: int) -> None:
        gone = self.tracked.pop(pid)
        self.exited.append(gone.description)
        self.details["exited"] = ", ".join(self.exited)
        self.notes.append(f"host: {gone.description} exited during the window (read {self.reads}); later reads omit it")

    @property
    def display_url(self) -> str:
        return "host:pid " + ",".join(str(pid) for pid in sorted(self.tracked))

    def read(self) -> Scrape:
        self.reads += 1
        try:
            self._refresh()
            now = time.monotonic()
            scrape = Scrape(at_unix=time.time())
            series = scrape.series
            self._host(scrape, now)
            cpu: dict[LabelKey, float] = {}
            rss: dict[LabelKey, float] = {}
            threads: dict[LabelKey, float] = {}
            for pid in list(self.tracked):
                known = self.tracked[pid]
                try:
                    with known.proc.oneshot():
                        if known.proc.status() == psutil.STATUS_ZOMBIE:
                            raise psutil.ZombieProcess(pid)
                        times = known.proc.cpu_times()
                        rss[known.key] = float(known.proc.memory_info().rss)
                        threads[known.key] = float(known.proc.num_threads())
                except psutil.NoSuchProcess:  # ZombieProcess too
                    rss.pop(known.key, None)
                    threads.pop(known.key, None)
                    self._exit(pid)
                    continue
                except psutil.AccessDenied:
                    self.notes.append(f"host: {known.description} can no longer be read (access denied); omitted")
                    self._exit(pid)
                    continue
                used = times.user + times.system
                if known.cpu_seconds is not None and now - known.cpu_at >= MIN_CPU_INTERVAL_SECONDS:
                    cpu[known.key] = max(0.0, used - known.cpu_seconds) / (now - known.cpu_at)
                if known.cpu_seconds is None or now - known.cpu_at >= MIN_CPU_INTERVAL_SECONDS:
                    known.cpu_seconds, known.cpu_at = used, now
        except psutil.Error as exc:
            raise ProbeError(f"psutil failed: {exc}") from None
        if not self.tracked:
            raise ProbeError("every server process has exited: " + ", ".join(self.exited))
        series[PROCESS_COUNT] = {NO_LABELS: float(len(self.tracked))}
        series[PROCESS_RSS] = rss
        series[PROCESS_THREADS] = threads
        if cpu:
            series[PROCESS_CPU] = cpu
        else:
            scrape.unavailable[PROCESS_CPU] = "no two reads of the server's processes far enough apart to measure CPU"
        return scrape

    def _host(self, scrape: Scrape, now: float) -> None:
        memory = psutil.virtual_memory()
        used = float(memory.total - memory.available)  # what new allocations cannot have: page cache excluded
        scrape.series[HOST_MEMORY_USED] = {NO_LABELS: used}
        if memory.total:
            scrape.series[HOST_MEMORY_RATIO] = {NO_LABELS: used / memory.total}
        if self.logical_cpus:  # psutil returns None where the platform cannot tell: left out, not 0
            scrape.series[HOST_CPUS] = {NO_LABELS: float(self.logical_cpus)}
        if now - self.host_cpu_at < MIN_CPU_INTERVAL_SECONDS:
            return
        busy, total = _busy_and_total(psutil.cpu_times())
        busy_before, total_before = self.host_cpu
        if total > total_before:
            ratio = (busy - busy_before) / (total - total_before)
            scrape.series[HOST_CPU] = {NO_LABELS: min(1.0, max(0.0, ratio))}
        self.host_cpu, self.host_cpu_at = (busy, total), now


# ---------------------------------------------------------------------------------------------
# the source


def open_host_source(base_url: str, pids: list[int]) -> Source | SourceInfo:
    """The host source for the server at ``base_url`` (or the given pids), or a coverage line saying why not."""
    try:
        if pids:
            chosen: list[psutil.Process] = []
            problems: list[str] = []
            for pid in dict.fromkeys(pids):
                found = _from_pid(pid)
                if isinstance(found, str):
                    problems.append(found)
                else:
                    chosen.append(found)
            if not chosen:
                return unavailable_source("host", "host", NOTE.format("; ".join(problems)))
            roots = _server_roots(chosen)
            how = f"{option('pids')} " + ", ".join(str(p.pid) for p in chosen)
        else:
            by_port = find_by_port(base_url)
            if isinstance(by_port, str):
                return unavailable_source("host", "host", NOTE.format(by_port))
            roots, how = by_port
            problems = []
        sampler = HostSampler(roots, how, problems)
    except psutil.Error as exc:
        return unavailable_source("host", "host", NOTE.format(f"psutil failed: {exc}"))
    if not sampler.tracked:
        return unavailable_source("host", "host", NOTE.format("the server's processes exited before the window"))
    source = Source(
        spec=load_probe("host"),
        display_url=sampler.display_url,
        read=sampler.read,
        interval_seconds=SAMPLE_INTERVAL_SECONDS,
        label="host",
        check_first=False,
        details=sampler.details,
    )
    # the loop adds a source's failures to the verdict's notes: the sampler appends to the same list
    sampler.notes = source.failures
    source.failures.extend(f"host: {p}; measured the other processes" for p in problems)
    return source
