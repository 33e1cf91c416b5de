"""``report.md``: a run's evaluation report as Markdown a researcher can paste, and the number formats.

Why a module of its own: the Markdown is a view of the report dict
(:mod:`fedcxr.evaluation.report`) with its own rules — every cell escaped
(:func:`fedcxr.escape.md`: site names, reasons and class names come from run directories and
other sites' summaries), undefined numbers shown as ``n/a`` (never 0.5), CIs as
``0.812 (0.790–0.834)`` (:func:`fmt`, :func:`fmt_ci`, which the command lines and the
comparison table print too). :func:`render_markdown` serves ``fedcxr evaluate`` and FLARE's
cross-site report alike.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from fedcxr.escape import md
from fedcxr.evaluation import operating, small_sample
from fedcxr.evaluation.report_refusals import training_section
from fedcxr.wording import count

SUBGROUP_TITLES = {"sex": "Sex", "age_bin": "Age bin (years)", "race": "Race/ethnicity"}


def fmt(value: Optional[float], digits: int = 3) -> str:
    """``0.812``, or ``n/a`` for an undefined number (None, NaN)."""
    return "n/a" if value is None or not np.isfinite(value) else f"{value:.{digits}f}"


def fmt_ci(value, low, high, digits: int = 3) -> str:
    """``0.812 (0.790–0.834)``; the value alone when the interval is undefined; ``n/a`` without a value."""
    if value is None or not np.isfinite(value):
        return "n/a"
    if low is None or high is None or not (np.isfinite(low) and np.isfinite(high)):
        return fmt(value, digits)
    return f"{value:.{digits}f} ({low:.{digits}f}–{high:.{digits}f})"


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table; every cell escaped (:func:`fedcxr.escape.md`: site names, reasons and class
    names come from run directories and other sites' summaries)."""
    lines = ["| " + " | ".join(md(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(md(c) for c in r) + " |" for r in rows]
    return lines


def render_markdown(report: dict, figures: Optional[dict[str, Any]] = None, *, curves: Optional[str] = None,
                    curves_note: Optional[str] = None) -> str:
    """A report a researcher can paste: run facts, training curves, per-site per-class table,
    calibration, operating points, subgroup tables. ``figures``: site → {"roc": name, "calibration":
    name} (a plain name means the ROC figure); ``curves``: the training-curve figure's name, or
    ``curves_note``: why there is none."""
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
             "an undefined AUROC (one label value in the test rows) is n/a, never 0.5.",
             f"- Small samples: {small_sample.RULE}", ""]
    for item in report.get("sites_without_predictions", []):
        lines += [f"- Site {md(item['site'])}: not evaluated ({md(item['reason'])})", ""]
    for item in report.get("sites_without_operating_points", []):  # fedcxr evaluate: a site with no val rows
        lines += [f"- Site {md(item['site'])}: no operating points ({md(item['reason'])})", ""]
    lines += training_section(report)
    if curves or curves_note:
        lines += ["## Training curves", ""]
        lines += ([f"![Training loss and validation AUROC per round]({curves})", "",
                   "Per round, from `metrics.jsonl`: each source's mean training loss and the target's "
                   "fine-tuning loss (top), each evaluated site's mean validation AUROC (bottom; the validation "
                   "split, never the test split).", ""] if curves else [f"Training curves {curves_note}.", ""])
    for site, entry in report["sites"].items():
        figure = (figures or {}).get(site) or {}
        lines += _site_section(report, site, entry, {"roc": figure} if isinstance(figure, str) else figure)
    return "\n".join(lines).rstrip() + "\n"


def _site_section(report, site, entry, figures: dict[str, str]) -> list[str]:
    lines = [f"## Site {md(site)}", "",
             f"{count(int(entry['n_rows']), 'image')} of {count(int(entry['n_patients']), 'patient')}.", "",
             f"**Mean AUROC** {headline(entry, len(report['classes']))}", ""]
    if "accuracy" in entry:
        lines += [f"**Accuracy** (threshold {md(entry['accuracy_threshold'])}): "
                  f"{fmt_ci(entry['accuracy'], entry['accuracy_ci_low'], entry['accuracy_ci_high'])}"
                  + _accuracy_note(entry), ""]
    rows = [[r["class"], fmt_ci(r["auroc"], r["ci_low"], r["ci_high"]), str(r["n"]), str(r["n_pos"]),
             fmt(r["prevalence"]), _note(r, report["ci"]["n_boot"])] for r in entry["per_class"]]
    lines += md_table(["Class", "AUROC (95% CI)", "n", "Positives", "Prevalence", "Note"], rows) + [""]
    if figures.get("roc"):
        lines += [f"![ROC curves, site {md(site)}]({figures['roc']})", ""]
    if "calibration" in entry:
        lines += _calibration_section(site, entry["calibration"], figures.get("calibration"))
    if entry.get("operating_points") is not None and report.get("operating_points"):
        lines += _operating_section(report["operating_points"], entry["operating_points"], report["ci"]["n_boot"])
    for task, sub in entry["subgroups"].items():
        lines += _subgroup_section(report, task, sub)
    return lines


def headline(entry: dict, n_classes: int) -> str:
    """``(3 of 3 classes; 2 of them with too few cases): 0.765 (0.330–0.928; mean of the class intervals)``:
    the mean AUROC of a site entry, how many classes behind it are small-sample, and which method
    made its interval (or why there is none)."""
    used = len(entry["mean_auroc_classes"])
    small = len(entry.get("mean_auroc_small_sample_classes") or [])
    scope = f"{used} of {n_classes} classes" + (f"; {small} of them with too few cases" if small else "")
    value = fmt_ci(entry["mean_auroc"], entry["mean_auroc_ci_low"], entry["mean_auroc_ci_high"])
    method = entry.get("mean_auroc_ci_method")
    if method in (small_sample.MEAN_OF_BOUNDS, small_sample.MEAN_COMBINED) and value.endswith(")"):
        value = f"{value[:-1]}; {method})"
    reason = f" ({md(entry['mean_auroc_reason'])})" if entry.get("mean_auroc_reason") else ""
    return f"({scope}): {value}{reason}"


def _accuracy_note(entry: dict) -> str:
    parts = []
    if entry.get("accuracy_small_sample"):
        parts.append(f"too few cases: fewer than {small_sample.MIN_CASES} patients")
    if entry.get("accuracy_ci_method") == small_sample.WILSON:
        parts.append("Wilson score interval")
    if entry.get("accuracy_reason"):
        parts.append(md(entry["accuracy_reason"]))
    return f" ({'; '.join(parts)})" if parts else ""


def _note(row: dict, n_boot: int) -> str:
    """Too few cases (in words), the reason a number is missing or an interval was replaced, the
    interval's method where it is not the report's own, or how many bootstrap resamples it skipped."""
    parts = []
    if row.get("small_sample") and row.get("auroc") is not None and np.isfinite(row["auroc"]):
        parts.append(small_sample.row_words(row))
    if row["reason"]:
        parts.append(row["reason"])
    if row.get("ci_method") == small_sample.NEWCOMBE and not row["reason"]:
        parts.append(f"{small_sample.NEWCOMBE} interval")
    if row.get("ci_skipped"):
        parts.append(f"CI from {n_boot - row['ci_skipped']} of {n_boot} resamples (rest had one label value)")
    return "; ".join(parts)


def _calibration_section(site: str, cal: dict, figure: Optional[str]) -> list[str]:
    pooled = cal["pooled"]
    lines = ["### Calibration", "",
             f"Brier score = mean of (probability − label)²; ECE = Σ over {md(cal['n_bins'])} equal-width bins of "
             "(share of rows in the bin) × |fraction positive − mean probability|. Lower is better for both.", "",
             f"**All classes pooled** ({md(pooled['n'])} labeled entries): Brier {fmt(pooled['brier'])}, "
             f"ECE {fmt(pooled['ece'])}; mean over classes: Brier {fmt(cal['mean_brier'])}, "
             f"ECE {fmt(cal['mean_ece'])}.", ""]
    rows = [[r["class"], fmt(r["brier"]), fmt(r["ece"]), str(r["n"]), r["reason"] or ""] for r in cal["per_class"]]
    lines += md_table(["Class", "Brier", "ECE", "n", "Note"], rows) + [""]
    if figure:
        lines += [f"![Reliability diagram, site {md(site)}]({figure})", ""]
    return lines


def _operating_section(info: dict, points: list[dict], n_boot: int) -> list[str]:
    ci = (f"95% CI by patient-level bootstrap, {n_boot} resamples; Wilson score interval where the Note says "
          f"too few cases (under {small_sample.MIN_CASES}) or the bootstrap collapsed" if n_boot > 0
          else "no CIs (n_boot = 0)")
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
    lines += md_table(["Class", "Rule", "Threshold", "Sensitivity", "Specificity", "PPV", "NPV", "Note"], rows)
    return lines + [""]


def _marked(row: dict) -> str:
    """A subgroup's class AUROC, with † when it is small-sample."""
    value = fmt(row["auroc"])
    return f"{value} †" if row.get("small_sample") and value != "n/a" else value


def _marked_mean(entry: dict) -> str:
    """A mean AUROC with its interval and ``†k`` when k classes behind it are small-sample."""
    value = fmt_ci(entry["mean_auroc"], entry["mean_auroc_ci_low"], entry["mean_auroc_ci_high"])
    small = len(entry.get("mean_auroc_small_sample_classes") or [])
    return f"{value} †{small}" if small else value


def _subgroup_section(report, task, sub) -> list[str]:
    lines = [f"### {md(SUBGROUP_TITLES.get(task, task))}", ""]
    groups = sub["groups"]
    if groups:
        names = list(groups)
        rows = [["n images"] + [str(groups[g]["n_rows"]) for g in names],
                ["**Mean AUROC**"] + [_marked_mean(groups[g]) for g in names]]
        if "accuracy" in groups[names[0]]:
            rows.append(["Accuracy"] + [fmt(groups[g]["accuracy"]) for g in names])
        for j, cls in enumerate(report["classes"]):
            rows.append([cls] + [_marked(groups[g]["per_class"][j]) for g in names])
        lines += md_table(["AUROC"] + names, rows) + [""]
        if any(groups[g].get("mean_auroc_small_sample_classes") for g in names):
            lines += [f"† too few cases: fewer than {small_sample.MIN_CASES} positive or {small_sample.MIN_CASES} "
                      "negative patients in the group; after a mean, how many of its classes are so.", ""]
    else:
        lines += ["No subgroup large enough to report.", ""]
    for item in sub["skipped"]:
        value = item["value"] if item["value"] is not None else "all"
        lines.append(f"- not reported: {md(value)} ({count(int(item['n_rows']), 'image')}): {md(item['reason'])}")
    if sub["skipped"]:
        lines.append("")
    return lines


__all__ = ["SUBGROUP_TITLES", "fmt", "fmt_ci", "md_table", "render_markdown"]
