"""A /metrics page as people paste it: the real recorded lines, verbatim, inside prose, fences and quotes."""

from __future__ import annotations

import pytest

from llmdiag.collect.exposition import describe_skipped, parse_exposition, parse_pasted
from llmdiag.errors import NotMetricsError
from tests.conftest import FIXTURES

PAGE = FIXTURES / "vllm-0.32.0" / "memory" / "scrape-06.prom"
DCGM = FIXTURES / "dcgm" / "a800-8gpu-mig-idle.prom"
WAITING = 'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 30.0'


def pasted(body: str, quote: str = "") -> str:
    """A bug report's text around a page: a thread header, a shell prompt, a fence; each data line quoted."""
    lines = [f"{quote}{line}" for line in body.splitlines()]
    return "\n".join(["Re: [Bug] KV cache full on 0.32", "", "$ curl -s localhost:8000/metrics", "```text", *lines])


@pytest.mark.parametrize("quote", ["", "> ", ">> ", "    "])
def test_a_pasted_page_reads_as_the_page_itself(quote):
    raw = PAGE.read_text()
    scrape = parse_pasted(pasted(raw, quote) + "\n```\nthanks for looking!\n", None)
    assert scrape.series == parse_exposition(raw, None).series
    assert scrape.skipped_lines == []  # the prose around the block is not data
    assert scrape.series["vllm:num_requests_waiting"] == {(("engine", "0"), ("model_name", "tiny-llama")): 30.0}


def test_bad_lines_inside_the_block_are_skipped_and_counted():
    raw = PAGE.read_text().splitlines()
    at = raw.index(WAITING)
    # an elided label set, a remark typed into the block, a trailing annotation and a last line cut off
    raw[at + 1 : at + 1] = [
        "vllm:num_requests_running{...} 2.0",
        "(the number above went up to 30 during the incident)",
        'vllm:num_preemptions_total{engine="0",model_name="tiny-llama"} 27.0   <-- here',
    ]
    raw.append('vllm:kv_cache_usage_perc{engine="0",model_na')
    text = pasted("\n".join(raw))
    scrape = parse_pasted(text, None)
    first = text.splitlines().index("vllm:num_requests_running{...} 2.0") + 1
    assert len(scrape.skipped_lines) == 4 and scrape.skipped_lines[0] == first
    assert scrape.series["vllm:num_requests_waiting"]  # the lines around them are kept
    said = describe_skipped([("report.md", n) for n in scrape.skipped_lines])
    assert said == f"skipped 4 unreadable lines (first: line {first})"


def test_a_page_with_no_readable_sample_is_refused():
    with pytest.raises(NotMetricsError, match="holds no metric samples"):
        parse_pasted("Here is my page:\n```\nvllm:num_requests_running{...} 2\n```\n", None)
    with pytest.raises(NotMetricsError, match="is empty"):
        parse_pasted("\n\n", None)


def test_dcgm_unconvertible_values_stay_unavailable_not_skipped():
    scrape = parse_pasted(pasted(DCGM.read_text(), "> "), None)
    assert "could not" not in str(scrape.unavailable)
    assert "ERROR - FAILED TO CONVERT TO STRING" in scrape.unavailable["DCGM_FI_DEV_VGPU_PER_PROCESS_UTILIZATION"]
    assert scrape.skipped_lines == []


def test_sample_timestamps_are_the_page_time():
    text = "```\nvllm:num_requests_running 3 1750000000000\nvllm:num_requests_waiting 1 1750000002000\n```"
    assert parse_pasted(text, None).at_unix == 1750000002.0
    assert parse_pasted(text, 5.0).at_unix == 5.0  # the llmdiag-scraped-at line wins
