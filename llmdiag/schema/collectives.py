"""The collectives catalogue (probes/collectives.toml): communication kernels and ops in profiler traces."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from llmdiag.schema.base import _Strict, compiled_pattern

# ---------------------------------------------------------------------------------------------
# collectives (probes/collectives.toml): which trace kernels and CPU ops are communication

COLLECTIVE_TYPES = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
    "send_recv",
    "gather",
    "scatter",
    "barrier",
)


class KernelPattern(_Strict):
    pattern: str
    family: Literal["nccl", "rccl", "symm_mem", "vllm_custom", "quick_ar", "trtllm_custom", "gloo"]
    # "": the name does not tell; the type comes from the kernel's args or its CPU op
    collective: str = ""

    _compiles = field_validator("pattern")(lambda cls, pattern: compiled_pattern(pattern))

    @field_validator("collective")
    @classmethod
    def _known(cls, collective: str) -> str:
        if collective and collective not in COLLECTIVE_TYPES:
            raise ValueError(f"unknown collective '{collective}'; one of {', '.join(COLLECTIVE_TYPES)}")
        return collective


class OpPattern(_Strict):
    pattern: str
    collective: str = ""

    _compiles = field_validator("pattern")(lambda cls, pattern: compiled_pattern(pattern))


class DeviceLink(_Strict):
    pattern: str
    link: str

    _compiles = field_validator("pattern")(lambda cls, pattern: compiled_pattern(pattern))


class CollectiveSpec(_Strict):
    kernel: list[KernelPattern] = Field(min_length=1)
    device_link: list[DeviceLink] = Field(default_factory=list)
    cpu_op: list[OpPattern] = Field(min_length=1)
    names: dict[str, str]
    bus_factor: dict[str, Literal["2(n-1)/n", "(n-1)/n", "1"]]
    dtype_bytes: dict[str, int]

    @model_validator(mode="after")
    def _names_are_types(self) -> CollectiveSpec:
        for name, collective in self.names.items():
            if collective not in COLLECTIVE_TYPES:
                raise ValueError(f"names.{name}: unknown collective '{collective}'")
        return self
