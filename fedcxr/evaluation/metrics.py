"""Per-class AUROC, patient-level bootstrap and DeLong confidence intervals, paired tests.

DeLong comes in two forms: classic (every image independent) and patient-clustered
(Obuchowski 1997: structural components summed within patients), which is what a paired
comparison of two models on multi-image patients should use.

Conventions shared by every function here (DESIGN §6):

* ``y`` holds 1 (positive), 0 (negative) or NaN (not labeled). Unlabeled rows are dropped
  before anything is computed; they are neither positives nor negatives.
* AUROC is **undefined** (NaN, never 0.5) when the labeled rows hold a single label value;
  :func:`auroc_reason` says why in words that go into reports.
* AUROC is the Mann-Whitney statistic with ties counted 1/2, i.e. exactly scikit-learn's
  ``roc_auc_score``. The bootstrap computes it on integer row weights (a resample is a
  multiplicity per patient), which equals ``roc_auc_score`` on the replicated rows.

Intervals of classes with few cases follow :mod:`fedcxr.evaluation.small_sample` (Newcombe's
score interval, or none for one patient) instead of the bootstrap or DeLong.

MONAI's ``ROCAUCMetric`` is not used: it returns NaN for every class as soon as one class
column is single-valued and it cannot mask unlabeled entries (DESIGN §9).
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Optional, Sequence

import numpy as np
import pandas as pd
from scipy import stats
from sklearn.metrics import roc_auc_score

from fedcxr.evaluation import small_sample

#: Bootstrap resamples are drawn in chunks so that a chunk's weight matrix stays this small.
_CHUNK_CELLS = 4_000_000


# --------------------------------------------------------------------------- point estimates


def _labeled(y, p) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(y, dtype=float)
    p = np.asarray(p, dtype=float)
    if y.shape != p.shape:
        raise ValueError(f"labels {y.shape} and probabilities {p.shape} differ in shape")
    keep = ~np.isnan(y)
    if np.isnan(p[keep]).any():
        raise ValueError("probabilities contain NaN on labeled rows")
    return y[keep], p[keep]


def auroc_reason(y, split: str = "test") -> Optional[str]:
    """Why AUROC is undefined for labels ``y`` (``None`` when it is defined)."""
    y = np.asarray(y, dtype=float)
    y = y[~np.isnan(y)]
    if y.size == 0:
        return f"no labeled rows in {split} split"
    if not (y == 1).any():
        return f"no positive rows in {split} split"
    if not (y == 0).any():
        return f"no negative rows in {split} split"
    return None


def auroc(y, p) -> float:
    """AUROC on the labeled rows of ``y`` (scikit-learn); NaN when one label value is absent."""
    y, p = _labeled(y, p)
    if auroc_reason(y) is not None:
        return float("nan")
    return float(roc_auc_score(y, p))


def class_aurocs(labels, mask, probs, classes: Sequence[str]) -> dict[str, float]:
    """``{class: AUROC}`` of ``(n, C)`` arrays: per column, :func:`auroc` over the rows whose
    ``mask`` > 0 (labeled); NaN where those rows hold one label value (never 0.5).

    The array form of :func:`per_class_auroc` for training's per-round validation (no CI,
    no reason): the labels, label mask and probabilities a forward pass returns.
    """
    labels, mask, probs = (np.asarray(a, dtype=float) for a in (labels, mask, probs))
    y = np.where(mask > 0, labels, np.nan)
    return {cls: auroc(y[:, i], probs[:, i]) for i, cls in enumerate(classes)}


def accuracy(y, p, threshold: float = 0.5) -> float:
    """Fraction of labeled rows with ``(p >= threshold) == y``; NaN when nothing is labeled.

    Meant for binary tasks (one class, e.g. covid19), as the FDA paper reports ACC beside AUC.
    """
    y, p = _labeled(y, p)
    if y.size == 0:
        return float("nan")
    return float(np.mean((p >= threshold) == (y == 1)))


def mean_auroc(aurocs) -> float:
    """Mean over the defined (finite) class AUROCs; NaN when none is defined."""
    values = np.asarray(list(aurocs.values()) if isinstance(aurocs, Mapping) else aurocs, dtype=float)
    values = values[np.isfinite(values)]
    return float(values.mean()) if values.size else float("nan")


# --------------------------------------------------------------------------- AUROC under many weightings


class _SortedClass:
    """One class's labeled rows prepared for AUROC under many weightings.

    AUROC numerator = Σ over positives i of w_i · (weight of negatives scored below p_i
    + ½ weight of negatives tied with p_i). With the negatives sorted once, the two sums are
    a cumulative sum read at precomputed positions (``lo``: first tie, ``hi``: past the last),
    so a weighting costs one gather and one cumsum over the negatives.
    ``cols``: for each labeled row, its column in the weight matrix (row index or patient code).
    """

    def __init__(self, y: np.ndarray, p: np.ndarray, cols: np.ndarray):
        pos = y == 1
        order = np.argsort(p[~pos], kind="mergesort")
        sorted_neg = p[~pos][order]
        self.neg_cols = cols[~pos][order]
        self.pos_cols = cols[pos]
        self.lo = np.searchsorted(sorted_neg, p[pos], side="left")
        self.hi = np.searchsorted(sorted_neg, p[pos], side="right")

    def auc(self, weights: np.ndarray) -> np.ndarray:
        """AUROC per weight row: ``weights`` (B, columns) → (B,); NaN where one class weighs 0."""
        # integer weights (bootstrap counts) keep an integer cumsum: exact and ~8× faster
        wn = weights.take(self.neg_cols, axis=1)
        cum = np.zeros((weights.shape[0], wn.shape[1] + 1), dtype=wn.dtype)
        np.cumsum(wn, axis=1, out=cum[:, 1:])
        wp = weights.take(self.pos_cols, axis=1)
        num = 0.5 * np.einsum("ij,ij->i", wp, cum[:, self.lo] + cum[:, self.hi])
        denom = wp.sum(axis=1) * cum[:, -1]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(denom > 0, num / np.where(denom > 0, denom, 1.0), np.nan)


# --------------------------------------------------------------------------- bootstrap


class BootstrapCI(NamedTuple):
    """Percentile interval; ``n_skipped`` resamples had one label value and were left out."""

    low: float
    high: float
    n_used: int
    n_skipped: int


def _group_codes(groups, n: int) -> np.ndarray:
    if groups is None:
        return np.arange(n)
    codes, _ = pd.factorize(pd.Series(np.asarray(groups, dtype=object)), use_na_sentinel=False)
    if codes.shape[0] != n:
        raise ValueError(f"groups has {codes.shape[0]} entries for {n} rows")
    return codes


def _resample_counts(codes: np.ndarray, n_boot: int, seed: int):
    """Yield (b, n_patients) int64 chunks: how often each patient is drawn per resample."""
    n_groups = int(codes.max()) + 1 if codes.size else 0
    if n_groups == 0:
        return
    rng = np.random.default_rng(seed)
    chunk = max(1, _CHUNK_CELLS // max(n_groups, codes.size, 1))
    done = 0
    while done < n_boot:
        b = min(chunk, n_boot - done)
        draws = rng.integers(0, n_groups, size=(b, n_groups)) + (np.arange(b) * n_groups)[:, None]
        yield np.bincount(draws.ravel(), minlength=b * n_groups).reshape(b, n_groups)
        done += b


def resample_weights(groups, n_boot: int, seed: int = 0):
    """Yield row-weight chunks (b, n) of a patient-level bootstrap.

    Each resample draws as many patients as there are, with replacement, and takes all rows
    of every drawn patient: a row's weight is how often its patient was drawn. Deterministic
    for a given ``seed``, group order and ``n_boot``.
    """
    codes = _group_codes(groups, len(groups))
    for counts in _resample_counts(codes, n_boot, seed):
        yield counts[:, codes]


def bootstrap_aurocs(y, p, groups, n_boot: int = 1000, seed: int = 0) -> np.ndarray:
    """Per-class AUROC of every patient-level bootstrap resample.

    ``y``, ``p``: (n,) or (n, C); ``groups``: (n,) patient keys. Returns (n_boot, C) with NaN
    where a resample leaves a class with one label value. All classes share the same
    resamples, so a row of the result is one resampled test set (for the mean-AUROC CI).
    """
    y = np.asarray(y, dtype=float)
    p = np.asarray(p, dtype=float)
    if y.ndim == 1:
        y, p = y[:, None], p[:, None]
    n, n_classes = y.shape
    if n == 0:
        return np.full((n_boot, n_classes), np.nan)
    codes = _group_codes(groups, n)
    sorted_classes = []
    for c in range(n_classes):
        rows = np.flatnonzero(~np.isnan(y[:, c]))
        sorted_classes.append(_SortedClass(y[rows, c], p[rows, c], codes[rows]))
    out = []
    for counts in _resample_counts(codes, n_boot, seed):  # weights per patient, gathered per class
        out.append(np.stack([sc.auc(counts) for sc in sorted_classes], axis=1))
    return np.concatenate(out, axis=0) if out else np.empty((0, n_classes))


def percentile_ci(samples, alpha: float = 0.05) -> BootstrapCI:
    """Percentile interval over the finite entries of ``samples``."""
    samples = np.asarray(samples, dtype=float)
    finite = samples[np.isfinite(samples)]
    skipped = int(samples.size - finite.size)
    if finite.size == 0:
        return BootstrapCI(float("nan"), float("nan"), 0, skipped)
    low, high = np.quantile(finite, [alpha / 2, 1 - alpha / 2])
    return BootstrapCI(float(low), float(high), int(finite.size), skipped)


def bootstrap_mean_ci(boot: np.ndarray, alpha: float = 0.05) -> BootstrapCI:
    """CI of the mean AUROC over the classes (columns) of a :func:`bootstrap_aurocs` matrix.

    Pass only the columns of classes that are defined on the full test set: a resample in which
    any of them becomes undefined is skipped (and counted), so every bootstrap mean is over the
    same classes as the point estimate.
    """
    boot = np.asarray(boot, dtype=float)
    if boot.ndim != 2 or boot.shape[1] == 0:
        return BootstrapCI(float("nan"), float("nan"), 0, int(boot.shape[0]) if boot.ndim else 0)
    means = np.where(np.isfinite(boot).all(axis=1), boot.mean(axis=1), np.nan)
    return percentile_ci(means, alpha)


def bootstrap_accuracy_ci(y, p, groups, n_boot: int = 1000, seed: int = 0, alpha: float = 0.05,
                          threshold: float = 0.5) -> BootstrapCI:
    """Patient-level bootstrap percentile CI of :func:`accuracy` (same resampling as AUROC)."""
    y = np.asarray(y, dtype=float)
    p = np.asarray(p, dtype=float)
    labeled = ~np.isnan(y)
    correct = ((p >= threshold) == (y == 1)) & labeled
    values = []
    for weights in resample_weights(groups, n_boot, seed):
        total = weights @ labeled.astype(float)
        with np.errstate(invalid="ignore", divide="ignore"):
            values.append(np.where(total > 0, (weights @ correct.astype(float)) / total, np.nan))
    return percentile_ci(np.concatenate(values) if values else np.array([]), alpha)


# --------------------------------------------------------------------------- DeLong


def _structural_components(y: np.ndarray, preds: np.ndarray):
    """DeLong's structural components for k predictors on labeled rows, via midranks (Sun & Xu 2014).

    ``preds``: (k, n) scores. With ψ(x, y) = 1 if x > y, ½ if x = y, 0 otherwise, M positives X
    and N negatives Y::

        V10(X_i) = (1/N) Σ_j ψ(X_i, Y_j)      per positive: negatives ranked below it
        V01(Y_j) = (1/M) Σ_i ψ(X_i, Y_j)      per negative: positives ranked above it
        AUC = mean_i V10(X_i) = mean_j V01(Y_j)

    computed from average ranks (``scipy.stats.rankdata``) in O(n log n) rather than O(M·N).
    Returns (aucs (k,), v10 (k, M), v01 (k, N)).
    """
    pos = preds[:, y == 1]
    neg = preds[:, y == 0]
    m, n = pos.shape[1], neg.shape[1]
    tx = stats.rankdata(pos, axis=1)
    ty = stats.rankdata(neg, axis=1)
    tz = stats.rankdata(np.concatenate([pos, neg], axis=1), axis=1)
    aucs = (tz[:, :m].sum(axis=1) / m - (m + 1) / 2.0) / n
    v10 = (tz[:, :m] - tx) / n
    v01 = 1.0 - (tz[:, m:] - ty) / m
    return aucs, v10, v01


def _delong_components(y: np.ndarray, preds: np.ndarray):
    """Fast DeLong (DeLong et al. 1988; Sun & Xu 2014): AUCs and their covariance for k predictors.

    cov = S10/M + S01/N with S10, S01 the sample covariances (ddof 1) of the structural
    components V10 over positives and V01 over negatives (:func:`_structural_components`).
    Returns (aucs (k,), cov (k, k)); cov is NaN with fewer than 2 positives or negatives, where
    the components' variance is undefined.
    """
    aucs, v10, v01 = _structural_components(y, preds)
    m, n = v10.shape[1], v01.shape[1]
    k = preds.shape[0]
    if m < 2 or n < 2:
        return aucs, np.full((k, k), np.nan)
    sx = np.atleast_2d(np.cov(v10))
    sy = np.atleast_2d(np.cov(v01))
    return aucs, sx / m + sy / n


def delong(y, p) -> tuple[float, float]:
    """DeLong AUROC and its variance on labeled rows; (NaN, NaN) when AUROC is undefined."""
    y, p = _labeled(y, p)
    if auroc_reason(y) is not None:
        return float("nan"), float("nan")
    aucs, cov = _delong_components(y, p[None, :])
    return float(aucs[0]), float(cov[0, 0])


def delong_ci(y, p, alpha: float = 0.05) -> tuple[float, float]:
    """Normal-approximation CI from the DeLong variance, clipped to [0, 1]."""
    auc, var = delong(y, p)
    if not (np.isfinite(auc) and np.isfinite(var)):
        return float("nan"), float("nan")
    half = stats.norm.ppf(1 - alpha / 2) * np.sqrt(max(var, 0.0))
    return float(max(0.0, auc - half)), float(min(1.0, auc + half))


def delong_paired_test(y, p1, p2) -> tuple[float, float, float, float]:
    """Two-sided DeLong test of AUROC(p1) = AUROC(p2) on the same labeled rows.

    Returns ``(auc1, auc2, z, p_value)``. Identical predictions (zero variance of the
    difference) give z = 0, p = 1. NaN everywhere when AUROC is undefined or there are fewer
    than two positives or negatives.
    """
    y = np.asarray(y, dtype=float)
    keep = ~np.isnan(y)
    y, p1, p2 = y[keep], np.asarray(p1, float)[keep], np.asarray(p2, float)[keep]
    if auroc_reason(y) is not None:
        return (float("nan"),) * 4
    aucs, cov = _delong_components(y, np.stack([p1, p2]))
    return _paired_z(aucs, cov)


# --------------------------------------------------------------------------- patient-clustered DeLong


def _clustered_delong_components(y: np.ndarray, preds: np.ndarray, codes: np.ndarray):
    """Obuchowski (1997) AUCs and covariance for k predictors when rows come in clusters (patients).

    Why: images of one patient are correlated, so DeLong's variance, which treats every image
    as independent, is too small when patients have several images. Obuchowski sums DeLong's
    structural components within each cluster i (m_i positives, n_i negatives; I clusters, I10
    of them with a positive, I01 with a negative; M = Σ m_i, N = Σ n_i) and treats clusters as
    the independent units::

        a_ri = Σ_{positives of i} V10_r(X) − m_i θ_r     b_ri = Σ_{negatives of i} V01_r(Y) − n_i θ_r
        S10_rs = I10 / ((I10 − 1) M) · Σ_i a_ri a_si
        S01_rs = I01 / ((I01 − 1) N) · Σ_i b_ri b_si
        S11_rs = I / (I − 1)         · Σ_i a_ri b_si
        cov(θ_r, θ_s) = S10_rs / M + S01_rs / N + (S11_rs + S11_sr) / (M N)

    With one row per cluster, S11 = 0 (no cluster holds both a positive and a negative) and
    S10, S01 are DeLong's sample variances, so the result is DeLong's exactly.
    ``codes``: (n,) integer cluster codes of the labeled rows. Returns (aucs (k,), cov (k, k),
    n_clusters); cov is NaN unless at least 2 clusters hold a positive and 2 a negative.
    """
    aucs, v10, v01 = _structural_components(y, preds)
    k = preds.shape[0]
    codes = pd.factorize(codes)[0]  # dense 0..I-1 over the labeled rows only
    n_clusters = int(codes.max()) + 1 if codes.size else 0
    pos_codes, neg_codes = codes[y == 1], codes[y == 0]
    i10, i01 = np.unique(pos_codes).size, np.unique(neg_codes).size
    if i10 < 2 or i01 < 2:
        return aucs, np.full((k, k), np.nan), n_clusters
    m_i = np.bincount(pos_codes, minlength=n_clusters)
    n_i = np.bincount(neg_codes, minlength=n_clusters)
    a = np.stack([np.bincount(pos_codes, weights=v10[r], minlength=n_clusters) for r in range(k)])
    b = np.stack([np.bincount(neg_codes, weights=v01[r], minlength=n_clusters) for r in range(k)])
    a -= aucs[:, None] * m_i[None, :]
    b -= aucs[:, None] * n_i[None, :]
    m, n = pos_codes.size, neg_codes.size
    s10 = i10 / ((i10 - 1) * m) * (a @ a.T)
    s01 = i01 / ((i01 - 1) * n) * (b @ b.T)
    s11 = n_clusters / (n_clusters - 1) * (a @ b.T)
    return aucs, s10 / m + s01 / n + (s11 + s11.T) / (m * n), n_clusters


def _labeled_with_clusters(y, preds: list, clusters):
    """Labeled rows of ``y``, each predictor and the cluster codes (checked to match in length)."""
    y = np.asarray(y, dtype=float)
    codes = _group_codes(clusters, y.shape[0])
    keep = ~np.isnan(y)
    out = [np.asarray(p, dtype=float) for p in preds]
    for p in out:
        if p.shape != y.shape:
            raise ValueError(f"labels {y.shape} and probabilities {p.shape} differ in shape")
        if np.isnan(p[keep]).any():
            raise ValueError("probabilities contain NaN on labeled rows")
    return y[keep], [p[keep] for p in out], codes[keep]


def clustered_delong(y, p, clusters) -> tuple[float, float]:
    """AUROC and its patient-clustered variance (Obuchowski 1997) on labeled rows.

    ``clusters``: (n,) cluster labels (``patient_key``). Equals :func:`delong` when every
    cluster has one row. (NaN, NaN) when AUROC is undefined; variance NaN unless at least 2
    clusters hold a positive and 2 a negative.
    """
    y, (p,), codes = _labeled_with_clusters(y, [p], clusters)
    if auroc_reason(y) is not None:
        return float("nan"), float("nan")
    aucs, cov, _ = _clustered_delong_components(y, p[None, :], codes)
    return float(aucs[0]), float(cov[0, 0])


def clustered_delong_paired_test(y, p1, p2, clusters) -> tuple[float, float, float, float]:
    """Two-sided test of AUROC(p1) = AUROC(p2) on the same labeled rows, clustered by patient.

    z = (θ1 − θ2) / sqrt(var1 + var2 − 2 cov12) with the Obuchowski (co)variances of
    :func:`_clustered_delong_components`; p = 2 (1 − Φ(|z|)). Returns ``(auc1, auc2, z, p)``:
    the same conventions as :func:`delong_paired_test` (identical predictions: z = 0, p = 1;
    NaN when undefined), and the same numbers when every cluster has one row.
    """
    y, (p1, p2), codes = _labeled_with_clusters(y, [p1, p2], clusters)
    if auroc_reason(y) is not None:
        return (float("nan"),) * 4
    aucs, cov, _ = _clustered_delong_components(y, np.stack([p1, p2]), codes)
    return _paired_z(aucs, cov)


def _paired_z(aucs: np.ndarray, cov: np.ndarray) -> tuple[float, float, float, float]:
    """z and two-sided p of θ1 − θ2 given their (2, 2) covariance."""
    auc1, auc2 = float(aucs[0]), float(aucs[1])
    var = cov[0, 0] + cov[1, 1] - 2 * cov[0, 1]
    if not np.isfinite(var):
        return auc1, auc2, float("nan"), float("nan")
    if var <= 1e-15:
        return auc1, auc2, 0.0, 1.0
    z = (auc1 - auc2) / np.sqrt(var)
    return auc1, auc2, float(z), float(2 * stats.norm.sf(abs(z)))


# --------------------------------------------------------------------------- across classes


def paired_ttest(aurocs_a, aurocs_b) -> tuple[float, float]:
    """Paired t-test over class AUROCs (as the surgical-aggregation paper compares methods).

    Inputs: equal-length sequences in the same class order, or mappings class → AUROC (then
    paired by class name). Only pairs defined in both are used. Returns ``(t, p)``; NaN with
    fewer than two pairs; ``(0.0, 1.0)`` when every difference is exactly zero.
    """
    if isinstance(aurocs_a, Mapping) and isinstance(aurocs_b, Mapping):
        keys = [k for k in aurocs_a if k in aurocs_b]
        a = np.array([aurocs_a[k] for k in keys], dtype=float)
        b = np.array([aurocs_b[k] for k in keys], dtype=float)
    else:
        a = np.asarray(aurocs_a, dtype=float)
        b = np.asarray(aurocs_b, dtype=float)
        if a.shape != b.shape:
            raise ValueError(f"paired AUROCs differ in length: {a.shape} vs {b.shape}")
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    if a.size < 2:
        return float("nan"), float("nan")
    if np.all(a - b == 0):
        return 0.0, 1.0
    res = stats.ttest_rel(a, b)
    return float(res.statistic), float(res.pvalue)


# --------------------------------------------------------------------------- per-class table

#: the columns every per-class row has held since schema 1 (readers of old reports require only these)
PER_CLASS_COLUMNS = ["class", "auroc", "ci_low", "ci_high", "n", "n_pos", "prevalence", "reason"]
#: schema 3: is the AUROC small-sample, which method made its interval, cases counted in patients
#: (:mod:`fedcxr.evaluation.small_sample`)
SMALL_SAMPLE_COLUMNS = ["small_sample", "ci_method", "pos_patients", "neg_patients"]


def per_class_auroc(
    frame: pd.DataFrame,
    classes: Sequence[str],
    *,
    n_boot: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
    split: str = "test",
    return_bootstrap: bool = False,
):
    """Per-class AUROC table of a prediction frame (``label__<c>``, ``prob__<c>``, ``patient_key``).

    CIs: patient-level bootstrap (``n_boot`` > 0, needs ``patient_key``) or DeLong (``n_boot`` = 0),
    except where the small-sample rule (:mod:`fedcxr.evaluation.small_sample`) gives Newcombe's
    score interval or none. Columns: :data:`PER_CLASS_COLUMNS`, :data:`SMALL_SAMPLE_COLUMNS` and
    ``ci_skipped`` (bootstrap resamples left out). ``reason`` explains a NaN AUROC or CI, or an
    interval replaced because it had no width. With ``return_bootstrap`` also returns the
    (n_boot, C) bootstrap matrix (for the mean-AUROC CI), ``None`` under DeLong.
    """
    n = len(frame)
    y = np.full((n, len(classes)), np.nan)
    p = np.full((n, len(classes)), np.nan)
    missing: dict[int, str] = {}
    for j, cls in enumerate(classes):
        if f"label__{cls}" not in frame:
            missing[j] = f"no label column label__{cls}"
        elif f"prob__{cls}" not in frame:
            missing[j] = f"model has no output prob__{cls}"
        else:
            y[:, j] = pd.to_numeric(frame[f"label__{cls}"], errors="raise").to_numpy(dtype=float, na_value=np.nan)
            p[:, j] = pd.to_numeric(frame[f"prob__{cls}"], errors="raise").to_numpy(dtype=float, na_value=np.nan)
    groups = frame["patient_key"].to_numpy(dtype=object) if "patient_key" in frame else None
    boot = None
    if n_boot > 0:
        if groups is None:
            raise ValueError("a patient-level bootstrap needs a patient_key column")
        boot = bootstrap_aurocs(y, p, groups, n_boot, seed)
    rows = [_class_row(cls, y[:, j], p[:, j], groups, missing.get(j), boot, j, alpha, split)
            for j, cls in enumerate(classes)]
    table = pd.DataFrame(rows, columns=PER_CLASS_COLUMNS + SMALL_SAMPLE_COLUMNS + ["ci_skipped"])
    return (table, boot) if return_bootstrap else table


def _class_row(cls, y, p, groups, missing, boot, j, alpha, split) -> dict:
    cases = small_sample.count_cases(y, groups)
    n, n_pos = cases.pos + cases.neg, cases.pos
    row = {"class": cls, "auroc": np.nan, "ci_low": np.nan, "ci_high": np.nan, "n": n,
           "n_pos": n_pos, "prevalence": n_pos / n if n else np.nan, "reason": None,
           "small_sample": cases.small, "ci_method": None, "pos_patients": cases.pos_patients,
           "neg_patients": cases.neg_patients, "ci_skipped": 0}
    reason = missing or auroc_reason(y, split)
    if reason:
        row["reason"] = reason
        return row
    row["auroc"] = auroc(y, p)
    if boot is not None:
        ci = percentile_ci(boot[:, j], alpha)
        note = "CI undefined: every bootstrap resample had a single label value" if ci.n_used == 0 else None
        default = small_sample.Interval(ci.low, ci.high, small_sample.BOOTSTRAP, note)
    else:
        low, high = delong_ci(y, p, alpha)
        note = None if np.isfinite(low) else "DeLong CI undefined: fewer than 2 positive or 2 negative rows"
        default = small_sample.Interval(low, high, small_sample.DELONG, note)
    chosen = small_sample.auroc_interval(row["auroc"], cases, default, alpha)
    row.update(ci_low=chosen.low, ci_high=chosen.high, ci_method=chosen.method, reason=chosen.note)
    if chosen.method == small_sample.BOOTSTRAP:
        row["ci_skipped"] = ci.n_skipped
    return row
