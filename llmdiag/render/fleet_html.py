"""Render a FleetReport as one self-contained HTML file (reports/fleet.html.j2 + reports/fleet.css).

Like the scan report it makes no request (CSP ``default-src 'none'``); unlike it, it runs no script at all
(``script-src 'none'``): the heat strip is plain cells generated here, coloured by class, every string autoescaped.

The heat strip: with a timeline, one row per replica and one cell per step, coloured by that step's class (a step
without the replica's data is a grey "no data" cell, never healthy). Without one (a direct scan: one window per
replica), one cell per scrape, shaded by the replica's waiting requests at that scrape against the fleet's
highest, so a queue building on one replica shows as a dark row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmdiag.model import Bottleneck, FleetReport
from llmdiag.render.format import UNAVAILABLE, clock, when
from llmdiag.render.html import CLASS_COLORS, _asset, _environment, _inline

NO_DATA_COLOR = "#e0e0e0"
MAX_CELLS = 400  # per row: longer timelines are thinned to every k-th step


@dataclass
class Cell:
    cls: str
    color: str
    title: str


@dataclass
class Strip:
    caption: str
    columns: int = 0
    rows: list[dict] = field(default_factory=list)  # {name, cells: [Cell]}
    axis: list[str] = field(default_factory=list)
    legend: list[tuple[str, str]] = field(default_factory=list)


def _tint(color: str, alpha: float) -> str:
    """``color`` (#rrggbb) blended with white: alpha 1 is the colour, 0 white."""
    rgb = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(255 - (255 - c) * alpha):02x}" for c in rgb)


def _axis(times: list[float], columns: int) -> list[str]:
    """A label every ~10 columns, empty cells between."""
    every = max(1, columns // 10)
    return [clock(t) if i % every == 0 else "" for i, t in enumerate(times)]


def heat_strip(report: FleetReport) -> Strip:
    names = [t.name for t in report.targets]
    timeline = report.timeline
    if timeline is not None and timeline.steps:
        steps = timeline.steps[:: max(1, -(-len(timeline.steps) // MAX_CELLS))]
        strip = Strip(
            caption=f"class of each replica at each of {len(steps)} steps"
            + (f" ({timeline.step_seconds:g} s apart)" if timeline.step_seconds else ""),
            columns=len(steps),
        )
        seen = sorted({n for s in steps for n in s.classes} | set(names), key=lambda n: (n not in names, n))
        ordered = [n for n in names if n in seen] + [n for n in seen if n not in names]
        for name in ordered:
            cells = []
            for step in steps:
                cls = step.classes.get(name)
                when = clock(step.at_unix)
                if cls is None:
                    cells.append(Cell("none", NO_DATA_COLOR, f"{name} at {when}: no data"))
                else:
                    cells.append(Cell(cls.value, CLASS_COLORS[cls], f"{name} at {when}: {cls.value}"))
            strip.rows.append({"name": name, "cells": cells})
        strip.axis = _axis([s.at_unix for s in steps], len(steps))
        used = {c.cls for row in strip.rows for c in row["cells"]}
        strip.legend = [(b.value, CLASS_COLORS[b]) for b in Bottleneck if b.value in used]
        if "none" in used:
            strip.legend.append(("no data", NO_DATA_COLOR))
        return strip
    sampled = [t for t in report.targets if t.waiting_samples]
    if not sampled:
        return Strip(caption="no replica recorded per-scrape waiting requests")
    peak = max(v for t in sampled for _, v in t.waiting_samples)
    columns = max(len(t.waiting_samples) for t in sampled)
    strip = Strip(
        caption=f"requests waiting at each scrape, darker = more (the fleet's highest: {peak:g}); "
        "one row per replica, its class colour",
        columns=columns,
    )
    for t in report.targets:
        color = CLASS_COLORS[t.bottleneck]
        cells = []
        for at, waiting in t.waiting_samples:
            share = waiting / peak if peak > 0 else 0.0
            alpha = round(0.08 + 0.92 * share, 3)
            cells.append(Cell(t.bottleneck.value, _tint(color, alpha), f"{t.name} at {clock(at)}: {waiting:g} waiting"))
        if not cells:
            reason = t.error or "no per-scrape samples"
            cells = [Cell("none", NO_DATA_COLOR, f"{t.name}: {UNAVAILABLE} ({reason})")]
        strip.rows.append({"name": t.name, "cells": cells})
    longest = max(sampled, key=lambda t: len(t.waiting_samples))
    origin = longest.waiting_samples[0][0]
    strip.axis = [
        f"+{at - origin:.0f} s" if i % max(1, columns // 6) == 0 else ""
        for i, (at, _) in enumerate(longest.waiting_samples)
    ]
    strip.legend = [
        (f"{b.value} (shade: waiting)", CLASS_COLORS[b])
        for b in Bottleneck
        if any(t.bottleneck is b for t in report.targets)
    ]
    strip.legend.append(("no data", NO_DATA_COLOR))
    return strip


def render_fleet_html(report: FleetReport) -> str:
    env = _environment()
    env.filters["when"] = when
    css = _inline(_asset("report.css") + "\n" + _asset("fleet.css"), "</style")
    csp = "; ".join(
        [
            "default-src 'none'",
            "script-src 'none'",
            "style-src 'unsafe-inline'",
            "img-src data:",
            "base-uri 'none'",
            "form-action 'none'",
        ]
    )
    counts = ", ".join(f"{n} {name}" for name, n in report.class_counts.items())
    return env.get_template("fleet.html.j2").render(
        title=f"llmdiag fleet report: {len(report.targets)} replicas ({counts})",
        csp=csp,
        css=css,
        report=report,
        strip=heat_strip(report),
        class_colors={b.value: c for b, c in CLASS_COLORS.items()},
        unavailable=UNAVAILABLE,
    )
