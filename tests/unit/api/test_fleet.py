"""Fleets judged from SignalSets, without servers: the recorded vLLM scenarios as replicas (their classes are the ones
the golden set pins for each scenario), instances without data as rows that say so, never healthy, and a
Prometheus evaluation's queries, scrape interval and notes carried into the report."""

from __future__ import annotations

import pytest

from llmdiag.api.fleet import fleet_from_prometheus, fleet_from_signal_sets
from llmdiag.collect.files import collect_files
from llmdiag.collect.prometheus.plan import PrometheusResult
from llmdiag.model import Bottleneck, SignalSet, SourceInfo
from tests.conftest import FIXTURES


def scenario(name: str) -> SignalSet:
    return collect_files(sorted((FIXTURES / "vllm-0.32.0" / name).glob("*.prom")))


@pytest.fixture(scope="module")
def recorded() -> dict[str, SignalSet]:
    return {"r-memory": scenario("memory"), "r-healthy": scenario("healthy"), "r-idle": scenario("idle")}


def test_each_instance_is_judged_on_its_own_signals(recorded: dict[str, SignalSet]):
    report = fleet_from_signal_sets(recorded, source="three recordings", window_seconds=10.0, at_unix=1.0)
    classes = {t.name: t.bottleneck for t in report.targets}
    assert classes == {"r-memory": Bottleneck.memory, "r-healthy": Bottleneck.healthy, "r-idle": Bottleneck.idle}
    assert report.class_counts == {"memory": 1, "healthy": 1, "idle": 1}
    assert report.targets[0].name == "r-memory"  # the one with a critical finding first
    memory = report.targets[0]
    assert memory.state == "CRITICAL" and memory.primary == "MEM001" and memory.verdict is not None
    assert memory.verdict.target == "r-memory"
    assert (report.source, report.window_seconds, report.at_unix) == ("three recordings", 10.0, 1.0)


def test_errors_are_unknown_rows_left_out_of_the_comparison(recorded: dict[str, SignalSet]):
    report = fleet_from_signal_sets({"r-healthy": recorded["r-healthy"]}, errors={"gone": "no series for it"})
    gone = next(t for t in report.targets if t.name == "gone")
    assert gone.bottleneck is Bottleneck.unknown and gone.error == "no series for it" and gone.state == "UNKNOWN"
    assert report.probed() == 1


def no_data(note: str) -> SignalSet:
    return SignalSet(sources=[SourceInfo(probe="prometheus", ok=False, note=note)])


def test_a_prometheus_instance_without_server_series_is_a_row_that_says_so(recorded: dict[str, SignalSet]):
    result = PrometheusResult(
        instances={"vllm/a:8000": recorded["r-memory"], "vllm/b:8000": no_data(""), "vllm/c:8000": no_data("down")},
        queries=14,
        notes=["scrape interval from /api/v1/targets"],
        scrape_interval_seconds=15.0,
        window_seconds=60.0,
        end_unix=1_800_000_000.0,
        prometheus_url="http://prom:9090",
    )
    report = fleet_from_prometheus(result, selector='{job="vllm"}')
    rows = {t.name: t for t in report.targets}
    assert rows["vllm/a:8000"].bottleneck is Bottleneck.memory
    assert rows["vllm/b:8000"].error == "no inference-server series in the window"  # the default reason
    assert rows["vllm/c:8000"].error == "down" and rows["vllm/c:8000"].bottleneck is Bottleneck.unknown
    assert report.source == 'prometheus http://prom:9090 {job="vllm"}'
    assert (report.queries, report.scrape_interval_seconds) == (14, 15.0)
    assert (report.window_seconds, report.at_unix) == (60.0, 1_800_000_000.0)
    assert "scrape interval from /api/v1/targets" in report.notes


def test_without_a_selector_the_source_is_the_prometheus_alone(recorded: dict[str, SignalSet]):
    result = PrometheusResult(instances={"a": recorded["r-idle"]}, prometheus_url="http://prom:9090")
    assert fleet_from_prometheus(result).source == "prometheus http://prom:9090"
