"""One recorded real vLLM state (tests/fixtures/vllm-0.32.0/<state>/scrape-NN.prom) as promtool ``input_series``.

A recording is six scrapes 2 s apart, ~10 s in all; the exported rules look over windows and ``for:`` periods of
minutes. Each series is extended over the test's span so that what the rules measure stays what was measured:

* counters, and every part of a histogram or summary (``_bucket``, ``_sum``, ``_count``): ``a+bxN``, starting at
  the first scrape's value and rising at the rate measured over the recording,
  ``(last - first) / (last scrape time - first scrape time)``, per ``interval``. Every ``rate``/``increase`` over any
  window reads that measured rate, a ratio of two counters keeps its measured ratio, and the buckets of one
  histogram keep their measured increments, so ``histogram_quantile`` over bucket rates reads the recording's
  distribution of the window (the buckets stay cumulative: a lower bucket never rises faster than a higher one);
* gauges: the recorded values in order, one per ``interval``, repeated (``axN`` when all six are equal). Any window
  of six steps or more holds every recorded value, so ``max_over_time``/``min_over_time`` are the recorded peak and
  floor, and ``avg_over_time`` is the recorded mean: exactly over a multiple of six samples, and otherwise within
  the recorded range times the share of the extra samples (a 5 m window at 15 s holds 21 samples: three replays and
  three more values, so within 1/7 of the range).

Every series also gets the labels Prometheus attaches to a scraped target (``job``, ``instance``). A counter that
fell between the first and last scrape (a restart) cannot be extended at a rate and is refused.

    python -m tests.support.promtool_series tests/fixtures/vllm-0.32.0/memory   # prints the input_series (JSON)
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.support.required import require_tool

SCRAPED_AT = "# llmdiag-scraped-at:"
# Debian's prometheus package ships promtool; ``make test`` installs it (tests.support.prometheus_server install)
# and sets this variable, so a missing promtool fails there instead of skipping
REQUIRED_ENV = "LLMDIAG_PROMETHEUS_TESTS"
BINARY = os.environ.get("LLMDIAG_PROMTOOL", "promtool")

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


def missing() -> str | None:
    """Why promtool cannot run here, or None when it can."""
    if shutil.which(BINARY) is None:
        return f"{BINARY} not on PATH (python -m tests.support.prometheus_server install: Debian's prometheus has it)"
    return None


def require() -> None:
    require_tool(missing(), REQUIRED_ENV)


@dataclass(frozen=True)
class Recording:
    """One state's scrapes: their times (unix s) and, per series, its value in each scrape and its kind."""

    times_s: list[float]
    values: dict[SeriesKey, list[float]]
    counters: frozenset[SeriesKey]

    def rate_per_second(self, key: SeriesKey) -> float:
        first, last = self.values[key][0], self.values[key][-1]
        if last < first:
            raise ValueError(f"{series_name(key, {})}: counter fell from {first} to {last} during the recording")
        return (last - first) / (self.times_s[-1] - self.times_s[0])


def _is_counter_sample(family_type: str, sample_name: str, labels: dict[str, str]) -> bool:
    if family_type == "counter":
        return True
    if family_type in ("histogram", "gaugehistogram", "summary"):
        # a summary's quantile samples are gauges; its _sum/_count and a histogram's parts are counters
        return "quantile" not in labels and sample_name.endswith(("_bucket", "_sum", "_count"))
    return False


def _parse_scrape(path: Path) -> tuple[float, dict[SeriesKey, float], set[SeriesKey]]:
    text = path.read_text()
    first = text.split("\n", 1)[0]
    if not first.startswith(SCRAPED_AT):
        raise ValueError(f"{path}: first line is not '{SCRAPED_AT} <unix time>'")
    at = float(first[len(SCRAPED_AT) :])
    values: dict[SeriesKey, float] = {}
    counters: set[SeriesKey] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            values[key] = float(sample.value)
            if _is_counter_sample(family.type, sample.name, sample.labels):
                counters.add(key)
    return at, values, counters


def read_state(state_dir: Path) -> Recording:
    """The scrapes of one recorded state, in order. A series missing from a scrape is refused: the recordings have
    every series in every scrape, and extending a partial one would invent its missing part."""
    scrapes = [_parse_scrape(p) for p in sorted(state_dir.glob("scrape-*.prom"))]
    if len(scrapes) < 2:
        raise ValueError(f"{state_dir}: a rate needs two scrapes or more, found {len(scrapes)}")
    keys = set(scrapes[0][1])
    for at, values, _ in scrapes[1:]:
        if set(values) != keys:
            raise ValueError(f"{state_dir}: the scrape at {at} has other series than the first")
    return Recording(
        times_s=[at for at, _, _ in scrapes],
        values={k: [values[k] for _, values, _ in scrapes] for k in sorted(keys)},
        counters=frozenset(scrapes[0][2]),
    )


def number(value: float) -> str:
    """A value in promtool's series notation (PromQL number literals; NaN and ±Inf spelled its way)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def series_name(key: SeriesKey, extra_labels: dict[str, str]) -> str:
    name, labels = key
    merged = {**dict(labels), **extra_labels}
    body = ",".join(f'{k}="{_label_value(v)}"' for k, v in sorted(merged.items()))
    return f"{name}{{{body}}}"


def extended_values(recording: Recording, key: SeriesKey, interval_s: float, steps: int) -> str:
    """The series' values at 0, interval, …, steps × interval, in promtool's notation (see the module docstring)."""
    values = recording.values[key]
    if key in recording.counters:
        return f"{number(values[0])}+{number(recording.rate_per_second(key) * interval_s)}x{steps}"
    if len(set(values)) == 1:
        return f"{number(values[0])}x{steps}"
    return " ".join(number(values[i % len(values)]) for i in range(steps + 1))


def input_series(
    recording: Recording, interval_s: float, span_s: float, extra_labels: dict[str, str]
) -> list[dict[str, str]]:
    """promtool ``input_series`` entries for every series of the recording, covering 0 … ``span_s``."""
    steps = math.ceil(span_s / interval_s)
    return [
        {"series": series_name(key, extra_labels), "values": extended_values(recording, key, interval_s, steps)}
        for key in recording.values
    ]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.support.promtool_series STATE_DIR", file=sys.stderr)
        return 2
    recording = read_state(Path(argv[0]))
    labels = {"job": "vllm", "instance": "vllm:8000"}
    print(json.dumps(input_series(recording, 15.0, 900.0, labels), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
