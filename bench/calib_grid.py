"""The simulator's scenario grid for bench/calibration.py, in virtual time: no sockets, no real clock.

One case is a preset (``llmdiag.sim.presets``) with its parameters varied by a seed (efficiencies, request sizes,
users, and the knob that puts the memory and scheduling presets in their state, drawn across its edge), served in
one dialect, under a closed-loop load scaled by a load level. The engine is driven by hand (as
tests/unit/sim/test_dialects.py does): each user sends one request and the next when it ends; at each scrape instant
(1 s apart, timestamps jittered) the dialect's metrics page and the simulated dcgm-exporter page are rendered from
the engine's state, their gauges get multiplicative noise, and they are parsed as a scan parses them. The window's
last 5, 10 and 20 s of scrapes each give one verdict (``build_verdict``), judged against the truth: the class of the
largest share of the window in the engine's own accounting of what limited each step (``Step.limit``), not the
preset's name.

    run_grid(GridSpec(...)) -> list[SimCase]
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from llmdiag.collect.exposition import Scrape, parse_exposition
from llmdiag.collect.merge import merge_signal_sets
from llmdiag.collect.servers.llamacpp import props_signals
from llmdiag.collect.servers.pages import build_server_signals
from llmdiag.collect.signals import build_signal_set
from llmdiag.engine.evaluate import build_verdict
from llmdiag.model import Verdict
from llmdiag.schema.loader import load_probe
from llmdiag.sim.dialects import SimState, get_dialect
from llmdiag.sim.engine import Engine, SimRequest, limit_shares
from llmdiag.sim.metrics import HttpCounts, dcgm_registry, render
from llmdiag.sim.presets import PRESETS, Preset

WALL_START = 1_800_000_000.0
SCRAPE_INTERVAL_SECONDS = 1.0
SCRAPE_JITTER_SECONDS = 0.05  # a scraper's timer and the page's render time
GAUGE_NOISE = 0.1  # one standard deviation of the multiplicative noise on a page's gauges
WARMUP_SECONDS = 15.0  # the memory preset fills its KV pool in ~8 s of simulated time
WINDOWS_SECONDS = (5, 10, 20)
LOAD_LEVELS = (0.0, 0.3, 1.0, 2.0)  # × the preset's users; 0 is an idle server
PARAMETER_SPREAD = 0.25  # users, prompt and output lengths drawn from ×[1/(1+s), 1+s]
# the knob that puts a preset in its state, drawn across the edge of that state: the memory preset's KV pool holds
# 17k-70k tokens (its users want ~49k at load 1), the scheduling preset's cap runs 2-24 of 10-64 users
MEMORY_UTILIZATION = (0.24, 0.32)
MAX_NUM_SEQS = (2, 24)
MAIN_PAGE = {"trtllm": "/prometheus/metrics"}  # the dialect's Prometheus page where its default is not one
# the accounting's limits → the verdict class each one means; "host" (per-step host overhead) is no class llmdiag
# names from a server's page, so a window it dominates is left out as "mixed"
LIMIT_CLASS = {
    "kv": "memory",
    "batch_cap": "scheduling",
    "compute": "compute",
    "bandwidth": "compute",
    "link": "network",
    "none": "healthy",
    "idle": "healthy",
}
PERCENT_SUFFIXES = ("_UTIL", "_perc")  # gauges in percent (dcgm-exporter's utilizations): noise stays ≤ 100
MIXED = "mixed"  # no class holds half the window: no single truth


@dataclass(frozen=True)
class GridSpec:
    presets: tuple[str, ...] = tuple(PRESETS)
    dialects: tuple[str, ...] = ("vllm", "sglang", "tgi", "llamacpp", "trtllm", "triton")
    load_levels: tuple[float, ...] = LOAD_LEVELS
    windows_seconds: tuple[int, ...] = WINDOWS_SECONDS
    seeds: tuple[int, ...] = (0, 1)
    warmup_seconds: float = WARMUP_SECONDS
    noise: float = GAUGE_NOISE


@dataclass
class SimCase:
    """One verdict on one window of one simulated run, and the truth from the engine's accounting."""

    preset: str
    dialect: str
    load_level: float
    window_seconds: int
    seed: int
    truth: str  # a verdict class, or MIXED
    shares: dict[str, float]  # each class's share of the window (the accounting, mapped by LIMIT_CLASS)
    verdict: Verdict
    settings: dict[str, float] = field(default_factory=dict)  # the varied parameters

    @property
    def name(self) -> str:
        return f"{self.preset}/{self.dialect}/x{self.load_level:g}/{self.window_seconds}s/seed{self.seed}"


def truth_of(shares: dict[str, float]) -> tuple[str, dict[str, float]]:
    """The class of the largest share of the window, and the shares by class; idle only when no step ran."""
    ran = sum(v for k, v in shares.items() if k != "idle")
    if ran <= 0:
        return "idle", {"idle": 1.0}
    by_class: dict[str, float] = {}
    for limit, share in shares.items():
        cls = LIMIT_CLASS.get(limit, MIXED)
        by_class[cls] = by_class.get(cls, 0.0) + share
    best = max(by_class, key=lambda k: by_class[k])
    return (best if by_class[best] >= 0.5 and best != MIXED else MIXED), by_class


def varied(preset: Preset, level: float, rng: random.Random) -> tuple[Preset, dict[str, float]]:
    """The preset with its efficiencies, users and request sizes drawn around the named values."""
    spread = 1 + PARAMETER_SPREAD

    def draw() -> float:
        return math.exp(rng.uniform(-math.log(spread), math.log(spread)))

    dep = preset.deployment
    eff_c, eff_b = rng.uniform(0.6, 1.0), rng.uniform(0.7, 1.0)
    knobs: dict[str, float] = {}
    if preset.name == "memory":  # the KV pool around the load's need: from a third of it to a little more
        knobs["gpu_memory_utilization"] = round(rng.uniform(*MEMORY_UTILIZATION), 3)
    dep = dataclasses.replace(dep, compute_efficiency=eff_c, bandwidth_efficiency=eff_b, **knobs)
    engine = dataclasses.replace(preset.engine, deployment=dep, max_model_len=None)
    if preset.name == "scheduling":  # the batch cap around the users: a queue at some loads, none at others
        knobs["max_num_seqs"] = rng.randint(*MAX_NUM_SEQS)
        engine = dataclasses.replace(engine, max_num_seqs=int(knobs["max_num_seqs"]))
    load = preset.load
    users = 0 if level == 0 else max(1, round(load.users * level * draw()))
    prompt = max(1, round(load.prompt_tokens * draw()))
    output = max(2, round(load.output_tokens * draw()))
    longest = engine.model_len
    if prompt + round(output * (1 + load.output_spread)) > longest:  # keep every request inside max_model_len
        prompt = max(1, longest - round(output * (1 + load.output_spread)) - 1)
    load = dataclasses.replace(load, users=max(users, 1), prompt_tokens=prompt, output_tokens=output)
    settings = {
        "users": float(users),
        "prompt_tokens": float(prompt),
        "output_tokens": float(output),
        "compute_efficiency": round(eff_c, 3),
        "bandwidth_efficiency": round(eff_b, 3),
        **knobs,
    }
    return dataclasses.replace(preset, engine=engine, load=load), settings


class Noise:
    """Multiplicative noise on a scrape's gauges, one factor per page read (as if read a moment earlier or later
    under a little more or less load): counts stay whole, ratios and percentages stay in range, and a gauge that
    a probe divides by another (TGI's tokens held over its token budget) never passes its denominator."""

    def __init__(self, rng: random.Random, sigma: float) -> None:
        self.rng, self.sigma = rng, sigma

    def apply(self, scrape: Scrape) -> Scrape:
        if self.sigma <= 0:
            return scrape
        factor = max(0.0, self.rng.gauss(1.0, self.sigma))
        for name, series in scrape.series.items():
            if scrape.types.get(name) != "gauge":
                continue
            for key, value in series.items():
                noisy = value * factor
                if float(value).is_integer() and abs(value) >= 1:
                    noisy = float(round(noisy))
                if 0 <= value <= 1:
                    noisy = min(1.0, noisy)
                elif name.endswith(PERCENT_SUFFIXES) and 0 <= value <= 100:
                    noisy = min(100.0, noisy)
                series[key] = noisy
        return scrape


class Run:
    """One simulated server under its closed loop, stepped in virtual time, scraped every second."""

    def __init__(self, preset: Preset, dialect: str, users: int, seed: int, noise: float) -> None:
        self.engine = Engine(preset.engine)
        self.now = 0.0
        self.rng = random.Random(seed)
        self.noise = Noise(random.Random(seed + 1), noise)
        self.load = preset.load
        self.users = users
        self.count = 0
        state = SimState(
            engine=self.engine,
            clock=lambda: self.now,
            wall_start=WALL_START,
            http=HttpCounts(),
            model="sim-model",
            model_len=self.engine.config.model_len,
        )
        self.dialect = get_dialect(dialect)
        self.pages = self.dialect.setup(state)
        self.main_path = MAIN_PAGE.get(dialect, self.dialect.metrics_path)
        self.dcgm = dcgm_registry(self.engine, lambda: self.now)
        self.scrapes: list[tuple[Scrape, Scrape]] = []
        self.totals: list[dict[str, float]] = []
        for _ in range(users):
            self._send(0.0)

    def _send(self, at: float) -> None:
        low, high = self.load.output_range()
        self.count += 1
        self.engine.add_request(SimRequest(f"r{self.count}", self.load.prompt_tokens, self.rng.randint(low, high), at))

    def _page(self, path: str) -> str:
        body, *_ = self.pages[path]()
        return body.decode()

    def _scrape(self, at: float) -> None:
        self.now = at
        stamp = WALL_START + at + self.rng.uniform(-SCRAPE_JITTER_SECONDS, SCRAPE_JITTER_SECONDS)
        main = self.noise.apply(parse_exposition(self._page(self.main_path), stamp, origin=f"sim {self.main_path}"))
        dcgm = self.noise.apply(parse_exposition(render(self.dcgm).decode(), stamp, origin="sim /dcgm/metrics"))
        self.scrapes.append((main, dcgm))
        self.totals.append(self.engine.limit_totals())

    def run(self, until: float, scrape_from: float) -> None:
        """Step to ``until``; scrape at every whole second from ``scrape_from`` on."""
        next_scrape = scrape_from
        while self.now < until:
            step = self.engine.schedule(self.now) if self.engine.has_work() else None
            end = step.end if step is not None else until
            while next_scrape <= min(end, until):
                self._scrape(next_scrape)  # the step in flight is on the GPU at this moment
                next_scrape += SCRAPE_INTERVAL_SECONDS
            if step is None:
                self.now = until
                break
            for request in self.engine.complete(step):
                if request.finished:
                    self._send(step.end)  # the user's next request, at once
            self.now = step.end

    def props(self) -> object:
        return json.loads(self._page("/props")) if "/props" in self.pages else None


def judge(run: Run, first: int, dialect: str) -> tuple[Verdict, dict[str, float], float]:
    """The verdict on the scrapes from index ``first`` to the last, the accounting's shares, the window length."""
    mains = [m for m, _ in run.scrapes[first:]]
    dcgms = [d for _, d in run.scrapes[first:]]
    signals = build_server_signals(load_probe(dialect), mains, f"sim {run.main_path}")
    if dialect == "llamacpp":
        for signal in props_signals(run.props()):
            signals.add(signal)
    merge_signal_sets(signals, build_signal_set(load_probe("dcgm"), dcgms, "sim /dcgm/metrics"))
    window = SCRAPE_INTERVAL_SECONDS * (len(run.scrapes) - 1 - first)
    shares = limit_shares(run.totals[first], run.totals[-1], window)
    return build_verdict(signals), shares, window


def cases_of(spec: GridSpec) -> Iterator[tuple[str, str, float, int]]:
    for preset in spec.presets:
        for dialect in spec.dialects:
            for level in spec.load_levels:
                for seed in spec.seeds:
                    yield preset, dialect, level, seed


def run_one(spec: GridSpec, preset_name: str, dialect: str, level: float, seed: int) -> list[SimCase]:
    """One run, judged over each window length (its last N seconds)."""
    rng = random.Random(zlib.crc32(f"{preset_name}/{dialect}/{level}/{seed}".encode()))
    preset, settings = varied(PRESETS[preset_name], level, rng)
    users = int(settings["users"])
    run = Run(preset, dialect, users, seed, spec.noise)
    longest = max(spec.windows_seconds)
    run.run(spec.warmup_seconds + longest + 1e-9, spec.warmup_seconds)
    out = []
    for window in spec.windows_seconds:
        first = len(run.scrapes) - 1 - int(window / SCRAPE_INTERVAL_SECONDS)
        verdict, shares, _ = judge(run, max(0, first), dialect)
        truth, by_class = truth_of(shares)
        out.append(SimCase(preset_name, dialect, level, window, seed, truth, by_class, verdict, settings))
    return out


def run_grid(spec: GridSpec) -> list[SimCase]:
    return [case for args in cases_of(spec) for case in run_one(spec, *args)]
