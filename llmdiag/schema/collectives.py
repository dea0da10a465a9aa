"""The collectives catalogue (probes/collectives.toml): communication kernels and ops in profiler traces."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from llmdiag.schema.base import _Strict

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

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        return pattern

    @field_validator("collective")
    @classmethod
    def _known(cls, collective: str) -> str:
        if collective and collective not in COLLECTIVE_TYPES:
            raise ValueError(f"unknown collective '{collective}'; one of {', '.join(COLLECTIVE_TYPES)}")
        return collective


class OpPattern(_Strict):
    pattern: str
    collective: str = ""

    _compiles = field_validator("pattern")(KernelPattern._compiles.__func__)  # type: ignore[attr-defined]


class DeviceLink(_Strict):
    pattern: str
    link: str

    _compiles = field_validator("pattern")(KernelPattern._compiles.__func__)  # type: ignore[attr-defined]


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
