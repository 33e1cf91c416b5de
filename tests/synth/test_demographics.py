"""NIH's effects as the cohort model uses them: cell log-odds, the level shift, the calibration."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import expit, logit

from fedcxr.synth import demographics as nih
from fedcxr.synth.nih_fit import TERMS


def test_cell_logits_add_up_the_terms_of_the_cell():
    coef = dict(zip(TERMS, nih.tables()[0].loc["edema", list(TERMS)].to_numpy(float)))
    cells = nih.cell_logits("edema")
    assert cells.shape == (2, 5, 2)
    assert cells[0, 2, 0] == pytest.approx(coef["intercept"])  # F, 40-59, PA: the reference
    man_80_ap = (coef["intercept"] + coef["sex_M"] + coef["age_80p"] + coef["view_AP"] + coef["sex_M:view_AP"]
                 + coef["age_80p:view_AP"] + coef["sex_M:age_80p"])
    assert cells[1, 4, 1] == pytest.approx(man_80_ap)
    # NIH's edema: about 11 times as frequent on AP films, in every sex and age bin
    assert (cells[..., 1] - cells[..., 0] > 1.5).all()


def test_lift_sets_the_prevalence_in_nih_case_mix_and_keeps_odds_ratios():
    shift = nih.lift("pneumonia", 0.13)
    lifted = nih.cell_logits("pneumonia") + shift
    assert nih.mix_prevalence(lifted) == pytest.approx(0.13, abs=1e-9)
    assert nih.mix_prevalence(nih.cell_logits("pneumonia")) == pytest.approx(0.0128, abs=1e-3)  # NIH's own
    with pytest.raises(ValueError, match="pneumonia"):
        nih.lift("pneumonia", 1.0)


def test_calibration_without_latent_spread_is_the_target():
    targets = np.array([[-3.0, -1.0], [0.5, -6.0]])
    offsets = nih.calibrate(targets, {}, acute="acute", noise_sd=0.0, ap_intercept=-0.8, ap_slope=1.2)
    np.testing.assert_allclose(offsets, targets, atol=1e-9)


def test_calibrated_offsets_give_the_target_prevalence_given_the_view():
    """Monte Carlo of the cohort's own latent structure: factors, noise, and AP views chosen by the
    acute factor. Each (cell, view) prevalence is the target within 4 standard errors; ignoring that
    the view depends on the acute factor misses it by more than 20 (35 on PA films, measured)."""
    loadings = {"cardiac": 1.5, "acute": 0.6}
    targets = np.array([[-4.0, -1.0], [-2.5, -2.5]])  # [cell, view]
    offsets = nih.calibrate(targets, loadings, acute="acute", noise_sd=0.5, ap_intercept=-0.8, ap_slope=1.2)
    rng = np.random.default_rng(0)
    n = 1_000_000
    acute, cardiac, noise = rng.standard_normal(n), rng.standard_normal(n), rng.normal(0.0, 0.5, n)
    ap = rng.random(n) < expit(-0.8 + 1.2 * acute)
    latent = 1.5 * cardiac + 0.6 * acute + noise
    naive = nih.calibrate(targets, {"cardiac": 1.5, "other": 0.6}, acute="acute", noise_sd=0.5,
                          ap_intercept=-0.8, ap_slope=1.2)  # the same spread, not linked to the view
    for cell in range(2):
        for view, chosen in ((0, ~ap), (1, ap)):
            goal = expit(targets[cell, view])
            se = np.sqrt(goal * (1 - goal) / chosen.sum())
            got = expit(offsets[cell, view] + latent[chosen]).mean()
            assert abs(got - goal) < 4 * se, (cell, view, got, goal)
            if cell == 1:
                wrong = expit(naive[cell, view] + latent[chosen]).mean()
                assert abs(wrong - goal) > 20 * se, (view, wrong, goal)


def test_nih_findings_are_the_fourteen():
    assert len(nih.nih_findings()) == 14 and "pleural_effusion" in nih.nih_findings()
    assert float(logit(0.5)) == 0.0  # the module's expit/logit are scipy's, on the log-odds scale
