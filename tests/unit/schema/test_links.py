"""probes/links.toml and llmdiag/schema/links.py: link names → the bus bandwidth a healthy link reaches."""

from __future__ import annotations

import pytest

from llmdiag.errors import RuleSpecError
from llmdiag.schema.links import (
    describe_link,
    expected_bus_bandwidth_bytes_per_second,
    load_links,
    parse_catalogue,
)

GB = 1e9


def test_catalogue_loads_and_every_figure_is_conservative():
    cat = load_links()
    for link in cat.link:
        assert 0 < link.expected_bus_bandwidth_bytes_per_second <= link.raw_bytes_per_second
        assert link.source
    for gen in cat.pcie:
        assert 0 < gen.expected_per_lane_bytes_per_second <= gen.raw_per_lane_bytes_per_second


@pytest.mark.parametrize(
    ("name", "low", "high"),
    [
        ("nvlink2", 100 * GB, 150 * GB),
        ("nvlink3", 200 * GB, 300 * GB),
        ("nvlink4", 300 * GB, 450 * GB),
        ("nvlink5", 500 * GB, 900 * GB),
        ("pcie3x16", 10 * GB, 16 * GB),
        ("pcie4x16", 20 * GB, 32 * GB),
        ("pcie5x16", 40 * GB, 64 * GB),
        ("ib-hdr", 20 * GB, 25 * GB),
        ("ib-ndr", 40 * GB, 50 * GB),
        ("eth-100g", 8 * GB, 12.5 * GB),
    ],
)
def test_known_classes_are_in_their_plausible_range(name, low, high):
    value = expected_bus_bandwidth_bytes_per_second(name)
    assert value is not None and low <= value <= high


def test_generations_are_ordered():
    def bw(n: str) -> float:
        v = expected_bus_bandwidth_bytes_per_second(n)
        assert v is not None
        return v

    assert bw("nvlink2") < bw("nvlink3") < bw("nvlink4") < bw("nvlink5")
    assert bw("pcie3x16") < bw("pcie4x16") < bw("pcie5x16")
    assert bw("pcie4x16") < bw("nvlink2")
    assert bw("ib-hdr") < bw("ib-ndr")


def test_generic_widths_and_link_counts_scale_linearly():
    assert expected_bus_bandwidth_bytes_per_second("pcie4x8") == pytest.approx(
        expected_bus_bandwidth_bytes_per_second("pcie4x16") / 2
    )
    assert expected_bus_bandwidth_bytes_per_second("nvlink4x9") == pytest.approx(
        expected_bus_bandwidth_bytes_per_second("nvlink4") / 2
    )
    assert describe_link("PCIe4x8").name == "pcie4x8"  # case-insensitive
    assert "8 of 18" in describe_link("nvlink4x8").title


@pytest.mark.parametrize("name", ["", "bogus", "pcie9x16", "pcie4x3", "nvlink4x19", "nvlink4x0", "nvlink9", "ib-"])
def test_unknown_names_are_none_not_zero(name):
    assert expected_bus_bandwidth_bytes_per_second(name) is None
    assert describe_link(name) is None


def test_a_bad_table_is_a_rule_spec_error():
    bad = """
[[link]]
name = "nvlink3"
title = "x"
links = 12
raw_bytes_per_second = 100e9
expected_bus_bandwidth_bytes_per_second = 200e9
source = "s"

[[pcie]]
generation = 4
raw_per_lane_bytes_per_second = 2e9
expected_per_lane_bytes_per_second = 1.5e9
source = "s"
"""
    with pytest.raises(RuleSpecError, match="cannot exceed"):
        parse_catalogue(bad)
    with pytest.raises(RuleSpecError, match="links"):
        parse_catalogue(bad.replace("links = 12\n", "").replace("200e9", "50e9"))
