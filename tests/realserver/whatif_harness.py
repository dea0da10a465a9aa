"""Predict a fix with `llmdiag whatif`, apply it to the real CPU vLLM, and measure it (issue 18 §2).

One validation is a ``Fix``: a diagnosed state (``before``, a ``StateSpec``), the server flags that change
(``after``: the same state with other flags, or two replicas), the ``--set`` that names the change for `whatif`, and
the load both sides get: the same users, prompt and output lengths, and seed. ``validate`` runs it:

    before: start the server, drive the load, `llmdiag scan --json` (saved), `llmdiag whatif scan.json --set … --json`
            (a fix that moves the batch: `llmdiag load --sweep` levels instead, the last one the state's load, and
            `whatif sweep.json`: one window holds the batch still and gives no step slope)
    after:  start the server with the fix's flags (or two replicas, each pinned to its core), the same load, scan again

and returns a ``Validation``: the predicted figures beside the measured ones. The tests (test_whatif_real.py) assert
the classes and the structure and print the ratios; bench/whatif_real.py prints the table. Accuracy is never asserted.

Replicas: each runs under ``taskset -c CORE`` with vLLM's OpenMP threads bound to that core; the load is split
round-robin (user i goes to replica i mod 2), so the two halves together are the single replica's load.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from .loadgen import Load
from .states import STATES, StateSpec
from .vllm_cpu import VllmServer

REPO_ROOT = Path(__file__).resolve().parents[2]
SCAN_SECONDS = 15
# 8 s keeps the suite short, but a closed loop's queue needs about one whole cycle (users / requests per second:
# 30-40 s in the scheduling and memory states) to reach its steady length: before that, TTFT is the first wave's
# (bench/whatif_real.py --warmup sets a longer one through this variable)
WARMUP_ENV = "LLMDIAG_WHATIF_REAL_WARMUP_SECONDS"
WARMUP_SECONDS = float(os.environ.get(WARMUP_ENV) or 8)
LOAD_SECONDS = WARMUP_SECONDS + SCAN_SECONDS + 120
SEED = 0
# where each validation's figures are also written, as <fix>.json (bench/whatif_real.py reads them from there)
RESULTS_ENV = "LLMDIAG_WHATIF_REAL_OUT"

# the figures compared: (name in whatif's FIGURES, how the measured value is read from a verdict's signals)
COMPARED = ("per_user_tokens_per_second_incl_waiting", "requests_waiting", "ttft_p50_seconds")
REPORTED = (
    *COMPARED,
    "requests_running",
    "per_user_tokens_per_second",
    "total_tokens_per_second",
    "kv_peak_ratio",
    "preemptions_per_second",
)
# the target: ±25 % of the measured value, or ±1 absolute where the measured value is below 1
TARGET_RATIO = 0.25
TARGET_ABSOLUTE_BELOW_ONE = 1.0


class PinnedVllmServer(VllmServer):
    """A vLLM server whose every process runs on one core (``taskset -c``), its OpenMP threads bound there too
    (vLLM's auto binding would otherwise pick core 0 for every replica)."""

    def __init__(self, *args, core: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.core = core
        self.extra_env.update({"VLLM_CPU_OMP_THREADS_BIND": str(core), "OMP_NUM_THREADS": "1"})

    def command(self) -> list[str]:
        return ["taskset", "-c", str(self.core), *super().command()]


@dataclass(frozen=True)
class Fix:
    name: str
    before: StateSpec
    changes: dict[str, float | int | str]  # whatif's --set NAME=VALUE
    after: StateSpec  # the same load; other server flags
    replicas_before: int = 1
    replicas_after: int = 1
    flag: str = ""  # the change as the user types it, for the table
    # closed-loop levels of a `llmdiag load` sweep measured as the "before" (its last level the state's load), for a
    # change that moves the batch: one window holds the batch still, and the sweep's levels give the step's slope
    sweep: tuple[int, ...] = ()

    def sets(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.changes.items()]


@dataclass
class Side:
    """One side (before or after) as measured: the verdicts of each replica and the clients' own timings."""

    verdicts: list[dict]
    client: dict[str, float]
    figures: dict[str, float | None] = field(default_factory=dict)

    @property
    def bottleneck(self) -> str:
        classes = {v["bottleneck"] for v in self.verdicts}
        return classes.pop() if len(classes) == 1 else "/".join(sorted(classes))


@dataclass
class Validation:
    fix: Fix
    before: Side
    after: Side
    whatif: dict | None  # whatif's JSON, None while the command is missing
    whatif_error: str = ""
    seconds: float = 0.0

    def rows(self) -> list[tuple[str, float | None, float | None, float | None, bool | None]]:
        """(figure, predicted, measured, predicted/measured, within target) for each compared figure."""
        predicted = (self.whatif or {}).get("after") or {}
        out = []
        for name in REPORTED:
            p, m = predicted.get(name), self.after.figures.get(name)
            ratio = p / m if p is not None and m not in (None, 0) else None
            out.append((name, p, m, ratio, within_target(p, m) if name in COMPARED else None))
        return out

    def as_dict(self) -> dict:
        return {
            "fix": self.fix.name,
            "flag": self.fix.flag,
            "changes": self.fix.changes,
            "load": {k: getattr(self.fix.before, k) for k in ("users", "prompt_tokens", "output_tokens", "model")},
            "seed": SEED,
            "warmup_seconds": WARMUP_SECONDS,
            "class_before": self.before.bottleneck,
            "class_after": self.after.bottleneck,
            "before": self.before.figures,
            "after": self.after.figures,
            "before_client": self.before.client,
            "after_client": self.after.client,
            "whatif": self.whatif,
            "whatif_error": self.whatif_error,
            "compared": list(COMPARED),
            "seconds": self.seconds,
        }

    def save(self, out: Path) -> None:
        """``out``/validation.json, and <fix>.json in $LLMDIAG_WHATIF_REAL_OUT when it is set."""
        text = json.dumps(self.as_dict(), indent=1)
        (out / "validation.json").write_text(text)
        shared = os.environ.get(RESULTS_ENV)
        if shared:
            Path(shared).mkdir(parents=True, exist_ok=True)
            (Path(shared) / f"{self.fix.name}.json").write_text(text)


def within_target(predicted: float | None, measured: float | None) -> bool | None:
    if predicted is None or measured is None:
        return None
    if abs(measured) < 1:
        return abs(predicted - measured) <= TARGET_ABSOLUTE_BELOW_ONE
    return abs(predicted - measured) <= TARGET_RATIO * abs(measured)


def _stat(verdict: dict, signal: str, stat: str) -> float | None:
    sig = verdict["signals"].get(signal) or {}
    if sig.get("unavailable") is not None:
        return None
    return (sig.get("stats") or {}).get(stat)


def figures(verdicts: Sequence[dict]) -> dict[str, float | None]:
    """whatif's FIGURES read from the measured verdicts. With several replicas: queue, batch and tokens/s are the
    fleet's sums, per-user rates and TTFT the replicas' mean (the load is split evenly), KV peak the largest."""

    def each(signal: str, stat: str) -> list[float] | None:
        values = [_stat(v, signal, stat) for v in verdicts]
        return None if any(x is None for x in values) else values  # type: ignore[return-value]

    def total(signal: str, stat: str) -> float | None:
        values = each(signal, stat)
        return sum(values) if values else None

    def mean(signal: str, stat: str) -> float | None:
        values = each(signal, stat)
        return sum(values) / len(values) if values else None

    def peak(signal: str, stat: str) -> float | None:
        values = each(signal, stat)
        return max(values) if values else None

    return {
        "requests_running": total("requests_running_avg", "value"),
        "requests_waiting": total("requests_waiting_avg", "value"),
        "per_user_tokens_per_second": mean("per_user_tokens_per_second", "value"),
        "per_user_tokens_per_second_incl_waiting": mean("per_user_tokens_per_second_incl_waiting", "value"),
        "ttft_p50_seconds": mean("ttft_seconds", "p50"),
        "ttft_p90_seconds": mean("ttft_seconds", "p90"),
        "total_tokens_per_second": total("generation_tokens_per_second", "rate"),
        "kv_peak_ratio": peak("kv_cache_usage_ratio", "max"),
        "preemptions_per_second": total("preemptions_per_second", "rate"),
    }


def client_figures(loads: Sequence[Load], since: float) -> dict[str, float]:
    """The clients' own view of the requests sent after warm-up: tokens per second of a user's wait (queue included),
    of the decode alone, and the median time to first token."""
    tokens = e2e = decode_tokens = decode_seconds = 0.0
    ttfts: list[float] = []
    for load in loads:
        for sent, first, ended, output, ok in load.stats.timings:
            if not ok or sent < since or not output:
                continue
            tokens += output
            e2e += ended - sent
            if first is not None:
                ttfts.append(first - sent)
                if output >= 2:
                    decode_tokens += output - 1
                    decode_seconds += ended - first
    ttfts.sort()
    return {
        "requests": float(len(ttfts)),
        "per_user_tokens_per_second_incl_waiting": tokens / e2e if e2e else float("nan"),
        "per_user_tokens_per_second": decode_tokens / decode_seconds if decode_seconds else float("nan"),
        "ttft_p50_seconds": ttfts[len(ttfts) // 2] if ttfts else float("nan"),
    }


def scan(base_url: str, out: Path, duration: int = SCAN_SECONDS) -> dict:
    """`llmdiag scan URL --json` as a user runs it; the verdict is saved to ``out`` for `whatif`."""
    cmd = [sys.executable, "-m", "llmdiag", "scan", base_url, "--duration", str(duration), "--json"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=duration + 180)
    if proc.returncode not in (0, 1):
        raise AssertionError(f"scan failed ({proc.returncode}): {proc.stderr[-3000:]}")
    out.write_text(proc.stdout)
    return json.loads(proc.stdout)


def whatif(verdict_path: Path, sets: Sequence[str]) -> tuple[dict | None, str]:
    """`llmdiag whatif VERDICT --set … --json`: its JSON, or None and why (the command is not there yet)."""
    cmd = [sys.executable, "-m", "llmdiag", "whatif", str(verdict_path)]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.run([*cmd, "--json"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        return None, f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-600:]}"
    return json.loads(proc.stdout), ""


def launch(
    spec: StateSpec, models: dict[str, Path], stack: contextlib.ExitStack, count: int = 1, first_core: int | None = None
) -> list[VllmServer]:
    """Start ``count`` servers for the state, stopped when ``stack`` closes; with ``first_core``, each pinned to its
    own core from that one on, launched side by side."""
    common = dict(
        model_name=spec.served_model_name,
        extra_args=spec.server_args,
        kvcache_space_gib=spec.kvcache_space_gib,
        engine_nice=spec.engine_nice,
    )
    model = models[spec.model]
    if first_core is None:
        server = VllmServer(model, **common)  # type: ignore[arg-type]
        stack.callback(server.stop)
        return [server.start()]
    pinned = [PinnedVllmServer(model, core=first_core + i, **common) for i in range(count)]  # type: ignore[arg-type]
    for server in pinned:  # launched side by side, each on its own core
        stack.callback(server.stop)
        server.launch()
    for server in pinned:
        server.ready()
    return list(pinned)


def sweep(spec: StateSpec, server: VllmServer, levels: Sequence[int], out: Path) -> Side:
    """`llmdiag load URL --sweep LEVELS -o sweep.json` as a user runs it; the last level (the state's load) is the
    before side, and sweep.json is what `whatif` predicts from."""
    path = out / "sweep.json"
    cmd = [sys.executable, "-m", "llmdiag", "load", server.base_url, "--sweep", ",".join(map(str, levels))]
    cmd += ["--duration", str(SCAN_SECONDS), "--warmup", str(WARMUP_SECONDS), "--no-nvml", "-o", str(path), "--json"]
    cmd += ["--prompt-tokens", str(spec.prompt_tokens), "--output-tokens", str(spec.output_tokens)]
    seconds = len(levels) * (SCAN_SECONDS + WARMUP_SECONDS) + 240
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=seconds)
    assert proc.returncode == 0 and path.exists(), f"load sweep failed ({proc.returncode}): {proc.stderr[-3000:]}"
    report = json.loads(path.read_text())
    top = report["points"][-1]
    assert top["users"] == spec.users and top["verdict"], json.dumps(top)[:3000]
    (out / "scan-0.json").write_text(json.dumps(top["verdict"]))
    client = {"per_user_tokens_per_second": top["per_user_tokens_per_second"]["p50"]}
    return Side([top["verdict"]], client, figures([top["verdict"]]))


def _split(users: int, replicas: int) -> list[int]:
    """Round-robin: user i goes to replica i mod replicas."""
    return [len(range(r, users, replicas)) for r in range(replicas)]


def _drive(spec: StateSpec, servers: list[VllmServer], out: Path) -> Side:
    shape = dict(
        prompt_tokens=spec.prompt_tokens, output_tokens=spec.output_tokens, max_seconds=LOAD_SECONDS, seed=SEED
    )
    loads = [
        Load(server.base_url, server.model_name, users=n, **shape)  # type: ignore[arg-type]
        for server, n in zip(servers, _split(spec.users, len(servers)), strict=True)
    ]
    for load in loads:
        load.__enter__()
    try:
        since = time.monotonic() + WARMUP_SECONDS
        time.sleep(WARMUP_SECONDS)
        assert all(load.running for load in loads), [load.stats.as_dict() for load in loads]
        verdicts: list[dict | None] = [None] * len(servers)
        errors: list[BaseException] = []

        def one(i: int) -> None:
            try:
                verdicts[i] = scan(servers[i].base_url, out / f"scan-{i}.json")
            except BaseException as exc:  # noqa: BLE001 - re-raised below in the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(servers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        assert all(load.running for load in loads), "the load ended before the scan did"
    finally:
        for load in loads:
            load.__exit__(None, None, None)
    for load, server in zip(loads, servers, strict=True):
        assert load.error is None, f"load generator crashed: {load.error!r}"
        assert load.stats.errors_total == 0, load.stats.as_dict()
        assert server.is_running(), f"server died under load\n{server.log_tail()}"
    done = [v for v in verdicts if v is not None]
    return Side(done, client_figures(loads, since), figures(done))


# "before" sides measured by the state tests themselves (test_vllm_states.py), by state name, for reuse
MEASURED_BEFORE: dict[str, Side] = {}


def remember_before(spec: StateSpec, verdict: dict, load: Load | None) -> None:
    """Keep a state test's scan and load as that state's measured "before" (same state, load and seed)."""
    if load is None or not load.stats.timings:
        return
    since = min(sent for sent, *_ in load.stats.timings) + WARMUP_SECONDS
    MEASURED_BEFORE[spec.name] = Side([verdict], client_figures([load], since), figures([verdict]))


def validate(
    fix: Fix, models: dict[str, Path], out: Path, before: Side | None = None, log: Callable[[str], None] = print
) -> Validation:
    """Predict and apply one fix (``before``: an already measured before side, e.g. the state test's own scan).
    Adding replicas keeps the first one running: its flags do not change, so only the new one starts."""
    t0 = time.monotonic()
    (out / "before").mkdir(parents=True, exist_ok=True)
    (out / "after").mkdir(parents=True, exist_ok=True)
    pinned = fix.replicas_after > 1 or fix.replicas_before > 1
    with contextlib.ExitStack() as stack:
        servers: list[VllmServer] = []
        if before is None:
            servers = launch(fix.before, models, stack, fix.replicas_before, 0 if pinned else None)
            if fix.sweep:
                before = sweep(fix.before, servers[0], fix.sweep, out / "before")
            else:
                before = _drive(fix.before, servers, out / "before")
        else:
            (out / "before" / "scan-0.json").write_text(json.dumps(before.verdicts[0]))
        source = (
            out / "before" / ("sweep.json" if fix.sweep and (out / "before" / "sweep.json").exists() else "scan-0.json")
        )
        predicted, error = whatif(source, fix.sets())
        log(f"[{fix.name}] before: {before.bottleneck} {before.figures}; whatif: {error or 'ok'}")
        if fix.after.server_args != fix.before.server_args:
            for server in servers:
                server.stop()
            servers = []
        more = fix.replicas_after - len(servers)
        servers += launch(fix.after, models, stack, more, len(servers) if pinned else None) if more else []
        after = _drive(fix.after, servers, out / "after")
    log(f"[{fix.name}] after: {after.bottleneck} {after.figures}")
    validation = Validation(fix, before, after, predicted, error, time.monotonic() - t0)
    validation.save(out)
    return validation


# the four fixes of issue 18 §2
def _with(spec: StateSpec, name: str, flags: tuple[str, ...]) -> StateSpec:
    return replace(spec, name=name, extra_args=flags)


SCHEDULING = STATES["scheduling"]
MEMORY = STATES["memory"]
# prefill-heavy: long prompts, short outputs, on the 139 M model. A token budget of 128 cuts each 512-token prompt
# into 4 chunks and admits one chunk a step, so 10 users queue for it (SCH002: queue time is most of TTFT; a first run
# with 6 users judged nothing, the queue then under half of TTFT); 1024 admits two whole prompts a step
PREFILL = StateSpec(
    "prefill",
    "scheduling",
    model="dummy139m",
    extra_args=("--max-num-batched-tokens", "128"),
    users=10,
    prompt_tokens=512,
    output_tokens=16,
    notes="prefill-heavy: 512-token prompts, 16-token outputs, token budget 128",
)
# one replica pinned to one core against two, each on its own core; a decode-heavy load on the 139 M model
REPLICA = StateSpec(
    "replica",
    "compute",
    model="dummy139m",
    users=16,
    prompt_tokens=64,
    output_tokens=64,
    notes="the 139 M model on one core, 16 closed-loop users",
)

FIXES: dict[str, Fix] = {
    f.name: f
    for f in (
        Fix(
            "max_num_seqs",
            SCHEDULING,
            {"max_num_seqs": 8},
            _with(SCHEDULING, "scheduling-8", ("--max-num-seqs", "8")),
            flag="--max-num-seqs 2 → 8",
            sweep=(1, SCHEDULING.users),
        ),
        Fix(
            "kv_pool",
            MEMORY,
            {"num_gpu_blocks": 64},
            _with(MEMORY, "memory-64-blocks", ("--kv-cache-memory-bytes", str(8 * 2**20), "--max-model-len", "1536")),
            flag="--kv-cache-memory-bytes 2 → 8 MiB (16 → 64 blocks)",
            # more blocks admit more of the queue, so the batch moves: the state's own window is KV-bound churn whose
            # batch jumps between readings (a CI run kept 2 steady intervals of the 4 a step fit needs)
            sweep=(1, MEMORY.users),
        ),
        Fix(
            "token_budget",
            PREFILL,
            {"max_num_batched_tokens": 1024},
            _with(PREFILL, "prefill-1024", ("--max-num-batched-tokens", "1024")),
            flag="--max-num-batched-tokens 128 → 1024",
        ),
        Fix(
            "replicas",
            REPLICA,
            {"replicas": 2},
            replace(REPLICA, name="replica-pair"),
            replicas_before=1,
            replicas_after=2,
            sweep=(4, REPLICA.users),
            flag="1 → 2 replicas (taskset -c 0 / -c 1)",
        ),
    )
}
