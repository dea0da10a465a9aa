"""Render a Verdict as JSON: a public interface, versioned by ``schema_version``."""

from __future__ import annotations

from llmdiag.model import Verdict


def render_json(verdict: Verdict, include_samples: bool = True) -> str:
    exclude = {"signals": {"__all__": {"samples"}}} if not include_samples else None
    return verdict.model_dump_json(indent=2, exclude=exclude)
