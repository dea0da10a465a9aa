"""`llmdiag whatif` checked against the simulator (llmdiag.planning.validate_whatif): every preset is scanned in
simulated time, each fix its verdict quantifies is applied and rerun under the same users, and the class the
prediction names after the fix is the class the rerun's own verdict names. The accuracy of the figures is the
bench's to print (bench/whatif_accuracy.py), never asserted here."""

from __future__ import annotations

import pytest

from llmdiag.planning import validate_whatif

DECIDED = ("memory", "compute", "scheduling", "network", "healthy")


@pytest.mark.parametrize("preset", ["scheduling", "memory", "compute", "network", "healthy"])
def test_each_fix_predicts_the_class_the_rerun_shows(preset):
    checks = validate_whatif(preset, seconds=40.0)
    if preset in ("scheduling", "memory"):
        # the cap and the KV pool are what these presets are about: their fixes are priced, not refused
        assert len(checks) >= 3, [c.changes for c in checks]
    for check in checks:
        p = check.prediction
        assert p.modelled, p.not_modelled_reason
        assert p.basis and p.band_ratio is not None and p.next_limit
        for figure in (p.before, p.after, check.measured):
            assert figure.requests_running is not None and figure.total_tokens_per_second is not None
        if check.measured_class in DECIDED:  # a rerun judged unknown (no SLO, no telemetry) names no class
            assert p.class_after == check.measured_class, (check.changes, p.next_limit)


def test_raising_the_cap_on_the_scheduling_preset_still_leaves_users_waiting():
    """32 users with --max-num-seqs 4: doubling the cap to 8 leaves 24 waiting, and the prediction says so."""
    [doubled] = [c for c in validate_whatif("scheduling", seconds=40.0) if c.changes == {"max_num_seqs": 8}]
    assert doubled.prediction.after.requests_running == 8 and doubled.prediction.after.requests_waiting == 24
    assert doubled.measured.requests_waiting is not None and doubled.measured.requests_waiting > 20
    assert "still wait" in doubled.prediction.next_limit


def test_a_load_sweep_gives_the_slope_one_held_batch_cannot():
    """The scheduling preset at 2 users (batch 2) and at 32 (held at the cap, 4): each window alone holds its batch
    still, so neither can price --max-num-seqs 8; the two levels of a sweep can."""
    from llmdiag.api.whatif import from_load, predict
    from llmdiag.model import LoadPoint, LoadReport
    from llmdiag.planning import simulated_window
    from llmdiag.sim.presets import LoadSpec, get_preset

    preset = get_preset("scheduling")
    levels = []
    for users in (2, 32):
        load = LoadSpec(users, preset.load.prompt_tokens, preset.load.output_tokens, preset.load.output_spread)
        levels.append(
            LoadPoint(users=users, window_seconds=20, verdict=simulated_window(preset.engine, load, 20, False))
        )
    alone = predict(levels[-1].verdict, {"max_num_seqs": 8})
    assert not alone.modelled and "step slope" in alone.not_modelled_reason
    swept = predict(from_load(LoadReport(points=levels)), {"max_num_seqs": 8})
    assert swept.modelled, swept.not_modelled_reason
    assert any("2 load levels" in line for line in swept.basis)
    assert swept.after.requests_running == 8 and swept.after.requests_waiting == 24
