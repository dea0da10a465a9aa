"""A what-if as people read it (llmdiag.render.whatif and the HTML page), and the library entry that makes one from
a saved verdict (llmdiag.api.whatif): on the recorded vLLM 0.32 scheduling window (2 running, ~30 waiting)."""

from __future__ import annotations

import pytest

from llmdiag.api.scan import diagnose_files
from llmdiag.api.whatif import parse_assignments, predict
from llmdiag.errors import InputFileError, UsageError
from llmdiag.render.html import render_whatif_html
from llmdiag.render.whatif import effect_line, render_whatif_json, render_whatif_markdown
from tests.conftest import FIXTURES


@pytest.fixture(scope="module")
def verdict():
    return diagnose_files(sorted((FIXTURES / "vllm-0.32.0" / "scheduling").glob("scrape-*.prom")))


def test_markdown_puts_measured_model_and_after_side_by_side(verdict):
    text = render_whatif_markdown(predict(verdict, {"replicas": "2"}, source="s.json"))
    assert "| running | 2.0 | 2.0 | 4.0 |" in text  # the pages show 2 running; two replicas run 4
    assert "**Next limit**" in text and "still wait" in text


def test_a_refusal_reads_as_one_reason_everywhere(verdict):
    refused = predict(verdict, {"max_num_seqs": "8"})
    assert "Not modelled" in render_whatif_markdown(refused)
    assert '"after": {' in render_whatif_json(refused) and "step slope" in render_whatif_json(refused)
    page = render_whatif_html(refused)
    assert "NOT MODELLED" in page and "Before and after" not in page


def test_html_has_the_table_and_the_charts(verdict):
    page = render_whatif_html(predict(verdict, {"replicas": 2}))
    assert "Before and after" in page and "whatif_per_user" in page and "Content-Security-Policy" in page


def test_a_fix_effect_in_one_line(verdict):
    effects = [e for f in verdict.findings for e in f.predicted]
    priced = next(e for e in effects if e.modelled)
    assert effect_line(priced).startswith("replicas=2: running 2.0 → 4.0, waiting 30.0 → 28.0")
    refused = next(e for e in effects if not e.modelled)
    assert "not modelled (" in effect_line(refused)


def test_assignments_and_a_verdict_without_inputs(verdict):
    assert parse_assignments(["max_num_seqs=8", "kv_cache_dtype=fp8"]) == {"max_num_seqs": "8", "kv_cache_dtype": "fp8"}
    with pytest.raises(UsageError, match="set twice"):
        parse_assignments(["replicas=2", "replicas=3"])
    old = verdict.model_copy(update={"whatif_inputs": None, "schema_version": "2"})
    with pytest.raises(InputFileError, match="schema 2"):
        predict(old, {"replicas": 2})
