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


def test_class_aurocs_use_the_labeled_rows_of_each_column():
    labels = np.array([[1, 0], [0, 1], [1, 1], [0, 0]], dtype=float)
    mask = np.array([[1, 1], [1, 1], [1, 0], [0, 1]], dtype=float)
    probs = np.array([[0.9, 0.2], [0.4, 0.1], [0.3, 0.8], [0.6, 0.7]])
    got = metrics.class_aurocs(labels, mask, probs, ["a", "b"])
    # a: rows 0-2 (1: 0.9, 0.3; 0: 0.4) → pairs (0.9 > 0.4), (0.3 < 0.4) → 1/2;
    # b: rows 0, 1, 3 (1: 0.1; 0: 0.2, 0.7) → 0/2
    assert got == {"a": 0.5, "b": 0.0}
    one_valued = metrics.class_aurocs(np.ones((4, 1)), np.ones((4, 1)), np.random.rand(4, 1), ["edema"])
    assert np.isnan(one_valued["edema"])


def test_bootstrap_aurocs_equal_sklearn_on_each_resample_replicated():
    """A resample's AUROC (integer row weights: how often each row's patient was drawn) is
    scikit-learn's on the rows replicated that often; ``resample_weights`` gives the same draws."""
    y, p = _data(150, seed=3)
    groups = np.arange(150) // 2
    boot = metrics.bootstrap_aurocs(y, p, groups, n_boot=6, seed=1)
    weights = np.concatenate(list(metrics.resample_weights(groups, 6, seed=1)))
    want = [roc_auc_score(np.repeat(y, w), np.repeat(p, w)) for w in weights]
    np.testing.assert_allclose(boot[:, 0], want, atol=1e-12)


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


def _bootstrap_ci(y, p, groups, n_boot, seed):
    """The per-class CI of :func:`metrics.per_class_auroc`: percentiles of the class's resampled AUROCs."""
    return metrics.percentile_ci(metrics.bootstrap_aurocs(y, p, groups, n_boot, seed)[:, 0])


def test_bootstrap_ci_contains_estimate_narrows_with_n_and_is_reproducible():
    widths = []
    for n_patients in (60, 1000):
        y, p = _data(2 * n_patients, seed=2)
        groups = np.repeat(np.arange(n_patients), 2)
        ci = _bootstrap_ci(y, p, groups, n_boot=400, seed=7)
        assert ci.low <= metrics.auroc(y, p) <= ci.high
        assert ci.n_used + ci.n_skipped == 400
        widths.append(ci.high - ci.low)
        assert _bootstrap_ci(y, p, groups, n_boot=400, seed=7) == ci
        assert _bootstrap_ci(y, p, groups, n_boot=400, seed=8) != ci
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
    ci = _bootstrap_ci(y, p, np.arange(6), n_boot=300, seed=0)
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


# --------------------------------------------------------------------------- patient-clustered DeLong


def _slow_clustered(y, preds, clusters):
    """Obuchowski (1997) written out with the O(M·N) kernel and explicit loops over clusters."""
    pos, neg = y == 1, y == 0
    comps = []
    for p in preds:
        psi = (p[pos][:, None] > p[neg][None, :]) + 0.5 * (p[pos][:, None] == p[neg][None, :])
        theta = psi.mean()
        v10, v01 = psi.mean(axis=1), psi.mean(axis=0)
        a, b = [], []
        for c in dict.fromkeys(clusters):
            in_c = np.asarray(clusters) == c
            a.append(v10[in_c[pos]].sum() - in_c[pos].sum() * theta)
            b.append(v01[in_c[neg]].sum() - in_c[neg].sum() * theta)
        comps.append((theta, np.array(a), np.array(b)))
    m, n = pos.sum(), neg.sum()
    i_all = len(dict.fromkeys(clusters))
    i10 = len(set(np.asarray(clusters)[pos]))
    i01 = len(set(np.asarray(clusters)[neg]))

    def cov(r, s):
        (_, ar, br), (_, as_, bs) = comps[r], comps[s]
        s10 = i10 / ((i10 - 1) * m) * np.sum(ar * as_)
        s01 = i01 / ((i01 - 1) * n) * np.sum(br * bs)
        s11_rs = i_all / (i_all - 1) * np.sum(ar * bs)
        s11_sr = i_all / (i_all - 1) * np.sum(as_ * br)
        return s10 / m + s01 / n + (s11_rs + s11_sr) / (m * n)

    return [c[0] for c in comps], np.array([[cov(r, s) for s in range(len(preds))] for r in range(len(preds))])


def _clustered_data(n_patients: int, seed: int = 0):
    """Patients with 1–4 images and a per-patient difficulty: an easy patient's positive images
    score high and its negative images low, so the images of one patient are correlated."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 5, n_patients)
    clusters = np.repeat([f"P{i:04d}" for i in range(n_patients)], sizes)
    ease = np.repeat(rng.normal(size=n_patients), sizes)
    y = (rng.random(clusters.size) < 0.35).astype(float)
    sign = 2 * y - 1
    p1 = np.round(1 / (1 + np.exp(-(sign * (1.0 + ease) + rng.normal(size=y.size)))), 2)
    p2 = np.round(1 / (1 + np.exp(-(sign * (0.6 + ease) + rng.normal(size=y.size)))), 2)
    return y, p1, p2, clusters


def test_clustered_delong_equals_classic_delong_with_one_row_per_cluster():
    for ties in (True, False):
        y, p = _data(300, seed=11, ties=ties)
        q = np.clip(p + np.random.default_rng(1).normal(0, 0.1, p.size), 0, 1)
        clusters = np.random.default_rng(2).permutation([f"K{i}" for i in range(y.size)])
        auc, var = metrics.clustered_delong(y, p, clusters)
        assert (auc, var) == pytest.approx(metrics.delong(y, p), rel=1e-12)
        assert metrics.clustered_delong_paired_test(y, p, q, clusters) == pytest.approx(
            metrics.delong_paired_test(y, p, q), rel=1e-10)
        # no cluster labels at all means one cluster per row
        assert metrics.clustered_delong(y, p, None) == pytest.approx((auc, var), rel=1e-12)


def test_clustered_delong_hand_checked_example():
    """Patients A (one positive 0.9, one negative 0.3), B (positive 0.6, negative 0.7),
    C (positive 0.8), D (negative 0.2).

    V10: 0.9 → 1, 0.6 → 2/3 (beats 0.3 and 0.2, not 0.7), 0.8 → 1; θ = 8/9.
    V01: 0.3 → 1, 0.7 → 2/3 (below 0.9 and 0.8), 0.2 → 1.
    a = V10 sums − m_i θ: A 1/9, B −2/9, C 1/9, D 0;  b = V01 sums − n_i θ: A 1/9, B −2/9, C 0, D 1/9.
    I = 4, I10 = I01 = 3, M = N = 3:
    S10 = 3/(2·3) · 6/81 = 1/27,  S01 = 1/27,  S11 = 4/3 · 5/81 = 20/243,
    var = S10/3 + S01/3 + 2 S11/9 = 1/81 + 1/81 + 40/2187 = 94/2187,
    against classic DeLong's 1/81 + 1/81 = 54/2187: the two within-patient pairs agree, so the
    clustered variance is larger.
    """
    y = np.array([1, 0, 1, 0, 1, 0], dtype=float)
    p = np.array([0.9, 0.3, 0.6, 0.7, 0.8, 0.2])
    clusters = ["A", "A", "B", "B", "C", "D"]
    auc, var = metrics.clustered_delong(y, p, clusters)
    assert auc == pytest.approx(8 / 9, abs=1e-15)
    assert var == pytest.approx(94 / 2187, rel=1e-12)
    assert metrics.delong(y, p)[1] == pytest.approx(54 / 2187, rel=1e-12)


def test_clustered_delong_matches_slow_reference_for_single_and_paired():
    y, p1, p2, clusters = _clustered_data(120, seed=4)
    y[::9] = np.nan  # unlabeled rows are dropped (and their clusters with them)
    keep = ~np.isnan(y)
    aucs, cov = _slow_clustered(y[keep], [p1[keep], p2[keep]], list(clusters[keep]))
    auc, var = metrics.clustered_delong(y, p1, clusters)
    assert auc == pytest.approx(aucs[0], abs=1e-12) and var == pytest.approx(cov[0, 0], rel=1e-9)
    auc1, auc2, z, p = metrics.clustered_delong_paired_test(y, p1, p2, clusters)
    z_ref = (aucs[0] - aucs[1]) / np.sqrt(cov[0, 0] + cov[1, 1] - 2 * cov[0, 1])
    assert (auc1, auc2) == pytest.approx(tuple(aucs), abs=1e-12)
    assert z == pytest.approx(z_ref, rel=1e-9)
    from scipy.stats import norm
    assert p == pytest.approx(2 * norm.sf(abs(z_ref)), rel=1e-9)
    # correlated images of one patient: the clustered variance clearly exceeds the naive one
    assert var > 1.3 * metrics.delong(y, p1)[1]


def test_duplicated_rows_keep_clustered_variance_while_naive_variance_halves():
    """Every image copied into a 2-row cluster adds no information: AUROC and the clustered
    variance stay (exactly, in theory) the same; the naive DeLong variance about halves."""
    y, p = _data(400, seed=9)
    q = np.round(np.clip(p + np.random.default_rng(3).normal(0, 0.15, p.size), 0, 1), 2)
    auc, var = metrics.delong(y, p)
    y2, p2, q2 = (np.repeat(a, 2) for a in (y, p, q))
    clusters = np.repeat(np.arange(y.size), 2)
    auc_c, var_c = metrics.clustered_delong(y2, p2, clusters)
    assert auc_c == pytest.approx(auc, abs=1e-12)
    assert var_c == pytest.approx(var, rel=1e-9)
    naive = metrics.delong(y2, p2)[1]
    assert 0.45 < naive / var < 0.55
    # the paired test: the clustered p-value is the unduplicated one, the naive one shrinks
    p_orig = metrics.delong_paired_test(y, p, q)[3]
    assert metrics.clustered_delong_paired_test(y2, p2, q2, clusters)[3] == pytest.approx(p_orig, rel=1e-6)
    assert metrics.delong_paired_test(y2, p2, q2)[3] < p_orig


def test_clustered_delong_undefined_and_identical_cases():
    y = np.array([1, 1, 0, 0, 0, 1], dtype=float)
    p = np.array([0.9, 0.8, 0.1, 0.4, 0.3, 0.7])
    one_positive_patient = ["A", "A", "B", "C", "D", "A"]
    auc, var = metrics.clustered_delong(y, p, one_positive_patient)
    assert auc == pytest.approx(metrics.auroc(y, p)) and np.isnan(var)
    res = metrics.clustered_delong_paired_test(y, p, p[::-1], one_positive_patient)
    assert np.isnan(res[2]) and np.isnan(res[3])
    assert all(np.isnan(metrics.clustered_delong([0, 0, np.nan], [0.1, 0.2, 0.3], ["a", "b", "c"])))
    yc, p1, _, clusters = _clustered_data(50, seed=1)
    assert metrics.clustered_delong_paired_test(yc, p1, p1.copy(), clusters)[2:] == (0.0, 1.0)
    with pytest.raises(ValueError, match="groups has 2 entries for 6 rows"):
        metrics.clustered_delong(y, p, ["a", "b"])
