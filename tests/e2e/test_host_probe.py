"""The host probe with real processes: children that listen on a port and burn CPU, found by port and by --pid.

Nothing here mocks psutil. Each test starts its own Python child processes (in their own session, killed in a
``finally``), reads them through ``open_host_source`` or the CLI, and asserts what a person would check: the
process is found, its CPU reads clearly busy (never an exact number: this box has few, noisy cores), and what
cannot be measured is a coverage line, never a crash or a zero.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from llmdiag.collect.signals import build_signal_set
from llmdiag.collect.source import Source
from llmdiag.collect.telemetry import host
from llmdiag.model import SourceInfo
from tests.conftest import REPO_ROOT, run_cli
from tests.e2e.test_bad_input import growing_vllm
from tests.support.httpserver import Reply, ScriptedServer

# a process that uses a whole core reads about 1.0; "clearly busy" leaves room for a shared, noisy machine
BUSY_CORES = 0.5
CHILD_SECONDS = 40  # every child ends itself by then, even if a test is interrupted before its finally

# Listens on 127.0.0.1 (prints "PORT WORKER_PID") and burns CPU. Modes: "self" burns in the listener;
# "child" burns in a child of the listener (as vLLM's EngineCore is a child of its API server); "late" starts
# that child a second after printing, and the child exits two seconds later.
LISTEN_AND_BURN = r"""
import socket, subprocess, sys, time
seconds, mode = float(sys.argv[1]), sys.argv[2]
deadline = time.monotonic() + seconds
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
burn = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end: pass"
if mode == "self":
    print(server.getsockname()[1], 0, flush=True)
    while time.monotonic() < deadline:
        pass
elif mode == "child":
    worker = subprocess.Popen([sys.executable, "-c", burn, str(seconds)])
    print(server.getsockname()[1], worker.pid, flush=True)
    worker.wait()
else:
    print(server.getsockname()[1], 0, flush=True)
    time.sleep(1.0)
    worker = subprocess.Popen([sys.executable, "-c", burn, "2.0"])
    worker.wait()
    time.sleep(max(0.0, deadline - time.monotonic()))
"""

# A minimal vLLM-like server in its own process (4 running, 2 waiting) that also burns a core: in the serving
# process itself ("self": the handler threads share the GIL with the burner, as in a starved API server) or
# in a child ("child", like EngineCore). Prints the server's URL.
VLLM_AND_BURN = r"""
import subprocess, sys, time
sys.path.insert(0, sys.argv[3])
from tests.support.httpserver import Reply, ScriptedServer
from tests.e2e.test_bad_input import growing_vllm
from tests.e2e.test_bad_input import vllm_exposition
seconds, mode = float(sys.argv[1]), sys.argv[2]
deadline = time.monotonic() + seconds
state = {"n": 0}
def page(path, headers):
    state["n"] += 1
    return Reply(body=vllm_exposition(10 + 5 * state["n"], running=4, waiting=2).encode())
burn = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end: pass"
with ScriptedServer(page) as server:
    if mode == "self":
        print(server.url, flush=True)
        while time.monotonic() < deadline:
            pass
    else:
        worker = subprocess.Popen([sys.executable, "-c", burn, str(seconds)])
        print(server.url, worker.pid, flush=True)
        worker.wait()
"""


# vLLM's process tree with --api-server-count: a launcher whose children are the API server (listening, titled
# "VLLM::APIServer_0") and EngineCore (titled "VLLM::EngineCore", burning a core). The titles are argv[0], as
# setproctitle leaves them. Prints "PORT API_SERVER_PID ENGINE_CORE_PID".
VLLM_TREE = r"""
import subprocess, sys
seconds = sys.argv[1]
serve = ("import socket, sys, time\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen()\n"
         "print(s.getsockname()[1], flush=True)\ntime.sleep(float(sys.argv[1]))")
burn = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end: pass"
api = subprocess.Popen(["VLLM::APIServer_0", "-c", serve, seconds], executable=sys.executable,
                       stdout=subprocess.PIPE, text=True)
engine = subprocess.Popen(["VLLM::EngineCore", "-c", burn, seconds], executable=sys.executable)
print(api.stdout.readline().strip(), api.pid, engine.pid, flush=True)
api.wait()
"""


@contextmanager
def child(script: str, *args: str) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """A Python child in its own session; yields it and the words of its first line. Its whole group dies after."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(CHILD_SECONDS), *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        start_new_session=True,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line, f"the child printed nothing (exit {proc.poll()})"
        yield proc, line.split()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group of the child we started: it and its own children
        proc.wait(timeout=10)


def missing_pid() -> int:
    """A pid no process can have: the kernel hands out pids below pid_max."""
    return int(Path("/proc/sys/kernel/pid_max").read_text())


def read_window(source: Source, reads: int) -> None:
    for _ in range(reads):
        source.scrapes.append(source.read())
        time.sleep(host.SAMPLE_INTERVAL_SECONDS)


def cpu_of(source: Source, pid: int) -> list[float]:
    """The CPU samples (cores) of one process over the reads so far."""
    samples = (s.series.get(host.PROCESS_CPU, {}) for s in source.scrapes)
    return [v for cpu in samples for k, v in cpu.items() if f"({pid})" in dict(k)["process"]]


def mean(values: list[float]) -> float:
    assert values, "no samples"
    return sum(values) / len(values)


# ---------------------------------------------------------------------------------------------
# the probe itself


@pytest.mark.parametrize("hostname", ["127.0.0.1", "localhost"])
def test_busy_process_is_found_by_its_port(hostname: str):
    with child(LISTEN_AND_BURN, "self") as (proc, (port, _)):
        source = host.open_host_source(f"http://{hostname}:{port}", [])
        assert isinstance(source, Source), source
        assert source.details["found"] == f"listening on port {port}"
        assert f"python -c ({proc.pid})" in source.details["processes"]
        assert source.display_url == f"host:pid {proc.pid}"
        read_window(source, 5)
    busy = cpu_of(source, proc.pid)
    assert len(busy) >= 3 and mean(busy) > BUSY_CORES, busy
    last = source.scrapes[-1].series
    assert 0.0 <= last[host.HOST_CPU][()] <= 1.0
    assert last[host.HOST_CPUS][()] >= 1 and 0.0 < last[host.HOST_MEMORY_RATIO][()] < 1.0
    assert last[host.PROCESS_COUNT][()] == 1.0
    assert all(v > 0 for v in last[host.PROCESS_RSS].values())
    assert all(v >= 1 for v in last[host.PROCESS_THREADS].values())
    # the probe spec turns the reads into the signals the rules read
    signals = build_signal_set(source.spec, source.scrapes, source.display_url)
    busiest = signals.get("busiest_server_process_cpu_cores")
    assert busiest is not None and busiest.unavailable is None and busiest.stats["mean"] > BUSY_CORES
    assert list(busiest.by_series) == [f"process=python -c({proc.pid})"]
    assert signals.get("server_process_count").stats["last"] == 1.0


def test_busy_process_is_found_by_pid():
    with child(LISTEN_AND_BURN, "self") as (proc, _):
        source = host.open_host_source("http://10.255.255.1:8000", [proc.pid])  # --pid wins over the URL
        assert isinstance(source, Source), source
        assert source.details["found"] == f"pids {proc.pid}"
        read_window(source, 4)
    assert mean(cpu_of(source, proc.pid)) > BUSY_CORES


def test_child_of_the_listener_is_measured_as_part_of_the_server():
    with child(LISTEN_AND_BURN, "child") as (proc, (port, worker)):
        source = host.open_host_source(f"http://127.0.0.1:{port}", [])
        assert isinstance(source, Source), source
        assert source.display_url == f"host:pid {proc.pid},{worker}"
        read_window(source, 5)
    assert mean(cpu_of(source, int(worker))) > BUSY_CORES
    assert mean(cpu_of(source, proc.pid)) < BUSY_CORES  # the listener only waits
    assert all(s.series[host.PROCESS_COUNT][()] == 2.0 for s in source.scrapes)


def test_children_that_start_and_exit_during_the_window():
    with child(LISTEN_AND_BURN, "late") as (proc, (port, _)):
        source = host.open_host_source(f"http://127.0.0.1:{port}", [])
        assert isinstance(source, Source), source
        assert source.display_url == f"host:pid {proc.pid}"  # the worker starts a second later
        read_window(source, 10)
    counts = [s.series[host.PROCESS_COUNT][()] for s in source.scrapes]
    assert counts[0] == 1.0 and 2.0 in counts and counts[-1] == 1.0, counts
    [worker] = [d for d in source.details["processes"].split(", ") if f"({proc.pid})" not in d]
    worker_pid = int(worker.rsplit("(", 1)[1].rstrip(")"))
    assert max(cpu_of(source, worker_pid)) > BUSY_CORES
    assert source.details["exited"] == worker
    assert any(f"{worker} exited during the window" in note for note in source.failures), source.failures
    # after it exited, the reads leave it out rather than writing zeros
    last = source.scrapes[-1].series
    assert not [k for k in last[host.PROCESS_RSS] if f"({worker_pid})" in dict(k)["process"]]


def test_pid_that_does_not_exist_is_a_coverage_line():
    pid = missing_pid()
    info = host.open_host_source("http://127.0.0.1:8000", [pid])
    assert isinstance(info, SourceInfo) and not info.ok
    assert info.note == f"server process CPU: unavailable (pids {pid}: no such process)"


@pytest.mark.parametrize(("pid", "words"), [(0, "is not a process id"), (os.getpid(), "is llmdiag itself")])
def test_pids_that_are_not_a_server_are_a_coverage_line(pid: int, words: str):
    info = host.open_host_source("http://127.0.0.1:8000", [pid])
    assert isinstance(info, SourceInfo) and words in info.note


def test_good_and_bad_pids_measure_the_good_ones_and_say_so():
    pid = missing_pid()
    with child(LISTEN_AND_BURN, "self") as (proc, _):
        source = host.open_host_source("http://127.0.0.1:8000", [pid, proc.pid])
        assert isinstance(source, Source), source
        read_window(source, 3)
    assert source.details["skipped"] == f"pids {pid}: no such process"
    assert source.failures == [f"host: pids {pid}: no such process; measured the other processes"]
    assert cpu_of(source, proc.pid)


def test_server_on_another_machine_is_not_measured():
    # 10.255.255.1 is not an address of this machine: classified from the address alone, no packet is sent
    info = host.open_host_source("http://10.255.255.1:8000", [])
    assert isinstance(info, SourceInfo) and not info.ok
    assert info.note == (
        "server process CPU: unavailable (the server runs on 10.255.255.1, not on this machine; "
        "run llmdiag there or pass pids)"
    )


def test_nothing_listening_on_the_port_is_a_coverage_line():
    with child(LISTEN_AND_BURN, "self") as (proc, (port, _)):
        pass  # the port was the child's: now nobody listens on it
    info = host.open_host_source(f"http://127.0.0.1:{port}", [])
    assert isinstance(info, SourceInfo) and f"nothing on this machine listens on port {port}" in info.note
    assert "pass pids with" in info.note


def test_vllm_multi_api_server_tree_is_measured_from_its_launcher():
    # the listener is "VLLM::APIServer_0", a child of the launcher; EngineCore is its sibling and does the work
    with child(VLLM_TREE) as (launcher, (port, api_server, engine_core)):
        source = host.open_host_source(f"http://127.0.0.1:{port}", [])
        assert isinstance(source, Source), source
        pids = sorted([launcher.pid, int(api_server), int(engine_core)])
        assert source.display_url == "host:pid " + ",".join(map(str, pids))
        assert f"APIServer_0 ({api_server})" in source.details["processes"]
        assert f"EngineCore ({engine_core})" in source.details["processes"]
        read_window(source, 4)
    signals = build_signal_set(source.spec, source.scrapes, source.display_url)
    by_process = signals.get("busiest_server_process_cpu_cores").by_series
    assert by_process[f"process=EngineCore({engine_core})"] > BUSY_CORES, by_process
    assert by_process[f"process=APIServer_0({api_server})"] < BUSY_CORES, by_process


def test_url_naming_this_machine_by_its_network_address_is_local():
    addresses = [a.address for nic in psutil.net_if_addrs().values() for a in nic if a.family == socket.AF_INET]
    external = [a for a in addresses if not a.startswith("127.")]
    if not external:
        pytest.skip("this machine has no IPv4 address besides loopback")
    with child(LISTEN_AND_BURN, "self") as (proc, (port, _)):
        source = host.open_host_source(f"http://{external[0]}:{port}", [])
    assert isinstance(source, Source) and source.display_url == f"host:pid {proc.pid}", source


# ---------------------------------------------------------------------------------------------
# another user's processes, for real: run the probe as 'nobody' against processes owned by root


def interpreter_for(user: str) -> str | None:
    """A Python of this version that ``user`` may run (the venv's may sit under /root), or None."""
    candidates = [
        sys.executable,
        getattr(sys, "_base_executable", ""),
        shutil.which("python3") or "",
        f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}",
        "/usr/bin/python3",
    ]
    for candidate in dict.fromkeys(c for c in candidates if c):
        try:
            out = subprocess.run(
                [candidate, "-c", "import sys; print(sys.version_info[:2])"],
                user=user,
                capture_output=True,
                text=True,
                timeout=20,
                cwd="/tmp",
                env={},
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode == 0 and out.stdout.strip() == str(tuple(sys.version_info[:2])):
            return candidate
    return None


AS_OTHER_USER = r"""
import json, site, sys, time
site.addsitedir(sys.argv[1])
sys.path.insert(0, sys.argv[2])
from llmdiag.collect.telemetry.host import PROCESS_CPU, open_host_source
by_port = open_host_source("http://127.0.0.1:" + sys.argv[3], [])
by_pid = open_host_source("http://127.0.0.1:8000", [int(sys.argv[4])])
cpu = []
if hasattr(by_pid, "read"):
    for _ in range(3):
        cpu += list(by_pid.read().series.get(PROCESS_CPU, {}).values())
        time.sleep(0.5)
print(json.dumps({"by_port": getattr(by_port, "note", "measured"), "by_pid": getattr(by_pid, "note", "measured"),
                  "cpu": cpu}))
"""


def others_can_read(path: Path) -> bool:
    """Whether a user with no rights of its own could reach and read ``path`` (o+x on every parent, o+r on it)."""
    path = path.resolve()
    if not os.stat(path).st_mode & stat.S_IROTH:
        return False
    return all(os.stat(parent).st_mode & stat.S_IXOTH for parent in [path, *path.parents])


def test_another_users_process():
    if os.geteuid() != 0:
        pytest.skip("needs root to run the probe as another user")
    python = interpreter_for("nobody")
    if python is None:
        pytest.skip("no Python of this version that user 'nobody' may run")
    site_packages = sysconfig.get_paths()["purelib"]
    for needed in (REPO_ROOT, Path(site_packages)):
        if not others_can_read(needed):
            # e.g. a checkout under `mktemp -d` (mode 700): 'nobody' could not import llmdiag at all
            pytest.skip(f"{needed} is not readable by other users, so the probe cannot run as 'nobody'")
    with child(LISTEN_AND_BURN, "self") as (proc, (port, _)):
        out = subprocess.run(
            [python, "-c", AS_OTHER_USER, site_packages, str(REPO_ROOT), port, str(proc.pid)],
            user="nobody",
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/tmp",
            env={},
        )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    # Linux lists root's listening socket without its owner: a clear line, with what to do
    assert seen["by_port"] == (
        f"server process CPU: unavailable (port {port} is held by another user's process, which this user "
        "cannot see; run llmdiag as that user or as root, or pass pids)"
    )
    # ... but lets any user read another user's CPU times (/proc/PID/stat), so --pid measures it
    assert seen["by_pid"] == "measured" and seen["cpu"] and max(seen["cpu"]) > BUSY_CORES, seen


# ---------------------------------------------------------------------------------------------
# end to end: scan a busy server through the CLI, with a DCGM page saying the GPU idles


def idle_gpu(path: str, headers: dict[str, str]) -> Reply:
    return Reply(body=b'# TYPE DCGM_FI_DEV_GPU_UTIL gauge\nDCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="h"} 5\n')


def scan_json(url: str, *extra: str) -> dict:
    with ScriptedServer(idle_gpu) as dcgm:
        result = run_cli(
            "scan",
            url,
            "--duration",
            "3",
            "--json",
            "--no-nvml",
            "--dcgm-url",
            f"{dcgm.url}/metrics",
            *extra,
            timeout=90,
        )
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


def host_probe(verdict: dict) -> dict:
    [probe] = [p for p in verdict["coverage"]["probes"] if p["probe"] == "host"]
    return probe


def assert_cpu_bound(verdict: dict) -> dict:
    findings = {f["code"]: f for f in verdict["findings"]}
    assert "SCH006" in findings, (
        verdict["summary"],
        [(f["code"], f["summary"]) for f in verdict["findings"]],
        [r for r in verdict["coverage"]["rules"] if r["code"] == "SCH006"],
    )
    finding = findings["SCH006"]
    assert finding["category"] == "scheduling" and verdict["bottleneck"] == "scheduling", verdict["summary"]
    busiest = finding["evidence"][0]
    assert busiest["signal"] == "busiest_server_process_cpu_cores" and busiest["unit"] == "cores"
    assert busiest["value"] > 0.8, busiest
    gpu = next(e for e in finding["evidence"] if e["signal"] == "gpu_utilization_ratio")
    assert gpu["value"] == pytest.approx(0.05)
    return finding


def test_scan_finds_the_busy_engine_child_by_port():
    with child(VLLM_AND_BURN, "child", str(REPO_ROOT)) as (proc, (url, worker)):
        verdict = scan_json(url)
    assert_cpu_bound(verdict)
    probe = host_probe(verdict)
    assert probe["ok"] and probe["config"]["found"].startswith("listening on port")
    assert f"({proc.pid})" in probe["config"]["processes"] and f"({worker})" in probe["config"]["processes"]
    by_process = verdict["signals"]["busiest_server_process_cpu_cores"]["by_series"]
    assert by_process[f"process=python -c({worker})"] > 0.8, by_process


def test_scan_finds_the_busy_api_server_by_pid():
    with child(VLLM_AND_BURN, "self", str(REPO_ROOT)) as (proc, (url,)):
        verdict = scan_json(url, "--pid", str(proc.pid))
    finding = assert_cpu_bound(verdict)
    assert host_probe(verdict)["config"]["found"] == f"--pid {proc.pid}"
    assert any(e["signal"] == "server_processes_cpu_cores" and e["value"] > 0.8 for e in finding["evidence"])


def test_scan_with_a_pid_that_does_not_exist_still_gives_a_verdict():
    pid = 999999 if not psutil.pid_exists(999999) else missing_pid()
    with ScriptedServer(growing_vllm) as server:
        verdict = scan_json(server.url, "--pid", str(pid))
    probe = host_probe(verdict)
    assert not probe["ok"] and probe["note"] == f"server process CPU: unavailable (--pid {pid}: no such process)"
    assert "busiest_server_process_cpu_cores" not in verdict["signals"]
    [outcome] = [r for r in verdict["coverage"]["rules"] if r["code"] == "SCH006"]
    assert outcome["status"] == "skipped" and "busiest_server_process_cpu_cores" in outcome["reason"]
    assert verdict["bottleneck"]  # a verdict from what the scan had
