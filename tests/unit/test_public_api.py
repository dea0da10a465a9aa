"""The public API: ``llmdiag.__all__`` is pinned, every name in it resolves, and ``import llmdiag`` stays cheap."""

from __future__ import annotations

import subprocess
import sys

import llmdiag
from llmdiag.api import ENTRY_POINTS

PUBLIC = [
    "Finding",
    "SignalSet",
    "Verdict",
    "__version__",
    "analyze_traces",
    "capacity_question",
    "diagnose",
    "diagnose_files",
    "diagnose_fleet",
    "diagnose_logs",
    "diagnose_prometheus",
    "diagnose_prometheus_fleet",
    "diagnose_prometheus_fleet_timeline",
    "fleet_from_prometheus",
    "fleet_from_signal_sets",
    "predict_whatif",
    "run_capacity",
    "run_check",
    "run_compare",
    "run_demo",
    "run_load",
    "run_nccl_bench",
    "run_prometheus_check",
    "whatif_file",
]


def test_all_is_pinned():
    assert llmdiag.__all__ == PUBLIC


def test_every_api_entry_point_is_public():
    # a new entry point in llmdiag.api is exported from llmdiag too (and pinned above)
    assert set(ENTRY_POINTS) <= set(llmdiag.__all__)


def test_every_name_resolves():
    from llmdiag import api, model

    for name in llmdiag.__all__:
        value = getattr(llmdiag, name)
        assert value is not None, name
        if name in ENTRY_POINTS:
            assert value is getattr(api, name) and callable(value), name
    assert llmdiag.Verdict is model.Verdict and llmdiag.Finding is model.Finding
    assert llmdiag.SignalSet is model.SignalSet
    assert isinstance(llmdiag.__version__, str)
    assert set(llmdiag.__all__) <= set(dir(llmdiag))


def test_an_unknown_name_is_an_attribute_error():
    try:
        llmdiag.no_such_thing  # noqa: B018
    except AttributeError as error:
        assert "no_such_thing" in str(error)
    else:
        raise AssertionError("llmdiag.no_such_thing resolved")


def test_import_llmdiag_is_cheap():
    probe = "import sys, llmdiag; print(sorted(m for m in sys.modules if m.startswith('llmdiag')))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['llmdiag', 'llmdiag._version']"
