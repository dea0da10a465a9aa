"""--record's bundle is written when the run ends, also when it failed; an interrupted run writes none."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmdiag.api.record import ScanCall, active_recorder
from llmdiag.cli.output import recording
from llmdiag.client.endpoint import Connection
from llmdiag.collect.bundle import read_bundle
from llmdiag.errors import ConnectError


def one_scan(recorder: object) -> None:
    assert active_recorder() is recorder
    with recorder.tape("http://h:1", ScanCall(Connection(base_url="http://h:1"), 3.0)):  # type: ignore[attr-defined]
        raise ConnectError("cannot connect to http://h:1/metrics: connection refused")


def test_a_failed_run_is_written_with_its_error(tmp_path: Path) -> None:
    path = tmp_path / "b.tar.gz"
    with pytest.raises(ConnectError), recording(path, "scan", {"url": "http://h:1"}) as recorder:
        one_scan(recorder)
    (run,) = read_bundle(path).runs
    assert run.call["error"]["message"] == "cannot connect to http://h:1/metrics: connection refused"
    assert active_recorder() is None


def test_an_interrupted_run_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "b.tar.gz"
    with pytest.raises(KeyboardInterrupt), recording(path, "scan", {}) as recorder:
        try:
            one_scan(recorder)
        except ConnectError:
            raise KeyboardInterrupt from None
    assert not path.exists() and not list(tmp_path.iterdir())
