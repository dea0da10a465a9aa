"""Named simulator setups, each with the bounded load that puts it in one state.

A preset is a deployment (GPU, model, TP, link), the engine's flags, and a closed-loop load: ``users`` clients
each sending one request of ``prompt_tokens`` prompt and ``output_tokens`` output tokens, the next as soon as the
previous ends; output lengths spread ±50 % around the mean so that users do not move in lockstep. The numbers
below are the physics' (``llmdiag.physics.step``, efficiencies 1, 2 ms host overhead):

    healthy     Llama 3 8B on one H100, vLLM defaults; 32 users × (256 + 128). ~7 ms decode steps (HBM-bound),
                KV ~2 % of 461k tokens, nobody waits.
    memory      Llama 3 8B on one H100 with --gpu-memory-utilization 0.25 (a GPU shared with another job): the
                weights leave 3 GB, 1,512 blocks = 24k tokens of KV; 32 users × (1024 + ~512) want ~49k. The pool
                fills, running requests are preempted and recomputed, the rest queue.
    compute     Llama 3 8B on one L4 (300 GB/s GDDR6): every decode step streams 16 GB of weights, ~61 ms per
                step, ~70 ms for a 512-token prompt; 12 users × (512 + ~128) use about a quarter of the KV.
    scheduling  the healthy deployment with --max-num-seqs 4; 32 users × (256 + 128). Steps stay ~7 ms and KV near
                empty while 28 requests queue for a batch slot.
    network     Llama 3 70B on 8 × A100 with the ranks talking over PCIe Gen4 (no NVLink): each step all-reduces
                the hidden state 160 times; ~10–16 ms of a ~22–30 ms decode step and ~100 ms of a 512-token prefill
                are the link. vLLM's metrics cannot show it; the DCGM page shows PCIe bytes high and SMs idle.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmdiag.errors import UsageError
from llmdiag.physics.hardware import GPUS, MODELS, interconnect_for
from llmdiag.physics.step import Deployment
from llmdiag.sim.engine import EngineConfig


@dataclass(frozen=True)
class LoadSpec:
    """A closed loop: ``users`` requests in flight at once, each ``prompt_tokens`` in and ``output_tokens`` out.

    ``output_spread`` s draws each request's output uniformly from O·(1 − s) … O·(1 + s) (mean O, seeded): equal
    lengths keep a closed loop's users in lockstep, so they finish together and flood the next step with prompts,
    which real traffic does not do.
    """

    users: int
    prompt_tokens: int
    output_tokens: int
    output_spread: float = 0.0

    def __post_init__(self) -> None:
        if self.users < 1 or self.prompt_tokens < 1 or self.output_tokens < 1:
            raise UsageError("a load needs at least one user, one prompt token and one output token")
        if not 0 <= self.output_spread < 1:
            raise UsageError(f"output_spread must be in [0, 1), got {self.output_spread:g}")

    def output_range(self) -> tuple[int, int]:
        low = max(1, round(self.output_tokens * (1 - self.output_spread)))
        return low, max(low, round(self.output_tokens * (1 + self.output_spread)))


@dataclass(frozen=True)
class Preset:
    name: str
    expected: str  # the class llmdiag should name: healthy, memory, compute, scheduling or network
    summary: str  # one line: what is wrong, in the user's words
    engine: EngineConfig
    load: LoadSpec

    @property
    def deployment(self) -> Deployment:
        return self.engine.deployment


H100, A100, L4 = GPUS["H100"], GPUS["A100"], GPUS["L4"]
LLAMA8, LLAMA70 = MODELS["llama-3-8b"], MODELS["llama-3-70b"]
SPREAD = 0.5

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "healthy",
            "healthy",
            "Llama 3 8B on an H100 with room to spare",
            EngineConfig(Deployment(H100, LLAMA8)),
            LoadSpec(users=32, prompt_tokens=256, output_tokens=128, output_spread=SPREAD),
        ),
        Preset(
            "memory",
            "memory",
            "Llama 3 8B on an H100 given a quarter of its memory: 3 GB of KV for long requests",
            EngineConfig(Deployment(H100, LLAMA8, gpu_memory_utilization=0.25)),
            LoadSpec(users=32, prompt_tokens=1024, output_tokens=512, output_spread=SPREAD),
        ),
        Preset(
            "compute",
            "compute",
            "Llama 3 8B on an L4: every step streams the weights over slow GDDR6",
            EngineConfig(Deployment(L4, LLAMA8)),
            LoadSpec(users=12, prompt_tokens=512, output_tokens=128, output_spread=SPREAD),
        ),
        Preset(
            "scheduling",
            "scheduling",
            "Llama 3 8B on an H100 capped at --max-num-seqs 4",
            EngineConfig(Deployment(H100, LLAMA8), max_num_seqs=4),
            LoadSpec(users=32, prompt_tokens=256, output_tokens=128, output_spread=SPREAD),
        ),
        Preset(
            "network",
            "network",
            "Llama 3 70B on 8 A100s over PCIe Gen4: every step waits on all-reduces",
            EngineConfig(Deployment(A100, LLAMA70, tp=8, interconnect=interconnect_for(A100, "pcie4"))),
            LoadSpec(users=64, prompt_tokens=512, output_tokens=128, output_spread=SPREAD),
        ),
    )
}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name.strip().lower()]
    except KeyError:
        raise UsageError(f"unknown preset '{name}'", f"known presets: {', '.join(PRESETS)}") from None
