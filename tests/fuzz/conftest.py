"""The fuzz tests' hypothesis profile: derandomized (the same examples on every run, so `make test` is
reproducible and a failure replays), no example database, no deadline (time is bounded by pytest's timeout and
judged by scaling in test_bounds.py, never by an absolute time), and a fixed number of examples per target.

The long, random run is bench/fuzz.py.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile(
    "llmdiag-fuzz",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    # the seeds are real fixtures of tens of kB: hypothesis' size and speed checks expect small generated data
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
FUZZ = settings.get_profile("llmdiag-fuzz")
