"""bench/calibration.py and its grid (bench/calib_grid.py) on a tiny grid, so the bench cannot rot: the simulated
windows get their truth from the engine's accounting, the measures add up on cases whose numbers are known by hand,
and the factor fit finds the direction a factor was given."""

from __future__ import annotations

import math
import random

import pytest

from bench import calib_fit, calibration
from bench.calib_grid import MIXED, GridSpec, Noise, run_one, truth_of
from llmdiag.collect.exposition import parse_exposition
from llmdiag.schema.base import parse_toml
from llmdiag.schema.confidence import ConfidenceModel


def _outcome(truth: str, said: str, confidence: float, **factors: float) -> calibration.Outcome:
    return calibration.Outcome("sim", f"{truth}-{said}-{confidence}", truth, said, confidence, factors=factors)


def test_measures_on_cases_known_by_hand():
    cases = [_outcome("memory", "memory", 0.9)] * 3 + [_outcome("memory", "scheduling", 0.9)]
    cases += [_outcome("healthy", "healthy", 0.55)]
    buckets = {(b.low, b.high): b for b in calibration.reliability(cases)}
    top = buckets[(0.9, 1.0)]
    assert (top.n, top.accuracy, top.mean_confidence) == (4, 0.75, pytest.approx(0.9))
    assert buckets[(0.5, 0.6)].n == 1 and buckets[(0.8, 0.9)].n == 0
    # (3 × 0.1² + 0.9² + 0.45²) / 5
    assert calibration.brier(cases) == pytest.approx((3 * 0.01 + 0.81 + 0.2025) / 5)
    assert calibration.confusion(cases) == {"memory": {"memory": 3, "scheduling": 1}, "healthy": {"healthy": 1}}
    # an unknown verdict is an abstention and a mixed window has no truth: neither is judged
    assert calibration.judged([*cases, _outcome("memory", "unknown", 0.3), _outcome(MIXED, "memory", 0.9)]) == cases
    assert any("MISSED" in line for line in calibration.targets(cases))  # 75 % right at 0.9


def test_truth_is_the_largest_share_of_the_window_in_the_accounting():
    assert truth_of({"kv": 0.7, "none": 0.3, "idle": 0.0})[0] == "memory"
    assert truth_of({"compute": 0.3, "bandwidth": 0.3, "none": 0.4})[0] == "compute"  # both are the GPU's step
    assert truth_of({"none": 0.4, "idle": 0.2, "batch_cap": 0.4})[0] == "healthy"  # idle time beside steps
    assert truth_of({"kv": 0.4, "batch_cap": 0.35, "none": 0.25})[0] == MIXED
    assert truth_of({"idle": 1.0, "none": 0.0}) == ("idle", {"idle": 1.0})


def test_noise_keeps_counts_whole_and_ratios_in_range():
    page = (
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 30\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0.99\n"
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\nDCGM_FI_DEV_GPU_UTIL 99\n"
        "# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total 1234\n"
        "# TYPE held gauge\nheld 4096\n# TYPE budget gauge\nbudget 4096\n"
    )
    noise = Noise(random.Random(3), 0.2)
    seen = []
    for _ in range(50):
        scrape = noise.apply(parse_exposition(page, 0.0))
        running = next(iter(scrape.series["vllm:num_requests_running"].values()))
        kv = next(iter(scrape.series["vllm:kv_cache_usage_perc"].values()))
        util = next(iter(scrape.series["DCGM_FI_DEV_GPU_UTIL"].values()))
        assert running.is_integer() and 0 <= kv <= 1 and 0 <= util <= 100
        assert next(iter(scrape.series["vllm:prompt_tokens_total"].values())) == 1234  # counters are not noised
        held, budget = (next(iter(scrape.series[n].values())) for n in ("held", "budget"))
        assert held <= budget  # a full pool read with noise is still full, never fuller
        seen.append(running)
    assert len(set(seen)) > 3  # and the gauges do move


def test_a_tiny_grid_judges_the_simulator_against_its_accounting():
    spec = GridSpec(windows_seconds=(5,), noise=0.05)
    (scheduling,) = run_one(spec, "scheduling", "vllm", 1.0, 0)
    assert scheduling.truth == "scheduling" and scheduling.shares["scheduling"] > 0.9
    assert scheduling.verdict.bottleneck.value == "scheduling"
    # a quarter of the memory preset's users fit in its KV pool: nothing waits, whatever the preset's name
    (light,) = run_one(spec, "memory", "sglang", 0.3, 0)
    assert light.truth == "healthy" and light.settings["users"] < 16
    (idle,) = run_one(spec, "healthy", "tgi", 0.0, 0)
    assert idle.truth == "idle" and idle.verdict.bottleneck.value == "idle"
    outcomes = calibration.sim_outcomes(
        GridSpec(presets=("scheduling",), dialects=("llamacpp",), load_levels=(1.0,), seeds=(0,), windows_seconds=(5,))
    )
    assert [o.held_out for o in outcomes] == [True]  # a held-out preset and dialect
    assert set(outcomes[0].factors) == set(calib_fit.FEATURES)


def test_the_fit_finds_the_direction_each_factor_was_given():
    rng = random.Random(0)
    rows, labels = [], []
    for _ in range(400):
        row = {"critical": float(rng.random() < 0.5), "sanity": float(rng.random() < 0.3), "coverage": 1.0}
        row["warning"] = 1.0 - row["critical"]
        p = 0.95 if row["critical"] else 0.6
        p -= 0.3 * row["sanity"]
        rows.append(row)
        labels.append(rng.random() < p)
    weights, dropped = calib_fit.fit(rows, labels)
    assert weights["sanity"] < -0.5 and weights["critical"] > weights["warning"] and dropped == []
    typical = {"critical": 1.0, "coverage": 1.0}
    assert calib_fit.predict(weights, typical) == pytest.approx(0.95, abs=0.06)
    assert not math.isnan(calib_fit.predict(weights, {**typical, "sanity": 1.0}))


def test_a_factor_the_cases_give_the_wrong_sign_is_dropped_not_fitted():
    # cases where a rival class firing goes with being right more often: logic says a rival never raises the
    # confidence, so the fit holds it at 0 rather than learn the accident
    rng = random.Random(1)
    rows, labels = [], []
    for _ in range(300):
        row = {"critical": 1.0, "coverage": 1.0, "rivals": float(rng.random() < 0.5)}
        rows.append(row)
        labels.append(rng.random() < (0.95 if row["rivals"] else 0.6))
    weights, dropped = calib_fit.fit(rows, labels)
    assert dropped == ["rivals"] and weights["rivals"] == 0.0


def test_the_real_recordings_count_as_much_as_the_sim_grid_and_unknowns_are_not_fitted():
    real = [calibration.Outcome("real", f"r{i}", "memory", "memory", 0.5, factors={"critical": 1.0}) for i in range(2)]
    sim = [calibration.Outcome("sim", f"s{i}", "memory", "memory", 0.5, factors={"critical": 1.0}) for i in range(8)]
    weights = calibration.case_weights([*real, *sim])
    assert sum(weights[:2]) == pytest.approx(sum(weights[2:])) and sum(weights) == pytest.approx(10)
    held = calibration.Outcome("sim", "h", "memory", "memory", 0.5, held_out=True, factors={"critical": 1.0})
    unknown = calibration.Outcome("sim", "u", "memory", "unknown", 0.3, factors={"no_finding": 1.0})
    field = calibration.Outcome("field", "f", "memory", "memory", 0.5, held_out=True, factors={"critical": 1.0})
    result = calibration.fit_confidence([*real, *sim, held, unknown, field])
    assert [o.name for o in result.train] == [o.name for o in [*real, *sim]]


def test_the_written_model_is_one_the_engine_loads(tmp_path):
    rows = [calibration.Outcome("real", "r", "memory", "memory", 0.5, factors={"critical": 1.0})] * 3
    rows.append(calibration.Outcome("sim", "s", "memory", "healthy", 0.5, factors={"critical": 1.0}))
    result = calibration.fit_confidence(rows)
    figures = calibration.figures(rows)
    assert (figures["cases"], figures["accuracy"]) == (4, 0.75)
    path = tmp_path / "confidence.toml"
    calibration.write_model(result, {"real": figures}, path)
    model = parse_toml(ConfidenceModel, "rules/confidence.toml", path.read_text(encoding="utf-8"))
    assert model.weights == {name: round(w, 4) for name, w in result.weights.items()}
    assert (model.provenance.real_cases, model.provenance.sim_cases) == (3, 1)
    assert model.provenance.held_out_presets == list(calibration.HELD_OUT_PRESETS)
    assert model.provenance.measured["real"].accuracy == 0.75


def test_the_quick_run_prints_every_source_and_the_fit(capsys):
    assert calibration.main(["--quick", "--fit"]) == 0
    out = capsys.readouterr().out
    assert "## real (vLLM 0.32 recordings)" in out and "## summary" in out
    assert "| factor | what it is | weight |" in out
    with pytest.raises(SystemExit):
        calibration.main(["--quick", "--fit", "--write"])  # never written from the tiny grid
