"""Operating points: decision thresholds chosen on the validation split, measured on the evaluated one.

AUROC says nothing about where to cut, and a threshold chosen on the rows it is judged on is
optimistic. So thresholds are chosen per (site, class) on that site's **validation**
predictions and applied to the evaluated split (normally test), where sensitivity,
specificity, PPV and NPV get patient-bootstrap 95% intervals.

Decision rule everywhere: predicted positive ⇔ ``prob >= threshold``. Candidate thresholds are
the distinct labeled validation scores plus one just above the largest (nothing positive).

Rules (their names are the keys of :func:`operating_point_thresholds`):

* ``youden``: maximises Youden's J = sensitivity + specificity − 1 on validation (ties: the
  highest such threshold, i.e. the fewest positive calls);
* ``sens90`` (``sens<100·target>``): the highest threshold whose validation sensitivity is at
  least the target, i.e. the most specific way to reach the target sensitivity;
* ``spec90`` (``spec<100·target>``): the lowest threshold whose validation specificity is at
  least the target, i.e. the most sensitive way to reach the target specificity.

A threshold is undefined (``None`` in JSON, with a reason, never an error) when the site's
validation rows of the class hold no positive or no negative, or the site has no validation rows.

On the evaluated split's labeled rows, with TP, FP, TN, FN counted at the threshold::

    sensitivity = TP / (TP + FN)    specificity = TN / (TN + FP)
    PPV         = TP / (TP + FP)    NPV         = TN / (TN + FN)

PPV and NPV depend on the evaluated split's prevalence. A metric whose denominator is 0 is NaN
with a reason. CIs: percentiles over patient-level bootstrap resamples
(:func:`~fedcxr.evaluation.metrics.resample_weights`, the same resamples as the AUROC CIs for the
same seed); resamples with a zero denominator are skipped. A metric whose denominator holds fewer
than 10 cases (patients), or whose bootstrap interval has no width (every positive found), gets
Wilson's score interval instead, and the record is flagged ``small_sample`` with the counts in
words (:mod:`~fedcxr.evaluation.small_sample`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence

import numpy as np
import pandas as pd

from fedcxr.evaluation import metrics, small_sample

DEFAULT_TARGET_SENSITIVITY = 0.9
DEFAULT_TARGET_SPECIFICITY = 0.9
METRICS = ("sensitivity", "specificity", "ppv", "npv")
_METRIC_LABELS = {"sensitivity": "sensitivity", "specificity": "specificity", "ppv": "PPV", "npv": "NPV"}


class Threshold(NamedTuple):
    """A chosen threshold and what it achieved on the rows it was chosen on (NaN + reason if undefined)."""

    threshold: float
    sensitivity: float
    specificity: float
    reason: Optional[str]


class Confusion(NamedTuple):
    """Counts (ints, or arrays of per-resample weighted counts) on labeled rows."""

    tp: Any
    fp: Any
    tn: Any
    fn: Any


# --------------------------------------------------------------------------- choosing thresholds


def rule_names(target_sensitivity: float = DEFAULT_TARGET_SENSITIVITY,
               target_specificity: float = DEFAULT_TARGET_SPECIFICITY) -> dict[str, str]:
    """Rule kind → its name in outputs: ``youden``, ``sens<pct>``, ``spec<pct>`` (0.9 → ``sens90``)."""
    _check_target(target_sensitivity)
    _check_target(target_specificity)
    return {"youden": "youden", "sensitivity": f"sens{100 * target_sensitivity:g}",
            "specificity": f"spec{100 * target_specificity:g}"}


def _check_target(target: float) -> None:
    if not 0 < target <= 1:
        raise ValueError(f"a target sensitivity/specificity must be in (0, 1], got {target!r}")


def _candidates(y: np.ndarray, p: np.ndarray):
    """Ascending candidate thresholds and, at each, the true-positive and true-negative counts.

    tp(t) = #{positives with p ≥ t}, tn(t) = #{negatives with p < t}: one sort and two
    ``searchsorted`` calls instead of a pass per threshold.
    """
    scores = np.unique(p)
    thresholds = np.append(scores, np.nextafter(scores[-1], np.inf))
    pos, neg = np.sort(p[y == 1]), np.sort(p[y == 0])
    tp = pos.size - np.searchsorted(pos, thresholds, side="left")
    tn = np.searchsorted(neg, thresholds, side="left")
    return thresholds, tp, tn


def _undefined(reason: str) -> Threshold:
    return Threshold(float("nan"), float("nan"), float("nan"), reason)


def _choose(y, p, split: str, pick) -> Threshold:
    """Shared frame of the three rules: labeled rows, the undefined cases, then ``pick``."""
    y, p = metrics._labeled(y, p)
    reason = metrics.auroc_reason(y, split)  # a threshold needs both label values, as AUROC does
    if reason is not None:
        return _undefined(reason)
    thresholds, tp, tn = _candidates(y, p)
    m, n = int((y == 1).sum()), int((y == 0).sum())
    i = pick(tp, tn, m, n)
    return Threshold(float(thresholds[i]), float(tp[i] / m), float(tn[i] / n), None)


def youden_threshold(y, p, split: str = "val") -> Threshold:
    """Threshold maximising Youden's J = TP/M + TN/N − 1 (ties: the highest threshold)."""
    def pick(tp, tn, m, n):
        j = tp / m + tn / n - 1.0
        return int(np.flatnonzero(j >= j.max() - 1e-12)[-1])
    return _choose(y, p, split, pick)


def _needed(target: float, total: int) -> int:
    """Smallest count c with c / total ≥ target (a hair of slack for 0.9·10 = 9.000000000000002)."""
    return int(np.ceil(target * total - 1e-9))


def sensitivity_threshold(y, p, target: float = DEFAULT_TARGET_SENSITIVITY, split: str = "val") -> Threshold:
    """The highest threshold with TP/M ≥ ``target`` (the most specific one reaching the target)."""
    _check_target(target)
    def pick(tp, tn, m, n):
        return int(np.flatnonzero(tp >= _needed(target, m))[-1])  # tp falls as t rises; t_0 has tp = M
    return _choose(y, p, split, pick)


def specificity_threshold(y, p, target: float = DEFAULT_TARGET_SPECIFICITY, split: str = "val") -> Threshold:
    """The lowest threshold with TN/N ≥ ``target`` (the most sensitive one reaching the target)."""
    _check_target(target)
    def pick(tp, tn, m, n):
        return int(np.flatnonzero(tn >= _needed(target, n))[0])  # tn rises with t; the top one has tn = N
    return _choose(y, p, split, pick)


def select_thresholds(
    y,
    p,
    *,
    target_sensitivity: float = DEFAULT_TARGET_SENSITIVITY,
    target_specificity: float = DEFAULT_TARGET_SPECIFICITY,
    split: str = "val",
) -> dict[str, Threshold]:
    """The three rules' thresholds for one class, keyed by :func:`rule_names`."""
    names = rule_names(target_sensitivity, target_specificity)
    return {names["youden"]: youden_threshold(y, p, split),
            names["sensitivity"]: sensitivity_threshold(y, p, target_sensitivity, split),
            names["specificity"]: specificity_threshold(y, p, target_specificity, split)}


def _class_arrays(frame: pd.DataFrame, cls: str, split: str):
    """(y, p, None) of one class in ``frame``, or (None, None, reason) when a column is missing."""
    for kind in ("label", "prob"):
        if f"{kind}__{cls}" not in frame:
            return None, None, f"no {kind}__{cls} column in {split} predictions"
    y = pd.to_numeric(frame[f"label__{cls}"]).to_numpy(dtype=float, na_value=np.nan)
    p = pd.to_numeric(frame[f"prob__{cls}"]).to_numpy(dtype=float, na_value=np.nan)
    return y, p, None


def site_thresholds(
    val_rows: Optional[pd.DataFrame],
    classes: Sequence[str],
    *,
    target_sensitivity: float = DEFAULT_TARGET_SENSITIVITY,
    target_specificity: float = DEFAULT_TARGET_SPECIFICITY,
    split: str = "val",
) -> dict[str, dict[str, Threshold]]:
    """class → rule name → :class:`Threshold` on one site's validation rows (``None``/empty: undefined)."""
    names = list(rule_names(target_sensitivity, target_specificity).values())
    out = {}
    for cls in classes:
        if val_rows is None or val_rows.empty:
            out[cls] = {name: _undefined(f"no {split} predictions for this site") for name in names}
            continue
        y, p, missing = _class_arrays(val_rows, cls, split)
        out[cls] = ({name: _undefined(missing) for name in names} if missing else
                    select_thresholds(y, p, target_sensitivity=target_sensitivity,
                                      target_specificity=target_specificity, split=split))
    return out


def operating_point_thresholds(
    val_predictions: pd.DataFrame,
    classes: Sequence[str],
    *,
    target_sensitivity: float = DEFAULT_TARGET_SENSITIVITY,
    target_specificity: float = DEFAULT_TARGET_SPECIFICITY,
    split: str = "val",
) -> dict[str, dict[str, dict[str, Any]]]:
    """Thresholds of every site in ``val_predictions`` as plain JSON (for ``operating_points.json``)::

        {site: {class: {"youden": t, "sens90": t, "spec90": t, "reason": None}}}

    ``t`` is a float, or ``None`` when undefined; ``reason`` says why (``None`` when all are
    defined). Rule names follow the targets (0.95 → ``sens95``). Sites in first-seen order.
    """
    site_col = val_predictions["site"].astype(str)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for site in dict.fromkeys(site_col):
        chosen = site_thresholds(val_predictions[(site_col == site).to_numpy()], classes,
                                 target_sensitivity=target_sensitivity, target_specificity=target_specificity,
                                 split=split)
        out[site] = {cls: _plain(rules) for cls, rules in chosen.items()}
    return out


def _plain(rules: dict[str, Threshold]) -> dict[str, Any]:
    entry: dict[str, Any] = {name: (float(t.threshold) if np.isfinite(t.threshold) else None)
                             for name, t in rules.items()}
    reasons = list(dict.fromkeys(t.reason for t in rules.values() if t.reason))
    entry["reason"] = "; ".join(reasons) if reasons else None
    return entry


# --------------------------------------------------------------------------- applying thresholds


def confusion(y, p, threshold: float) -> Confusion:
    """TP, FP, TN, FN of ``prob >= threshold`` on the labeled rows of ``y``."""
    y, p = metrics._labeled(y, p)
    called = p >= threshold
    pos = y == 1
    return Confusion(int((called & pos).sum()), int((called & ~pos).sum()),
                     int((~called & ~pos).sum()), int((~called & pos).sum()))


def rates(c: Confusion) -> dict[str, Any]:
    """Sensitivity TP/(TP+FN), specificity TN/(TN+FP), PPV TP/(TP+FP), NPV TN/(TN+FN).

    Works elementwise on arrays of (bootstrap-weighted) counts; NaN where a denominator is 0.
    """
    tp, fp, tn, fn = (np.asarray(v, dtype=float) for v in c)

    def ratio(a, b):
        with np.errstate(invalid="ignore", divide="ignore"):
            out = np.where(b > 0, a / np.where(b > 0, b, 1.0), np.nan)
        return float(out) if out.ndim == 0 else out

    return {"sensitivity": ratio(tp, tp + fn), "specificity": ratio(tn, tn + fp),
            "ppv": ratio(tp, tp + fp), "npv": ratio(tn, tn + fn)}


def _indicators(y: np.ndarray, p: np.ndarray, threshold: float) -> np.ndarray:
    """(n, 4) 0/1 columns TP, FP, TN, FN per row (0 on unlabeled rows): weighted sums are counts."""
    labeled = ~np.isnan(y)
    called = np.where(labeled, p, -np.inf) >= threshold
    pos, neg = labeled & (y == 1), labeled & (y == 0)
    return np.stack([called & pos, called & neg, ~called & neg, ~called & pos], axis=1).astype(float)


def bootstrap_rates(indicators: np.ndarray, groups, n_boot: int, seed: int) -> dict[str, np.ndarray]:
    """Per-resample rates of K operating points at once: ``indicators`` (n, K, 4) from
    :func:`_indicators`, ``groups`` the patient keys. Returns metric → (n_boot, K), NaN where a
    resample leaves a denominator at 0. One weight matrix per chunk serves every point."""
    n, k, _ = indicators.shape
    flat = indicators.reshape(n, k * 4)
    chunks = [weights @ flat for weights in metrics.resample_weights(groups, n_boot, seed)]
    counts = np.concatenate(chunks, axis=0).reshape(-1, k, 4) if chunks else np.empty((0, k, 4))
    return rates(Confusion(counts[..., 0], counts[..., 1], counts[..., 2], counts[..., 3]))


def operating_point_rows(
    rows: pd.DataFrame,
    val_rows: Optional[pd.DataFrame],
    classes: Sequence[str],
    *,
    n_boot: int,
    seed: int,
    alpha: float = 0.05,
    split: str = "test",
    val_split: str = "val",
    target_sensitivity: float = DEFAULT_TARGET_SENSITIVITY,
    target_specificity: float = DEFAULT_TARGET_SPECIFICITY,
) -> list[dict[str, Any]]:
    """One site: per (class, rule) the validation threshold and the evaluated split's metrics.

    ``rows``/``val_rows``: this site's evaluated and validation predictions (``patient_key``
    needed for ``n_boot`` > 0). Each record: class, rule, threshold, threshold_reason,
    val_sensitivity, val_specificity, n, n_pos, tp, fp, tn, fn, then for each of
    :data:`METRICS` the value and ``_ci_low``/``_ci_high``, and ``reason`` (why numbers are missing).
    """
    chosen = site_thresholds(val_rows, classes, target_sensitivity=target_sensitivity,
                             target_specificity=target_specificity, split=val_split)
    records, columns = [], []
    for cls in classes:
        y, p, missing = _class_arrays(rows, cls, split)
        for rule, t in chosen[cls].items():
            if missing is None and t.reason is None:
                columns.append((len(records), _indicators(y, p, t.threshold)))
            records.append(_record(cls, rule, t, y, p, missing, split))
    groups = rows["patient_key"].to_numpy(dtype=object) if "patient_key" in rows else None
    if n_boot > 0 and columns:
        boot = bootstrap_rates(np.stack([c for _, c in columns], axis=1), groups, n_boot, seed)
        for j, (i, _) in enumerate(columns):
            _add_cis(records[i], {m: boot[m][:, j] for m in METRICS}, alpha)
    for i, indicators in columns:
        _small_sample(records[i], indicators, groups, n_boot, alpha)
    return records


def _record(cls, rule, t: Threshold, y, p, missing, split) -> dict[str, Any]:
    record: dict[str, Any] = {"class": cls, "rule": rule, "threshold": t.threshold, "threshold_reason": t.reason,
                              "val_sensitivity": t.sensitivity, "val_specificity": t.specificity,
                              "n": 0, "n_pos": 0, "tp": 0, "fp": 0, "tn": 0, "fn": 0}
    for m in METRICS:
        record.update({m: float("nan"), f"{m}_ci_low": float("nan"), f"{m}_ci_high": float("nan"),
                       f"{m}_ci_method": None})
    record["small_sample"] = False
    if t.reason is not None or missing is not None:
        record["reason"] = t.reason or missing
        return record
    c = confusion(y, p, t.threshold)
    record.update(tp=c.tp, fp=c.fp, tn=c.tn, fn=c.fn, n=c.tp + c.fp + c.tn + c.fn, n_pos=c.tp + c.fn)
    record.update(rates(c))
    why = {"sensitivity": f"no positive rows in {split} split", "specificity": f"no negative rows in {split} split",
           "ppv": "no row predicted positive", "npv": "no row predicted negative"}
    gaps = [f"{_METRIC_LABELS[m]} undefined: {why[m]}" for m in METRICS if not np.isfinite(record[m])]
    record["reason"] = "; ".join(gaps) if gaps else None
    return record


#: what each metric's denominator counts (the words of the small-sample note)
_DENOMINATORS = {"sensitivity": "positive", "specificity": "negative", "ppv": "called positive",
                 "npv": "called negative"}


def _small_sample(record: dict[str, Any], indicators: np.ndarray, groups, n_boot: int, alpha: float) -> None:
    """The small-sample rule (:mod:`~fedcxr.evaluation.small_sample`) on one operating point's metrics.

    A metric whose denominator holds fewer than ``MIN_CASES`` cases (patients; images without
    keys), or whose bootstrap interval has no width (e.g. every positive detected), gets the Wilson
    score interval; one patient, none. ``small_sample`` is set when any denominator is small and the
    reason says which, in words. Without the bootstrap (``n_boot`` = 0) there are no intervals, as before.
    """
    # indicators: (n, 4) TP, FP, TN, FN per row; a metric's denominator rows are two of them
    tp, fp, tn, fn = (indicators[:, k] > 0 for k in range(4))
    rows_of = {"sensitivity": tp | fn, "specificity": tn | fp, "ppv": tp | fp, "npv": tn | fn}
    keys = None if groups is None else pd.Series(np.asarray(groups, dtype=object))

    def cases(mask: np.ndarray) -> int:
        return int(mask.sum()) if keys is None else int(keys[mask].nunique(dropna=False))

    patients = cases(tp | fp | tn | fn)
    small, notes = [], []
    for m in METRICS:
        if not np.isfinite(record[m]):
            continue
        n_cases = cases(rows_of[m])
        if n_cases < small_sample.MIN_CASES:
            small.append(f"{n_cases} {_DENOMINATORS[m]} ({_METRIC_LABELS[m]})")
        bootstrapped = n_boot > 0 and np.isfinite(record[f"{m}_ci_low"])
        default = small_sample.Interval(record[f"{m}_ci_low"], record[f"{m}_ci_high"],
                                        small_sample.BOOTSTRAP if n_boot > 0 else None, None)
        chosen = small_sample.proportion_interval(record[m], n_cases, patients, default, alpha)
        record.update({f"{m}_ci_low": chosen.low, f"{m}_ci_high": chosen.high,
                       f"{m}_ci_method": chosen.method if (bootstrapped or chosen.method == small_sample.WILSON)
                       else None})
        if chosen.note and chosen.note not in notes:
            notes.append(chosen.note)
    record["small_sample"] = bool(small)
    if small:
        notes.insert(0, f"too few cases: {', '.join(small)}; {small_sample.WILSON} intervals"
                     if n_boot > 0 and patients > 1 else f"too few cases: {', '.join(small)}")
    if notes:
        record["reason"] = "; ".join(([record["reason"]] if record["reason"] else []) + notes)


def _add_cis(record: dict[str, Any], samples: dict[str, np.ndarray], alpha: float) -> None:
    gaps = []
    for m in METRICS:
        if not np.isfinite(record[m]):
            continue
        ci = metrics.percentile_ci(samples[m], alpha)
        record[f"{m}_ci_low"], record[f"{m}_ci_high"] = ci.low, ci.high
        if ci.n_used == 0:
            gaps.append(f"{_METRIC_LABELS[m]} CI undefined: every bootstrap resample had a zero denominator")
    if gaps:
        record["reason"] = "; ".join(([record["reason"]] if record["reason"] else []) + gaps)
