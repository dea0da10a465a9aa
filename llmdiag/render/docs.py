"""Rule documentation, generated from the rule files: `llmdiag rules show` and docs/rules/*.md."""

from __future__ import annotations

from llmdiag.engine.schema import RuleSpec

ENGINE_TITLES = (("vllm", "vLLM"), ("sglang", "SGLang"), ("trtllm", "TensorRT-LLM"))
# sections every rule page has; a test fails when one is empty
DOC_SECTIONS = ("What it catches", "Why it matters", "When it fires", "How to check by hand", "How to fix")


def _condition(signal: str, stat: str, op: str, value: float | None) -> str:
    return f"`{signal}` {stat} {op} {value:g}" if value is not None else ""


def render_rule_markdown(rule: RuleSpec) -> str:
    ladder = rule.severity
    op = ">=" if ladder.direction == "above" else "<="
    lines = [
        f"# {rule.code} {rule.slug}",
        "",
        f"**{rule.title}** · class `{rule.category.value}` · status `{rule.status}`",
        "",
        "## What it catches",
        "",
        rule.what,
        "",
        "## Why it matters",
        "",
        rule.why,
        "",
        "## When it fires",
        "",
        f"- warning when {_condition(ladder.signal, ladder.stat, op, ladder.warning)}",
    ]
    if ladder.critical is not None:
        lines.append(f"- critical when {_condition(ladder.signal, ladder.stat, op, ladder.critical)}")
    if rule.gate:
        lines.append("- only while all of these hold:")
        lines += [f"  - {_condition(c.signal, c.stat, c.op, c.value)}" for c in rule.gate]
    lines += [
        "",
        "Thresholds can be changed in `llmdiag.toml` (`[rules." + rule.code + "] warning = …, critical = …`).",
        "",
        "## How to check by hand",
        "",
        "```sh",
        rule.verify or "llmdiag scan URL --verbose",
        "```",
        "",
        "## How to fix",
        "",
        rule.fix.text,
    ]
    for key, title in ENGINE_TITLES:
        flags = getattr(rule.fix, key)
        if flags:
            lines += ["", f"{title}:", ""] + [f"- {flag}" for flag in flags]
    return "\n".join(lines) + "\n"
