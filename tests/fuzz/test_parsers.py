"""Every parser of saved or served data, fuzzed (issue 19 §2): real fixtures mutated (truncated, spliced,
duplicated, reordered, bytes flipped, huge numbers, NaN/Inf, odd Unicode, CRLF, deep nesting) and inputs built from
scratch, through bench/fuzz_inputs.py's targets.

The property: a parser returns, or raises one of llmdiag's errors (the CLI prints those as one ERROR and one HINT
line, exit 2). Any other exception fails the test, with the input hypothesis shrank it to. The number of examples
per target is fixed and the run derandomized (conftest.py's profile): seconds in `make test`; bench/fuzz.py runs
the same targets for thousands.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from hypothesis import given, settings

from bench import fuzz_inputs
from llmdiag.errors import LlmdiagError
from tests.fuzz.conftest import FUZZ
from tests.support.required import SHARED_TRACES, TRACES_ENV, require_tool

# examples per target: the cheap parsers more, the file-level ones (the catalogue, the whole analyze path) fewer
EXAMPLES = {"analyze": 30, "trace": 20, "trace-gzip": 20, "prometheus-api": 30, "logs": 40}
DEFAULT_EXAMPLES = 50
TARGETS = fuzz_inputs.targets()


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_a_parser_raises_only_llmdiag_errors(name: str, tmp_path: Path) -> None:
    strategy, call = TARGETS[name]
    if name.startswith("trace") and not fuzz_inputs.trace_seeds():
        require_tool(f"{SHARED_TRACES} holds no trace to start from", TRACES_ENV)  # fails in make test

    @settings(FUZZ, max_examples=EXAMPLES.get(name, DEFAULT_EXAMPLES))
    @given(strategy)
    def property_(value: object) -> None:
        with contextlib.suppress(LlmdiagError):  # refused in plain words: what bad input should get
            call(value, tmp_path)  # type: ignore[operator]

    property_()


def test_every_parser_of_the_issue_is_a_target() -> None:
    """The list of issue 19 §2, so a target dropped from bench/fuzz_inputs.py is noticed."""
    wanted = {
        "exposition-live", "exposition-pasted", "logs", "trtllm-json", "trace", "trace-gzip", "prometheus-api",
        "config", "rule-spec", "probe-spec", "nvidia-smi", "nccl-log", "nccl-tests", "ib-ports", "analyze",
    }  # fmt: skip
    assert wanted <= set(TARGETS)


def test_the_seeds_are_the_real_fixtures() -> None:
    """Each target starts from fixtures that exist (a glob that matches nothing would fuzz nothing)."""
    for patterns in (fuzz_inputs.PAGES, fuzz_inputs.LOGS, fuzz_inputs.EVERYTHING):
        assert len(fuzz_inputs.seeds(*patterns)) >= 5
    page = fuzz_inputs.seeds("vllm-0.32.0/memory/scrape-01.prom")[0]
    assert b"vllm:kv_cache_usage_perc" in page  # verbatim, cut at a line end
    assert page.endswith(b"\n")
