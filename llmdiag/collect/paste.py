"""Text as people paste it into bug reports: the data lines inside Markdown fences, ``>`` quotes, shell prompts
and prose. Readers take each line through ``unquote_line`` and match their own formats anywhere in the file, so a
thread header or a sentence before the data never decides what the file is."""

from __future__ import annotations

import re

# "> ", ">> ", "> > " (e-mail and GitHub quotes), then the indentation of a list item or a code block
QUOTE_RE = re.compile(r"^(?:\s*>)+ ?")
FENCE_RE = re.compile(r"^\s*(?:```|~~~)")


def unquote_line(line: str) -> str:
    """The line without quote markers, surrounding whitespace and a trailing CR; a Markdown fence line is empty."""
    text = QUOTE_RE.sub("", line.rstrip("\r\n"))
    if FENCE_RE.match(text):
        return ""
    return text.strip()


def data_lines(text: str) -> list[str]:
    """Every line of a pasted text, unquoted (empty lines kept, so line numbers still match the file)."""
    return [unquote_line(line) for line in text.splitlines()]
