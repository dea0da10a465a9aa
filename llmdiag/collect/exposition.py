"""Read Prometheus text exposition and turn a series of scrapes into windowed values.

Parsing is prometheus_client's parser; this module adds what a diagnosis needs on top:
counter increases with reset handling, histogram quantiles from bucket deltas inside the window
(the same interpolation as PromQL's ``histogram_quantile``), and gauge statistics across scrapes.

A single scrape can still be judged with *lifetime* values: the window then starts at a virtual
empty scrape at the process start time, where every counter and histogram was zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from prometheus_client.parser import text_string_to_metric_families

from llmdiag.errors import ExpositionParseError, NotMetricsError, option

LabelKey = tuple[tuple[str, str], ...]
# the default label match: every series (read-only, so one instance serves every call)
ANY_LABELS: Mapping[str, str] = MappingProxyType({})


def label_key(labels: Mapping[str, str], drop: Iterable[str] = ()) -> LabelKey:
    dropped = set(drop)
    return tuple(sorted((k, v) for k, v in labels.items() if k not in dropped))


@dataclass
class Scrape:
    """One parsed exposition: sample name → {label set → value}."""

    at_unix: float | None
    series: dict[str, dict[LabelKey, float]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    size_bytes: int = 0
    # sample name → why it has no value (a local probe's call failed); exposition pages leave this empty
    unavailable: dict[str, str] = field(default_factory=dict)

    def names(self) -> set[str]:
        return set(self.series)

    def has(self, name: str) -> bool:
        return bool(self.series.get(name))


def parse_exposition(text: str, at_unix: float | None, origin: str = "metrics page") -> Scrape:
    stripped = text.lstrip()
    if not stripped:
        raise NotMetricsError(f"{origin} is empty")
    if stripped.startswith("<"):
        raise NotMetricsError(f"{origin} is an HTML/XML page, not Prometheus metrics")
    if stripped.startswith(("{", "[")):
        raise NotMetricsError(
            f"{origin} is JSON, not Prometheus text",
            f"TensorRT-LLM's /metrics is JSON iteration stats: point {option('metrics_url')} at /prometheus/metrics",
        )
    if not text.endswith("\n"):
        # every exporter ends the page with a newline; a missing one means the body was cut off
        raise ExpositionParseError(f"{origin} ends mid-line: the exposition is truncated")
    scrape = Scrape(at_unix=at_unix, size_bytes=len(text))
    try:
        _parse_into(scrape, text)
    except Exception as exc:  # the parser raises ValueError, IndexError, KeyError… on garbage
        # dcgm-exporter writes 'ERROR - FAILED TO CONVERT TO STRING' for fields it cannot read: drop such samples,
        # say which, and keep the rest of the page; a page that is garbage throughout still fails
        kept, unreadable = _drop_unreadable_samples(text)
        if not unreadable:
            raise ExpositionParseError(f"{origin} is not valid Prometheus text: {exc}") from None
        scrape = Scrape(at_unix=at_unix, size_bytes=len(text))
        try:
            _parse_into(scrape, kept)
        except Exception:
            scrape.series.clear()
        if not scrape.series:
            raise ExpositionParseError(f"{origin} is not valid Prometheus text: {exc}") from None
        for name, value in unreadable.items():
            scrape.unavailable[name] = f"the exporter wrote '{value}' instead of a number"
    if not scrape.series:
        raise NotMetricsError(f"{origin} holds no metric samples")
    return scrape


def _parse_into(scrape: Scrape, text: str) -> None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            scrape.series.setdefault(sample.name, {})[label_key(sample.labels)] = float(sample.value)
            scrape.types.setdefault(sample.name, family.type)


def _drop_unreadable_samples(text: str) -> tuple[str, dict[str, str]]:
    """The page without sample lines whose value is not a number, and those samples' names → what they held."""
    kept: list[str] = []
    unreadable: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, rest = line.partition("{") if "{" in line.split(" ", 1)[0] else line.partition(" ")
            value = rest.rpartition("}")[2].strip() if "{" in line.split(" ", 1)[0] else rest.strip()
            try:
                float(value.split()[0] if value else "")
            except ValueError:
                unreadable[name.strip()] = value
                continue
        kept.append(line)
    return "\n".join(kept) + "\n", unreadable


def _matches(key: LabelKey, match: Mapping[str, str]) -> bool:
    if not match:
        return True
    labels = dict(key)
    return all(labels.get(k) == v for k, v in match.items())


def select(scrape: Scrape, name: str, match: Mapping[str, str] = ANY_LABELS) -> dict[LabelKey, float]:
    return {k: v for k, v in scrape.series.get(name, {}).items() if _matches(k, dict(match))}
