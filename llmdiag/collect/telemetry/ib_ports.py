"""InfiniBand port listings (``ibstatus``, ``ibstat``) pasted into a report, as the port signals NET016 judges.

``ibstatus`` (infiniband-diags' script over /sys/class/infiniband) prints one block per port::

    Infiniband device 'mlx5_0' port 1 status:
            default gid:     fe80:0000:0000:0000:b859:9f03:00d4:fe72
            state:           4: ACTIVE
            phys state:      5: LinkUp
            rate:            100 Gb/sec (4X EDR)
            link_layer:      InfiniBand

``ibstat`` prints one block per adapter (``CA 'mlx5_0'``) with one ``Port N:`` block per port: ``State: Active``,
``Physical state: LinkUp``, ``Rate: 200`` (Gb/s), ``Link layer: InfiniBand``. Both print one moment: the window is
a snapshot. A listing is one host's ports, so the rates are compared within it: NCCL spreads its rings over the
host's NICs and each ring runs at its slowest link, so one port trained at a lower rate than its siblings (a bad
cable or transceiver) slows every collective that crosses it.

A port whose block is cut off (a paste ends mid-block, before its state, physical state or rate) is counted as seen
and its readings are unavailable: never zero, never healthy.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from llmdiag.collect.paste import unquote_line
from llmdiag.errors import InputFileError
from llmdiag.model import Signal, SignalSet, SourceInfo, Window

PROBE = "ib-ports"
GBIT = 1e9  # both tools print Gb/s, 1e9 bits per second
HINT = "give the whole listing: ibstatus (or ibstat) on the host, every port block to its link_layer line"
VERIFY = "ibstatus  # or ibstat; mlxlink -d mlx5_N shows a port's cable and its errors"

IBSTATUS_RE = re.compile(r"^Infiniband device '([^']+)' port (\d+) status:$")
CA_RE = re.compile(r"^CA '([^']+)'$")
IBSTAT_PORT_RE = re.compile(r"^Port (\d+):$")
# ibstatus: 'state: 4: ACTIVE', 'phys state: 5: LinkUp'; ibstat: 'State: Active', 'Physical state: LinkUp'
STATE_RE = re.compile(r"^state:\s*(?:\d+:\s*)?(\w+)$", re.IGNORECASE)
PHYS_RE = re.compile(r"^(?:phys|physical) state:\s*(?:\d+:\s*)?(\w+)$", re.IGNORECASE)
# ibstatus prints the width and speed in parentheses ('100 Gb/sec (4X EDR)'): a line without the closing one is cut
IBSTATUS_RATE_RE = re.compile(r"^rate:\s*([0-9.]+) Gb/sec \(([^)]*)\)$")
IBSTAT_RATE_RE = re.compile(r"^Rate:\s*([0-9.]+)(?:\s*\([^)]*\))?$")
LAYER_RE = re.compile(r"^link[_ ]layer:\s*(\w+)$", re.IGNORECASE)


@dataclass
class Port:
    device: str
    number: int
    state: str | None = None  # 'ACTIVE', 'Active', 'DOWN' … as printed
    phys_state: str | None = None
    rate_bits_per_second: float | None = None
    width: str = ""  # ibstatus' '4X EDR'
    link_layer: str | None = None

    @property
    def name(self) -> str:
        return f"{self.device}/{self.number}"

    @property
    def whole(self) -> bool:
        """Whether the block shows what the signals need; one cut off before them has no readings."""
        return None not in (self.state, self.phys_state, self.rate_bits_per_second)

    @property
    def active(self) -> bool:
        return (self.state or "").lower() == "active"

    @property
    def link_up(self) -> bool:
        return (self.phys_state or "").lower() == "linkup"


def parse_ib_ports(text: str) -> list[Port]:
    """Every port block of an ibstatus or ibstat listing, in order; the last line of a text that ends without a
    newline is not trusted (a paste cut there may have cut its number: 'Rate: 40' of 'Rate: 400')."""
    lines = [unquote_line(line) for line in text.splitlines()]
    last = -1 if text.endswith("\n") else max((i for i, line in enumerate(lines) if line), default=-1)
    ports: list[Port] = []
    port: Port | None = None
    ca = ""
    for i, line in enumerate(lines):
        if match := IBSTATUS_RE.match(line):
            port = Port(match.group(1), int(match.group(2)))
            ports.append(port)
        elif match := CA_RE.match(line):
            ca, port = match.group(1), None
        elif ca and (match := IBSTAT_PORT_RE.match(line)):
            port = Port(ca, int(match.group(1)))
            ports.append(port)
        elif port is not None and i != last:
            _field(port, line)
    return ports


def _field(port: Port, line: str) -> None:
    if match := STATE_RE.match(line):
        port.state = match.group(1)
    elif match := PHYS_RE.match(line):
        port.phys_state = match.group(1)
    elif match := IBSTATUS_RATE_RE.match(line) or IBSTAT_RATE_RE.match(line):
        port.rate_bits_per_second = float(match.group(1)) * GBIT
        port.width = match.group(2) if match.re is IBSTATUS_RATE_RE else ""
    elif match := LAYER_RE.match(line):
        port.link_layer = match.group(1)


def looks_like_ib_ports(text: str) -> bool:
    """Whether the text holds an ibstatus or ibstat listing: a port block with a state line at least."""
    return any(port.state is not None for port in parse_ib_ports(text))


def _fabric(ports: list[Port]) -> list[Port]:
    """The active ports NCCL's rings would share: those of the link layer most active ports have (a host's
    Ethernet management NIC beside its InfiniBand rails is not compared with them); a port whose link layer line
    is cut off joins them."""
    active = [p for p in ports if p.whole and p.active and p.link_up]
    layers = Counter(p.link_layer for p in active if p.link_layer)
    if not layers:
        return active
    top = max(layers.values())
    layer = "InfiniBand" if layers.get("InfiniBand") == top else layers.most_common(1)[0][0]
    return [p for p in active if p.link_layer in (layer, None)]


def _signal(name: str, unit: str, value: float | None, why: str, source: str) -> Signal:
    if value is None:
        return Signal.missing(name, "derived", unit, why, source=source)
    return Signal(name=name, kind="derived", unit=unit, stats={"value": value}, source=source, verify=VERIFY)


def collect_ib_ports(text: str, origin: str) -> SignalSet:
    """An ibstatus or ibstat listing as the port signals: ports seen and active, the lowest and highest active
    rate, the ports not LinkUp and the ports degraded (down, or active below the host's fastest).

    Raises ``InputFileError`` when the text holds no port block.
    """
    ports = parse_ib_ports(text)
    if not ports:
        raise InputFileError(f"{origin}: no ibstatus or ibstat port block", HINT)
    whole = [p for p in ports if p.whole]
    cut = [p for p in ports if not p.whole]
    fabric = _fabric(ports)
    source = f"ib ports ({origin}): {len(ports)} port(s), one host's listing"
    none = f"every port's block is cut off before its state, physical state or rate ({len(cut)} port(s))"
    signals = SignalSet(window=Window(kind="snapshot", note="one ibstatus/ibstat listing: the ports at one moment"))
    signals.add(_signal("ib_ports_seen_count", "count", float(len(ports)), "", source))
    counted = (lambda n: float(n)) if whole else (lambda n: None)
    signals.add(_signal("ib_ports_active_count", "count", counted(sum(p.active for p in whole)), none, source))
    signals.add(_signal("ib_ports_not_linkup_count", "count", counted(sum(not p.link_up for p in whole)), none, source))
    rates = [p.rate_bits_per_second for p in fabric if p.rate_bits_per_second is not None]
    no_rate = none if not whole else "no port is active and LinkUp: no rate to read"
    lowest, highest = (min(rates), max(rates)) if rates else (None, None)
    signals.add(_signal("ib_port_rate_min_bits_per_second", "bits_per_second", lowest, no_rate, source))
    signals.add(_signal("ib_port_rate_max_bits_per_second", "bits_per_second", highest, no_rate, source))
    degraded = [p for p in whole if not (p.active and p.link_up)]
    degraded += [p for p in fabric if highest is not None and (p.rate_bits_per_second or 0.0) < highest]
    signals.add(_signal("ib_ports_degraded_count", "count", counted(len(degraded)), none, source))
    signals.sources = [_source_info(ports, degraded, origin)]
    return signals


def _source_info(ports: list[Port], degraded: list[Port], origin: str) -> SourceInfo:
    config = {}
    for port in ports:
        if not port.whole:
            config[port.name] = "cut off: its readings are unavailable"
            continue
        rate = f"{(port.rate_bits_per_second or 0.0) / GBIT:g} Gb/s" + (f" ({port.width})" if port.width else "")
        config[port.name] = f"{port.state} {port.phys_state} {rate} {port.link_layer or '(link layer cut off)'}"
    cut = sum(not p.whole for p in ports)
    note = f"{len(ports)} port(s)" + (f", {cut} cut off" if cut else "")
    if degraded:
        note += f"; degraded: {', '.join(p.name for p in degraded)}"
    return SourceInfo(probe=PROBE, url=origin, server="ib-ports", note=note, config=config)
