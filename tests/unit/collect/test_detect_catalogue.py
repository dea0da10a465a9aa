"""Server detection reads the probe catalogue: a broken probe spec is an error, never a server silently missing."""

from __future__ import annotations

import pytest

from llmdiag.collect import detect
from llmdiag.errors import NotMetricsError, RuleSpecError, UnsupportedServerError
from llmdiag.schema.loader import DATA_TABLES, probe_names


def test_every_server_probe_is_a_candidate():
    assert detect.server_names() == ["llamacpp", "sglang", "tgi", "triton", "trtllm", "vllm"]
    assert not DATA_TABLES & set(probe_names())


def test_a_broken_probe_spec_raises(monkeypatch: pytest.MonkeyPatch):
    def broken(name: str):
        raise RuleSpecError(f"probes/{name}.toml", "signal.0.kind", "Input should be 'gauge', …")

    monkeypatch.setattr(detect, "load_probe", broken)
    detect.server_probes.cache_clear()
    try:
        with pytest.raises(RuleSpecError, match="probes/"):
            detect.server_probes()
    finally:
        detect.server_probes.cache_clear()


def test_unsupported_server_is_in_the_error_tree():
    error = detect.unsupported("http://host:8000", ["metric names (none)"])
    assert isinstance(error, UnsupportedServerError) and isinstance(error, NotMetricsError)
    assert "vLLM" in error.hint and "{servers}" not in error.hint
