"""Evaluation report of one run: per site, per class AUROC with 95% CI, mean AUROC, subgroups,
calibration and (given validation predictions) operating points.

:func:`build_report` turns a prediction table into a plain dict (the content of
``report.json``); :func:`write_report` writes it as ``report.json``, ``per_class.csv``,
``report.md`` and per evaluated site a ROC figure ``roc_<site>.png`` and a reliability diagram
``calibration_<site>.png``. Layout of the dict (schema version 2)::

    schema_version, kind, method, seed, target, split, classes, binary_task, ci{...},
    calibration: {n_bins, binning, brier, ece},                       what the numbers mean
    operating_points: null | {selected_on, evaluated_on, decision, targets{sensitivity, specificity},
                              rules{name: description}, ci, same_rows},
    sites: {site: {n_rows, n_patients, per_class: [rows], mean_auroc, mean_auroc_ci_low/high,
                   mean_auroc_classes, mean_auroc_reason, [accuracy, accuracy_ci_low/high],
                   subgroups: {task: {groups: {value: {...same fields...}}, skipped: [...]}},
                   calibration: {n_bins, binning, per_class: [{class, n, n_pos, brier, ece, reason}],
                                 mean_brier, mean_ece, pooled: {n, brier, ece, bins: [...]}},
                   [operating_points: [{class, rule, threshold, threshold_reason, val_sensitivity,
                                        val_specificity, n, n_pos, tp, fp, tn, fn, sensitivity,
                                        sensitivity_ci_low/high, specificity..., ppv..., npv...,
                                        reason}]]}},
    sites_without_predictions: [{site, reason}]

Version 2 added ``calibration`` (top level and per site) and ``operating_points`` (top level,
``null`` without validation predictions, and per site when given); version 1 fields are unchanged.
See :mod:`fedcxr.evaluation.calibration` and :mod:`fedcxr.evaluation.operating` for definitions.

Undefined numbers are NaN in the dict and ``null`` in JSON, always next to a ``reason``.
``patient_key`` and ``row_key`` never appear in any output.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

import fedcxr
from fedcxr.evaluation import calibration, metrics, operating
from fedcxr.atomic import atomic_write_bytes, json_bytes
from fedcxr.escape import md, to_csv_text
from fedcxr.vocab import AUX_VOCAB

#: 2: calibration and operating points added (see module doc).
SCHEMA_VERSION = 2
SUBGROUP_TASKS = ("sex", "age_bin", "race")
#: A subgroup with fewer rows is listed as skipped rather than given a noisy AUROC.
MIN_SUBGROUP_ROWS = 20
ACCURACY_THRESHOLD = 0.5
ALPHA = 0.05
SUBGROUP_TITLES = {"sex": "Sex", "age_bin": "Age bin (years)", "race": "Race/ethnicity"}


def is_binary_task(classes: Sequence[str]) -> bool:
    """A run with one output (e.g. the covid19-only task): accuracy is reported beside AUROC."""
    return len(classes) == 1


# --------------------------------------------------------------------------- build


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
    out: dict[str, Any] = {
        "n_rows": int(len(frame)),
        "n_patients": int(frame["patient_key"].nunique()),
        "per_class": _records(table),
        "mean_auroc": metrics.mean_auroc(table["auroc"]),
        "mean_auroc_ci_low": float("nan"),
        "mean_auroc_ci_high": float("nan"),
        "mean_auroc_classes": [c for c, d in zip(classes, defined) if d],
        "mean_auroc_reason": None,
    }
    if not defined.any():
        out["mean_auroc_reason"] = "no class has a defined AUROC"
    elif boot is None:
        out["mean_auroc_reason"] = "CI of the mean needs the patient bootstrap (n_boot > 0)"
    else:
        ci = metrics.bootstrap_mean_ci(boot[:, defined], alpha)
        out.update(mean_auroc_ci_low=ci.low, mean_auroc_ci_high=ci.high, mean_auroc_ci_skipped=ci.n_skipped)
        if ci.n_used == 0:
            out["mean_auroc_reason"] = "CI undefined: every bootstrap resample lost a class"
    if binary:
        out.update(_accuracy(frame, classes[0], n_boot=n_boot, seed=seed, alpha=alpha))
    return out


def _accuracy(frame, cls, *, n_boot, seed, alpha) -> dict[str, Any]:
    y = frame[f"label__{cls}"].to_numpy(dtype=float, na_value=np.nan)
    p = frame[f"prob__{cls}"].to_numpy(dtype=float)
    out = {"accuracy": metrics.accuracy(y, p, ACCURACY_THRESHOLD), "accuracy_threshold": ACCURACY_THRESHOLD,
           "accuracy_ci_low": float("nan"), "accuracy_ci_high": float("nan")}
    if not np.isfinite(out["accuracy"]):
        out["accuracy_reason"] = f"no labeled rows of {cls}"
    elif n_boot > 0:
        ci = metrics.bootstrap_accuracy_ci(y, p, frame["patient_key"].to_numpy(dtype=object), n_boot, seed,
                                           alpha, ACCURACY_THRESHOLD)
        out.update(accuracy_ci_low=ci.low, accuracy_ci_high=ci.high)
    return out


def _records(table: pd.DataFrame) -> list[dict[str, Any]]:
    rows = []
    for rec in table.to_dict(orient="records"):
        rows.append({k: (None if k == "reason" and not isinstance(v, str) else v) for k, v in rec.items()})
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
               "n_boot": int(n_boot), "seed": int(seed)},
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


# --------------------------------------------------------------------------- write


def write_json(path: Path, payload: Any) -> None:
    """``report.json``: :func:`fedcxr.atomic.json_safe` (NaN → null), in the report's own key order."""
    atomic_write_bytes(path, json_bytes(payload, sort_keys=False))


def write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def safe_name(name: str) -> str:
    """A site name as a file-name fragment: letters, digits, ``._-`` only, no ``..``, no leading or
    trailing separators (so it can never climb out of the run directory nor hide a file)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", str(name))
    name = re.sub(r"_+", "_", re.sub(r"\.{2,}", "_", name))
    return name.strip("._-") or "site"


#: Longest file-name fragment used for a site (file systems stop at 255 bytes).
MAX_NAME = 80


def figure_names(sites) -> dict[str, str]:
    """site → a file-name fragment unique among ``sites``: :func:`safe_name`, and where two sites
    would share one (``a/b``, ``a b``) or the name is long, a short hash of the site name added."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    for site in sites:
        if site in names:
            continue
        base = safe_name(site)
        digest = hashlib.sha1(str(site).encode()).hexdigest()
        width = 8
        name = base if len(base) <= MAX_NAME else _hashed(base, digest, width)
        while name in taken and width <= len(digest):
            name = _hashed(base, digest, width)
            width += 1
        names[site] = name
        taken.add(name)
    return names


def _hashed(base: str, digest: str, width: int) -> str:
    return f"{base[:MAX_NAME - 1 - width]}_{digest[:width]}"


def per_class_frame(report: dict) -> pd.DataFrame:
    """``per_class.csv``: one row per (site, class). With operating points, per rule ``<rule>_threshold``
    and ``<rule>_<metric>``, ``<rule>_<metric>_ci_low``, ``<rule>_<metric>_ci_high`` for
    sensitivity, specificity, ppv, npv follow the AUROC columns."""
    columns = ["site"] + metrics.PER_CLASS_COLUMNS
    rows = []
    for site, entry in report["sites"].items():
        points: dict[str, dict[str, Any]] = {}
        for op in entry.get("operating_points") or []:
            fields = {f"{op['rule']}_threshold": op["threshold"]}
            for m in operating.METRICS:
                fields.update({f"{op['rule']}_{m}{suffix}": op[f"{m}{suffix}"] for suffix in ("", "_ci_low", "_ci_high")})
            points.setdefault(op["class"], {}).update(fields)
            columns += [c for c in fields if c not in columns]
        rows += [{"site": site, **{k: r[k] for k in metrics.PER_CLASS_COLUMNS}, **points.get(r["class"], {})}
                 for r in entry["per_class"]]
    return pd.DataFrame(rows, columns=columns)


def write_report(run_dir: Path | str, report: dict, predictions: pd.DataFrame) -> list[Path]:
    """Write ``report.json``, ``per_class.csv``, ``report.md``, ``roc_<site>.png`` and
    ``calibration_<site>.png`` into ``run_dir`` (``<site>``: :func:`figure_names`)."""
    from fedcxr.evaluation.plots import plot_reliability, plot_roc  # matplotlib only when writing

    run_dir = Path(run_dir)
    paths = [run_dir / "report.json", run_dir / "per_class.csv", run_dir / "report.md"]
    write_json(paths[0], report)
    write_text(paths[1], to_csv_text(per_class_frame(report), float_format="%.6g"))
    figures: dict[str, dict[str, str]] = {}
    names = figure_names(report["sites"])
    site_col = predictions["site"].astype(str).to_numpy()
    for site, entry in report["sites"].items():
        rows = predictions[site_col == site]
        where = f"{site} ({report['split']}, {entry['n_rows']} images)"
        roc = plot_roc(rows, report["classes"], run_dir / f"roc_{names[site]}.png",
                       title=f"{report['method']}: ROC on {where}",
                       aurocs={r["class"]: r["auroc"] for r in entry["per_class"]})
        reliability = plot_reliability(rows, report["classes"], run_dir / f"calibration_{names[site]}.png",
                                       title=f"{report['method']}: calibration on {where}",
                                       n_bins=entry["calibration"]["n_bins"])
        figures[site] = {"roc": roc.name, "calibration": reliability.name}
        paths += [roc, reliability]
    write_text(paths[2], render_markdown(report, figures))
    return paths


# --------------------------------------------------------------------------- markdown


def fmt(value: Optional[float], digits: int = 3) -> str:
    return "n/a" if value is None or not np.isfinite(value) else f"{value:.{digits}f}"


def fmt_ci(value, low, high, digits: int = 3) -> str:
    if value is None or not np.isfinite(value):
        return "n/a"
    if low is None or high is None or not (np.isfinite(low) and np.isfinite(high)):
        return fmt(value, digits)
    return f"{value:.{digits}f} ({low:.{digits}f}–{high:.{digits}f})"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table; every cell escaped (:func:`fedcxr.escape.md`: site names, reasons and class
    names come from run directories and other sites' summaries)."""
    lines = ["| " + " | ".join(md(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(md(c) for c in r) + " |" for r in rows]
    return lines


def render_markdown(report: dict, figures: Optional[dict[str, Any]] = None) -> str:
    """A report a researcher can paste: run facts, per-site per-class table, calibration,
    operating points, subgroup tables. ``figures``: site → {"roc": name, "calibration": name}
    (a plain name means the ROC figure)."""
    ci = report["ci"]
    level = int(round(ci["level"] * 100))
    ci_text = (f"{level}% CI by patient-level bootstrap ({md(ci['n_boot'])} resamples, seed {md(ci['seed'])})"
               if ci["n_boot"] > 0 else f"{level}% CI by DeLong (normal approximation)")
    lines = [f"# Evaluation report: {md(report['method'])}", "",
             f"- Method: **{md(report['method'])}**, seed {md(report['seed'])}, target: {md(report['target'] or 'none')}",
             f"- Split: {md(report['split'])}; evaluated sites: {md(', '.join(report['sites']) or 'none')}",
             f"- Training sites: {md(', '.join(map(str, report['train_sites'])) or 'not recorded')}",
             f"- Classes ({len(report['classes'])}): {md(', '.join(map(str, report['classes'])))}",
             f"- AUROC with {ci_text}. Mean AUROC is over the classes with a defined AUROC; "
             "an undefined AUROC (one label value in the test rows) is n/a, never 0.5.", ""]
    for item in report.get("sites_without_predictions", []):
        lines += [f"- Site {md(item['site'])}: not evaluated ({md(item['reason'])})", ""]
    for site, entry in report["sites"].items():
        figure = (figures or {}).get(site) or {}
        lines += _site_section(report, site, entry, {"roc": figure} if isinstance(figure, str) else figure)
    return "\n".join(lines).rstrip() + "\n"


def _site_section(report, site, entry, figures: dict[str, str]) -> list[str]:
    lines = [f"## Site {md(site)}", "",
             f"{md(entry['n_rows'])} images of {md(entry['n_patients'])} patients.", "",
             f"**Mean AUROC** ({len(entry['mean_auroc_classes'])} of {len(report['classes'])} classes): "
             f"{fmt_ci(entry['mean_auroc'], entry['mean_auroc_ci_low'], entry['mean_auroc_ci_high'])}"
             + (f" ({md(entry['mean_auroc_reason'])})" if entry.get("mean_auroc_reason") else ""), ""]
    if "accuracy" in entry:
        lines += [f"**Accuracy** (threshold {md(entry['accuracy_threshold'])}): "
                  f"{fmt_ci(entry['accuracy'], entry['accuracy_ci_low'], entry['accuracy_ci_high'])}", ""]
    rows = [[r["class"], fmt_ci(r["auroc"], r["ci_low"], r["ci_high"]), str(r["n"]), str(r["n_pos"]),
             fmt(r["prevalence"]), _note(r, report["ci"]["n_boot"])] for r in entry["per_class"]]
    lines += _table(["Class", "AUROC (95% CI)", "n", "Positives", "Prevalence", "Note"], rows) + [""]
    if figures.get("roc"):
        lines += [f"![ROC curves, site {md(site)}]({figures['roc']})", ""]
    if "calibration" in entry:
        lines += _calibration_section(site, entry["calibration"], figures.get("calibration"))
    if entry.get("operating_points") is not None and report.get("operating_points"):
        lines += _operating_section(report["operating_points"], entry["operating_points"], report["ci"]["n_boot"])
    for task, sub in entry["subgroups"].items():
        lines += _subgroup_section(report, task, sub)
    return lines


def _note(row: dict, n_boot: int) -> str:
    """The reason a number is missing, or how many bootstrap resamples the CI had to skip."""
    if row["reason"]:
        return row["reason"]
    if row.get("ci_skipped"):
        return f"CI from {n_boot - row['ci_skipped']} of {n_boot} resamples (rest had one label value)"
    return ""


def _calibration_section(site: str, cal: dict, figure: Optional[str]) -> list[str]:
    pooled = cal["pooled"]
    lines = ["### Calibration", "",
             f"Brier score = mean of (probability − label)²; ECE = Σ over {md(cal['n_bins'])} equal-width bins of "
             "(share of rows in the bin) × |fraction positive − mean probability|. Lower is better for both.", "",
             f"**All classes pooled** ({md(pooled['n'])} labeled entries): Brier {fmt(pooled['brier'])}, "
             f"ECE {fmt(pooled['ece'])}; mean over classes: Brier {fmt(cal['mean_brier'])}, "
             f"ECE {fmt(cal['mean_ece'])}.", ""]
    rows = [[r["class"], fmt(r["brier"]), fmt(r["ece"]), str(r["n"]), r["reason"] or ""] for r in cal["per_class"]]
    lines += _table(["Class", "Brier", "ECE", "n", "Note"], rows) + [""]
    if figure:
        lines += [f"![Reliability diagram, site {md(site)}]({figure})", ""]
    return lines


def _operating_section(info: dict, points: list[dict], n_boot: int) -> list[str]:
    ci = f"95% CI by patient-level bootstrap, {n_boot} resamples" if n_boot > 0 else "no CIs (n_boot = 0)"
    rules = "; ".join(f"**{md(name)}**: {md(text)}" for name, text in info["rules"].items())
    lines = ["### Operating points", "",
             f"Thresholds chosen per class on the {info['selected_on']} split, measured on the "
             f"{info['evaluated_on']} split ({ci}); predicted positive when probability ≥ threshold. "
             f"{rules}.", ""]
    if info.get("same_rows"):
        lines += [f"Note: thresholds were chosen on these same {info['evaluated_on']} rows, so these numbers "
                  "are optimistic.", ""]
    rows = []
    for op in points:
        rows.append([op["class"], op["rule"], fmt(op["threshold"])]
                    + [fmt_ci(op[m], op[f"{m}_ci_low"], op[f"{m}_ci_high"]) for m in operating.METRICS]
                    + [op["reason"] or ""])
    lines += _table(["Class", "Rule", "Threshold", "Sensitivity", "Specificity", "PPV", "NPV", "Note"], rows)
    return lines + [""]


def _subgroup_section(report, task, sub) -> list[str]:
    lines = [f"### {md(SUBGROUP_TITLES.get(task, task))}", ""]
    groups = sub["groups"]
    if groups:
        names = list(groups)
        rows = [["n images"] + [str(groups[g]["n_rows"]) for g in names],
                ["**Mean AUROC**"] + [fmt_ci(groups[g]["mean_auroc"], groups[g]["mean_auroc_ci_low"],
                                             groups[g]["mean_auroc_ci_high"]) for g in names]]
        if "accuracy" in groups[names[0]]:
            rows.append(["Accuracy"] + [fmt(groups[g]["accuracy"]) for g in names])
        for j, cls in enumerate(report["classes"]):
            rows.append([cls] + [fmt(groups[g]["per_class"][j]["auroc"]) for g in names])
        lines += _table(["AUROC"] + names, rows) + [""]
    else:
        lines += ["No subgroup large enough to report.", ""]
    for item in sub["skipped"]:
        value = item["value"] if item["value"] is not None else "all"
        lines.append(f"- not reported: {md(value)} ({md(item['n_rows'])} images): {md(item['reason'])}")
    if sub["skipped"]:
        lines.append("")
    return lines
