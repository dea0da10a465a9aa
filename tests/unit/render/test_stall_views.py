"""`stalled` and "snapshot" wherever a class or a state is shown: terminal, Markdown, HTML, JSON, Nagios, textfile;
and saved schema "1" verdicts still load."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from llmdiag.collect.logs import collect_logs
from llmdiag.config import Settings
from llmdiag.engine.evaluate import build_verdict
from llmdiag.errors import InputFileError
from llmdiag.model import SCHEMA_VERSION, Signal, SignalSet, SourceInfo, Verdict, Window
from llmdiag.model.check import CheckReport, State, TargetResult, state_of
from llmdiag.model.io import load_result
from llmdiag.render.html import render_html
from llmdiag.render.json import render_json
from llmdiag.render.markdown import render_markdown
from llmdiag.render.nagios import render_nagios
from llmdiag.render.terminal import render_terminal

STALLED_LOG = Path(__file__).parents[2] / "fixtures" / "logs" / "vllm-v0-stalled-cpu.log"


@pytest.fixture(scope="module")
def stalled() -> Verdict:
    return build_verdict(collect_logs([STALLED_LOG]), target=str(STALLED_LOG))


@pytest.fixture(scope="module")
def snapshot() -> Verdict:
    signals = SignalSet(window=Window(kind="snapshot", scrapes=1), sources=[SourceInfo(probe="vllm")])
    for name, value in (("requests_running", 24.0), ("requests_waiting", 40.0), ("kv_cache_usage_ratio", 0.99)):
        stats = {"last": value, "mean": value, "min": value, "max": value, "p90": value}
        signals.add(Signal(name=name, kind="gauge", unit="", stats=stats))
    return build_verdict(signals, target="one pasted dump")


def terminal_text(verdict: Verdict) -> str:
    console = Console(width=200, record=True, file=io.StringIO(), color_system=None)
    console.print(render_terminal(verdict))
    return console.export_text()


def test_terminal_shows_stalled_not_bound(stalled: Verdict):
    text = terminal_text(stalled)
    assert " STALLED " in text and "STALLED-BOUND" not in text
    assert "SCH003" in text


def test_terminal_and_markdown_label_a_snapshot(snapshot: Verdict):
    text = terminal_text(snapshot)
    assert f"confidence {snapshot.confidence:.2f} ({snapshot.confidence_label}, snapshot)" in text
    assert "one snapshot (gauges at one moment, no rates)" in text
    markdown = render_markdown(snapshot)
    assert f"({snapshot.confidence_label}, snapshot)" in markdown
    assert "one snapshot (gauges at one moment, no rates)" in markdown


def test_markdown_and_html_show_stalled(stalled: Verdict):
    assert "**llmdiag: STALLED** · confidence" in render_markdown(stalled)
    page = render_html(stalled)
    assert "stalled" in page and "SCH003" in page


def test_html_labels_a_snapshot(snapshot: Verdict):
    page = render_html(snapshot)
    assert f"({snapshot.confidence_label}, snapshot)" in page
    assert "one snapshot (gauges at one moment, no rates)" in page


def test_json_carries_the_state_the_class_confidences_and_schema_3(stalled: Verdict):
    data = json.loads(render_json(stalled))
    assert data["schema_version"] == SCHEMA_VERSION == "3"
    assert data["bottleneck"] == "stalled"
    assert data["findings"][0]["stall"] is True
    assert data["class_confidence"]["stalled"] == data["confidence"]


def test_a_stalled_server_is_critical_for_check_whatever_its_findings_severity(stalled: Verdict):
    assert state_of(stalled) is State.CRITICAL
    # even were the stall finding only a warning, a hung engine serves nobody
    softened = stalled.model_copy(deep=True)
    for finding in softened.findings:
        finding.severity = finding.severity.__class__("warning")
    assert state_of(softened) is State.CRITICAL
    target = TargetResult(name="gpu-a", url="http://10.0.0.1:8000", verdict=stalled, state=state_of(stalled))
    line = render_nagios(CheckReport(state=target.state, at_unix=1_800_000_000.0, targets=[target]), Settings())
    assert line.startswith("LLMDIAG CRITICAL") or "CRITICAL" in line.splitlines()[0]
    assert "stalled" in line.splitlines()[0]


def test_a_schema_1_verdict_still_loads_and_an_unknown_version_is_refused(stalled: Verdict, tmp_path: Path):
    old = json.loads(render_json(stalled))
    old["schema_version"] = "1"
    for key in ("class_confidence",):
        old.pop(key)
    for finding in old["findings"]:
        finding.pop("stall")
    old["bottleneck"] = "scheduling"  # a "1" file never says stalled
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(old))
    loaded = load_result(path)
    assert isinstance(loaded, Verdict) and loaded.schema_version == "1" and loaded.class_confidence == {}
    old["schema_version"] = "4"
    path.write_text(json.dumps(old))
    with pytest.raises(InputFileError, match="schema_version '4'"):
        load_result(path)
