"""Read Prometheus text exposition and turn a series of scrapes into windowed values.

Parsing is prometheus_client's parser; this module adds what a diagnosis needs on top:
counter increases with reset handling, histogram quantiles from bucket deltas inside the window
(the same interpolation as PromQL's ``histogram_quantile``), and gauge statistics across scrapes.

A single scrape can still be judged with *lifetime* values: the window then starts at a virtual
empty scrape at the process start time, where every counter and histogram was zero.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from prometheus_client.parser import text_string_to_metric_families

from llmdiag.collect.paste import data_lines
from llmdiag.errors import ExpositionParseError, LlmdiagError, NotMetricsError, ResponseTooLargeError, option

# Caps on one page, so a page cannot take the memory and the minutes a scan or a cron check does not have. An
# inference server's page holds hundreds to a few thousand series (vLLM with 8 engines and its histograms: ~10^4),
# a histogram's 'le' a few dozen values: a page past these is a label with a value per request, user or session.
MAX_SERIES = 200_000
MAX_LABEL_VALUES = 10_000
CARDINALITY_HINT = (
    "an inference server's page holds thousands of series, not hundreds of thousands: a label with a value per "
    "request or user makes a series each; point llmdiag at the server's own page, or drop that label before it"
)

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
    # a pasted page (``parse_pasted``): the 1-based numbers of the lines inside the data that could not be read
    skipped_lines: list[int] = field(default_factory=list)

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
    check_line_count(text, origin)
    scrape = Scrape(at_unix=at_unix, size_bytes=len(text))
    try:
        _parse_into(scrape, text, origin)
    except LlmdiagError:
        raise
    except Exception as exc:  # the parser raises ValueError, IndexError, KeyError… on garbage
        # dcgm-exporter writes 'ERROR - FAILED TO CONVERT TO STRING' for fields it cannot read: drop such samples,
        # say which, and keep the rest of the page; a page that is garbage throughout still fails
        kept, unreadable = _drop_unreadable_samples(text)
        if not unreadable:
            raise ExpositionParseError(f"{origin} is not valid Prometheus text: {exc}") from None
        scrape = Scrape(at_unix=at_unix, size_bytes=len(text))
        try:
            _parse_into(scrape, kept, origin)
        except LlmdiagError:
            raise
        except Exception:
            scrape.series.clear()
        if not scrape.series:
            raise ExpositionParseError(f"{origin} is not valid Prometheus text: {exc}") from None
        for name, value in unreadable.items():
            scrape.unavailable[name] = f"the exporter wrote '{value}' instead of a number"
    if not scrape.series:
        raise NotMetricsError(f"{origin} holds no metric samples")
    return scrape


def check_line_count(text: str, origin: str) -> None:
    """Refuse a page with more sample lines than ``MAX_SERIES`` before the parser builds them (counted in C)."""
    if text.count("\n") <= MAX_SERIES:
        return
    samples = sum(1 for line in text.split("\n") if line.strip() and not line.lstrip().startswith("#"))
    if samples > MAX_SERIES:
        raise ResponseTooLargeError(
            f"{origin} holds {samples:,} lines besides comments, over the cap of {MAX_SERIES:,} series",
            CARDINALITY_HINT,
        )


def _check_cardinality(scrape: Scrape, origin: str, values: bool = True) -> None:
    """Refuse a page with more than ``MAX_SERIES`` series or (``values``) ``MAX_LABEL_VALUES`` values of one label."""
    count = sum(len(by_labels) for by_labels in scrape.series.values())
    if count > MAX_SERIES:
        raise ResponseTooLargeError(
            f"{origin} holds {count:,} series, over the cap of {MAX_SERIES:,}", CARDINALITY_HINT
        )
    if not values or count <= MAX_LABEL_VALUES:
        return  # fewer series than the cap: no label can have more values
    seen_values: dict[str, set[str]] = {}
    for by_labels in scrape.series.values():
        for key in by_labels:
            for label, value in key:
                seen = seen_values.setdefault(label, set())
                seen.add(value)
                if len(seen) > MAX_LABEL_VALUES:
                    raise _too_many_values(origin, label)


def _too_many_values(origin: str, label: str) -> ResponseTooLargeError:
    return ResponseTooLargeError(
        f"{origin}: label '{label}' takes more than {MAX_LABEL_VALUES:,} values (a series per value), over the cap",
        CARDINALITY_HINT,
    )


def _parse_into(scrape: Scrape, text: str, origin: str = "metrics page", check: bool = True) -> None:
    # each label's values counted as the samples come: a page past the cap is refused at the cap, not at its end
    values: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            scrape.series.setdefault(sample.name, {})[label_key(sample.labels)] = float(sample.value)
            scrape.types.setdefault(sample.name, family.type)
            if check:
                for label, value in sample.labels.items():
                    seen = values.setdefault(label, set())
                    seen.add(value)
                    if len(seen) > MAX_LABEL_VALUES:
                        raise _too_many_values(origin, label)
    if check:
        _check_cardinality(scrape, origin, values=False)  # the values were counted as they came


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


# ---------------------------------------------------------------------------------------------
# pasted pages: the metric lines wherever they are in the text, a bad line skipped and counted

# a sample's timestamp (ms) up to datetime's year 9999
MAX_STAMP_MS = 253402300799000
METRIC_NAME = r"[A-Za-z_:][A-Za-z0-9_:]*"
LABELS = r'\{\s*(?:[A-Za-z_][A-Za-z0-9_]*\s*=\s*"(?:[^"\\]|\\.)*"\s*(?:,\s*)?)*\}'
VALUE = r"[-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|[0-9]+\.|Inf|inf|NaN|nan)"
SAMPLE_RE = re.compile(rf"^(?P<name>{METRIC_NAME})(?P<labels>{LABELS})?\s+(?P<value>{VALUE})(?:\s+(?P<ms>-?[0-9]+))?$")
# a sample whose value is not a number (dcgm-exporter's 'ERROR - FAILED TO CONVERT TO STRING'): labels required, so
# a line of prose never reads as one
WORDY_SAMPLE_RE = re.compile(rf"^(?P<name>{METRIC_NAME})(?P<labels>{LABELS})\s+(?P<value>\S.*)$")
META_RE = re.compile(rf"^#\s*(?:HELP\s+{METRIC_NAME}(?:\s.*)?|TYPE\s+{METRIC_NAME}\s+[a-z]+\s*)$")
# a line that set out to be a sample (a metric name with '_' or ':' inside, then labels or a number) but is not one:
# elided labels ('{...}'), a line cut off; counted as unreadable even outside the block of data
ATTEMPT_RE = re.compile(r"^[A-Za-z_:][A-Za-z0-9]*[_:][A-Za-z0-9][A-Za-z0-9_:]*(?:\{|\s+[-+.0-9])")


def sample_name(line: str) -> str | None:
    """The metric name of an unquoted exposition sample line, or None."""
    found = SAMPLE_RE.match(line)
    return found.group("name") if found else None


@dataclass
class _Sorted:
    kept: list[tuple[int, str]] = field(default_factory=list)  # HELP/TYPE and sample lines, with their numbers
    samples: list[int] = field(default_factory=list)  # line numbers of samples (0-based)
    other: list[int] = field(default_factory=list)  # neither a sample nor a comment nor blank
    attempts: set[int] = field(default_factory=set)  # of ``other``: lines that set out to be samples
    wordy: dict[str, str] = field(default_factory=dict)
    stamps_ms: list[int] = field(default_factory=list)


def _sort_lines(lines: list[str]) -> _Sorted:
    out = _Sorted()
    for number, line in enumerate(lines):
        if not line:
            continue
        if line.startswith("#"):
            if META_RE.match(line):
                out.kept.append((number, line))
            elif re.match(r"#\s*(?:HELP|TYPE)\b", line):  # a HELP/TYPE line cut short
                out.other.append(number)
                out.attempts.add(number)
            continue  # any other comment is part of the exposition format (or of the paste around it)
        found = SAMPLE_RE.match(line)
        if found:
            out.kept.append((number, line))
            out.samples.append(number)
            if found.group("ms"):
                out.stamps_ms.append(int(found.group("ms")))
            continue
        wordy = WORDY_SAMPLE_RE.match(line)
        if wordy and not re.match(VALUE, wordy.group("value")):  # a number with a remark after it is no sample
            out.wordy[wordy.group("name")] = wordy.group("value").strip()
            continue
        out.other.append(number)
        if ATTEMPT_RE.match(line):
            out.attempts.add(number)
    return out


def parse_pasted(text: str, at_unix: float | None, origin: str = "metrics page") -> Scrape:
    """A saved or pasted page: every sample line, wherever it is (quotes, fences and prose around it).

    A line inside the block of data that is not one (elided labels, a stray remark, a line cut off), or a line that
    set out to be a sample anywhere, is skipped and its number kept in ``skipped_lines``; the page is refused only
    when not one sample can be read. ``at_unix`` None and samples with timestamps: the page's time is their last."""
    if not text.strip():
        raise NotMetricsError(f"{origin} is empty")
    check_line_count(text, origin)
    lines = data_lines(text)
    joined = "\n".join(line for line in lines if line).lstrip()
    if joined.startswith("<"):
        raise NotMetricsError(f"{origin} is an HTML/XML page, not Prometheus metrics")
    found = _sort_lines(lines)
    if not found.samples:
        if joined.startswith(("{", "[")):
            raise NotMetricsError(f"{origin} is JSON, not Prometheus text")
        raise NotMetricsError(f"{origin} holds no metric samples")
    first, last = found.samples[0], found.samples[-1]
    skipped = [n + 1 for n in found.other if first < n < last or n in found.attempts]
    stamps_ms = [ms for ms in found.stamps_ms if 0 < ms <= MAX_STAMP_MS]  # a 400-digit stamp is no time
    if stamps_ms and at_unix is None:
        at_unix = max(stamps_ms) / 1000.0
    scrape = Scrape(at_unix=at_unix, size_bytes=len(text), skipped_lines=skipped)
    try:
        _parse_into(scrape, "\n".join(line for _, line in found.kept) + "\n", origin)
    except LlmdiagError:
        raise
    except Exception:  # lines each well-formed, together not (a TYPE line twice, out of order): one at a time
        scrape.series.clear()
        for number, line in found.kept:
            if line.startswith("#"):
                continue
            try:
                _parse_into(scrape, line + "\n", check=False)  # checked once, below
            except Exception:
                scrape.skipped_lines.append(number + 1)
        _check_cardinality(scrape, origin)
        scrape.skipped_lines.sort()
        if not scrape.series:
            raise ExpositionParseError(f"{origin} is not valid Prometheus text") from None
    for name, value in found.wordy.items():
        scrape.unavailable[name] = f"the exporter wrote '{value}' instead of a number"
    return scrape


def describe_skipped(skipped: list[tuple[str, int]]) -> str:
    """'skipped 3 unreadable lines (first: line 12)' for (file, line number) pairs; '' for none."""
    if not skipped:
        return ""
    where, number = skipped[0]
    files = {w for w, _ in skipped}
    first = f"line {number}" if len(files) == 1 else f"{where} line {number}"
    count = len(skipped)
    return f"skipped {count} unreadable line{'s' if count != 1 else ''} (first: {first})"


def _matches(key: LabelKey, match: Mapping[str, str]) -> bool:
    if not match:
        return True
    labels = dict(key)
    return all(labels.get(k) == v for k, v in match.items())


def select(scrape: Scrape, name: str, match: Mapping[str, str] = ANY_LABELS) -> dict[LabelKey, float]:
    return {k: v for k, v in scrape.series.get(name, {}).items() if _matches(k, dict(match))}
