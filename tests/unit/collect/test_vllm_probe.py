"""probes/vllm.toml beyond its names: per-engine sums, the valid range, lifetime rates from one dump.

Which wire names of which vLLM generation map onto which signal (V0, 0.8, 0.10, 0.33) is tested as data in
tests/probes/vllm.toml, run by tests/probes/test_probe_cases.py.
"""

from __future__ import annotations

import pytest

from llmdiag.collect.exposition import Scrape, parse_exposition
from llmdiag.collect.signals import build_signal_set
from llmdiag.schema.loader import load_probe

SPEC = load_probe("vllm")


def page(metrics: dict[str, tuple[str, float]], labels: str = 'model_name="m"') -> str:
    """name → (type, value), one series each with ``labels``."""
    out = []
    for name, (kind, value) in metrics.items():
        out.append(f"# TYPE {name} {kind}")
        out.append(f"{name}{{{labels}}} {value}")
    return "\n".join(out) + "\n"


def test_v1_names_with_engines_sum_and_keep_per_engine_values():
    first = page({"vllm:num_requests_running": ("gauge", 4)}, 'engine="0",model_name="m"')
    first += page({"vllm:num_requests_running": ("gauge", 12)}, 'engine="1",model_name="m"').split("\n", 1)[1]
    scrapes = [parse_exposition(first, 1.0), parse_exposition(first, 2.0)]
    signals = build_signal_set(SPEC, scrapes, "test")
    running = signals.signals["requests_running"]
    assert running.stats["mean"] == 16
    assert running.by_series == {"engine=0,model_name=m": 4, "engine=1,model_name=m": 12}
    assert signals.sources[0].engines == ["0", "1"]


def test_kv_usage_outside_zero_one_is_not_trusted():
    bad = page({"vllm:kv_cache_usage_perc": ("gauge", -0.3)})
    signals = build_signal_set(SPEC, [parse_exposition(bad, 100.0), parse_exposition(bad, 110.0)], "test")
    assert signals.signals["kv_cache_usage_ratio"].unavailable
    assert signals.signals["implausible_samples"].stats["value"] == 2


def test_single_dump_gives_lifetime_rates_from_process_start():
    text = page({"vllm:generation_tokens_total": ("counter", 5000)}) + "process_start_time_seconds 1000.0\n"
    dump = parse_exposition(text, 1100.0)
    signals = build_signal_set(SPEC, [dump], "dump", origin=Scrape(at_unix=1000.0))
    assert signals.window.kind == "lifetime"
    assert signals.signals["generation_tokens_per_second"].stats["rate"] == pytest.approx(50)
