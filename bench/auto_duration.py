"""`scan --duration auto`: how soon it ends, and whether it says what the full window says.

Each case is scanned once for the full window, judging the window so far after every scrape (the interim verdicts
an automatic scan would see). The automatic stop is then found on that same sequence with the scan's own rule
(``llmdiag.engine.settle.VerdictSettler``), and its class compared with the full window's: one run per case gives
both answers from the same scrapes.

Cases:
* the simulator: every preset under the chosen dialects, loaded by the preset's closed loop (3 s warm-up, then a
  20 s window read live over HTTP);
* the real vLLM 0.32 states recorded in tests/fixtures/vllm-0.32.0 (six dumps 2 s apart each): the dumps are
  interpolated linearly to one page a second, so counters move every second as a live server's do, and judged
  page by page; the full window there is the recording's 10 s.

    .venv/bin/python bench/auto_duration.py                      # vllm, sglang, tgi dialects (~6 min)
    .venv/bin/python bench/auto_duration.py --dialects all       # every dialect (~12 min)
    .venv/bin/python bench/auto_duration.py --no-sim             # the recorded real states only (seconds)

Prints the time to verdict per case, the median, and the agreement; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from llmdiag.client.endpoint import Connection  # noqa: E402
from llmdiag.collect import DEFAULT_DURATION_SECONDS  # noqa: E402
from llmdiag.collect.exposition import parse_exposition  # noqa: E402
from llmdiag.collect.live import TelemetryOptions, collect_live  # noqa: E402
from llmdiag.collect.servers.pages import build_server_signals  # noqa: E402
from llmdiag.engine.evaluate import build_verdict  # noqa: E402
from llmdiag.engine.settle import VerdictSettler  # noqa: E402
from llmdiag.model import Verdict  # noqa: E402
from llmdiag.schema.loader import load_probe  # noqa: E402

RECORDED = REPO_ROOT / "tests" / "fixtures" / "vllm-0.32.0"
WARMUP_SECONDS = 3.0
DEFAULT_DIALECTS = ("vllm", "sglang", "tgi")


@dataclass
class Case:
    name: str
    full_class: str
    interim: list[tuple[float, Verdict]]

    def auto(self) -> tuple[float, str]:
        """Where the automatic scan would have ended, and the class it would have named there."""
        settler = VerdictSettler()
        for elapsed, verdict in self.interim:
            if settler.observe(verdict, elapsed):
                return elapsed, verdict.bottleneck.value
        return self.interim[-1][0], self.full_class


def sim_case(preset_name: str, dialect: str) -> Case:
    from llmdiag.sim.load import ClosedLoopLoad
    from llmdiag.sim.presets import get_preset
    from llmdiag.sim.server import SimServer

    preset = get_preset(preset_name)
    interim: list[tuple[float, Verdict]] = []

    def record(so_far, elapsed: float) -> bool:
        interim.append((elapsed, build_verdict(so_far)))
        return False

    with SimServer(preset, dialect=dialect) as server:
        max_seconds = WARMUP_SECONDS + DEFAULT_DURATION_SECONDS + 30
        with ClosedLoopLoad(server.url, server.model, preset.load, max_seconds=max_seconds):
            time.sleep(WARMUP_SECONDS)
            signals = collect_live(
                Connection(base_url=server.url),
                DEFAULT_DURATION_SECONDS,
                probe=dialect,
                telemetry=TelemetryOptions(dcgm_url=server.dcgm_url, nvml="off", host=False),
                settled=record,
            )
    return Case(f"sim {preset_name}/{dialect}", build_verdict(signals).bottleneck.value, interim)


def _blend(before: str, after: str, share: float) -> str:
    """A page between two dumps: every sample's value moved ``share`` of the way (counters stay monotonic)."""
    later = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(after)
        for s in family.samples
    }
    lines = []
    for family in text_string_to_metric_families(before):
        lines.append(f"# TYPE {family.name} {family.type}")
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            value = s.value + share * (later.get(key, s.value) - s.value)
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            lines.append(f"{s.name}{{{labels}}} {value!r}" if labels else f"{s.name} {value!r}")
    return "\n".join(lines) + "\n"


def recorded_case(state: Path) -> Case:
    import json

    meta = json.loads((state / "meta.json").read_text())
    step = float(meta.get("interval_seconds", 2.0))
    texts = [p.read_text() for p in sorted(state.glob("scrape-*.prom"))]
    pages: list[str] = [texts[0]]
    per_gap = max(1, round(step))
    for before, after in zip(texts, texts[1:], strict=False):
        pages += [_blend(before, after, k / per_gap) for k in range(1, per_gap)] + [after]
    scrapes = [parse_exposition(text, 1_800_000_000.0 + i * step / per_gap) for i, text in enumerate(pages)]
    spec = load_probe("vllm")
    interim = [
        (i * step / per_gap, build_verdict(build_server_signals(spec, scrapes[: i + 1], "recorded")))
        for i in range(2, len(scrapes))
    ]
    return Case(f"real {state.name}", interim[-1][1].bottleneck.value, interim)


def report(title: str, cases: list[Case]) -> None:
    print(f"\n## {title}\n")
    print("| case | full window | auto | ended at (s) |")
    print("|---|---|---|---|")
    times, agree = [], 0
    for case in cases:
        at, auto_class = case.auto()
        times.append(at)
        agree += auto_class == case.full_class
        print(f"| {case.name} | {case.full_class} | {auto_class} | {at:.1f} |")
    if cases:
        print(
            f"\n{len(cases)} cases: median time to verdict {statistics.median(times):.1f} s, "
            f"agreement with the full window {agree}/{len(cases)} ({agree / len(cases):.0%})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dialects", default=",".join(DEFAULT_DIALECTS), help="comma-separated, or all")
    parser.add_argument("--no-sim", action="store_true", help="only the recorded real states")
    args = parser.parse_args()
    report(
        "recorded real vLLM states (interpolated to 1 page/s)",
        [recorded_case(d) for d in sorted(RECORDED.iterdir()) if d.is_dir()],
    )
    if args.no_sim:
        return
    from llmdiag.sim.dialects import dialect_names
    from llmdiag.sim.presets import PRESETS

    dialects = dialect_names() if args.dialects == "all" else args.dialects.split(",")
    cases = []
    for preset in PRESETS:
        for dialect in dialects:
            cases.append(sim_case(preset, dialect))
            print(f"  {cases[-1].name}: {cases[-1].full_class}", file=sys.stderr, flush=True)
    report(f"simulator presets × {', '.join(dialects)} (20 s window)", cases)


if __name__ == "__main__":
    main()
