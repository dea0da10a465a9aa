"""Render a ``WhatIf`` (``llmdiag whatif``): the terminal's before/after table, Markdown and JSON. The HTML page is
``llmdiag.render.html.render_whatif_html``."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from llmdiag.model.whatif import Figures, FixEffect, WhatIf
from llmdiag.render.format import UNAVAILABLE

# (field, label, unit for format)
ROWS: list[tuple[str, str, str]] = [
    ("requests_running", "running", "requests"),
    ("requests_waiting", "waiting", "requests"),
    ("per_user_tokens_per_second", "per-user tokens/s (decoding)", "tokens/s"),
    ("per_user_tokens_per_second_incl_waiting", "per-user tokens/s (queue included)", "tokens/s"),
    ("ttft_p50_seconds", "TTFT p50", "seconds"),
    ("ttft_p90_seconds", "TTFT p90", "seconds"),
    ("total_tokens_per_second", "total tokens/s", "tokens/s"),
    ("kv_peak_ratio", "KV peak", "ratio"),
    ("preemptions_per_second", "preemptions/s", "per second"),
]


def cell(value: float | None, unit: str) -> str:
    if value is None:
        return UNAVAILABLE
    if unit == "ratio":
        return f"{value:.0%}"
    if unit == "seconds":
        return f"{value * 1e3:.0f} ms" if value < 1 else f"{value:.2f} s"
    if unit == "requests":
        return f"{value:.1f}"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"


def changes_text(w: WhatIf) -> str:
    return ", ".join(f"{k}={v}" for k, v in w.changes.items()) or "no change"


def rows(w: WhatIf) -> list[tuple[str, str, str, str]]:
    """(label, measured, before, after) per figure, as text."""
    return [
        (
            label,
            cell(getattr(w.measured, name), unit),
            cell(getattr(w.before, name), unit),
            cell(getattr(w.after, name), unit),
        )
        for name, label, unit in ROWS
    ]


def render_whatif(w: WhatIf) -> RenderableType:
    head = Text.assemble(("what if ", "bold"), (changes_text(w), "bold cyan"), f"  ({w.source})" if w.source else "")
    if not w.modelled:
        return Group(head, Text(f"not modelled: {w.not_modelled_reason}", style="yellow"))
    table = Table(show_header=True, header_style="bold", box=None, padding=(0, 2))
    for title, justify in (("", "left"), ("measured", "right"), ("model before", "right"), ("after", "right")):
        table.add_column(title, justify=justify)  # type: ignore[arg-type]
    for row in rows(w):
        table.add_row(*row)
    band = f"±{w.band_ratio:.0%}" if w.band_ratio is not None else UNAVAILABLE
    lines: list[RenderableType] = [
        head,
        Text(f"class {w.class_before or UNAVAILABLE} → {w.class_after or UNAVAILABLE}   (after: {band})"),
        table,
        Text.assemble(("next limit: ", "bold"), w.next_limit),
        Text("basis:", style="bold"),
        *(Text(f"  - {b}") for b in w.basis),
    ]
    return Group(*lines)


def render_whatif_markdown(w: WhatIf) -> str:
    out = [f"## What if {changes_text(w)}", ""]
    if w.source:
        out += [f"From `{w.source}`.", ""]
    if not w.modelled:
        return "\n".join([*out, f"**Not modelled**: {w.not_modelled_reason}", ""])
    band = f"±{w.band_ratio:.0%}" if w.band_ratio is not None else UNAVAILABLE
    out += [f"Class **{w.class_before}** → **{w.class_after}** (after: {band}).", ""]
    out += ["| figure | measured | model before | after |", "|---|---:|---:|---:|"]
    out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows(w)]
    out += ["", f"**Next limit**: {w.next_limit}", "", "Basis:", ""]
    out += [f"- {b}" for b in w.basis]
    return "\n".join(out) + "\n"


def render_whatif_json(w: WhatIf) -> str:
    return w.model_dump_json(indent=2)


def figures_pairs(before: Figures, after: Figures) -> list[tuple[str, float | None, float | None]]:
    return [(label, getattr(before, name), getattr(after, name)) for name, label, _ in ROWS]


def effect_line(effect: FixEffect) -> str:
    """A fix's predicted effect in one line: the changes, then before → after for the figures users feel."""
    changes = ", ".join(f"{k}={v}" for k, v in effect.changes.items())
    if not effect.modelled or effect.before is None or effect.after is None:
        return f"{changes + ': ' if changes else ''}not modelled ({effect.not_modelled_reason})"
    parts = []
    for name, label, unit in SHORT:
        before, after = getattr(effect.before, name), getattr(effect.after, name)
        if before is not None or after is not None:
            parts.append(f"{label} {cell(before, unit)} → {cell(after, unit)}")
    band = f" (±{effect.band_ratio:.0%})" if effect.band_ratio is not None else ""
    return f"{changes}: {', '.join(parts)}{band}; then {effect.class_after}; next: {effect.next_limit}"


SHORT = [
    ("requests_running", "running", "requests"),
    ("requests_waiting", "waiting", "requests"),
    ("per_user_tokens_per_second_incl_waiting", "per-user tok/s (queue incl.)", "tokens/s"),
    ("ttft_p50_seconds", "TTFT p50", "seconds"),
    ("kv_peak_ratio", "KV peak", "ratio"),
]
