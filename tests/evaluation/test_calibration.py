"""Brier score, expected calibration error (10 equal-width bins) and the site summary."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.calibration import calibration_curve
from sklearn.metrics import brier_score_loss

from fedcxr.evaluation import calibration


def test_brier_matches_sklearn_on_labeled_rows():
    rng = np.random.default_rng(0)
    y = (rng.random(200) < 0.3).astype(float)
    p = rng.random(200)
    y_masked = y.copy()
    y_masked[::5] = np.nan
    keep = ~np.isnan(y_masked)
    assert calibration.brier_score(y_masked, p) == pytest.approx(brier_score_loss(y[keep], p[keep]))
    assert np.isnan(calibration.brier_score([np.nan], [0.5]))


def test_ece_by_hand():
    """Bins [0, .1) … [.9, 1]: 0.05 and 0.08 → bin 0 (mean 0.065, observed 0);
    0.3 → bin 3 (observed 1); 0.95 and 1.0 → bin 9 (mean 0.975, observed 1/2).
    ECE = 2/5·0.065 + 1/5·|1 − 0.3| + 2/5·|0.5 − 0.975| = 0.026 + 0.14 + 0.19 = 0.356."""
    y = [0, 0, 1, 1, 0, np.nan]
    p = [0.05, 0.08, 0.3, 0.95, 1.0, 0.5]
    assert calibration.expected_calibration_error(y, p) == pytest.approx(0.356)
    bins = calibration.reliability_bins(y, p)
    assert bins.count.tolist() == [2, 0, 0, 1, 0, 0, 0, 0, 0, 2]
    assert bins.mean_predicted[[0, 3, 9]] == pytest.approx([0.065, 0.3, 0.975])
    assert bins.observed[[0, 3, 9]] == pytest.approx([0.0, 1.0, 0.5]) and np.isnan(bins.observed[1])
    assert bins.edges == pytest.approx(np.linspace(0, 1, 11))


def test_bins_agree_with_sklearn_calibration_curve():
    rng = np.random.default_rng(1)
    p = rng.random(500)
    y = (rng.random(500) < p ** 2).astype(float)
    bins = calibration.reliability_bins(y, p)
    frac, mean = calibration_curve(y, p, n_bins=10, strategy="uniform")
    filled = bins.count > 0
    assert bins.observed[filled] == pytest.approx(frac) and bins.mean_predicted[filled] == pytest.approx(mean)


def test_perfectly_calibrated_scores_have_small_ece_and_shifted_ones_do_not():
    rng = np.random.default_rng(2)
    p = rng.random(20000)
    y = (rng.random(p.size) < p).astype(float)
    assert calibration.expected_calibration_error(y, p) < 0.02
    overconfident = np.clip(p * 1.6 - 0.3, 0, 1)
    assert calibration.expected_calibration_error(y, overconfident) > 0.08
    assert calibration.brier_score(y, overconfident) > calibration.brier_score(y, p)


def test_calibration_summary_per_class_means_and_pooled():
    y1, p1 = np.array([0, 1, 1, np.nan]), np.array([0.1, 0.8, 0.6, 0.3])
    y2, p2 = np.zeros(4), np.array([0.2, 0.4, 0.05, 0.0])
    frame = pd.DataFrame({"label__a": y1, "prob__a": p1, "label__b": y2, "prob__b": p2,
                          "label__c": np.nan, "prob__c": 0.5})
    summary = calibration.calibration_summary(frame, ["a", "b", "c", "d"])
    a, b, c, d = summary["per_class"]
    assert a["brier"] == pytest.approx((0.01 + 0.04 + 0.16) / 3) and a["n"] == 3 and a["n_pos"] == 2
    assert b["ece"] == pytest.approx(calibration.expected_calibration_error(y2, p2)) and b["reason"] is None
    assert np.isnan(c["brier"]) and c["reason"] == "no labeled rows in test split"
    assert d["reason"] == "no label__d or prob__d column"
    assert summary["mean_brier"] == pytest.approx((a["brier"] + b["brier"]) / 2)
    pooled = summary["pooled"]
    assert pooled["n"] == 7 and pooled["brier"] == pytest.approx(
        calibration.brier_score(np.r_[y1[:3], y2], np.r_[p1[:3], p2]))
    assert sum(b["n"] for b in pooled["bins"]) == 7 and len(pooled["bins"]) == 10
    assert summary["n_bins"] == 10 and pooled["bins"][9] == {"low": pytest.approx(0.9), "high": 1.0, "n": 0,
                                                            "mean_predicted": pytest.approx(np.nan, nan_ok=True),
                                                            "observed": pytest.approx(np.nan, nan_ok=True)}
    with pytest.raises(ValueError, match="n_bins must be at least 1"):
        calibration.reliability_bins([1], [0.5], n_bins=0)
