"""Calibration: do the predicted probabilities match how often the finding is present?

AUROC only ranks: any monotone transform of the scores leaves it unchanged, so a model can rank
well and still say 30% where the truth is 5% (federated and fine-tuned models often shift like
this between sites). Two summaries per class, on labeled rows (NaN labels are dropped):

* **Brier score** = (1/n) Σ_i (p_i − y_i)². 0 is perfect; always predicting the prevalence π
  scores π(1 − π), so compare classes with care.
* **Expected calibration error** (ECE) with B = 10 **equal-width** bins: bin k holds
  k/B ≤ p < (k+1)/B (the last bin also holds p = 1), and

      ECE = Σ_k (n_k / n) · |ȳ_k − p̄_k|

  with n_k rows in bin k, ȳ_k the fraction of them positive and p̄_k their mean probability;
  empty bins add nothing. ECE depends on the binning, so outputs name the bin count.

A site's **pooled** figures put every labeled (row, class) entry together: that is the bold
curve of the reliability diagram (:func:`fedcxr.evaluation.plots.plot_reliability`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np
import pandas as pd

from fedcxr.evaluation import metrics

N_BINS = 10


class ReliabilityBins(NamedTuple):
    """Per equal-width bin: edges (B+1,), count (B,), mean predicted and observed fraction (B,), NaN if empty."""

    edges: np.ndarray
    count: np.ndarray
    mean_predicted: np.ndarray
    observed: np.ndarray


def _bin_index(p: np.ndarray, n_bins: int) -> np.ndarray:
    """Bin of each probability: floor(p·B), with p = 1 put into the last bin."""
    return np.clip(np.floor(p * n_bins).astype(int), 0, n_bins - 1)


def reliability_bins(y, p, n_bins: int = N_BINS) -> ReliabilityBins:
    """Count, mean probability and observed positive fraction per equal-width bin (labeled rows)."""
    if n_bins < 1:
        raise ValueError(f"n_bins must be at least 1, got {n_bins}")
    y, p = metrics._labeled(y, p)
    idx = _bin_index(p, n_bins)
    count = np.bincount(idx, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_p = np.where(count > 0, np.bincount(idx, weights=p, minlength=n_bins) / count, np.nan)
        observed = np.where(count > 0, np.bincount(idx, weights=y, minlength=n_bins) / count, np.nan)
    return ReliabilityBins(np.linspace(0.0, 1.0, n_bins + 1), count, mean_p, observed)


def brier_score(y, p) -> float:
    """(1/n) Σ (p − y)² over labeled rows; NaN when nothing is labeled."""
    y, p = metrics._labeled(y, p)
    return float(np.mean((p - y) ** 2)) if y.size else float("nan")


def expected_calibration_error(y, p, n_bins: int = N_BINS) -> float:
    """Σ_k (n_k / n) |ȳ_k − p̄_k| over equal-width bins (see module doc); NaN when nothing is labeled."""
    bins = reliability_bins(y, p, n_bins)
    n = bins.count.sum()
    if n == 0:
        return float("nan")
    filled = bins.count > 0
    gaps = np.abs(bins.observed[filled] - bins.mean_predicted[filled])
    return float(np.sum(bins.count[filled] / n * gaps))


def calibration_summary(
    frame: pd.DataFrame,
    classes: Sequence[str],
    *,
    n_bins: int = N_BINS,
    split: str = "test",
) -> dict[str, Any]:
    """One site's calibration: per class Brier and ECE, their means over classes with labeled
    rows, and the pooled Brier, ECE and bins (the reliability diagram's data)::

        {n_bins, binning, per_class: [{class, n, n_pos, brier, ece, reason}], mean_brier, mean_ece,
         pooled: {n, brier, ece, bins: [{low, high, n, mean_predicted, observed}]}}
    """
    per_class, ys, ps = [], [], []
    for cls in classes:
        row = {"class": cls, "n": 0, "n_pos": 0, "brier": float("nan"), "ece": float("nan"), "reason": None}
        per_class.append(row)
        if f"label__{cls}" not in frame or f"prob__{cls}" not in frame:
            row["reason"] = f"no label__{cls} or prob__{cls} column"
            continue
        y = pd.to_numeric(frame[f"label__{cls}"]).to_numpy(dtype=float, na_value=np.nan)
        p = pd.to_numeric(frame[f"prob__{cls}"]).to_numpy(dtype=float, na_value=np.nan)
        labeled = ~np.isnan(y)
        row.update(n=int(labeled.sum()), n_pos=int((y[labeled] == 1).sum()))
        if not labeled.any():
            row["reason"] = f"no labeled rows in {split} split"
            continue
        row.update(brier=brier_score(y, p), ece=expected_calibration_error(y, p, n_bins))
        ys.append(y[labeled])
        ps.append(p[labeled])
    y_all = np.concatenate(ys) if ys else np.empty(0)
    p_all = np.concatenate(ps) if ps else np.empty(0)
    bins = reliability_bins(y_all, p_all, n_bins)
    return {
        "n_bins": int(n_bins),
        "binning": "equal-width on [0, 1]",
        "per_class": per_class,
        "mean_brier": _nanmean([r["brier"] for r in per_class]),
        "mean_ece": _nanmean([r["ece"] for r in per_class]),
        "pooled": {"n": int(y_all.size), "brier": brier_score(y_all, p_all),
                   "ece": expected_calibration_error(y_all, p_all, n_bins),
                   "bins": [{"low": float(bins.edges[k]), "high": float(bins.edges[k + 1]), "n": int(bins.count[k]),
                             "mean_predicted": float(bins.mean_predicted[k]), "observed": float(bins.observed[k])}
                            for k in range(n_bins)]},
    }


def _nanmean(values: list[float]) -> float:
    finite = np.array([v for v in values if np.isfinite(v)], dtype=float)
    return float(finite.mean()) if finite.size else float("nan")
