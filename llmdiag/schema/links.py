"""Inter-GPU link classes and the bus bandwidth a healthy one reaches (data: probes/links.toml).

    expected_bus_bandwidth_bytes_per_second("nvlink3")   -> 220e9
    expected_bus_bandwidth_bytes_per_second("pcie4x8")   -> 12e9   (per-lane figure x width)
    expected_bus_bandwidth_bytes_per_second("nvlink4x8") -> 160e9  (8 of 18 links active)
    expected_bus_bandwidth_bytes_per_second("bogus")     -> None   (unknown: a caller reports "unavailable")

Bus bandwidth is nccl-tests' "busbw": per GPU, per direction, independent of the rank count, so one figure per
link class compares with any all_reduce / all_gather / reduce_scatter / all_to_all measurement. Naming only: the
NVML reading that finds a GPU's link is llmdiag.collect.telemetry.nvml.link_from_nvml, which names it with
``nvlink_name`` and ``describe_link``.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from pydantic import Field, model_validator

from llmdiag.schema.base import _Strict, parse_toml

LINK_NAME = re.compile(r"^(?:nvlink(?P<nv>[1-9])(?:x(?P<links>\d+))?|pcie(?P<gen>[1-9])x(?P<width>\d+)|[a-z0-9-]+)$")
# compute capability major -> NVLink generation, for when NVML's version number is missing or out of range
NVLINK_BY_COMPUTE_MAJOR = {7: 2, 8: 3, 9: 4, 10: 5}
PCIE_WIDTHS = (1, 2, 4, 8, 12, 16, 32)


class LinkSpec(_Strict):
    name: str = Field(pattern=r"^[a-z0-9-]+$")
    title: str
    # NVLink: the link count of a full SXM board; a GPU with fewer active links scales per link
    links: int | None = Field(default=None, ge=1)
    raw_bytes_per_second: float = Field(gt=0)
    expected_bus_bandwidth_bytes_per_second: float = Field(gt=0)
    source: str = Field(min_length=1)

    @model_validator(mode="after")
    def _below_raw(self) -> LinkSpec:
        if self.expected_bus_bandwidth_bytes_per_second > self.raw_bytes_per_second:
            raise ValueError("expected bus bandwidth cannot exceed the raw link rate")
        if self.name.startswith("nvlink") != (self.links is not None):
            raise ValueError("'links' is required for nvlink classes and only for them")
        return self


class PcieGeneration(_Strict):
    generation: int = Field(ge=1, le=9)
    raw_per_lane_bytes_per_second: float = Field(gt=0)
    expected_per_lane_bytes_per_second: float = Field(gt=0)
    source: str = Field(min_length=1)

    @model_validator(mode="after")
    def _below_raw(self) -> PcieGeneration:
        if self.expected_per_lane_bytes_per_second > self.raw_per_lane_bytes_per_second:
            raise ValueError("expected per-lane bandwidth cannot exceed the raw rate")
        return self


class LinkCatalogue(_Strict):
    link: list[LinkSpec] = Field(min_length=1)
    pcie: list[PcieGeneration] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> LinkCatalogue:
        names = [link.name for link in self.link]
        if len(set(names)) != len(names):
            raise ValueError("link names must be unique")
        gens = [p.generation for p in self.pcie]
        if len(set(gens)) != len(gens):
            raise ValueError("PCIe generations must be unique")
        return self


class LinkDescription(_Strict):
    """One resolved link name: what it is and the busbw a healthy one reaches."""

    name: str
    title: str
    raw_bytes_per_second: float
    expected_bus_bandwidth_bytes_per_second: float
    source: str


def parse_catalogue(text: str, display_path: str = "probes/links.toml") -> LinkCatalogue:
    return parse_toml(LinkCatalogue, display_path, text)


@cache
def load_links() -> LinkCatalogue:
    entry = resources.files("llmdiag.probes") / "links.toml"
    return parse_catalogue(entry.read_text(encoding="utf-8"))


def describe_link(name: str, catalogue: LinkCatalogue | None = None) -> LinkDescription | None:
    """Resolve a link name (case-insensitive); None when it is not a known class."""
    cat = catalogue or load_links()
    key = name.strip().lower()
    match = LINK_NAME.match(key)
    if not match:
        return None
    if match["gen"]:
        gen, width = int(match["gen"]), int(match["width"])
        per_lane = next((p for p in cat.pcie if p.generation == gen), None)
        if per_lane is None or width not in PCIE_WIDTHS:
            return None
        return LinkDescription(
            name=key,
            title=f"PCIe {gen}.0 x{width}",
            raw_bytes_per_second=per_lane.raw_per_lane_bytes_per_second * width,
            expected_bus_bandwidth_bytes_per_second=per_lane.expected_per_lane_bytes_per_second * width,
            source=f"per-lane figure x {width} lanes; {per_lane.source}",
        )
    base = next((link for link in cat.link if link.name == (f"nvlink{match['nv']}" if match["nv"] else key)), None)
    if base is None:
        return None
    if match["links"]:
        links = int(match["links"])
        if not base.links or not 1 <= links <= base.links:
            return None
        share = links / base.links
        return LinkDescription(
            name=key,
            title=f"{base.title.split(' (')[0]}, {links} of {base.links} links active",
            raw_bytes_per_second=base.raw_bytes_per_second * share,
            expected_bus_bandwidth_bytes_per_second=base.expected_bus_bandwidth_bytes_per_second * share,
            source=f"{base.name} x {links}/{base.links} links; {base.source}",
        )
    return LinkDescription(**base.model_dump(exclude={"links"}))


def expected_bus_bandwidth_bytes_per_second(link: str) -> float | None:
    """The busbw a healthy link of this class reaches (bytes/s, per GPU, per direction); None when unknown."""
    found = describe_link(link)
    return None if found is None else found.expected_bus_bandwidth_bytes_per_second


def known_link_names() -> list[str]:
    """Every name accepted, with the generic families spelt as patterns (for --help and error hints)."""
    return [link.name for link in load_links().link] + ["nvlink<gen>x<links>", "pcie<gen>x<width>"]


def nvlink_name(version: int | None, active_links: int, compute_major: int | None = None) -> str | None:
    """nvlink<gen> when every link of a full board is up, nvlink<gen>x<n> for fewer; None without NVLink."""
    if active_links <= 0:
        return None
    gen = version if version in (2, 3, 4, 5) else NVLINK_BY_COMPUTE_MAJOR.get(compute_major or -1)
    if gen is None:
        return None
    base = describe_link(f"nvlink{gen}")
    full = next(link.links for link in load_links().link if link.name == f"nvlink{gen}")
    if base is None or full is None:
        return None
    return f"nvlink{gen}" if active_links >= full else f"nvlink{gen}x{active_links}"
