"""The fitted confidence model's data (rules/confidence.toml): one weight per factor and where the weights came from.

A verdict's confidence is σ(Σ weightᵢ·factorᵢ) over the factors llmdiag.engine.confidence reads at verdict time. The
weights are an estimate, fitted by ``bench/calibration.py`` on cases whose truth is known; the file says by which
command, when, on which cases and with which held-out figures, so a reader can judge the number it produces.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from pydantic import Field, model_validator

from llmdiag.errors import RuleSpecError
from llmdiag.schema.base import _Strict, parse_toml

CONFIDENCE_PATH = "rules/confidence.toml"
# each factor, what it is, and the sign its weight must have where physics or logic says which way it pulls (0: free).
# critical, warning and no_finding are one-hot (exactly one is 1): together they are the model's intercept.
FACTORS: dict[str, tuple[str, int]] = {
    "critical": ("the verdict's finding is critical", 0),
    "warning": ("the verdict's finding is a warning", 0),
    "no_finding": ("no finding: healthy or idle", 0),
    "idle": ("idle: nothing was served in the window", 0),
    "coverage": ("share of the core signals available (0-1)", +1),
    "margin": ("how far past its threshold the verdict's finding is, as a ratio less 1, clipped to 0-2", +1),
    "second_signal": ("another finding of the same class reads a different signal", +1),
    "rivals": ("classes that fired that the verdict's class does not explain", -1),
    "preview": ("the verdict's class rests on preview rules alone", -1),
    "log_window": ("ln(1 + window seconds), 0 for one dump, clipped at 10 min", +1),
    "single_dump": ("one dump: lifetime averages or a snapshot, not a window", -1),
    "few_scrapes": ("a window of fewer than 5 scrapes", -1),
    "sanity": ("a metric sanity finding fired", -1),
}


class Measured(_Strict):
    """One source's figures measured with these weights applied by the engine."""

    cases: int = Field(ge=0)
    accuracy: float = Field(ge=0, le=1)
    brier: float = Field(ge=0, le=1)
    targets: list[str] = Field(default_factory=list)


class Provenance(_Strict):
    command: str = Field(min_length=1)
    fitted_at: str = Field(min_length=1)  # ISO 8601, UTC
    tree: str = ""  # the git commit the fit ran on, when known
    method: str = Field(min_length=1)
    real_cases: int = Field(ge=0)
    sim_cases: int = Field(ge=0)
    held_out_presets: list[str]
    held_out_dialects: list[str]
    excluded: str = Field(min_length=1)
    measured: dict[str, Measured] = Field(default_factory=dict)  # real, sim, sim_held_out, field


class ConfidenceModel(_Strict):
    provenance: Provenance
    weights: dict[str, float]

    @model_validator(mode="after")
    def _every_factor_once(self) -> ConfidenceModel:
        missing = sorted(set(FACTORS) - set(self.weights))
        unknown = sorted(set(self.weights) - set(FACTORS))
        if missing or unknown:
            raise ValueError(f"weights must name every factor once: missing {missing}, unknown {unknown}")
        for name, weight in self.weights.items():
            sign = FACTORS[name][1]
            if sign * weight < 0:
                raise ValueError(f"{name} must not be {'negative' if sign > 0 else 'positive'} (got {weight:g})")
        return self


@cache
def load_confidence_model() -> ConfidenceModel:
    entry = resources.files("llmdiag.rules") / "confidence.toml"
    if not entry.is_file():
        raise RuleSpecError(CONFIDENCE_PATH, "(file)", "no confidence model")
    return parse_toml(ConfidenceModel, CONFIDENCE_PATH, entry.read_text(encoding="utf-8"))
