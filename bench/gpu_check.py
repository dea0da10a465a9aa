"""The NVML probe on a real GPU: 2 s idle, then ~10 s under a torch matmul loop, sampled as a scan would.

Run on a machine with an NVIDIA GPU, nvidia-ml-py and a CUDA build of torch:

    python bench/gpu_check.py                      # prints the signals, checks they are sane, exit 1 if not
    python bench/gpu_check.py --record gpu.tar.gz  # also writes a bundle: every sample, and what NVML answered

Checks: utilisation rises under load; NVML's memory used grows by what torch reserved (within 5 %); SM clocks and
power stay within the device's own maxima; the temperature is plausible. Unlike tests, this prints and asserts on
a real device; the unit tests replay recordings of one at the pynvml boundary.

--record writes the bundle every llmdiag recording is (llmdiag.collect.bundle): one run per phase (idle, under load)
with NVML's samples as the scan's NVML source records them, which `llmdiag analyze gpu.tar.gz` replays, and NVML's
answers call by call (ReplayNvml's format, for tests/fixtures/nvml) in the channel "nvml-library" of the first run.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

# The one bench that puts the repository on sys.path itself: it is run on GPU machines from a bare checkout, with
# the machine's own CUDA torch and nvidia-ml-py, where llmdiag may not be installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmdiag.collect.bundle import Bundle, Run, write_bundle  # noqa: E402
from llmdiag.collect.signals import build_signal_set  # noqa: E402
from llmdiag.collect.source import Source  # noqa: E402
from llmdiag.collect.tape import Tape, using  # noqa: E402
from llmdiag.collect.taped import taped_source  # noqa: E402
from llmdiag.collect.telemetry.nvml import NvmlSampler, explain  # noqa: E402
from llmdiag.collect.telemetry.nvml_record import RecordingNvml  # noqa: E402
from llmdiag.model import SignalSet  # noqa: E402
from llmdiag.schema.loader import load_probe  # noqa: E402

IDLE_SECONDS = 2.0
LOAD_SECONDS = 10.0
SAMPLE_SECONDS = 0.5
BUFFER_BYTES = 8 * 1024**3  # a block big enough that NVML's view and torch's must agree to within 5 %
MEMORY_TOLERANCE_RATIO = 0.05


def sample(sampler: NvmlSampler, seconds: float, tape: Tape | None = None) -> list:
    """Samples for ``seconds``; with a tape, read through the scan's NVML source, which records each one."""
    read = sampler.read
    if tape is not None:
        with using(tape):
            source = taped_source(
                "nvml",
                lambda: Source(
                    spec=load_probe("nvml"),
                    display_url="nvml://" + ",".join(str(g.index) for g in sampler.gpus),
                    read=sampler.read,
                    interval_seconds=SAMPLE_SECONDS,
                    label="GPU telemetry (NVML)",
                    check_first=False,
                    details=sampler.describe(),
                ),
            )
        assert isinstance(source, Source)
        read = source.read
    scrapes = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        scrapes.append(read())
        time.sleep(SAMPLE_SECONDS)
    return scrapes


def write_recording(path: Path, device: str, phases: list[tuple[str, float, Tape]], nvml_answers: object) -> None:
    """The phases as one bundle; NVML's own answers ride in the first run's tape."""
    phases[0][2].put("nvml-library", {"value": nvml_answers})
    runs = [
        Run(name, {"kind": "telemetry", "source": "nvml", "duration_seconds": seconds}, tape.to_json())
        for name, seconds, tape in phases
    ]
    size = write_bundle(path, Bundle("gpu_check", {"device": device}, runs))
    print(f"\nbundle written to {path} ({size / 1024:.0f} KiB): `llmdiag analyze {path}` replays each phase")


def matmul_load(stop: threading.Event, device: str) -> None:
    import torch

    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(20):
            a = (a @ b).clamp_(-1, 1)
        torch.cuda.synchronize()


def show(title: str, signals: SignalSet) -> None:
    print(f"\n== {title} ({signals.window.scrapes} samples over {signals.window.duration_seconds or 0:.1f} s)")
    for name, signal in signals.signals.items():
        body = (
            f"unavailable: {signal.unavailable}"
            if signal.unavailable
            else ", ".join(f"{k}={v:.4g}" for k, v in signal.stats.items())
        )
        print(f"  {name:38} {body}")


def stat(signals: SignalSet, name: str, which: str) -> float | None:
    signal = signals.get(name)
    return None if signal is None else signal.stat(which)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", type=Path, help="write a bundle (.tar.gz) of every sample and NVML's answers")
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args()
    try:
        import pynvml
        import torch
    except ImportError as exc:
        print(f"ERROR: {exc}: this needs nvidia-ml-py and a CUDA build of torch", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("ERROR: no GPU here (torch sees no CUDA device): run this on a GPU machine", file=sys.stderr)
        return 2
    library = (
        RecordingNvml(pynvml, source=f"bench/gpu_check.py on {time.strftime('%Y-%m-%d')}") if args.record else pynvml
    )
    try:
        library.nvmlInit()
        sampler = NvmlSampler(library)
    except pynvml.NVMLError as exc:
        print(f"ERROR: NVML: {explain(exc)}", file=sys.stderr)
        return 2
    print("devices:", json.dumps(sampler.describe()))
    spec = load_probe("nvml")

    # the CUDA context and cuBLAS workspace first, so the memory check sees only the buffer
    torch.ones(1, device=args.device)
    warm = torch.randn(256, 256, device=args.device, dtype=torch.bfloat16)
    (warm @ warm).sum().item()
    torch.cuda.synchronize()
    tapes = (Tape(), Tape()) if args.record else (None, None)
    idle = build_signal_set(spec, sample(sampler, IDLE_SECONDS, tapes[0]), "nvml")
    reserved_before = torch.cuda.memory_reserved(args.device)
    buffer = torch.empty(BUFFER_BYTES, dtype=torch.uint8, device=args.device)
    buffer.fill_(1)
    stop = threading.Event()
    worker = threading.Thread(target=matmul_load, args=(stop, args.device), daemon=True)
    worker.start()
    try:
        loaded_scrapes = sample(sampler, LOAD_SECONDS, tapes[1])
    finally:
        stop.set()
        worker.join(timeout=30)
    reserved_delta = torch.cuda.memory_reserved(args.device) - reserved_before
    loaded = build_signal_set(spec, loaded_scrapes, "nvml")
    del buffer
    sampler.close()
    show("idle", idle)
    show("under matmul load", loaded)

    checks: list[tuple[str, bool, str]] = []
    idle_util, load_util = stat(idle, "gpu_utilization_ratio", "mean"), stat(loaded, "gpu_utilization_ratio", "mean")
    checks.append(
        (
            "utilisation rises under load",
            load_util is not None and idle_util is not None and load_util >= 0.5 and load_util > idle_util + 0.3,
            f"idle {idle_util}, load {load_util}",
        )
    )
    used_idle, used_load = stat(idle, "gpu_memory_used_bytes", "mean"), stat(loaded, "gpu_memory_used_bytes", "min")
    if used_idle is not None and used_load is not None and reserved_delta > 0:
        error = abs((used_load - used_idle) - reserved_delta) / reserved_delta
        checks.append(
            (
                "memory used grows by what torch reserved (±5 %)",
                error <= MEMORY_TOLERANCE_RATIO,
                f"NVML +{(used_load - used_idle) / 2**30:.2f} GiB, torch +{reserved_delta / 2**30:.2f} GiB, "
                f"error {error:.1%}",
            )
        )
    else:
        checks.append(("memory used grows by what torch reserved (±5 %)", False, "memory signals unavailable"))
    sm_max, sm_peak = stat(loaded, "sm_clock_max_hertz", "max"), stat(loaded, "sm_clock_hertz", "max")
    checks.append(
        (
            "SM clock within its maximum",
            sm_max is not None and sm_peak is not None and 0 < sm_peak <= sm_max * 1.01,
            f"peak {sm_peak}, max {sm_max}",
        )
    )
    power_peak, power_limit = stat(loaded, "gpu_power_watts", "max"), stat(loaded, "gpu_power_limit_watts", "max")
    checks.append(
        (
            "power within the enforced limit",
            power_peak is not None and power_limit is not None and 0 < power_peak <= power_limit * 1.05,
            f"peak {power_peak} W, limit {power_limit} W",
        )
    )
    temperature = stat(loaded, "gpu_temperature_celsius", "max")
    checks.append(("temperature plausible", temperature is not None and 10 <= temperature <= 100, f"{temperature} °C"))
    print("\n== checks")
    for name, ok, detail in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}: {detail}")
    if args.record:
        assert tapes[0] is not None and tapes[1] is not None
        phases = [("idle", IDLE_SECONDS, tapes[0]), ("under matmul load", LOAD_SECONDS, tapes[1])]
        write_recording(args.record, args.device, phases, library.recording())  # type: ignore[union-attr]
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
