"""AUROC, bootstrap, DeLong and paired tests checked against scikit-learn and slow references."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from fedcxr.evaluation import metrics


def _data(n: int, seed: int = 0, skill: float = 1.0, ties: bool = True):
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.3).astype(float)
    p = 1 / (1 + np.exp(-(rng.normal(size=n) + skill * y)))
    if ties:
        p = np.round(p, 2)  # many tied scores
    return y, p


def _slow_delong(y, p):
    """O(m·n) DeLong (1988): structural components from the pairwise kernel."""
    pos, neg = p[y == 1], p[y == 0]
    psi = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    return psi.mean(), psi.mean(1).var(ddof=1) / len(pos) + psi.mean(0).var(ddof=1) / len(neg)


def test_auroc_equals_sklearn_on_labeled_rows():
    y, p = _data(400)
    y_masked = y.copy()
    y_masked[::7] = np.nan
    keep = ~np.isnan(y_masked)
    assert metrics.auroc(y_masked, p) == pytest.approx(roc_auc_score(y[keep], p[keep]), abs=1e-12)


@pytest.mark.parametrize("y,reason", [
    ([0, 0, np.nan, 0], "no positive rows in test split"),
    ([1, 1, 1, np.nan], "no negative rows in test split"),
    ([np.nan, np.nan, np.nan, np.nan], "no labeled rows in test split"),
])
def test_auroc_undefined_is_nan_with_reason_never_half(y, reason):
    p = [0.1, 0.9, 0.5, 0.3]
    assert np.isnan(metrics.auroc(y, p))
    assert metrics.auroc_reason(y) == reason
    assert metrics.auroc_reason([0, 1]) is None


def test_weighted_auroc_equals_sklearn_on_replicated_rows():
    y, p = _data(150, seed=3)
    weights = np.random.default_rng(1).integers(0, 4, size=(6, y.size))
    got = metrics.weighted_auroc(y, p, weights)
    want = [roc_auc_score(np.repeat(y, w), np.repeat(p, w)) for w in weights]
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_delong_auc_equals_sklearn_and_variance_matches_slow_reference():
    for ties in (True, False):
        y, p = _data(300, seed=5, ties=ties)
        auc, var = metrics.delong(y, p)
        slow_auc, slow_var = _slow_delong(y, p)
        assert auc == pytest.approx(roc_auc_score(y, p), abs=1e-12)
        assert auc == pytest.approx(slow_auc, abs=1e-12)
        assert var == pytest.approx(slow_var, rel=1e-9)
    low, high = metrics.delong_ci(y, p)
    assert low < auc < high


def test_delong_paired_test_detects_better_model_and_not_identical_ones():
    rng = np.random.default_rng(0)
    y = (rng.random(600) < 0.4).astype(float)
    good = y * 2.5 + rng.normal(size=y.size)
    weak = y * 0.3 + rng.normal(size=y.size)
    auc1, auc2, z, p = metrics.delong_paired_test(y, good, weak)
    assert auc1 == pytest.approx(roc_auc_score(y, good))
    assert auc2 == pytest.approx(roc_auc_score(y, weak))
    assert z > 0 and p < 1e-6
    _, _, z_same, p_same = metrics.delong_paired_test(y, good, good.copy())
    assert z_same == 0.0 and p_same == 1.0
    # a slightly different but equally good model is not significant
    other = y * 2.5 + rng.normal(size=y.size)
    assert metrics.delong_paired_test(y, good, other)[3] > 0.05


def test_bootstrap_ci_contains_estimate_narrows_with_n_and_is_reproducible():
    widths = []
    for n_patients in (60, 1000):
        y, p = _data(2 * n_patients, seed=2)
        groups = np.repeat(np.arange(n_patients), 2)
        ci = metrics.bootstrap_ci(y, p, groups, n_boot=400, seed=7)
        assert ci.low <= metrics.auroc(y, p) <= ci.high
        assert ci.n_used + ci.n_skipped == 400
        widths.append(ci.high - ci.low)
        assert metrics.bootstrap_ci(y, p, groups, n_boot=400, seed=7) == ci
        assert metrics.bootstrap_ci(y, p, groups, n_boot=400, seed=8) != ci
    assert widths[1] < widths[0] / 2


def test_bootstrap_resamples_whole_patients():
    """A patient's rows always come along together: every resample weight is per patient."""
    groups = np.array(["a", "a", "b", "c", "c", "c"])
    for weights in metrics.resample_weights(groups, 50, seed=0):
        assert (weights[:, 0] == weights[:, 1]).all()
        assert (weights[:, 3] == weights[:, 4]).all() and (weights[:, 4] == weights[:, 5]).all()
        # 3 patients drawn per resample
        assert (weights[:, [0, 2, 3]].sum(axis=1) == 3).all()


def test_bootstrap_skips_and_counts_single_class_resamples():
    # one positive patient among few: some resamples lose it
    y = np.array([1, 0, 0, 0, 0, 0], dtype=float)
    p = np.array([0.9, 0.1, 0.2, 0.3, 0.4, 0.5])
    ci = metrics.bootstrap_ci(y, p, np.arange(6), n_boot=300, seed=0)
    assert ci.n_skipped > 0 and ci.n_used + ci.n_skipped == 300
    assert ci.low <= 1.0 <= ci.high


def test_paired_ttest_nan_aware_and_by_class_name():
    a = [0.8, 0.7, np.nan, 0.9, 0.75]
    b = [0.7, 0.65, 0.6, np.nan, 0.7]
    t, p = metrics.paired_ttest(a, b)
    from scipy.stats import ttest_rel
    ref = ttest_rel([0.8, 0.7, 0.75], [0.7, 0.65, 0.7])
    assert t == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue)
    t2, p2 = metrics.paired_ttest({"x": 0.8, "y": 0.7, "z": 0.75}, {"z": 0.7, "y": 0.65, "x": 0.7})
    assert (t2, p2) == pytest.approx((t, p))
    assert metrics.paired_ttest([0.8, 0.7], [0.8, 0.7]) == (0.0, 1.0)
    assert np.isnan(metrics.paired_ttest([0.8, np.nan], [0.7, 0.6])[1])


def test_accuracy_and_mean_auroc():
    assert metrics.accuracy([1, 0, np.nan, 1], [0.7, 0.6, 0.9, 0.5]) == pytest.approx(2 / 3)
    assert np.isnan(metrics.accuracy([np.nan], [0.3]))
    assert metrics.mean_auroc([0.8, np.nan, 0.6]) == pytest.approx(0.7)
    assert np.isnan(metrics.mean_auroc([np.nan]))


def test_per_class_auroc_table_reasons_and_cis():
    rng = np.random.default_rng(0)
    n = 200
    y = (rng.random(n) < 0.3).astype(float)
    frame = pd.DataFrame({
        "patient_key": np.repeat(np.arange(100), 2).astype(str),
        "label__edema": y, "prob__edema": 0.3 * y + 0.7 * rng.random(n),
        "label__hernia": np.zeros(n), "prob__hernia": rng.random(n),
    })
    table = metrics.per_class_auroc(frame, ["edema", "hernia", "covid19"], n_boot=200)
    assert list(table.columns[:8]) == metrics.PER_CLASS_COLUMNS
    edema, hernia, covid = table.to_dict(orient="records")
    assert edema["auroc"] == pytest.approx(roc_auc_score(y, frame["prob__edema"]))
    assert edema["ci_low"] < edema["auroc"] < edema["ci_high"] and pd.isna(edema["reason"])
    assert edema["n_pos"] == int(y.sum()) and edema["prevalence"] == pytest.approx(y.mean())
    assert np.isnan(hernia["auroc"]) and hernia["reason"] == "no positive rows in test split"
    assert covid["reason"] == "no label column label__covid19"
    delong_table = metrics.per_class_auroc(frame, ["edema"], n_boot=0)
    assert delong_table.loc[0, "ci_low"] == pytest.approx(metrics.delong_ci(y, frame["prob__edema"])[0])
