"""A check report as Prometheus metrics: node_exporter's textfile collector, or a Pushgateway.

Every run builds a fresh ``CollectorRegistry`` (nothing lingers from a previous run or from the process) and
``prometheus_client.write_to_textfile`` writes it: the text goes to ``<path>.<pid>.<thread>`` first and is
renamed over ``<path>`` (rename(2) is atomic), so node_exporter reads the old file or the new one, never half
of either; a check killed mid-write leaves the old file and a stray temporary file that the next run removes.
The collector reads only ``*.prom``, so it never sees the temporary file.

Metric names follow the Prometheus conventions: base units in the name, a state as 0/1 per label value.
A signal that could not be measured is left out, never written as 0.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import CollectorRegistry, push_to_gateway, write_to_textfile
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from llmdiag.model import Bottleneck
from llmdiag.model.check import CheckReport, TargetResult

TEXTFILE_NAME = "llmdiag.prom"
PUSH_JOB = "llmdiag"
# (metric, help, signal, stat): one gauge per target
SIGNAL_GAUGES = (
    (
        "llmdiag_kv_cache_usage_peak_ratio",
        "Highest KV-cache usage seen in the check's window (0-1).",
        "kv_cache_usage_ratio",
        "max",
    ),
    ("llmdiag_requests_running", "Mean requests running in the window.", "requests_running_avg", "value"),
    ("llmdiag_requests_waiting", "Mean requests waiting in the window.", "requests_waiting_avg", "value"),
    (
        "llmdiag_generation_tokens_per_second",
        "Output tokens per second in the window.",
        "generation_tokens_per_second",
        "rate",
    ),
    ("llmdiag_preemptions_per_second", "Preemptions per second in the window.", "preemptions_per_second", "rate"),
)
# (metric, help, histogram signal): one gauge per target and quantile, from the window's bucket deltas
QUANTILE_GAUGES = (
    ("llmdiag_ttft_seconds", "Time to first token in the window, by quantile.", "ttft_seconds"),
    (
        "llmdiag_tpot_seconds",
        "Time per output token (per finished request) in the window, by quantile.",
        "tpot_seconds",
    ),
    ("llmdiag_itl_seconds", "Inter-token latency in the window, by quantile.", "itl_seconds"),
)
QUANTILES = (("0.5", "p50"), ("0.9", "p90"), ("0.95", "p95"), ("0.99", "p99"))


class _ReportCollector(Collector):
    def __init__(self, report: CheckReport) -> None:
        self.report = report

    def collect(self) -> Iterable[GaugeMetricFamily]:
        results = self.report.targets
        last = GaugeMetricFamily("llmdiag_last_run_timestamp_seconds", "When the last llmdiag check ran (unix time).")
        last.add_metric([], self.report.at_unix)
        yield last
        state = GaugeMetricFamily(
            "llmdiag_check_state",
            "Nagios state of the target: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN.",
            labels=["target"],
        )
        up = GaugeMetricFamily("llmdiag_target_up", "1 when the target could be diagnosed.", labels=["target"])
        for r in results:
            state.add_metric([r.name], int(r.state))
            up.add_metric([r.name], 1 if r.verdict is not None else 0)
        yield state
        yield up
        verdict = GaugeMetricFamily(
            "llmdiag_verdict", "1 for the target's verdict class, 0 for the others.", labels=["class", "target"]
        )
        confidence = GaugeMetricFamily(
            "llmdiag_verdict_confidence_ratio", "Confidence in the verdict (0-1).", labels=["target"]
        )
        finding = GaugeMetricFamily(
            "llmdiag_finding",
            "1 for each finding of the check (muted rules give none).",
            labels=["code", "category", "severity", "target"],
        )
        probe = GaugeMetricFamily(
            "llmdiag_probe_up", "1 when the probe read its source in the check's window.", labels=["probe", "target"]
        )
        window = GaugeMetricFamily("llmdiag_window_seconds", "Length of the check's window.", labels=["target"])
        for r in diagnosed(results):
            v = r.verdict
            assert v is not None
            for cls in Bottleneck:
                verdict.add_metric([cls.value, r.name], 1 if v.bottleneck is cls else 0)
            confidence.add_metric([r.name], v.confidence)
            for f in v.findings:
                finding.add_metric([f.code, f.category.value, f.severity.value, r.name], 1)
            for p in v.coverage.probes:
                probe.add_metric([p.probe, r.name], 1 if p.ok else 0)
            if v.window.duration_seconds is not None:
                window.add_metric([r.name], v.window.duration_seconds)
        yield from (verdict, confidence, finding, probe, window)
        for name, help_text, signal, stat in SIGNAL_GAUGES:
            family = GaugeMetricFamily(name, help_text, labels=["target"])
            for r in diagnosed(results):
                found = r.verdict.signals.get(signal) if r.verdict else None
                value = found.stat(stat) if found is not None else None
                if value is not None:
                    family.add_metric([r.name], value)
            yield family
        for name, help_text, signal in QUANTILE_GAUGES:
            family = GaugeMetricFamily(name, help_text, labels=["quantile", "target"])
            for r in diagnosed(results):
                found = r.verdict.signals.get(signal) if r.verdict else None
                for quantile, stat in QUANTILES:
                    value = found.stat(stat) if found is not None else None
                    if value is not None:
                        family.add_metric([quantile, r.name], value)
            yield family


def diagnosed(results: list[TargetResult]) -> list[TargetResult]:
    return [r for r in results if r.verdict is not None]


def build_registry(report: CheckReport) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ReportCollector(report))
    return registry


def _remove_stale_temporaries(path: Path) -> None:
    """write_to_textfile's temporary files (``<name>.<pid>.<thread>``) left by a writer that was killed."""
    pattern = re.compile(re.escape(path.name) + r"\.(\d+)\.\d+$")
    for entry in path.parent.iterdir():
        match = pattern.match(entry.name)
        if match is None or int(match.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(match.group(1)), 0)
            continue  # its writer still runs
        except ProcessLookupError:
            entry.unlink(missing_ok=True)
        except (PermissionError, OSError):
            continue


def write_textfile(report: CheckReport, directory: Path) -> Path:
    """Write ``directory/llmdiag.prom`` atomically; raises OSError when it cannot."""
    path = Path(directory) / TEXTFILE_NAME
    _remove_stale_temporaries(path)
    write_to_textfile(str(path), build_registry(report))
    return path


def push(report: CheckReport, gateway: str, instance: str, timeout_seconds: float = 10.0) -> None:
    """PUT the metrics to a Pushgateway under job="llmdiag", instance=<this host>; raises OSError on failure."""
    push_to_gateway(
        gateway,
        job=PUSH_JOB,
        registry=build_registry(report),
        grouping_key={"instance": instance},
        timeout=timeout_seconds,
    )
