"""The probe-spec schema (probes/*.toml): every shipped spec loads and keeps the rules the schema states (a counter
becomes a rate named *_per_second, an info signal names its label, a signal is measured or fixed by design, never
both), and a spec that breaks one is refused when read, naming the field."""

from __future__ import annotations

import pytest

from llmdiag.errors import RuleSpecError
from llmdiag.schema.base import parse_toml
from llmdiag.schema.loader import load_probe, probe_names
from llmdiag.schema.probes import STAT_NAMES, ProbeSpec

HEAD = """\
name = "demo"
title = "Demo /metrics"
server = "Demo"
detect_prefixes = ["demo_"]
"""
SIGNAL = """
[[signal]]
name = "{name}"
kind = "{kind}"
unit = "requests"
metrics = ["demo_x"]
help = "h"
"""


def spec(*tables: str, head: str = HEAD) -> ProbeSpec:
    return parse_toml(ProbeSpec, "probes/demo.toml", head + "".join(tables))


def signal(name: str = "requests_running", kind: str = "gauge", **extra: str) -> str:
    return SIGNAL.format(name=name, kind=kind) + "".join(f"{k} = {v}\n" for k, v in extra.items())


def test_every_shipped_spec_loads_and_keeps_the_schemas_rules():
    names = probe_names()
    assert {"vllm", "sglang", "tgi", "llamacpp", "trtllm", "dcgm"} <= set(names)
    for name in names:
        probe = load_probe(name)
        assert probe.name == name
        for s in probe.signal:
            assert s.kind != "counter" or s.name.endswith("_per_second"), (name, s.name)
            assert s.kind != "info" or s.label, (name, s.name)
        assert not {s.name for s in probe.signal} & {b.name for b in probe.by_design}, name
        if probe.role == "server":
            assert probe.detect_prefixes, name  # a server is recognised by its page


def test_tgi_never_preempts_by_design():
    fixed = {b.name: b for b in load_probe("tgi").by_design}
    assert fixed["preemptions_per_second"].value == 0.0 and "never preempts" in fixed["preemptions_per_second"].reason


def test_a_minimal_spec_takes_the_defaults():
    probe = spec(signal())
    assert (probe.metrics_path, probe.role, probe.blank_sentinels) == ("/metrics", "telemetry", False)
    s = probe.signal[0]
    assert (s.aggregate, s.scale, s.per_gpu, s.divide_by) == ("sum", 1.0, False, None)
    assert set(STAT_NAMES["counter"]) == {"rate", "increase"}


@pytest.mark.parametrize(
    "tables, words",
    [
        ((signal("requests_total", "counter"),), "_per_second"),
        ((signal("server_info", "info"),), "label"),
        ((signal("requests_per_second", "counter", divide_by='"demo_y"'),), "divide_by applies to gauges"),
        ((signal(), signal()), "signal names repeat"),
        ((signal(), '\n[[by_design]]\nname = "requests_running"\nkind = "gauge"\nunit = "r"\nreason = "r"\n'), "both"),
        ((signal(), '\n[[by_design]]\nname = "swaps"\nkind = "counter"\nunit = "r"\nreason = "r"\n'), "_per_second"),
        ((signal(), '\n[[by_design]]\nname = "x"\nkind = "gauge"\nunit = "r"\nreason = ""\n'), "at least 1"),
        ((signal(agregate='"max"'),), "Extra inputs"),  # a typo is an error, not a silent default
        ((signal(aggregate='"median"'),), "'sum', 'mean', 'max' or 'min'"),
    ],
)
def test_a_spec_breaking_a_rule_is_refused_when_read(tables: tuple[str, ...], words: str):
    with pytest.raises(RuleSpecError) as info:
        spec(*tables)
    assert words in info.value.reason and info.value.path == "probes/demo.toml"


def test_a_detection_endpoint_is_an_absolute_path():
    with pytest.raises(RuleSpecError) as info:
        spec(signal(), head=HEAD + 'detect_json = [{ path = "info", key = "router" }]\n')
    assert info.value.field == "detect_json.0.path"
    probe = spec(signal(), head=HEAD + 'detect_json = [{ path = "/info", key = "router" }]\n')
    assert probe.detect_json[0].contains == ""
