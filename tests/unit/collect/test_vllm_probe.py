"""probes/vllm.toml maps the names of every vLLM generation onto one signal vocabulary.

The old-name pages are built from the metrics catalog (shared/reference/metrics-catalog.md §1.3–1.4):
no V0 server can run here to record one.
"""

from __future__ import annotations

import pytest

from llmdiag.collect.exposition import Scrape, parse_exposition
from llmdiag.collect.signals import build_signal_set
from llmdiag.schema.loader import load_probe

SPEC = load_probe("vllm")


def page(metrics: dict[str, tuple[str, float]], labels: str = 'model_name="m"') -> str:
    """name → (type, value); histograms get a two-bucket body with the value as the count."""
    out = []
    for name, (kind, value) in metrics.items():
        base = name.removesuffix("_total") if kind == "counter" else name
        out.append(f"# TYPE {base} {kind}")
        if kind == "histogram":
            out.append(f'{name}_bucket{{{labels},le="0.1"}} {value}')
            out.append(f'{name}_bucket{{{labels},le="+Inf"}} {value}')
            out.append(f"{name}_count{{{labels}}} {value}")
            out.append(f"{name}_sum{{{labels}}} {value * 0.05}")
        else:
            out.append(f"{name}{{{labels}}} {value}")
    return "\n".join(out) + "\n"


def window(first: dict, second: dict, labels: str = 'model_name="m"'):
    scrapes = [parse_exposition(page(first, labels), 100.0), parse_exposition(page(second, labels), 110.0)]
    return build_signal_set(SPEC, scrapes, "test")


V0_NAMES = {
    "vllm:num_requests_running": ("gauge", 3),
    "vllm:num_requests_waiting": ("gauge", 2),
    "vllm:num_requests_swapped": ("gauge", 1),
    "vllm:gpu_cache_usage_perc": ("gauge", 0.97),
    "vllm:cpu_cache_usage_perc": ("gauge", 0.4),
    "vllm:num_preemptions_total": ("counter", 0),
    "vllm:generation_tokens_total": ("counter", 1000),
    "vllm:gpu_prefix_cache_queries_total": ("counter", 100),
    "vllm:gpu_prefix_cache_hits_total": ("counter", 10),
    "vllm:time_to_first_token_seconds": ("histogram", 0),
    "vllm:time_per_output_token_seconds": ("histogram", 0),
    "vllm:time_in_queue_requests": ("histogram", 0),
}


def test_v0_names_map_onto_the_signal_vocabulary():
    later = {**V0_NAMES}
    later.update(
        {
            "vllm:num_preemptions_total": ("counter", 5),
            "vllm:generation_tokens_total": ("counter", 1500),
            "vllm:gpu_prefix_cache_queries_total": ("counter", 200),
            "vllm:gpu_prefix_cache_hits_total": ("counter", 60),
            "vllm:time_to_first_token_seconds": ("histogram", 4),
            "vllm:time_per_output_token_seconds": ("histogram", 40),
            "vllm:time_in_queue_requests": ("histogram", 4),
        }
    )
    signals = window(V0_NAMES, later)
    assert signals.signals["kv_cache_usage_ratio"].stats["mean"] == pytest.approx(0.97)
    assert "gpu_cache_usage_perc" in signals.signals["kv_cache_usage_ratio"].source
    assert signals.signals["requests_swapped"].stats["mean"] == 1
    assert signals.signals["cpu_kv_cache_usage_ratio"].stats["max"] == pytest.approx(0.4)
    assert signals.signals["preemptions_per_second"].stats["rate"] == pytest.approx(0.5)
    assert signals.signals["generation_tokens_per_second"].stats["rate"] == pytest.approx(50)
    assert signals.signals["itl_seconds"].stats["count"] == 40
    assert "time_per_output_token_seconds" in signals.signals["itl_seconds"].source
    assert signals.signals["queue_time_seconds"].stats["count"] == 4
    assert signals.signals["prefix_cache_hits_per_second"].stats["rate"] == pytest.approx(5)
    # V0 counted prefix-cache lookups in blocks: the report must say the old name was used
    assert any("blocks" in note for note in signals.anomalies)
    # V0 has no engine label and no admission counter
    assert signals.signals["admission_rejections_per_second"].unavailable
    assert signals.sources[0].engines == []
    assert signals.sources[0].models == ["m"]


def test_when_both_names_are_emitted_the_new_one_wins():
    both = {"vllm:kv_cache_usage_perc": ("gauge", 0.5), "vllm:gpu_cache_usage_perc": ("gauge", 0.9)}
    signals = window(both, both)
    kv = signals.signals["kv_cache_usage_ratio"]
    assert kv.stats["mean"] == pytest.approx(0.5)
    assert kv.source.endswith("vllm:kv_cache_usage_perc")


def test_v1_names_with_engines_sum_and_keep_per_engine_values():
    first = page({"vllm:num_requests_running": ("gauge", 4)}, 'engine="0",model_name="m"')
    first += page({"vllm:num_requests_running": ("gauge", 12)}, 'engine="1",model_name="m"').split("\n", 1)[1]
    scrapes = [parse_exposition(first, 1.0), parse_exposition(first, 2.0)]
    signals = build_signal_set(SPEC, scrapes, "test")
    running = signals.signals["requests_running"]
    assert running.stats["mean"] == 16
    assert running.by_series == {"engine=0,model_name=m": 4, "engine=1,model_name=m": 12}
    assert signals.sources[0].engines == ["0", "1"]


def test_missing_metric_is_unavailable_not_zero():
    signals = window({"vllm:num_requests_running": ("gauge", 0)}, {"vllm:num_requests_running": ("gauge", 0)})
    kv = signals.signals["kv_cache_usage_ratio"]
    assert kv.unavailable and "not exposed" in kv.unavailable
    assert kv.stat("mean") is None
    assert signals.signals["requests_running"].stat("mean") == 0


def test_kv_usage_outside_zero_one_is_not_trusted():
    bad = {"vllm:kv_cache_usage_perc": ("gauge", -0.3)}
    signals = window(bad, bad)
    assert signals.signals["kv_cache_usage_ratio"].unavailable
    assert signals.signals["implausible_samples"].stats["value"] == 2


def test_single_dump_gives_lifetime_rates_from_process_start():
    text = page({"vllm:generation_tokens_total": ("counter", 5000)}) + "process_start_time_seconds 1000.0\n"
    dump = parse_exposition(text, 1100.0)
    signals = build_signal_set(SPEC, [dump], "dump", origin=Scrape(at_unix=1000.0))
    assert signals.window.kind == "lifetime"
    assert signals.signals["generation_tokens_per_second"].stats["rate"] == pytest.approx(50)
