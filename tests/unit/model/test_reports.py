"""Every report says which schema and which llmdiag wrote it, stamped once (llmdiag.model.report); one Nagios state."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llmdiag._version import __version__
from llmdiag.model import (
    SCHEMA_VERSION,
    CapacityReport,
    CheckReport,
    FleetReport,
    FleetTarget,
    LoadReport,
    Report,
    State,
    TraceReport,
    Verdict,
    Versioned,
    worst,
)


@pytest.mark.parametrize("model", [Verdict, TraceReport, LoadReport, FleetReport, CheckReport])
def test_reports_start_with_their_schema_and_tool_version(model: type[Report]):
    assert issubclass(model, Report)
    assert list(model.model_fields)[:2] == ["schema_version", "tool_version"]
    assert model.model_fields["schema_version"].default == SCHEMA_VERSION
    assert model.model_fields["tool_version"].default == __version__


def test_capacity_names_its_schema_only():
    """A capacity report is a pure function of its inputs: it names no tool version, as before."""
    assert issubclass(CapacityReport, Versioned) and not issubclass(CapacityReport, Report)
    assert list(CapacityReport.model_fields)[:2] == ["schema_version", "kind"]


def test_a_report_read_back_keeps_the_version_that_wrote_it():
    report = TraceReport.model_validate({"schema_version": "1", "tool_version": "0.0.1"})
    assert report.tool_version == "0.0.1"
    assert TraceReport().tool_version == __version__


def test_check_report_has_a_schema_version():
    report = CheckReport(state=State.WARNING, at_unix=0.0, targets=[])
    assert report.model_dump(mode="json")["schema_version"] == SCHEMA_VERSION
    assert report.model_dump(mode="json")["state"] == 1  # the Nagios exit code, as before


def test_a_replica_carries_the_state_by_name():
    assert FleetTarget(name="a", state=State.CRITICAL).state == "CRITICAL"
    assert FleetTarget(name="a").model_dump(mode="json")["state"] == "UNKNOWN"
    assert State[FleetTarget.model_validate({"name": "a", "state": "WARNING"}).state].rank == 2
    with pytest.raises(ValidationError, match="not a state"):
        FleetTarget(name="a", state="BAD")


def test_worse_ranks_higher():
    assert [s.name for s in sorted(State, key=lambda s: s.rank)] == ["OK", "UNKNOWN", "WARNING", "CRITICAL"]
    assert worst([State.OK, State.UNKNOWN, State.WARNING]) is State.WARNING and worst([]) is State.UNKNOWN
