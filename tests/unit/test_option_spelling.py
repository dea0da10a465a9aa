"""Messages from below the CLI name an option as the caller does (``llmdiag.errors.option``): a library caller reads
the keyword it passes, the CLI (which installs ``flag_name`` at startup) its flag, in the words it has always
printed. One error, one coverage note and one derived signal's reason and formula, in both spellings."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llmdiag.cli.options import flag_name
from llmdiag.collect.live import scrape_plan
from llmdiag.collect.servers.pages import check_server
from llmdiag.collect.servers.trtllm import IterationScrape
from llmdiag.collect.telemetry.nvml import no_gpu_note
from llmdiag.engine.derived import add_derived
from llmdiag.errors import NotMetricsError, UsageError, use_option_spelling
from llmdiag.model import SignalSet
from llmdiag.model.nccl import timing_note
from llmdiag.schema.loader import load_probe


@pytest.fixture(params=["library", "cli"])
def spelling(request: pytest.FixtureRequest) -> Iterator[str]:
    previous = use_option_spelling(flag_name if request.param == "cli" else None)
    yield request.param
    use_option_spelling(previous)


def test_an_error_names_the_duration_as_the_caller_does(spelling):
    with pytest.raises(UsageError) as caught:
        scrape_plan(0)
    expected = {
        "library": ("duration_seconds must be positive, got 0", "e.g. duration_seconds 20"),
        "cli": ("--duration must be positive, got 0", "e.g. --duration 20"),
    }
    assert (caught.value.message, caught.value.hint) == expected[spelling]


def test_a_coverage_note_names_the_dcgm_page_as_the_caller_does(spelling):
    option = {"library": "dcgm_url", "cli": "--dcgm-url"}[spelling]
    assert no_gpu_note() == f"GPU telemetry: unavailable (no NVIDIA driver found; pass {option} for remote GPUs)"


def test_a_derived_signal_says_how_to_get_it_as_the_caller_does(spelling):
    signals = SignalSet()
    add_derived(signals)
    roofline = signals.signals["roofline_fraction_ratio"]
    gpu, shape = {"library": ("gpu", "model_shape"), "cli": ("--gpu", "--model-shape")}[spelling]
    assert roofline.unavailable == (
        f"the deployment is unknown: pass {gpu} and {shape} to place the decode rate under its ceiling"
    )
    assert roofline.source == (
        f"derived: measured decode tokens/s / roofline ceiling (set by the scan from {gpu} and {shape})"
    )


def test_the_nccl_reports_timing_note_names_its_options(spelling):
    iters, trials = {"library": ("iters", "trials"), "cli": ("--iters", "--trials")}[spelling]
    assert timing_note() == f"mean per collective over {iters} back to back, averaged over ranks; median of {trials}"


def test_a_json_page_named_as_another_server_says_to_name_trtllm_with_the_server_option(spelling):
    # the hint once said "give --probe trtllm": --probe is the canary switch, the server is named by --server
    json_page = IterationScrape(at_unix=0.0)  # a read of TensorRT-LLM's JSON iteration stats
    with pytest.raises(NotMetricsError) as caught:
        check_server(load_probe("vllm"), json_page, "http://h:8000/metrics")
    assert caught.value.hint == {"library": "give server trtllm", "cli": "give --server trtllm"}[spelling]
