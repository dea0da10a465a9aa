"""`llmdiag load` as a library call refuses a plan it cannot run before it sends anything (the load itself, against a
live server, is tests/e2e/test_load_cli.py): no level is started, and the message says what to change."""

from __future__ import annotations

import pytest

from llmdiag.api.load import run_load
from llmdiag.client.endpoint import Connection
from llmdiag.collect.load import LoadPlan
from llmdiag.errors import UsageError


def refused(connection: Connection, plan: LoadPlan) -> UsageError:
    started: list[int] = []
    with pytest.raises(UsageError) as info:
        run_load(connection, plan, on_level=lambda index, total, level: started.append(index))
    assert started == []  # nothing ran
    return info.value


def test_another_machine_is_refused_before_any_request():
    # 10.1.2.3 is never contacted: the plan is checked first, and a request to it would hang, not refuse
    error = refused(Connection("http://10.1.2.3:8000", timeout_seconds=0.1), LoadPlan(levels=[8]))
    assert "10.1.2.3" in error.message and "not this machine" in error.message


def test_a_plan_without_levels_or_with_bad_ones_is_refused_before_any_request():
    local = Connection("http://127.0.0.1:9", timeout_seconds=0.1)  # the discard port: nothing is sent
    assert "no load level" in refused(local, LoadPlan(levels=[])).message
    assert "whole numbers" in refused(local, LoadPlan(levels=[1, 2.5])).message
