"""``llmdiag whatif``: a saved verdict re-predicted with a set of changes (llmdiag.engine.whatif)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from llmdiag.engine.series import fit
from llmdiag.engine.stepwall import STEP_FIT_MIN_BATCH_SPREAD
from llmdiag.engine.whatif import parse_changes
from llmdiag.engine.whatif import predict as predict_window
from llmdiag.errors import InputFileError, UsageError, option
from llmdiag.model.io import load_result
from llmdiag.model.load import LoadReport
from llmdiag.model.verdict import Verdict
from llmdiag.model.whatif import CHANGE_NAMES, ChangeValue, WhatIf

WHATIF_HINT = (
    "give a verdict saved by `llmdiag scan --json` or `llmdiag analyze --json`, or a `llmdiag load -o` sweep, with"
    " this llmdiag (schema 3)"
)


def predict(verdict: Verdict, changes: Mapping[str, ChangeValue | str], source: str = "") -> WhatIf:
    """What ``changes`` (vLLM's flags with `_`, and `replicas`) would buy on the verdict's window."""
    if verdict.whatif_inputs is None:
        raise InputFileError(
            f"{source or 'the verdict'} carries no what-if inputs (saved with schema {verdict.schema_version})",
            WHATIF_HINT,
        )
    typed = parse_changes({k: str(v) for k, v in changes.items()})
    result = predict_window(verdict.whatif_inputs, typed, verdict.bottleneck.value)
    result.source = source
    return result


# the name `llmdiag` exports it by (`llmdiag.predict_whatif`); `llmdiag.api.whatif.predict` is the same function
predict_whatif = predict


def parse_assignments(pairs: Sequence[str]) -> dict[str, str]:
    """NAME=VALUE strings as a mapping; a pair without '=' or a name given twice is a UsageError."""
    if not pairs:
        raise UsageError(
            "no change to predict",
            f"give at least one {option('set')} NAME=VALUE, NAME one of: {', '.join(CHANGE_NAMES)}",
        )
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        name = name.strip()
        if not sep or not name or not value.strip():
            raise UsageError(f"{pair!r} is not NAME=VALUE", f"e.g. {option('set')} max_num_seqs=8")
        if name in out:
            raise UsageError(f"{name} is set twice", f"give each NAME once to {option('set')}")
        out[name] = value
    return out


def from_load(report: LoadReport, source: str = "") -> Verdict:
    """A `llmdiag load` sweep as one verdict to predict from: its highest level's, with the step fitted across the
    levels (each level's batch and step, and each level's own steady intervals): a level holds its batch still, a
    sweep varies it, so the slope a single window cannot show comes from the sweep."""
    judged = [p.verdict for p in report.points if p.verdict is not None and p.verdict.whatif_inputs is not None]
    if not judged:
        raise InputFileError(f"{source or 'the load report'} has no level with a server-side verdict", WHATIF_HINT)
    top = judged[-1]
    assert top.whatif_inputs is not None
    points: list[tuple[float, float]] = []
    for verdict in judged:
        inputs = verdict.whatif_inputs
        assert inputs is not None
        points += inputs.step_samples
        if inputs.requests_running_mean and inputs.step_seconds_at_mean_batch:
            points.append((inputs.requests_running_mean, inputs.step_seconds_at_mean_batch))
    merged = top.whatif_inputs.model_copy(deep=True)
    batches = [b for b, _ in points]
    if len(points) >= 2 and max(batches) >= STEP_FIT_MIN_BATCH_SPREAD * min(batches):
        slope, at_last, r2 = fit(points)
        merged.step_samples = points
        merged.step_slope_seconds_per_request = slope
        merged.step_intercept_seconds = at_last - slope * points[-1][0]
        merged.step_fit_r2 = r2
        merged.step_fit_source = f"{len(judged)} load levels ({len(points)} points)"
        for name in ("step_intercept_seconds", "step_slope_seconds_per_request", "step_fit_r2"):
            merged.unavailable.pop(name, None)
    return top.model_copy(update={"whatif_inputs": merged})


def whatif_file(path: Path, pairs: Sequence[str]) -> WhatIf:
    """Load a saved verdict (or a `llmdiag load` sweep) and predict the changes given as NAME=VALUE."""
    assignments = parse_assignments(pairs)
    parse_changes(assignments)  # a bad name or value is told before the file is read
    loaded = load_result(path)
    if isinstance(loaded, LoadReport):
        loaded = from_load(loaded, str(path))
    if not isinstance(loaded, Verdict):
        raise InputFileError(f"{path} is a {type(loaded).__name__}, not a verdict", WHATIF_HINT)
    return predict(loaded, assignments, source=str(path))
