"""The fault matrix (README "Fault matrix"), end to end through the CLI: what a run does when something breaks
while it runs. Each case: its documented exit code, one ERROR and one HINT line where it ends the run, never a
traceback, and nothing the user had is lost (an existing report, textfile, history row or output file is intact,
and no temporary file is left beside it).

The servers are real ones on 127.0.0.1: the built-in simulator (in a subprocess where it must die: `llmdiag sim
serve`), recorded vLLM pages replayed (tests/fixtures/vllm-0.32.0), the recorded DCGM page, an NVML recording
played back at the pynvml boundary, and a TCP proxy that cuts streams. A full or read-only disk is a real tmpfs
where the machine lets the tests mount one, else an injected errno at the ``os`` boundary (tests/support/oserrors).
The HTTP-layer faults (status codes, redirects, TLS, DNS, slow drips) are tests/e2e/test_http_faults.py's, and
Prometheus's are in tests/e2e/test_prometheus_source.py beside its real Prometheus.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from llmdiag.history import CheckRow, History
from llmdiag.sim.presets import get_preset
from llmdiag.sim.server import SimServer
from tests.conftest import FIXTURES, REPO_ROOT, CliResult, run_cli
from tests.support.httpserver import ReplayResponder, Reply, ScriptedServer, strip_scraped_at
from tests.support.oserrors import FaultyFolder, faulty_folder

MEMORY_PAGES = sorted((FIXTURES / "vllm-0.32.0" / "memory").glob("scrape-*.prom"))
DCGM_PAGE = FIXTURES / "dcgm" / "readme-quickstart.prom"
NVML_RECORDING = FIXTURES / "nvml" / "h100-sxm-tp2-decode.json"
FAST = ("--duration", "1", "--timeout", "1")  # three scrapes, 0.5 s apart
OLD_REPORT = b"<html>the report of last week</html>\n"
OLD_JSON = b'{"the": "verdict of last week"}\n'


def clean(result: CliResult) -> CliResult:
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    return result


def error_lines(result: CliResult) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith(("ERROR:", "HINT:"))]


def one_error(result: CliResult) -> tuple[str, str]:
    lines = error_lines(clean(result))
    assert [line.split(":", 1)[0] for line in lines] == ["ERROR", "HINT"], result.stderr
    return lines[0], lines[1]


def leftovers(folder: Path, keep: set[str]) -> list[str]:
    """What is in ``folder`` besides the files the user had (and the tmpfs filler): a temporary, a half file."""
    return sorted(p.name for p in folder.iterdir() if p.name not in keep | {"filler"})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def refuses(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture
def folder(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., FaultyFolder]]:
    """``folder(kind, **files)``: a folder on a full, nearly full or read-only disk that holds ``files``."""
    with_stack: list = []

    def make(kind: str, **files: bytes) -> FaultyFolder:
        context = faulty_folder(tmp_path, kind, {name.replace("_", "."): data for name, data in files.items()})
        with_stack.append(context)
        return context.__enter__()

    yield make
    for context in reversed(with_stack):
        context.__exit__(None, None, None)


def cli(faulty: FaultyFolder, *args: str, timeout: float = 120) -> CliResult:
    return run_cli(*args, env=faulty.env or None, timeout=timeout)


# ---------------------------------------------------------------------------------------------------------------
# the local side: a full or read-only disk under --html, --output, --textfile and the history


def test_a_disk_that_fills_during_the_scan_keeps_the_verdict_and_the_old_report(folder):
    disk = folder("nearly_full", report_html=OLD_REPORT)
    with ScriptedServer(ReplayResponder(MEMORY_PAGES)) as server:
        result = cli(disk, "scan", server.url, *FAST, "--no-probe", "--json", "--html", str(disk.path / "report.html"))
    error, hint = one_error(result)
    assert result.returncode == 2
    # the window's verdict is printed whole before the error: the measurement is never what a full disk costs
    assert json.loads(result.stdout)["bottleneck"] == "memory"
    assert "no space left" in error.lower() and "report.html" in error
    assert "--html" in hint
    assert (disk.path / "report.html").read_bytes() == OLD_REPORT
    assert leftovers(disk.path, {"report.html"}) == []


@pytest.mark.parametrize("kind", ["full", "read_only"])
def test_demo_outputs_on_a_full_or_read_only_disk(folder, kind: str):
    disk = folder(kind, out_json=OLD_JSON, out_html=OLD_REPORT)
    out, html = disk.path / "out.json", disk.path / "out.html"
    result = cli(disk, "demo", "--duration", "2", "-o", str(out), "--html", str(html))
    error, hint = one_error(result)
    assert result.returncode == 2
    words = "no space left" if kind == "full" else "read-only file system"
    assert words in error.lower(), error
    if disk.mounted:  # the disk says so before the window: no simulator started, no time spent
        assert "simulated vLLM at" not in result.stderr and result.stdout == ""
    else:  # an injected errno shows only at the write: after the verdict, which is printed
        assert "bottleneck" in result.stdout.lower() or "SCHEDULING" in result.stdout
    assert out.read_bytes() == OLD_JSON and html.read_bytes() == OLD_REPORT
    assert leftovers(disk.path, {"out.json", "out.html"}) == []


def test_a_load_whose_output_cannot_be_written_still_prints_its_report(folder):
    disk = folder("nearly_full", load_json=OLD_JSON)
    out = disk.path / "load.json"
    result = cli(disk, "load", "--users", "2", "--duration", "1", "--warmup", "0.5", "--json", "-o", str(out))
    error, hint = one_error(result)
    assert result.returncode == 2
    report = json.loads(result.stdout)
    assert report["points"] and report["points"][0]["users"] == 2
    assert "no space left" in error.lower() and "--output" in hint
    assert out.read_bytes() == OLD_JSON
    assert leftovers(disk.path, {"load.json"}) == []


def test_report_output_on_a_read_only_disk_names_the_option_given(folder):
    saved = REPO_ROOT / "reports" / "examples" / "memory.json"  # a saved demo verdict
    disk = folder("read_only", report_html=OLD_REPORT)
    error, hint = one_error(cli(disk, "report", str(saved), "-o", str(disk.path / "report.html")))
    assert "read-only file system" in error.lower() and "--output" in hint and "--html" not in hint
    assert (disk.path / "report.html").read_bytes() == OLD_REPORT


OLD_PROM = b'# the textfile of the last check\nllmdiag_check_state{target="gpu-a"} 0\n'


@pytest.mark.parametrize("kind", ["full", "read_only"])
def test_check_textfile_on_a_full_or_read_only_disk_is_unknown_and_keeps_the_old_one(folder, kind: str):
    disk = folder(kind, llmdiag_prom=OLD_PROM)
    with ScriptedServer(ReplayResponder(MEMORY_PAGES)) as server:
        result = clean(
            cli(disk, "check", server.url, *FAST, "--no-probe", "--no-history", "--textfile", str(disk.path))
        )
    # the check itself ran: its status line; the textfile's failure makes it at least UNKNOWN (memory is CRITICAL)
    assert result.stdout.startswith("LLMDIAG CRITICAL - memory"), result.stdout
    assert result.returncode == 2
    words = "No space left on device" if kind == "full" else "Read-only file system"
    assert f"UNKNOWN: textfile not written to {disk.path}: {words}" in result.stdout
    assert (disk.path / "llmdiag.prom").read_bytes() == OLD_PROM
    assert leftovers(disk.path, {"llmdiag.prom"}) == []


def history_with_rows(path: Path, targets: list[str]) -> bytes:
    """A real history file with one row per target (as `llmdiag check` writes them), returned as its bytes."""
    store = History.open(path)
    store.record(
        [CheckRow(at_unix=1.8e9 + i, target=t, url=f"http://{t}:8000", state="OK") for i, t in enumerate(targets)]
    )
    return path.read_bytes()


def rows_in(path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return db.execute("SELECT target, state FROM checks ORDER BY id").fetchall()


@pytest.mark.parametrize("kind", ["full", "read_only"])
def test_check_history_on_a_full_or_read_only_disk_is_unknown_and_keeps_its_rows(folder, tmp_path: Path, kind: str):
    data = history_with_rows(tmp_path / "made.sqlite", ["gpu-a", "gpu-b"])
    disk = folder(kind, history_sqlite=data)
    history = disk.path / "history.sqlite"
    result = cli(disk, "check", f"http://127.0.0.1:{free_port()}", *FAST, "--history", str(history))
    error, hint = one_error(result)
    assert result.returncode == 3 and result.stdout.startswith("LLMDIAG UNKNOWN - ") and "the history" in error
    if disk.mounted:  # SQLite's terse words, and why: the disk
        why = "no space left on the disk" if kind == "full" else "read-only file system"
        assert why in error, error
    # untouched: the same bytes, no -wal or -shm made beside it (a half-made -shm on a full disk blocks readers)
    assert history.read_bytes() == data and leftovers(disk.path, {"history.sqlite"}) == []
    copy = tmp_path / "copy.sqlite"
    copy.write_bytes(history.read_bytes())
    assert rows_in(copy) == [("gpu-a", "OK"), ("gpu-b", "OK")]


def test_a_corrupt_history_is_unknown_and_left_as_it_is(tmp_path: Path):
    history = tmp_path / "history.sqlite"
    data = bytearray(history_with_rows(history, ["gpu-a"]))
    data[4096:] = b"\xa5" * (len(data) - 4096)  # every page after the first (the schema) overwritten
    history.write_bytes(bytes(data))
    result = run_cli("check", f"http://127.0.0.1:{free_port()}", *FAST, "--history", str(history))
    error, hint = one_error(result)
    assert result.returncode == 3
    assert "malformed" in error and "move it aside" in hint
    assert history.read_bytes() == bytes(data)
    result = run_cli("history", "--history", str(history))
    assert result.returncode == 2 and "malformed" in one_error(result)[0]


def test_a_history_locked_past_the_busy_timeout_is_unknown_and_keeps_its_rows(tmp_path: Path):
    history = tmp_path / "history.sqlite"
    history_with_rows(history, ["gpu-a"])
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:  # another writer that holds the write lock (a stuck check, a person in `sqlite3`)
        db = sqlite3.connect(history, isolation_level=None)
        db.execute("BEGIN EXCLUSIVE")
        locked.set()
        release.wait(60)
        db.execute("ROLLBACK")
        db.close()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert locked.wait(10)
    try:
        result = run_cli("check", f"http://127.0.0.1:{free_port()}", *FAST, "--history", str(history))
    finally:
        release.set()
        holder.join(10)
    error, hint = one_error(result)
    assert result.returncode == 3 and "database is locked" in error and "another process held" in hint
    assert rows_in(history) == [("gpu-a", "OK")]


# ---------------------------------------------------------------------------------------------------------------
# SIGINT and SIGTERM mid-scan and mid-load


def _sigint_at_its_default() -> None:
    """In the child before it runs: a background job (`make test &`, some CI runners) starts with SIGINT ignored,
    and Python leaves an ignored SIGINT ignored; a user's Ctrl-C reaches a run in the foreground, at the default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Running:
    """The CLI in its own process group, its stderr read line by line as it comes."""

    def __init__(self, *args: str) -> None:
        env = {**os.environ, "COLUMNS": "200"}
        env.pop("LLMDIAG_API_KEY", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmdiag", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env=env,
            start_new_session=True,  # its own group: whatever it starts is found by the group id afterwards
            preexec_fn=_sigint_at_its_default,
        )
        self.lines: list[str] = []
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
        with self.changed:
            self.lines.append("")  # end of stream
            self.changed.notify_all()

    def wait_for(self, words: str, timeout: float = 90) -> str:
        with self.changed:
            found = self.changed.wait_for(
                lambda: any(words in line for line in self.lines) or "" in self.lines, timeout
            )
        line = next((line for line in self.lines if words in line), None)
        assert found and line is not None, f"never said {words!r}: {''.join(self.lines)}"
        return line

    def finish(self, timeout: float = 60) -> CliResult:
        out = self.proc.stdout.read() if self.proc.stdout else ""
        self.proc.wait(timeout)
        with self.changed:
            self.changed.wait_for(lambda: "" in self.lines, 10)
        return CliResult(self.proc.returncode, out, "".join(self.lines))

    def group_is_gone(self, within_seconds: float = 10.0) -> bool:
        """No process is left in the run's group (a child the run stopped may take a moment to be reaped)."""
        end = time.monotonic() + within_seconds
        while True:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.1)


def sim_port(line: str) -> int:
    return int(re.search(r"http://127\.0\.0\.1:(\d+)", line).group(1))  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("sig", "code", "said"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_a_signal_mid_scan_exits_by_it_and_leaves_the_old_files_and_no_process(tmp_path: Path, sig, code, said):
    out, html = tmp_path / "out.json", tmp_path / "out.html"
    out.write_bytes(OLD_JSON)
    html.write_bytes(OLD_REPORT)
    run = Running("demo", "--duration", "20", "-o", str(out), "--html", str(html))
    port = sim_port(run.wait_for("simulated vLLM at"))
    run.wait_for("before the scan")
    time.sleep(4.0)  # past the 3 s of load before the window: scraping, the canaries in flight
    run.proc.send_signal(sig)
    result = clean(run.finish())
    assert result.returncode == code, result.stderr
    assert said in result.stderr and error_lines(result) == []
    assert out.read_bytes() == OLD_JSON and html.read_bytes() == OLD_REPORT
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.html", "out.json"]
    assert run.group_is_gone() and refuses(port)  # the simulator and its load stopped with the run


def test_sigterm_mid_load_exits_143_with_no_output_file_and_no_process(tmp_path: Path):
    out = tmp_path / "load.json"
    run = Running("load", "--users", "4", "--duration", "20", "--warmup", "0.5", "-o", str(out))
    port = sim_port(run.wait_for("loading the built-in simulator"))
    run.wait_for("level 1/1")
    time.sleep(2.0)
    run.proc.send_signal(signal.SIGTERM)
    result = clean(run.finish())
    assert result.returncode == 143 and "terminated" in result.stderr and error_lines(result) == []
    assert list(tmp_path.iterdir()) == []
    assert run.group_is_gone() and refuses(port)


# ---------------------------------------------------------------------------------------------------------------
# the server: killed mid-scan and restarted mid-window (the simulator in its own process, as a real server is)


class SimProcess:
    """`llmdiag sim serve --load` in a subprocess on a given port: a server that can be killed and started again."""

    def __init__(self, port: int, preset: str = "memory") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmdiag", "sim", "serve", "--port", str(port), "--preset", preset, "--load"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO_ROOT,
        )
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if "Ctrl-C" in line:
                return
        raise AssertionError("the simulator did not start")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def wait_until_scanning(scan: subprocess.Popen, port: int, timeout: float = 60) -> None:
    """Until the scan holds a connection to the server: it has found it and is reading its page."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if any(c.raddr and c.raddr.port == port for c in psutil.Process(scan.pid).net_connections("tcp")):
                return
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    raise AssertionError("the scan never connected to the server")


def scan_through_a_fault(fault: Callable[[int, SimProcess], SimProcess | None], duration: str) -> CliResult:
    port = free_port()
    sim = SimProcess(port)
    scan = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmdiag",
            "scan",
            f"http://127.0.0.1:{port}",
            "--duration",
            duration,
            "--timeout",
            "2",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        wait_until_scanning(scan, port)
        time.sleep(2.5)  # a few scrapes in (one a second)
        after = fault(port, sim)
        out, err = scan.communicate(timeout=120)
    finally:
        scan.kill()
        for process in {sim, after or sim}:
            process.kill()
    return clean(CliResult(scan.returncode, out, err))


def test_a_server_restarted_mid_window_counts_each_process_from_zero():
    def restart(port: int, sim: SimProcess) -> SimProcess:
        sim.kill()
        return SimProcess(port)

    result = scan_through_a_fault(restart, "10")
    assert result.returncode in (0, 1), result.stderr
    verdict = json.loads(result.stdout)
    notes = " ".join(verdict["notes"])
    assert "restarted in the window" in notes, notes
    assert "SAN002" in {f["code"] for f in verdict["findings"]}
    # while it was down (killed, its port closed): one line for the run of refused scrapes, not one per scrape
    outage = [n for n in verdict["notes"] if "failed: cannot connect to" in n]
    assert len(outage) == 1 and "connection refused" in outage[0] and outage[0].startswith("scrape"), notes
    [canary] = [p for p in verdict["coverage"]["probes"] if p["probe"] == "canary"]
    # the canaries in flight when it died say so: all of them unavailable (the note), or, when some after the
    # restart went through, their count of failures and the first error
    assert canary["note"] or canary["config"].get("first error"), canary
    # never a negative step: every counter's increase over the window is at least zero
    for name, signal_ in verdict["signals"].items():
        increase = (signal_.get("stats") or {}).get("increase")
        assert increase is None or increase >= 0, (name, increase)


# ---------------------------------------------------------------------------------------------------------------
# a stream cut mid-SSE: under the scan's canaries and under `llmdiag load`


class CuttingProxy:
    """A TCP proxy in front of a server that closes every connection carrying a POST (an API request) after
    ``cut_after_bytes`` of its answer, as a load balancer or a crashing worker does mid-stream. GETs (the metrics
    page) pass whole."""

    def __init__(self, upstream_port: int, cut_after_bytes: int = 700) -> None:
        self.upstream_port, self.cut_after_bytes = upstream_port, cut_after_bytes
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        posted = threading.Event()

        def requests_up() -> None:
            try:
                while data := client.recv(65536):
                    if data.startswith(b"POST "):
                        posted.set()
                    upstream.sendall(data)
            except OSError:
                pass

        threading.Thread(target=requests_up, daemon=True).start()
        sent = 0
        try:
            while data := upstream.recv(65536):
                if posted.is_set():
                    data = data[: max(0, self.cut_after_bytes - sent)]
                    sent += len(data)
                client.sendall(data)
                if posted.is_set() and sent >= self.cut_after_bytes:
                    self.cuts += 1
                    break
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # wakes the other thread's recv; a close alone would not
                sock.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def cut_streams() -> Iterator[tuple[SimServer, CuttingProxy]]:
    with SimServer(get_preset("healthy")) as sim:
        proxy = CuttingProxy(sim.port)
        try:
            yield sim, proxy
        finally:
            proxy.close()


def test_canary_streams_cut_mid_sse_leave_a_coverage_line_and_the_servers_verdict(cut_streams):
    sim, proxy = cut_streams
    result = clean(run_cli("scan", proxy.url, "--duration", "3", "--timeout", "5", "--json"))
    assert result.returncode in (0, 1), result.stderr
    verdict = json.loads(result.stdout)
    [canary] = [p for p in verdict["coverage"]["probes"] if p["probe"] == "canary"]
    assert canary["ok"] is False and "closed the connection mid-answer" in canary["note"], canary
    assert proxy.cuts >= 1
    # the server's own page passed whole: its verdict stands (the idle simulator, apart from the canaries)
    [server] = [p for p in verdict["coverage"]["probes"] if p["probe"] == "vllm"]
    assert server["ok"] is True and verdict["bottleneck"] != "unknown"


def test_load_streams_cut_mid_sse_are_counted_as_stream_errors_never_fatal(cut_streams):
    sim, proxy = cut_streams
    result = clean(run_cli("load", proxy.url, "--users", "2", "--duration", "2", "--warmup", "0.5", "--json"))
    assert result.returncode == 0, result.stderr
    [point] = json.loads(result.stdout)["points"]
    assert point["errors"].get("stream", 0) >= 1, point["errors"]
    assert proxy.cuts >= point["errors"]["stream"]


# ---------------------------------------------------------------------------------------------------------------
# the other sources: the DCGM exporter dying mid-scan, NVML raising mid-window


def dcgm_sm_clock_hertz() -> float:
    """The recorded DCGM page's SM clock (its one GPU), read off the page: MHz as hertz."""
    [value] = [
        float(line.rsplit(" ", 1)[1])
        for line in DCGM_PAGE.read_text().splitlines()
        if line.startswith("DCGM_FI_DEV_SM_CLOCK{")
    ]
    return value * 1e6


def test_a_dcgm_exporter_dying_mid_scan_keeps_what_it_said_and_says_when_it_went():
    page = strip_scraped_at(DCGM_PAGE.read_text()).encode()
    answered = []

    def exporter(path: str, headers: dict[str, str]) -> Reply:
        answered.append(path)
        if len(answered) <= 2:
            return Reply(body=page)
        # the third read: the process dies mid-answer, its port closes for good
        threading.Thread(target=lambda: (dying.httpd.shutdown(), dying.httpd.server_close()), daemon=True).start()
        return Reply(body=page, cut_after_bytes=100)

    with ScriptedServer(ReplayResponder(MEMORY_PAGES)) as server, ScriptedServer(exporter) as dying:
        result = clean(
            run_cli(
                "scan",
                server.url,
                "--duration",
                "4",
                "--timeout",
                "2",
                "--no-probe",
                "--dcgm-url",
                f"{dying.url}/metrics",
                "--json",
            )
        )
    assert result.returncode in (0, 1), result.stderr
    verdict = json.loads(result.stdout)
    [dcgm] = [p for p in verdict["coverage"]["probes"] if p["probe"] == "dcgm"]
    assert dcgm["ok"] is True and "DCGM exporter read" in dcgm["note"] and "failed" in dcgm["note"], dcgm
    assert dcgm["note"].count("failed") == len([n for n in verdict["notes"] if "DCGM exporter read" in n])
    # the GPU figures are the two reads before it died: the page's own SM clock
    stats = verdict["signals"]["sm_clock_hertz"]["stats"]
    assert stats and all(value == pytest.approx(dcgm_sm_clock_hertz()) for value in stats.values()), stats


def test_nvml_losing_the_gpu_mid_window_keeps_the_reads_before_and_says_so_once(tmp_path: Path):
    recording = json.loads(NVML_RECORDING.read_text())
    before = 3
    for device in recording["devices"]:  # after three answers the GPU falls off the bus (NVML_ERROR_GPU_IS_LOST)
        rates = device["calls"]["nvmlDeviceGetUtilizationRates"]
        rates["seq"] = [*rates["seq"][:before], {"error": 15}]
    lost = tmp_path / "gpu-lost.json"
    lost.write_text(json.dumps(recording))
    with ScriptedServer(ReplayResponder(MEMORY_PAGES)) as server:
        result = clean(
            run_cli(
                "scan",
                server.url,
                "--duration",
                "3",
                "--timeout",
                "2",
                "--no-probe",
                "--nvml-replay",
                str(lost),
                "--json",
            )
        )
    assert result.returncode in (0, 1), result.stderr
    verdict = json.loads(result.stdout)
    [nvml] = [p for p in verdict["coverage"]["probes"] if p["probe"] == "nvml"]
    lost_lines = [n for n in verdict["notes"] if "fallen off the bus" in n]
    assert len(lost_lines) == 1 and f"reads {before + 1}-" in lost_lines[0], verdict["notes"]
    assert nvml["note"] == lost_lines[0]
    # utilisation over the reads before: the recording's first three answers per GPU
    util = [
        r["gpu"]
        for d in json.loads(NVML_RECORDING.read_text())["devices"]
        for r in d["calls"]["nvmlDeviceGetUtilizationRates"]["seq"][:before]
    ]
    assert verdict["signals"]["gpu_utilization_ratio"]["stats"]["mean"] == pytest.approx(sum(util) / len(util) / 100)
