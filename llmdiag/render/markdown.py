"""Render a Verdict or a LoadReport as compact GitHub-flavoured Markdown, to paste into an issue or a chat.

Strings from a server (model names, label values, error text) are escaped so they cannot break a table, open
a link, or inject HTML into the page that renders the Markdown.
"""

from __future__ import annotations

import re

from llmdiag.engine.fixes import fix_view, verdict_engine
from llmdiag.model import LoadReport, Verdict
from llmdiag.render.format import CAPACITY_CLASSES, UNAVAILABLE, confidence_words, format_value, window_words
from llmdiag.render.whatif import effect_line

# what could start markup, a tag, a link or a table cell; '_' only where it is not inside a word (snake_case
# names stay readable: GitHub never reads an underscore between two word characters as emphasis)
_SPECIAL = re.compile(r"([\\`*\[\]<>|~&]|(?<!\w)_|_(?!\w))")


def md(text: object) -> str:
    """One line of Markdown text: backslash-escapes Markdown's specials (HTML tags and table pipes included)."""
    one_line = " ".join(str(text).split())
    return _SPECIAL.sub(r"\\\1", one_line)


def code(text: object) -> str:
    """Inline code on one line; backticks inside are replaced, pipes escaped (GFM tables split on them)."""
    one_line = " ".join(str(text).split()).replace("`", "'").replace("|", "\\|")
    return f"`{one_line}`" if one_line else ""


def _headline(verdict: Verdict) -> list[str]:
    bound = "-bound" if verdict.bottleneck.value in CAPACITY_CLASSES else ""
    return [
        f"**llmdiag: {verdict.bottleneck.value.upper()}{bound.upper()}** · confidence {verdict.confidence:.2f} "
        f"({confidence_words(verdict.confidence_label, verdict.window.kind)})",
        "",
        f"> {md(verdict.summary)}",
        "",
        f"{md(verdict.target)} · " + _window(verdict),
    ]


def _window(verdict: Verdict) -> str:
    window = verdict.window
    if (words := window_words(window.kind)) is not None:
        return words
    if window.duration_seconds is None:
        return f"window {UNAVAILABLE}"
    return f"window {window.duration_seconds:.0f} s, {window.scrapes} scrapes"


def _findings(verdict: Verdict) -> list[str]:
    if not verdict.findings:
        return ["", "No findings."]
    lines = ["", "| severity | rule | evidence | value | threshold | source |", "|---|---|---|---|---|---|"]
    for finding in verdict.findings:
        rule = f"**{finding.code}** {md(finding.title)}" + (" (advisory)" if finding.advisory else "")
        for index, item in enumerate(finding.evidence or [None]):
            if item is None:
                lines.append(f"| {finding.severity.value} | {rule} | | | | |")
                continue
            name = item.signal if item.stat == "value" else f"{item.signal} {item.stat}"
            threshold = f"{item.op} {format_value(item.threshold, item.unit)}" if item.threshold is not None else ""
            first = index == 0
            lines.append(
                f"| {finding.severity.value if first else ''} | {rule if first else ''} | {code(name)} | "
                f"{md(format_value(item.value, item.unit))} | {md(threshold)} | {code(item.source)} |"
            )
    engine = verdict_engine(verdict)
    for finding in verdict.findings:
        view = fix_view(finding, engine)
        if view is None:
            continue
        lines += ["", f"**{finding.code} fix:** {md(view.text)}"]
        if view.own:
            lines += ["", f"{md(view.title)}:", ""] + [f"- {code(fix)}" for fix in view.own]
        if view.others:
            titles = ", ".join(md(title) for title, _ in view.others)
            lines += ["", f"{titles}: {code('llmdiag rules show ' + finding.code)}"]
        if finding.predicted:
            lines += ["", "Predicted (`llmdiag whatif`):", ""] + [f"- {md(effect_line(e))}" for e in finding.predicted]
    return lines


def _experience(verdict: Verdict) -> list[str]:
    x = verdict.experience

    def s(v: float | None) -> str:
        return format_value(v, "seconds")

    return [
        "",
        f"Users: TTFT p50/p90 {s(x.ttft_p50_seconds)} / {s(x.ttft_p90_seconds)} · ITL p50/p90 "
        f"{s(x.itl_p50_seconds)} / {s(x.itl_p90_seconds)} · {format_value(x.per_user_tokens_per_second, 'tokens/s')}"
        f" per user · {format_value(x.generation_tokens_per_second, 'tokens/s')} total · running/waiting "
        f"{format_value(x.requests_running_mean, 'requests')} / {format_value(x.requests_waiting_mean, 'requests')}",
    ]


def _coverage(verdict: Verdict) -> list[str]:
    missing = [c for c in verdict.coverage.classes if not c.evaluated]
    skipped = [r for r in verdict.coverage.rules if r.status in ("skipped", "muted")]
    lines = ["", f"Coverage: {len(verdict.coverage.rules) - len(skipped)} of {len(verdict.coverage.rules)} rules ran"]
    lines += [f"- {c.category.value} not evaluated: {md(c.reason)}" for c in missing]
    if skipped:
        lines += ["", "<details><summary>skipped rules</summary>", ""]
        lines += [f"- {r.code} {r.status}: {md(r.reason)}" for r in skipped]
        lines += ["", "</details>"]
    return lines


def render_markdown(result: Verdict | LoadReport) -> str:
    if isinstance(result, LoadReport):
        return render_load_markdown(result)
    lines = _headline(result) + _findings(result) + _experience(result)
    if result.roofline is not None:
        r = result.roofline
        lines += [
            "",
            f"Ceiling: decode {format_value(r.measured_tokens_per_second, 'tokens/s')} is "
            f"{r.fraction_of_ceiling_ratio:.0%} of {format_value(r.ceiling_tokens_per_second, 'tokens/s')} "
            f"({md(r.model)} on {r.tp} × {md(r.gpu)}, bound by {md(r.bound_by)})",
        ]
    lines += _coverage(result)
    lines += ["", f"<sub>llmdiag {md(result.tool_version)}</sub>"]
    return "\n".join(lines) + "\n"


def render_load_markdown(report: LoadReport) -> str:
    level = "users" if report.mode == "closed" else "rate/s"
    lines = [
        f"**llmdiag load** · {md(report.target)} · model {md(report.model)} · prompt {md(report.prompt_tokens)} / "
        f"output {md(report.output_tokens)} tokens",
        "",
    ]
    if report.knee is not None:
        where = f"{report.knee.users} users" if report.knee.users is not None else f"{report.knee.rate_per_second:g}/s"
        cls = f"; the server there is {report.knee.bottleneck.value}" if report.knee.bottleneck is not None else ""
        lines.append(f"> Knee at {where}: {md(report.knee.reason)}{cls}")
    else:
        lines.append("> No knee across the sweep")
    lines += [
        "",
        f"| {level} | ok | errors | TTFT p50/p99 | ITL p50/p99 | tok/s total | per user tok/s p5/p50/p95 | goodput | "
        "verdict |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for p in report.points:
        u = p.per_user_decode_tokens_per_second
        tok = [format_value(v, "tokens/s") for v in (u.p5, u.p50, u.p95)]
        ttft, itl = (
            f"{format_value(d.p50, 'seconds')} / {format_value(d.p99, 'seconds')}"
            for d in (p.ttft_seconds, p.itl_seconds)
        )
        lines.append(
            f"| {p.users if p.users is not None else f'{p.rate_per_second:g}'} | {p.requests_completed} | "
            f"{sum(p.errors.values())} | {ttft} | {itl} | "
            f"{format_value(p.output_tokens_per_second, 'tokens/s')} | {' / '.join(tok)} | "
            f"{UNAVAILABLE if p.goodput_ratio is None else f'{p.goodput_ratio:.0%}'} | "
            f"{p.verdict.bottleneck.value if p.verdict is not None else UNAVAILABLE} |"
        )
    lines += [f"- {md(n)}" for n in report.notes]
    lines += ["", f"<sub>llmdiag {md(report.tool_version)}</sub>"]
    return "\n".join(lines) + "\n"
