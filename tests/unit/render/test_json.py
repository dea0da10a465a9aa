"""The JSON report (a public interface): it reads back into the same Verdict, and ``include_samples=False`` drops
only the per-scrape samples."""

from __future__ import annotations

import json

import pytest

from llmdiag.api import diagnose_files
from llmdiag.model import SCHEMA_VERSION, Verdict
from llmdiag.render.json import render_json
from tests.conftest import FIXTURES


@pytest.fixture(scope="module")
def verdict() -> Verdict:
    return diagnose_files(sorted((FIXTURES / "vllm-0.32.0" / "memory").glob("*.prom")))


def test_the_json_reads_back_into_the_same_verdict(verdict: Verdict):
    text = render_json(verdict)
    assert Verdict.model_validate_json(text) == verdict
    data = json.loads(text)
    assert next(iter(data)) == "schema_version" and data["schema_version"] == SCHEMA_VERSION
    assert text.startswith('{\n  "schema_version"')  # indented for a person reading it


def test_without_samples_only_the_samples_go(verdict: Verdict):
    with_samples = json.loads(render_json(verdict))
    without = json.loads(render_json(verdict, include_samples=False))
    sampled = [name for name, s in with_samples["signals"].items() if s["samples"]]
    assert len(sampled) > 5  # six scrapes: the gauges and counters have per-scrape points
    assert all("samples" not in s for s in without["signals"].values())
    for signal in with_samples["signals"].values():
        del signal["samples"]
    assert without == with_samples
