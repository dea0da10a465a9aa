"""InfiniBand port listings (llmdiag.collect.telemetry.ib_ports) on real ibstatus and ibstat outputs
(tests/fixtures/ib, provenance in its README) and the field corpus's NCCL report. Every expected figure is read off
the fixture text by eye: a port's state, physical state and rate as printed.
"""

from __future__ import annotations

import pytest

from llmdiag.collect.evidence import classify, collect_evidence, read_head
from llmdiag.collect.telemetry.ib_ports import collect_ib_ports, looks_like_ib_ports, parse_ib_ports
from llmdiag.errors import InputFileError
from llmdiag.model import SignalSet
from tests.conftest import FIXTURES

LISTINGS = FIXTURES / "ib"
FIELD_REPORT = FIXTURES / "field" / "nccl-ib-busbw-half-of-expected-misconfig" / "nccl.log"
NAMES = (
    "ib_ports_seen_count",
    "ib_ports_active_count",
    "ib_ports_not_linkup_count",
    "ib_port_rate_min_bits_per_second",
    "ib_port_rate_max_bits_per_second",
    "ib_ports_degraded_count",
)


def collect(name: str) -> SignalSet:
    return collect_ib_ports((LISTINGS / name).read_text(), name)


def values(signals: SignalSet) -> tuple[float | None, ...]:
    return tuple(signals.signals[name].stat("value") for name in NAMES)


@pytest.mark.parametrize("name", sorted(p.name for p in LISTINGS.glob("*.txt")))
def test_every_listing_is_recognised_and_taken_by_its_kind(name: str):
    assert looks_like_ib_ports((LISTINGS / name).read_text())
    assert classify(read_head(LISTINGS / name)).name == "ib-ports"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # mlx5_0 '4: ACTIVE' '5: LinkUp' '200 Gb/sec (4X HDR)'; mlx5_1 '1: DOWN' '3: Disabled' '10 Gb/sec (4X)'
        ("nccl489-ibstatus-hdr-one-port-disabled.txt", (2, 1, 1, 200e9, 200e9, 1)),
        # three ports 200 Gb/sec (4X HDR) ACTIVE; mlx5_3's rate cut at '40 Gb/sec (4': seen, not read
        ("nccl1412-ibstatus-hdr-x3-cut.txt", (4, 3, 0, 200e9, 200e9, 0)),
        # Port 1 'State: Down' 'Physical state: Disabled' 'Rate: 10'; Port 2 Active LinkUp 'Rate: 56', then cut
        ("rdma-core847-ibstat-mlx4-port1-down.txt", (2, 1, 1, 56e9, 56e9, 1)),
        # mlx5_5 Active LinkUp 'Rate: 400'
        ("nccl1591-ibstat-ndr-one-ca.txt", (1, 1, 0, 400e9, 400e9, 0)),
        # mlx5_10 'State: Down' 'Physical state: Polling' 'Rate: 10': no active port, so no rate to compare
        ("gpud482-ibstat-polling.txt", (1, 0, 1, None, None, 1)),
    ],
)
def test_listing_figures_as_printed(name: str, expected: tuple[float | None, ...]):
    signals = collect(name)
    assert values(signals) == expected
    assert signals.window.kind == "snapshot"


def test_a_port_cut_off_mid_block_is_seen_with_its_readings_unavailable():
    # the field report's ibstatus stops in mlx5_1's gid: mlx5_0 is '4: ACTIVE' '5: LinkUp' '100 Gb/sec (4X EDR)'
    signals = collect_ib_ports(FIELD_REPORT.read_text(), "nccl.log")
    assert values(signals) == (2, 1, 0, 100e9, 100e9, 0)
    config = signals.sources[0].config
    assert config["mlx5_0/1"] == "ACTIVE LinkUp 100 Gb/s (4X EDR) InfiniBand"
    assert config["mlx5_1/1"].startswith("cut off")


def test_the_field_report_with_prose_around_its_listing_is_read_not_refused():
    head = read_head(FIELD_REPORT)
    assert classify(head).name == "ib-ports"
    signals = collect_evidence([FIELD_REPORT])
    assert signals.signals["ib_port_rate_max_bits_per_second"].stat("value") == 100e9


def test_a_rate_cut_at_the_end_of_a_paste_is_not_read():
    # 'Rate: 40' at the very end, no newline: it may be the start of 'Rate: 400'
    text = (LISTINGS / "nccl1591-ibstat-ndr-one-ca.txt").read_text().split("Rate: 400")[0] + "Rate: 40"
    ports = parse_ib_ports(text)
    assert [(p.name, p.state, p.rate_bits_per_second) for p in ports] == [("mlx5_5/1", "Active", None)]
    signals = collect_ib_ports(text, "cut")
    assert signals.signals["ib_ports_seen_count"].stat("value") == 1
    assert signals.signals["ib_ports_degraded_count"].unavailable


def test_an_active_port_slower_than_its_siblings_is_degraded():
    # nccl#489's listing with mlx5_1's state, phys state and rate lines swapped for those of nccl#307's mlx5_0
    # ('4: ACTIVE', '5: LinkUp', '100 Gb/sec (4X EDR)'): real lines, none of their numbers changed
    text = (LISTINGS / "nccl489-ibstatus-hdr-one-port-disabled.txt").read_text()
    edr = FIELD_REPORT.read_text()
    state, phys, rate = (
        next(line for line in edr.splitlines() if line.strip().startswith(key)) for key in ("state:", "phys", "rate:")
    )
    down, disabled, slow = "        state:           1: DOWN", "        phys state:      3: Disabled", "(4X)"
    text = text.replace(down, state).replace(disabled, phys)
    text = text.replace(next(line for line in text.splitlines() if slow in line), rate)
    signals = collect_ib_ports(text, "mixed")
    assert values(signals) == (2, 2, 0, 100e9, 200e9, 1)
    assert "degraded: mlx5_1/1" in signals.sources[0].note


def test_prose_and_other_outputs_are_not_port_listings():
    assert not looks_like_ib_ports("Infiniband is slow, state: unknown\nrate: 100 Gb/sec\n")
    nccl_tests = sorted((FIXTURES / "nccl" / "nccl-tests").glob("*.txt"))[0]
    assert not looks_like_ib_ports(nccl_tests.read_text())
    with pytest.raises(InputFileError):
        collect_ib_ports("Rate: 200\n", "x")
