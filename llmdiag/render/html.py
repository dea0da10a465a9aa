"""Render a Verdict or a LoadReport as one self-contained HTML file.

Everything the page needs is inside it: the template's CSS, the vendored chart library (uPlot, MIT, see
``reports/vendor/uplot/VERSION``) and the chart data. GPU clusters are often air-gapped, so the page makes no
request at all; its Content-Security-Policy (``default-src 'none'``) forbids any, and lets only the page's own
scripts run, by hash: a string that slipped through escaping still could not execute.

Safety: every string that came from a server (model names, label values, error text) goes through Jinja's
autoescape; chart data is JSON inside ``<script type="application/json">`` written with Jinja's ``tojson``
(which escapes ``<``, ``>``, ``&`` and ``'``) and read with ``JSON.parse``, never concatenated into code. The
Verdict never holds API keys or headers (URLs are redacted when collected), so the report cannot leak them.

Charts show what was measured; a chart whose data is missing is a box saying "unavailable" and why, never an
empty chart that reads as zero.
"""

from __future__ import annotations

import base64
import hashlib
import math
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from jinja2 import BaseLoader, Environment, StrictUndefined, TemplateNotFound

from llmdiag.engine.fixes import fix_view, verdict_engine
from llmdiag.errors import option
from llmdiag.model import Bottleneck, LoadPoint, LoadReport, Percentiles, Signal, Verdict
from llmdiag.model.whatif import Figures, WhatIf
from llmdiag.render.format import BOUND_WORDS, UNAVAILABLE, format_value, when
from llmdiag.render.whatif import changes_text, effect_line, rows

REPORTS_PACKAGE = "llmdiag.reports"
UPLOT_DIR = "vendor/uplot"


class _ResourceLoader(BaseLoader):
    """Templates from the ``llmdiag.reports`` data package (importlib.resources: works from a wheel or a checkout)."""

    def get_source(self, environment: Environment, template: str) -> tuple[str, str, Any]:
        try:
            text = _asset(template)
        except FileNotFoundError:
            raise TemplateNotFound(template) from None
        return text, template, lambda: True


def _asset(name: str) -> str:
    return resources.files(REPORTS_PACKAGE).joinpath(name).read_text(encoding="utf-8")


def _environment() -> Environment:
    env = Environment(
        loader=_ResourceLoader(),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["fmt"] = format_value
    env.filters["pct"] = lambda v: UNAVAILABLE if v is None else f"{v:.0%}"
    env.filters["ms"] = lambda v: format_value(v, "seconds")
    env.filters["tok"] = lambda v: format_value(v, "tokens/s")
    env.filters["when"] = when
    return env


def _inline(text: str, closing: str) -> str:
    """Text for an inline <script> or <style>: it must not close its own element early."""
    if closing in text.lower():
        raise ValueError(f"an inline asset contains '{closing}'")
    return text


def _csp_hash(script: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii") + "'"


# ---------------------------------------------------------------------------------------------
# chart specs: what the page's script draws with uPlot. Values are pre-scaled to the display unit.


@dataclass
class Chart:
    id: str
    title: str
    y_label: str
    kind: str = "time"  # time: x is seconds into the window; buckets: a distribution; sweep: x is the load level
    x: list[float] = field(default_factory=list)
    series: list[dict[str, Any]] = field(default_factory=list)  # {label, values, color}
    x_labels: list[str] = field(default_factory=list)  # buckets: one label per bar
    x_label: str = ""
    x_log: bool = False
    marker_x: float | None = None  # a dashed vertical line (the knee)
    y_max: float | None = None
    caption: str = ""
    missing: list[str] = field(default_factory=list)  # series that could not be drawn, and why
    unavailable: str | None = None  # the whole chart: why there is nothing to draw

    def spec(self) -> dict[str, Any]:
        # JSON has no NaN or Infinity: a value that is not finite is a gap, never a number
        series = [{**s, "values": [_finite(v) for v in s["values"]]} for s in self.series]
        return {
            "id": self.id,
            "kind": self.kind,
            "x": self.x,
            "series": series,
            "x_labels": self.x_labels,
            "x_label": self.x_label,
            "y_label": self.y_label,
            "x_log": self.x_log,
            "marker_x": self.marker_x,
            "y_max": self.y_max,
        }


COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"]

# (chart id, title, y label, scale from the signal's unit, [(signal, series label)])
TIME_CHARTS: list[tuple[str, str, str, float, list[tuple[str, str]]]] = [
    (
        "requests",
        "Requests running and waiting",
        "requests",
        1.0,
        [("requests_running", "running"), ("requests_waiting", "waiting")],
    ),
    (
        "kv",
        "KV-cache usage",
        "% of the KV cache",
        100.0,
        [("kv_cache_usage_ratio", "GPU KV cache"), ("cpu_kv_cache_usage_ratio", "CPU KV cache")],
    ),
    ("preemptions", "Preemptions", "preemptions/s", 1.0, [("preemptions_per_second", "preemptions/s")]),
    (
        "tokens",
        "Token rates",
        "tokens/s",
        1.0,
        [("generation_tokens_per_second", "output (generation)"), ("prompt_tokens_per_second", "prompt (prefill)")],
    ),
    (
        "gpu_util",
        "GPU utilisation",
        "% busy",
        100.0,
        [
            ("gpu_utilization_ratio", "GPU utilisation"),
            ("sm_active_ratio", "SM active"),
            ("tensor_active_ratio", "tensor active"),
            ("dram_active_ratio", "DRAM active"),
        ],
    ),
    (
        "gpu_memory",
        "GPU memory",
        "GiB",
        1.0 / 2**30,
        [("gpu_memory_used_bytes", "used"), ("gpu_memory_total_bytes", "total")],
    ),
]

DISTRIBUTIONS = [("ttft", "Time to first token", "ttft_seconds"), ("itl", "Inter-token latency", "itl_seconds")]


def gpu_hint() -> str:
    return (
        f"no GPU telemetry in this result (scan with {option('dcgm_url')} URL, or on the GPU host where NVML sees "
        "the GPUs)"
    )


def _why_missing(signal: Signal | None, name: str, scrapes: int = 0) -> str:
    if signal is None:
        return f"{name}: not collected in this scan"
    if signal.unavailable is not None:
        return f"{name}: {signal.unavailable}"
    if scrapes < 2 and signal.kind == "counter":
        return f"{name}: one scrape has no interval to take a rate over"
    return f"{name}: no per-scrape samples recorded"


def _time_chart(
    verdict: Verdict, chart_id: str, title: str, y_label: str, scale: float, wanted: list[tuple[str, str]]
) -> Chart:
    chart = Chart(chart_id, title, y_label, kind="time", x_label="seconds into the window")
    present: list[tuple[str, dict[float, float]]] = []
    for name, label in wanted:
        signal = verdict.signals.get(name)
        if signal is None or signal.unavailable is not None or not signal.samples:
            chart.missing.append(_why_missing(signal, name, verdict.window.scrapes))
            continue
        present.append((label, {t: v * scale for t, v in signal.samples}))
    if not present:
        gpu_only = all(name.startswith(("gpu_", "sm_", "tensor_", "dram_")) for name, _ in wanted)
        if gpu_only and all(verdict.signals.get(name) is None for name, _ in wanted):
            chart.unavailable = gpu_hint()
        else:
            chart.unavailable = "; ".join(chart.missing)
        chart.missing = []
        return chart
    start = verdict.window.start_unix
    times = sorted({t for _, points in present for t in points})
    origin = start if start is not None and start <= times[0] else times[0]
    chart.x = [round(t - origin, 3) for t in times]
    for index, (label, points) in enumerate(present):
        chart.series.append(
            {"label": label, "values": [points.get(t) for t in times], "color": COLORS[index % len(COLORS)]}
        )
    if y_label.startswith("%"):
        chart.y_max = 100.0
    return chart


def _bucket_label(bound: float, unit: str) -> str:
    if unit == "seconds":
        return f"≤{bound * 1000:g} ms" if bound < 1 else f"≤{bound:g} s"
    return f"≤{bound:g}"


def _distribution(verdict: Verdict, chart_id: str, title: str, name: str) -> Chart:
    chart = Chart(chart_id, title, "% of observations", kind="buckets", x_label="bucket (upper bound)")
    signal = verdict.signals.get(name)
    count = signal.stat("count") if signal is not None else None
    if signal is None or signal.unavailable is not None or not signal.buckets or not count:
        reason = _why_missing(signal, name)
        if signal is not None and signal.unavailable is None and not signal.buckets:
            reason = f"{name}: no bucket data in this result (saved by an older llmdiag?)"
        chart.unavailable = reason
        return chart
    shares: list[float] = []
    labels: list[str] = []
    before = 0.0
    for bound, cumulative in signal.buckets:
        shares.append(max(0.0, cumulative - before) / count * 100)
        labels.append(_bucket_label(bound, signal.unit))
        before = cumulative
    shares.append(max(0.0, count - before) / count * 100)
    labels.append(f">{labels[-1][1:]}" if labels else "all")
    used = [i for i, share in enumerate(shares) if share > 0]
    low, high = max(0, used[0] - 1), min(len(shares) - 1, used[-1] + 1)
    chart.x = list(range(high - low + 1))
    chart.x_labels = labels[low : high + 1]
    chart.series = [
        {"label": "share of observations", "values": [round(v, 3) for v in shares[low : high + 1]], "color": COLORS[0]}
    ]
    quantiles = [f"{key} {format_value(signal.stat(key), signal.unit)}" for key in ("p50", "p90", "p99")]
    chart.caption = f"{count:,.0f} observations in the window; " + ", ".join(quantiles)
    return chart


def scan_charts(verdict: Verdict) -> list[Chart]:
    charts = [_time_chart(verdict, *spec) for spec in TIME_CHARTS]
    charts += [_distribution(verdict, *spec) for spec in DISTRIBUTIONS]
    if verdict.window.kind == "lifetime":
        for chart in charts:
            if chart.kind == "time" and chart.unavailable is None:
                chart.caption = "one dump: a single point, lifetime averages"
    return charts


# ---------------------------------------------------------------------------------------------
# load sweep charts


def _level(point: LoadPoint) -> float | None:
    return float(point.users) if point.users is not None else point.rate_per_second


def _sweep_chart(
    report: LoadReport,
    chart_id: str,
    title: str,
    y_label: str,
    wanted: list[tuple[str, Any]],
    scale: float = 1.0,
    why_none: str = "",
) -> Chart:
    closed = report.mode == "closed"
    chart = Chart(chart_id, title, y_label, kind="sweep", x_label="users" if closed else "requests/s")
    points = [p for p in report.points if _level(p) is not None]
    chart.x = [float(_level(p) or 0.0) for p in points]
    for index, (label, pick) in enumerate(wanted):
        values = [pick(p) for p in points]
        if all(v is None for v in values):
            chart.missing.append(f"{label}: {why_none or 'not measured at any level'}")
            continue
        chart.series.append(
            {
                "label": label,
                "values": [None if v is None else v * scale for v in values],
                "color": COLORS[index % len(COLORS)],
            }
        )
    if not chart.series:
        chart.unavailable = "; ".join(chart.missing) or "no load levels"
        chart.missing = []
    positive = [x for x in chart.x if x > 0]
    chart.x_log = len(positive) == len(chart.x) > 1 and max(positive) / min(positive) >= 8
    if report.knee is not None:
        chart.marker_x = float(report.knee.users) if report.knee.users is not None else report.knee.rate_per_second
    if y_label.startswith("%"):
        chart.y_max = 100.0
    return chart


def _pct(field_name: str, key: str):
    def pick(point: LoadPoint) -> float | None:
        value: Percentiles = getattr(point, field_name)
        return getattr(value, key)

    return pick


def sweep_charts(report: LoadReport) -> list[Chart]:
    no_slo = (
        f"no {option('slo_ttft_seconds')} or {option('slo_tpot_seconds')} given"
        if report.slo_ttft_seconds is None and report.slo_tpot_seconds is None
        else ""
    )
    return [
        _sweep_chart(
            report,
            "sweep_ttft",
            "Time to first token",
            "ms",
            [(f"TTFT {k}", _pct("ttft_seconds", k)) for k in ("p50", "p90", "p99")],
            1000.0,
        ),
        _sweep_chart(
            report,
            "sweep_itl",
            "Inter-token latency and time per output token",
            "ms",
            [
                ("ITL p50", _pct("itl_seconds", "p50")),
                ("ITL p99", _pct("itl_seconds", "p99")),
                ("TPOT p50", _pct("tpot_seconds", "p50")),
                ("TPOT p99", _pct("tpot_seconds", "p99")),
            ],
            1000.0,
        ),
        _sweep_chart(
            report,
            "sweep_total",
            "Output tokens/s, whole server",
            "tokens/s",
            [("total output tok/s", lambda p: p.output_tokens_per_second)],
        ),
        _sweep_chart(
            report,
            "sweep_per_user",
            "Output tokens/s per user while streaming",
            "tokens/s per user",
            [(f"per user {k}", _pct("per_user_decode_tokens_per_second", k)) for k in ("p5", "p50", "p95")]
            + [("naive X/N", lambda p: p.naive_per_user_tokens_per_second)],
        ),
        _sweep_chart(
            report,
            "sweep_goodput",
            "Goodput (requests meeting the SLO)",
            "% of requests",
            [("goodput", lambda p: p.goodput_ratio)],
            100.0,
            why_none=no_slo,
        ),
        _sweep_chart(
            report, "sweep_errors", "Errors", "failed requests", [("errors", lambda p: float(sum(p.errors.values())))]
        ),
    ]


# ---------------------------------------------------------------------------------------------
# the page


CLASS_COLORS = {
    Bottleneck.memory: "#c62828",
    Bottleneck.compute: "#e65100",
    Bottleneck.scheduling: "#f9a825",
    Bottleneck.network: "#8e24aa",
    Bottleneck.healthy: "#2e7d32",
    Bottleneck.idle: "#1565c0",
    Bottleneck.unknown: "#616161",
    Bottleneck.stalled: "#4a0000",
}


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _render(kind: str, title: str, context: dict[str, Any], charts: list[Chart]) -> str:
    env = _environment()
    uplot_js = _inline(_asset(f"{UPLOT_DIR}/uPlot.iife.min.js"), "</script")
    report_js = _inline(_asset("report.js"), "</script")
    css = _inline(_asset(f"{UPLOT_DIR}/uPlot.min.css") + "\n" + _asset("report.css"), "</style")
    scripts = [uplot_js, report_js]
    csp = "; ".join(
        [
            "default-src 'none'",
            "script-src " + " ".join(_csp_hash(s) for s in scripts),
            "style-src 'unsafe-inline'",
            "img-src data:",
            "base-uri 'none'",
            "form-action 'none'",
        ]
    )
    template = env.get_template("report.html.j2")
    return template.render(
        kind=kind,
        title=title,
        csp=csp,
        css=css,
        scripts=scripts,
        charts=charts,
        chart_specs=[c.spec() for c in charts if c.unavailable is None],
        class_colors=CLASS_COLORS,
        bound_words=BOUND_WORDS,
        unavailable=UNAVAILABLE,
        uplot_version=_asset(f"{UPLOT_DIR}/VERSION").strip(),
        fix_view=fix_view,
        verdict_engine=verdict_engine,
        effect_line=effect_line,
        **context,
    )


def render_html(result: Verdict | LoadReport) -> str:
    """The report for a scan's Verdict or a load sweep's LoadReport, as one HTML document."""
    if isinstance(result, LoadReport):
        title = f"llmdiag load report: {result.target}"
        return _render("load", title, {"report": result}, sweep_charts(result))
    title = f"llmdiag report: {result.bottleneck.value} ({result.target})"
    return _render("scan", title, {"verdict": result}, scan_charts(result))


def whatif_charts(w: WhatIf) -> list[Chart]:
    """Before against after, as bars: the batch and the queue; each user's tokens/s; TTFT."""
    groups = [
        ("whatif_requests", "Requests running and waiting", "requests", ["requests_running", "requests_waiting"], 1.0),
        (
            "whatif_per_user",
            "Tokens per second for each user",
            "tokens/s",
            ["per_user_tokens_per_second", "per_user_tokens_per_second_incl_waiting"],
            1.0,
        ),
        ("whatif_ttft", "Time to first token", "ms", ["ttft_p50_seconds", "ttft_p90_seconds"], 1e3),
    ]
    labels = {
        "requests_running": "running",
        "requests_waiting": "waiting",
        "per_user_tokens_per_second": "decoding",
        "per_user_tokens_per_second_incl_waiting": "queue included",
        "ttft_p50_seconds": "p50",
        "ttft_p90_seconds": "p90",
    }
    charts = []
    for chart_id, title, unit, names, scale in groups:

        def values(figures: Figures, names: list[str] = names, scale: float = scale) -> list[float | None]:
            return [None if (v := getattr(figures, n)) is None else v * scale for n in names]

        chart = Chart(chart_id, title, unit, kind="buckets", x=[float(i) for i in range(len(names))])
        chart.x_labels = [labels[n] for n in names]
        chart.series = [
            {"label": "before (model)", "values": values(w.before), "color": COLORS[0]},
            {"label": "after", "values": values(w.after), "color": COLORS[1]},
        ]
        if not w.modelled:
            chart.unavailable = f"not modelled: {w.not_modelled_reason}"
        charts.append(chart)
    return charts


def render_whatif_html(w: WhatIf) -> str:
    """``llmdiag whatif --html``: the before/after table and its charts, one self-contained page."""
    title = f"llmdiag what-if: {changes_text(w)}"
    return _render("whatif", title, {"w": w, "rows": rows(w), "changes": changes_text(w)}, whatif_charts(w))
