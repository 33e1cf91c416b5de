"""Evaluation report of one run: per site, per class AUROC with 95% CI, mean AUROC, subgroups,
calibration and (given validation predictions) operating points.

:func:`build_report` turns a prediction table into a plain dict (the content of
``report.json``); :func:`fedcxr.evaluation.report_files.write_report` writes it as
``report.json``, ``per_class.csv``, ``report.md`` (:mod:`fedcxr.evaluation.report_markdown`)
and per evaluated site a ROC figure ``roc_<site>.png`` and a reliability diagram
``calibration_<site>.png``. Layout of the dict (schema version 3)::

    schema_version, kind, method, seed, target, split, classes, binary_task,
    ci: {level, method, n_boot, seed, small_sample: {min_cases, cases, auroc_interval, ..., rule}},
    calibration: {n_bins, binning, brier, ece},                       what the numbers mean
    operating_points: null | {selected_on, evaluated_on, decision, targets{sensitivity, specificity},
                              rules{name: description}, ci, same_rows},
    sites: {site: {n_rows, n_patients, per_class: [rows], mean_auroc, mean_auroc_ci_low/high,
                   mean_auroc_classes, mean_auroc_reason, mean_auroc_small_sample_classes,
                   mean_auroc_ci_method, [accuracy, accuracy_ci_low/high, accuracy_small_sample,
                   accuracy_ci_method],
                   subgroups: {task: {groups: {value: {...same fields...}}, skipped: [...]}},
                   calibration: {n_bins, binning, per_class: [{class, n, n_pos, brier, ece, reason}],
                                 mean_brier, mean_ece, pooled: {n, brier, ece, bins: [...]}},
                   [operating_points: [{class, rule, threshold, threshold_reason, val_sensitivity,
                                        val_specificity, n, n_pos, tp, fp, tn, fn, sensitivity,
                                        sensitivity_ci_low/high, sensitivity_ci_method, specificity...,
                                        ppv..., npv..., small_sample, reason}]]}},
    sites_without_predictions: [{site, reason}],
    training: null | {status, refused: [{site, n, rounds, checks, reason}], missed: [{site, n, rounds, why}],
                      pattern, skipped, consortium}                   from run.json (report_refusals)

Version 2 added ``calibration`` (top level and per site) and ``operating_points`` (top level,
``null`` without validation predictions, and per site when given); version 1 fields are unchanged.
Version 3 added the small-sample rule (:mod:`fedcxr.evaluation.small_sample`): per class
``small_sample``, ``ci_method``, ``pos_patients``, ``neg_patients``; per site the mean's
``mean_auroc_small_sample_classes`` and ``mean_auroc_ci_method``; per operating point
``small_sample`` and ``<metric>_ci_method``; ``ci.small_sample`` states the rule. Version 2
fields are unchanged, but an interval may now come from Newcombe's or Wilson's score method, or be
null with a reason (one patient). Readers fill the version 3 fields of older reports
(:func:`fedcxr.evaluation.small_sample.fill_row`).
See :mod:`fedcxr.evaluation.calibration` and :mod:`fedcxr.evaluation.operating` for definitions.

Undefined numbers are NaN in the dict and ``null`` in JSON, always next to a ``reason``.
``patient_key`` and ``row_key`` never appear in any output.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

import fedcxr
from fedcxr.evaluation import calibration, metrics, operating, small_sample
from fedcxr.evaluation.report_refusals import training_record
from fedcxr.vocab import AUX_VOCAB

#: 2: calibration and operating points added; 3: the small-sample rule's fields (see module doc).
SCHEMA_VERSION = 3
SUBGROUP_TASKS = ("sex", "age_bin", "race")
#: A subgroup with fewer rows is listed as skipped rather than given a noisy AUROC.
MIN_SUBGROUP_ROWS = 20
ACCURACY_THRESHOLD = 0.5
ALPHA = 0.05


def is_binary_task(classes: Sequence[str]) -> bool:
    """A run with one output (e.g. the covid19-only task): accuracy is reported beside AUROC."""
    return len(classes) == 1


def evaluate_rows(
    frame: pd.DataFrame,
    classes: Sequence[str],
    *,
    n_boot: int,
    seed: int,
    split: str,
    binary: bool,
    alpha: float = ALPHA,
) -> dict[str, Any]:
    """Per-class rows, mean AUROC (+ patient-bootstrap CI) and, for binary tasks, accuracy."""
    table, boot = metrics.per_class_auroc(frame, classes, n_boot=n_boot, seed=seed, alpha=alpha,
                                          split=split, return_bootstrap=True)
    defined = np.isfinite(table["auroc"].to_numpy(dtype=float))
    small = table["small_sample"].to_numpy(dtype=bool)
    out: dict[str, Any] = {
        "n_rows": int(len(frame)),
        "n_patients": int(frame["patient_key"].nunique()),
        "per_class": _records(table),
        "mean_auroc": metrics.mean_auroc(table["auroc"]),
        "mean_auroc_ci_low": float("nan"),
        "mean_auroc_ci_high": float("nan"),
        "mean_auroc_classes": [c for c, d in zip(classes, defined) if d],
        "mean_auroc_reason": None,
        "mean_auroc_small_sample_classes": [c for c, d, s in zip(classes, defined, small) if d and s],
        "mean_auroc_ci_method": None,
    }
    out.update(_mean_interval(table, boot, defined, out["n_patients"], alpha))
    if binary:
        out.update(_accuracy(frame, classes[0], n_boot=n_boot, seed=seed, alpha=alpha))
    return out


def _mean_interval(table: pd.DataFrame, boot: Optional[np.ndarray], defined: np.ndarray, n_patients: int,
                   alpha: float) -> dict[str, Any]:
    """The mean AUROC's interval under the small-sample rule (:mod:`fedcxr.evaluation.small_sample`).

    Every class behind the mean bootstrapped: the patient bootstrap of the mean. Otherwise the
    bootstrapped classes' mean keeps its bootstrap interval (it knows how they co-vary) and is
    combined with the other classes' own intervals as a class-weighted mean of bounds, which is
    conservative (:func:`~fedcxr.evaluation.small_sample.mean_of_bounds`); with none bootstrapped, the
    mean of the classes' bounds. None for one patient, without the bootstrap, or when a class has none.
    """
    if not defined.any():
        return {"mean_auroc_reason": "no class has a defined AUROC"}
    if n_patients <= 1:
        return {"mean_auroc_reason": small_sample.ONE_PATIENT}
    if boot is None:
        return {"mean_auroc_reason": "CI of the mean needs the patient bootstrap (n_boot > 0)"}
    booted = defined & (table["ci_method"] == small_sample.BOOTSTRAP).to_numpy()
    out: dict[str, Any] = {}
    lows, highs, weights = [], [], []
    if booted.any():
        ci = metrics.bootstrap_mean_ci(boot[:, booted], alpha)
        out["mean_auroc_ci_skipped"] = ci.n_skipped
        if booted.sum() == defined.sum() and ci.n_used == 0:
            return {**out, "mean_auroc_reason": "CI undefined: every bootstrap resample lost a class"}
        if small_sample.has_width(ci.low, ci.high):
            if booted.sum() == defined.sum():
                return {**out, "mean_auroc_ci_low": ci.low, "mean_auroc_ci_high": ci.high,
                        "mean_auroc_ci_method": small_sample.BOOTSTRAP}
            lows, highs, weights = [ci.low], [ci.high], [float(booted.sum())]
        else:
            booted[:] = False  # the block's interval collapsed: every class by its own interval
    rest = table[defined & ~booted]
    lows += rest["ci_low"].tolist()
    highs += rest["ci_high"].tolist()
    weights += [1.0] * len(rest)
    low, high = small_sample.mean_of_bounds(lows, highs, weights)
    if not np.isfinite(low):
        return {**out, "mean_auroc_reason": small_sample.MEAN_WITHOUT_INTERVAL}
    method = small_sample.MEAN_COMBINED if booted.any() else small_sample.MEAN_OF_BOUNDS
    return {**out, "mean_auroc_ci_low": low, "mean_auroc_ci_high": high, "mean_auroc_ci_method": method}


def _accuracy(frame, cls, *, n_boot, seed, alpha) -> dict[str, Any]:
    y = frame[f"label__{cls}"].to_numpy(dtype=float, na_value=np.nan)
    p = frame[f"prob__{cls}"].to_numpy(dtype=float)
    groups = frame["patient_key"].to_numpy(dtype=object)
    cases = small_sample.count_cases(y, groups)
    out = {"accuracy": metrics.accuracy(y, p, ACCURACY_THRESHOLD), "accuracy_threshold": ACCURACY_THRESHOLD,
           "accuracy_ci_low": float("nan"), "accuracy_ci_high": float("nan"),
           "accuracy_small_sample": cases.patients < small_sample.MIN_CASES, "accuracy_ci_method": None}
    if not np.isfinite(out["accuracy"]):
        out["accuracy_reason"] = f"no labeled rows of {cls}"
    elif n_boot > 0:
        ci = metrics.bootstrap_accuracy_ci(y, p, groups, n_boot, seed, alpha, ACCURACY_THRESHOLD)
        # a proportion over every labeled case (patient): its denominator is all of them
        chosen = small_sample.proportion_interval(out["accuracy"], cases.patients, cases.patients,
                                                  small_sample.Interval(ci.low, ci.high, small_sample.BOOTSTRAP, None),
                                                  alpha)
        out.update(accuracy_ci_low=chosen.low, accuracy_ci_high=chosen.high, accuracy_ci_method=chosen.method)
        if chosen.note:
            out["accuracy_reason"] = chosen.note
    return out


#: text columns of the per-class table: pandas turns their None into NaN beside strings; JSON wants null
_TEXT_COLUMNS = ("reason", "ci_method")


def _records(table: pd.DataFrame) -> list[dict[str, Any]]:
    rows = []
    for rec in table.to_dict(orient="records"):
        rows.append({k: (None if k in _TEXT_COLUMNS and not isinstance(v, str) else v) for k, v in rec.items()})
    return rows


def subgroup_analysis(
    frame: pd.DataFrame,
    classes: Sequence[str],
    *,
    n_boot: int,
    seed: int,
    split: str,
    binary: bool,
    min_rows: int = MIN_SUBGROUP_ROWS,
) -> dict[str, Any]:
    """Per task in :data:`SUBGROUP_TASKS`: the :func:`evaluate_rows` result of every value with
    at least ``min_rows`` rows, decoded to vocabulary names; the rest listed under ``skipped``."""
    result: dict[str, Any] = {}
    for task in SUBGROUP_TASKS:
        column = f"aux__{task}"
        entry: dict[str, Any] = {"groups": {}, "skipped": []}
        result[task] = entry
        if column not in frame:
            entry["skipped"].append({"value": None, "n_rows": int(len(frame)),
                                     "reason": f"no {column} column in predictions"})
            continue
        codes = pd.to_numeric(frame[column], errors="coerce").astype("Float64")
        unknown = int(codes.isna().sum())
        if unknown:
            entry["skipped"].append({"value": "unknown", "n_rows": unknown, "reason": "value not recorded (null)"})
        for code in sorted(int(c) for c in codes.dropna().unique()):
            name = _decode(task, code)
            rows = frame[(codes == code).fillna(False).to_numpy(dtype=bool)]
            if len(rows) < min_rows:
                entry["skipped"].append({"value": name, "n_rows": int(len(rows)),
                                         "reason": f"fewer than {min_rows} rows"})
                continue
            entry["groups"][name] = evaluate_rows(rows, classes, n_boot=n_boot, seed=seed, split=split,
                                                  binary=binary)
    return result


def _decode(task: str, code: int) -> str:
    vocab = AUX_VOCAB.get(task, [])
    return vocab[code] if 0 <= code < len(vocab) else f"code {code}"


def report_header(run_info: Mapping[str, Any], split: str, classes: list[str]) -> dict[str, Any]:
    """The keys every report opens with (``fedcxr evaluate``'s and the cross-site one alike)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "fedcxr.evaluation.report",
        "fedcxr_version": fedcxr.__version__,
        "method": run_info["method"],
        "seed": run_info["seed"],
        "target": run_info.get("target"),
        "split": split,
        "classes": classes,
        "binary_task": is_binary_task(classes),
        "train_sites": list(run_info.get("sites") or []),
        "training": training_record(run_info),  # refused and missed replies (report_refusals)
    }


def build_report(
    predictions: pd.DataFrame,
    run_info: dict,
    *,
    split: str,
    n_boot: int,
    seed: int,
    val_predictions: Optional[pd.DataFrame] = None,
    val_split: str = "val",
    target_sensitivity: float = operating.DEFAULT_TARGET_SENSITIVITY,
    target_specificity: float = operating.DEFAULT_TARGET_SPECIFICITY,
) -> dict:
    """The content of ``report.json`` for one run's predictions on ``split``.

    ``n_boot`` > 0: 95% CIs by patient-level bootstrap (and a CI of the mean AUROC);
    ``n_boot`` = 0: per-class CIs by DeLong, none for the mean.
    ``val_predictions`` (the run's ``val_split`` predictions, same columns): per site, thresholds
    are chosen on the site's validation rows (Youden, ``target_sensitivity``,
    ``target_specificity``) and measured on ``split`` (:mod:`fedcxr.evaluation.operating`).
    Calibration is always reported.
    """
    classes = list(run_info["classes"])
    binary = is_binary_task(classes)
    present = list(dict.fromkeys(predictions["site"].astype(str)))
    wanted = [str(s) for s in run_info.get("eval_sites") or []]
    order = [s for s in wanted if s in present] + [s for s in present if s not in wanted]
    report: dict[str, Any] = {
        **report_header(run_info, split, classes),
        "ci": {"level": 1 - ALPHA,
               "method": "patient-level bootstrap (percentile)" if n_boot > 0 else "DeLong (normal approximation)",
               "n_boot": int(n_boot), "seed": int(seed), "small_sample": small_sample.rule_info()},
        "min_subgroup_rows": MIN_SUBGROUP_ROWS,
        "calibration": _calibration_info(),
        "operating_points": None if val_predictions is None else _operating_info(
            split, val_split, n_boot, target_sensitivity, target_specificity),
        "sites": {},
        "sites_without_predictions": [{"site": s, "reason": f"no rows in predictions/{split}.parquet"}
                                      for s in wanted if s not in present],
    }
    site_col = predictions["site"].astype(str).to_numpy()
    val_site = None if val_predictions is None else val_predictions["site"].astype(str).to_numpy()
    for site in order:
        rows = predictions[site_col == site]
        entry = evaluate_rows(rows, classes, n_boot=n_boot, seed=seed, split=split, binary=binary)
        entry["subgroups"] = subgroup_analysis(rows, classes, n_boot=n_boot, seed=seed, split=split, binary=binary)
        entry["calibration"] = calibration.calibration_summary(rows, classes, split=split)
        if val_predictions is not None:
            entry["operating_points"] = operating.operating_point_rows(
                rows, val_predictions[val_site == site], classes, n_boot=n_boot, seed=seed, alpha=ALPHA,
                split=split, val_split=val_split, target_sensitivity=target_sensitivity,
                target_specificity=target_specificity)
        report["sites"][site] = entry
    return report


def _calibration_info() -> dict[str, Any]:
    return {"n_bins": calibration.N_BINS, "binning": "equal-width on [0, 1]",
            "brier": "mean over labeled rows of (prob - label)^2",
            "ece": "sum over bins of (rows in bin / rows) * |fraction positive - mean prob|"}


def _operating_info(split: str, val_split: str, n_boot: int, target_sensitivity: float,
                    target_specificity: float) -> dict[str, Any]:
    names = operating.rule_names(target_sensitivity, target_specificity)
    return {
        "selected_on": val_split,
        "evaluated_on": split,
        "decision": "predicted positive when prob >= threshold",
        "targets": {"sensitivity": float(target_sensitivity), "specificity": float(target_specificity)},
        "rules": {names["youden"]: f"maximises sensitivity + specificity - 1 on {val_split}",
                  names["sensitivity"]: f"highest threshold with sensitivity >= {target_sensitivity:g} on {val_split}",
                  names["specificity"]: f"lowest threshold with specificity >= {target_specificity:g} on {val_split}"},
        "ci": ("patient-level bootstrap (percentile), the AUROC CIs' resamples" if n_boot > 0
               else "none (needs the patient bootstrap, n_boot > 0)"),
        "same_rows": split == val_split,
    }


__all__ = ["ACCURACY_THRESHOLD", "ALPHA", "MIN_SUBGROUP_ROWS", "SCHEMA_VERSION", "SUBGROUP_TASKS", "build_report",
           "evaluate_rows", "is_binary_task", "report_header", "subgroup_analysis"]
