"""A live test's CLI run against the simulator, run once more when the host starved the simulator during it.

The simulator holds its state on a busy machine: its clock stands still while the host is late
(``llmdiag.sim.realtime``), so its queues, latencies and GPU activity stay its preset's. What a scan measures in
real time does not hold: a canary's latency, seconds without a counter moving, rates per real second. When the
simulator's clock stood still for more than ``MAX_LAG_SHARE`` of the run, the run is repeated once (with a warning
in pytest's summary), and the second one is judged whatever its lag: a test never skips for it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

from llmdiag.sim.server import SimServer
from tests.conftest import CliResult, run_cli

# the share of a run's real time the simulator's clock may stand still before the run is not judged
MAX_LAG_SHARE = 0.5


def lag_share(before: Mapping[str, Any], after: Mapping[str, Any]) -> float:
    """The share of the real time between two ``SimServer.snapshot()`` readings the simulated clock stood still."""
    real = after["real_seconds"] - before["real_seconds"]
    return (after["lag_seconds"] - before["lag_seconds"]) / real if real > 0 else 0.0


def run_cli_on_sim(
    sim: SimServer, *args: str, timeout: float = 120, before_each: Callable[[], None] | None = None
) -> CliResult:
    """``run_cli(*args)`` against ``sim``; once more if the simulator lagged over ``MAX_LAG_SHARE`` of the run.
    ``before_each`` resets what a run leaves behind (a history file) before each one."""
    for attempt in (1, 2):
        if before_each is not None:
            before_each()
        before = sim.snapshot()
        result = run_cli(*args, timeout=timeout)
        share = lag_share(before, sim.snapshot())
        if share <= MAX_LAG_SHARE or attempt == 2:
            return result
        warnings.warn(
            f"the simulator's clock stood still {share:.0%} of the run (a starved host): run again", stacklevel=2
        )
    raise AssertionError("unreachable")
