"""The known vLLM 0.32 CPU states: server settings and load for each.

Shared by the end-to-end tests (test_vllm_states.py) and the fixture recorder
(record_fixtures.py) so both put the server in exactly the same state.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StateSpec:
    name: str
    expected: str  # bottleneck class llmdiag should report
    model: str = "tiny"  # "tiny" or "dummy139m"
    extra_args: tuple[str, ...] = ()
    kvcache_space_gib: int | None = 1  # None: VLLM_CPU_KVCACHE_SPACE unset
    engine_nice: int | None = 19  # None: engine processes not reniced
    users: int = 0  # 0: no load
    prompt_tokens: int = 64
    output_tokens: int = 128
    notes: str = ""

    @property
    def served_model_name(self) -> str:
        return "dummy-llama-139m" if self.model == "dummy139m" else "tiny-llama"

    @property
    def server_args(self) -> tuple[str, ...]:
        if self.model == "dummy139m":
            return ("--load-format", "dummy", *self.extra_args)
        return self.extra_args


STATES: dict[str, StateSpec] = {
    s.name: s
    for s in (
        StateSpec("idle", "idle", notes="default server, no requests"),
        StateSpec(
            "healthy",
            "healthy",
            users=4,
            prompt_tokens=64,
            output_tokens=128,
            notes="default server (1 GiB KV cache), light load",
        ),
        StateSpec(
            "scheduling",
            "scheduling",
            extra_args=("--max-num-seqs", "2"),
            users=32,
            prompt_tokens=64,
            output_tokens=128,
            notes="batch capped at 2 sequences; queue builds with KV nearly empty",
        ),
        StateSpec(
            "memory",
            "memory",
            extra_args=("--kv-cache-memory-bytes", "2097152", "--max-model-len", "1536"),
            kvcache_space_gib=None,
            users=32,
            prompt_tokens=640,
            output_tokens=640,
            notes="KV cache of 16 blocks x 128 tokens; VLLM_CPU_KVCACHE_SPACE unset (it would override the flag)",
        ),
        StateSpec(
            "admission",
            "scheduling",
            extra_args=("--max-num-seqs", "2", "--max-num-queued-reqs", "8"),
            users=32,
            prompt_tokens=64,
            output_tokens=128,
            notes="queue capped at 8: extra requests get HTTP 503",
        ),
        StateSpec(
            "compute",
            "compute",
            model="dummy139m",
            users=16,
            prompt_tokens=512,
            output_tokens=64,
            notes="139 M-parameter model with random weights (--load-format dummy)",
        ),
        # Not recorded by default: the scheduling state with the engine processes
        # left at nice 0, where the front end and the scraper starve (see
        # VllmServer's docstring). Its committed dumps come from the first run.
        StateSpec(
            "scheduling-starved",
            "scheduling",
            extra_args=("--max-num-seqs", "2"),
            users=32,
            prompt_tokens=64,
            output_tokens=128,
            engine_nice=None,
            notes="scheduling with the engine processes not reniced",
        ),
    )
}
