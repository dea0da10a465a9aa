"""llmdiag/collect/telemetry/nvml.py link_from_nvml: the link class of one GPU, read from NVML."""

from __future__ import annotations

import pytest

from llmdiag.collect.telemetry.nvml import NVML_ERROR_NOT_SUPPORTED, link_from_nvml


class FakeNvmlError(Exception):
    pass


class FakeNvml:
    """The pynvml calls link_from_nvml makes, answering like a device with these links."""

    NVMLError = FakeNvmlError

    def __init__(self, nvlinks: int = 0, version: int = 4, cc=(9, 0), pcie=(5, 16), current=(1, 16)):
        self.nvlinks, self.version, self.cc, self.pcie, self.current = nvlinks, version, cc, pcie, current

    def nvmlDeviceGetNvLinkState(self, handle, link):  # noqa: N802 - pynvml's names
        if link >= 18 or (self.nvlinks == 0 and link >= 0):
            raise FakeNvmlError("Not Supported")
        return 1 if link < self.nvlinks else 0

    def nvmlDeviceGetNvLinkVersion(self, handle, link):  # noqa: N802
        return self.version

    def nvmlDeviceGetCudaComputeCapability(self, handle):  # noqa: N802
        return self.cc

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle):  # noqa: N802
        return self.pcie[0]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle):  # noqa: N802
        return self.pcie[1]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle):  # noqa: N802
        return self.current[0]

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle):  # noqa: N802
        return self.current[1]


def test_nvml_h100_sxm_is_nvlink4():
    name, how = link_from_nvml(FakeNvml(nvlinks=18, version=4), handle=0)
    assert name == "nvlink4" and "18 active" in how


def test_nvml_partial_nvlink_and_unknown_version_falls_back_to_compute_capability():
    assert link_from_nvml(FakeNvml(nvlinks=12, version=3, cc=(8, 0)), 0)[0] == "nvlink3"
    assert link_from_nvml(FakeNvml(nvlinks=4, version=3, cc=(8, 0)), 0)[0] == "nvlink3x4"
    assert link_from_nvml(FakeNvml(nvlinks=18, version=99, cc=(10, 0)), 0)[0] == "nvlink5"


def test_nvml_pcie_uses_the_maximum_not_the_idle_downshift():
    name, how = link_from_nvml(FakeNvml(nvlinks=0, pcie=(4, 16), current=(1, 16)), 0)
    assert name == "pcie4x16"
    assert "now gen 1" in how


def test_nvml_without_link_information_says_why():
    class NoPcie(FakeNvml):
        def nvmlDeviceGetMaxPcieLinkGeneration(self, handle):  # noqa: N802
            raise FakeNvmlError("Not Supported")

    name, why = link_from_nvml(NoPcie(), 0)
    assert name is None and "Not Supported" in why


def test_nvml_errors_are_said_in_words():
    class Coded(FakeNvmlError):
        value = NVML_ERROR_NOT_SUPPORTED

    class NoPcieCoded(FakeNvml):
        def nvmlDeviceGetMaxPcieLinkGeneration(self, handle):  # noqa: N802
            raise Coded("Not Supported")

    name, why = link_from_nvml(NoPcieCoded(), 0)
    assert name is None and "not supported on this GPU (Not Supported)" in why


def test_other_errors_are_not_swallowed():
    """Only NVML's own errors mean "no link information": a bug in the caller's fake (or in llmdiag) raises."""

    class Broken(FakeNvml):
        def nvmlDeviceGetMaxPcieLinkGeneration(self, handle):  # noqa: N802
            raise TypeError("not NVML")

    with pytest.raises(TypeError):
        link_from_nvml(Broken(), 0)
