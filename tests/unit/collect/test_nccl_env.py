"""Where a benchmark rank runs: torchrun's variables read, the message-size cap and why, and the link it crosses
(or why it is unknown: one rank, several nodes, CPU ranks), never a made-up figure. On a CPU-only torch."""

from __future__ import annotations

import psutil
import pytest

from llmdiag.model import NcclBenchOptions
from llmdiag.schema.links import describe_link

torch = pytest.importorskip("torch", reason="the torch extra (llmdiag[torch], in llmdiag[test]) is not installed")

from llmdiag.collect.nccl.env import (  # noqa: E402  (imports torch)
    DEFAULT_GLOO_MAX_BYTES,
    Env,
    detect_link,
    memory_peak,
    read_env,
    size_cap,
)

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="these read a CPU-only machine's ranks")


def cpu_env(world_size: int = 2, local_world_size: int = 2) -> Env:
    return Env(0, world_size, 0, local_world_size, "gloo", "cpu", "x86_64", torch.__version__)


def options(**extra: object) -> NcclBenchOptions:
    return NcclBenchOptions(sizes=[1024], ops=["all_reduce"], **extra)  # type: ignore[arg-type]


def test_torchruns_variables_make_the_rank_and_a_cpu_rank_uses_gloo(monkeypatch: pytest.MonkeyPatch):
    for name, value in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    env = read_env()
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 4, 1, 2)
    assert (env.backend, env.device, env.cuda, env.nodes) == ("gloo", "cpu", False, 2)
    assert env.torch_version == torch.__version__


def test_without_torchrun_it_is_one_rank(monkeypatch: pytest.MonkeyPatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    env = read_env()
    assert (env.rank, env.world_size, env.local_world_size, env.nodes) == (0, 1, 1, 1)


def test_nodes_are_the_world_over_the_ranks_per_node():
    assert cpu_env(16, 8).nodes == 2 and cpu_env(9, 8).nodes == 2 and cpu_env(1, 0).nodes == 1


def test_the_size_cap_is_the_smallest_of_the_flag_gloos_default_and_memory():
    assert size_cap(cpu_env(), options(max_size_bytes=1 << 20)) == (1 << 20, "max_size")
    cap, why = size_cap(cpu_env(), options())
    assert cap == DEFAULT_GLOO_MAX_BYTES and "gloo default" in why  # this machine has more than 4 x 64 MiB free
    cap, why = size_cap(cpu_env(), options(max_size_bytes=1 << 60))  # more than any host: memory decides
    assert "host memory" in why and cap <= psutil.virtual_memory().total // 2 // 4  # a quarter of a local rank's share


def test_a_link_given_by_name_is_the_catalogues():
    link = detect_link(cpu_env(), "NVLink4")
    known = describe_link("nvlink4")
    assert known is not None
    assert (link.name, link.how, link.unavailable) == ("nvlink4", "link", None)
    assert link.expected_bus_bandwidth_bytes_per_second == known.expected_bus_bandwidth_bytes_per_second == 360e9


@pytest.mark.parametrize(
    "env, words",
    [(cpu_env(1, 1), "one rank"), (cpu_env(16, 8), "several nodes"), (cpu_env(2, 2), "CPU ranks")],
)
def test_without_a_name_the_link_is_unavailable_with_the_reason(env: Env, words: str):
    link = detect_link(env, None)
    assert link.name is None and link.expected_bus_bandwidth_bytes_per_second is None
    assert link.unavailable is not None and words in link.unavailable


def test_host_memory_has_no_nvml_peak():
    peak, how = memory_peak(cpu_env())
    assert peak is None and "host memory" in how
