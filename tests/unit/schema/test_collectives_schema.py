"""probes/collectives.toml's schema: the shipped catalogue loads and types the kernels and boards it names (first
match wins, as the file says), its bus factors are nccl-tests', and a bad entry is refused when the file is read,
naming the field."""

from __future__ import annotations

import re

import pytest

from llmdiag.collect.nccl.busbw import bus_factor
from llmdiag.errors import RuleSpecError
from llmdiag.schema.base import parse_toml
from llmdiag.schema.collectives import COLLECTIVE_TYPES, CollectiveSpec
from llmdiag.schema.loader import load_collectives

GOOD = """\
cpu_op = [{ pattern = "^c10d::", collective = "" }]
names = { allreduce = "all_reduce" }
bus_factor = { all_reduce = "2(n-1)/n" }
dtype_bytes = { Float = 4 }
"""


def kernel_type(name: str) -> tuple[str, str] | None:
    spec = load_collectives()
    found = next((k for k in spec.kernel if re.search(k.pattern, name)), None)
    return (found.family, found.collective) if found else None


@pytest.mark.parametrize(
    "kernel, typed",
    [
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", ("nccl", "all_reduce")),
        ("ncclKernel_AllGather_RING_LL_Sum_int8_t", ("nccl", "all_gather")),
        ("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", ("nccl", "send_recv")),
        ("ncclDevKernel_Generic(ncclDevComm*, unsigned long, ncclWork*)", ("rccl", "")),  # before nccl's catch-all
        ("ncclDevKernel_SomethingNew", ("nccl", "")),
        ("void multimem_all_reduce_kernel<c10::BFloat16>(...)", ("symm_mem", "all_reduce")),
        ("void at::native::vectorized_elementwise_kernel<4>(...)", None),
    ],
)
def test_the_shipped_patterns_type_the_kernels(kernel: str, typed: tuple[str, str] | None):
    assert kernel_type(kernel) == typed


@pytest.mark.parametrize(
    "device, link",
    [("NVIDIA H100 80GB HBM3", "nvlink4"), ("NVIDIA A100-SXM4-80GB", "nvlink3"), ("NVIDIA B200", "nvlink5")],
)
def test_sxm_boards_imply_their_nvlink(device: str, link: str):
    assert next(d.link for d in load_collectives().device_link if re.search(d.pattern, device)) == link


def test_bus_factors_are_the_benchmarks_own():
    formulas = {"2(n-1)/n": lambda n: 2 * (n - 1) / n, "(n-1)/n": lambda n: (n - 1) / n, "1": lambda n: 1.0}
    factors = load_collectives().bus_factor
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        assert formulas[factors[op]](8) == bus_factor(op, 8)
    assert set(load_collectives().names.values()) <= set(COLLECTIVE_TYPES)


@pytest.mark.parametrize(
    "extra, field",
    [
        ('kernel = [{ pattern = "^x", family = "nccl", collective = "allreduce" }]', "kernel.0.collective"),
        ('kernel = [{ pattern = "^x(", family = "nccl" }]', "kernel.0.pattern"),
        ('kernel = [{ pattern = "^x", family = "mpi" }]', "kernel.0.family"),
        ('kernel = [{ pattern = "^x", family = "nccl", colective = "" }]', "kernel.0.colective"),
        ("kernel = []", "kernel"),
    ],
)
def test_a_bad_kernel_entry_is_refused_naming_its_field(extra: str, field: str):
    with pytest.raises(RuleSpecError) as info:
        parse_toml(CollectiveSpec, "probes/collectives.toml", extra + "\n" + GOOD)
    assert info.value.field == field and "probes/collectives.toml" in str(info.value)


def test_names_must_be_known_collective_types():
    text = 'kernel = [{ pattern = "^x", family = "nccl" }]\n' + GOOD.replace('"all_reduce" }', '"all-reduce" }', 1)
    with pytest.raises(RuleSpecError, match="all-reduce"):
        parse_toml(CollectiveSpec, "probes/collectives.toml", text)
    good = parse_toml(CollectiveSpec, "p", 'kernel = [{ pattern = "^x", family = "nccl" }]\n' + GOOD)
    assert good.kernel[0].collective == ""  # not told by the name
