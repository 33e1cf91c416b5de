"""Reports built from per-site evaluation summaries instead of a prediction table.

In a federated deployment (FLARE cross-site evaluation, :mod:`fedcxr.flare.cross_site`) each
hospital scores its own test split and sends back only the ``sites`` entry of ``report.json``
(:func:`fedcxr.evaluation.report.evaluate_rows` + subgroups + calibration, computed at the site).
This module turns those summaries into the same ``report.json`` / ``per_class.csv`` /
``report.md`` as ``fedcxr evaluate`` (no ROC or reliability figures: the curves would need the
predictions), and lets ``fedcxr report`` read them back (:func:`load_summary_results`) so the
papers' comparison table is built from FLARE runs too.

Extra fields beside the schema of :mod:`fedcxr.evaluation.report`::

    source: "site summaries"          (absent in reports built from predictions)
    sites_without_predictions: [{site, reason}]   also every site whose evaluation failed
    cross_site: {convention, models: {model owner: {site: {mean_auroc, n_rows}}}}

Never imports :mod:`fedcxr.pipeline`: the summaries are plain dicts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Optional

from fedcxr.errors import UserError
from fedcxr.escape import md, to_csv_text
from fedcxr.evaluation import metrics, small_sample
from fedcxr.evaluation.report import ALPHA, MIN_SUBGROUP_ROWS, report_header
from fedcxr.evaluation.report_files import per_class_frame, write_json, write_text
from fedcxr.evaluation.report_markdown import render_markdown
from fedcxr.evaluation.summary_check import summary_problem
from fedcxr.rundir import RunDir

SOURCE = "site summaries"
#: what a site's summary must hold to be reported (the rest is optional)
REQUIRED_ENTRY_KEYS = ("n_rows", "n_patients", "per_class", "mean_auroc", "mean_auroc_ci_low", "mean_auroc_ci_high",
                       "mean_auroc_classes", "subgroups")


def entry_problem(entry: Any, classes: list[str]) -> Optional[str]:
    """Why a site's summary cannot go into the report (None when it can)."""
    if not isinstance(entry, Mapping):
        return "the summary is not a mapping"
    missing = [k for k in REQUIRED_ENTRY_KEYS if k not in entry]
    if missing:
        return f"the summary lacks {missing}"
    rows = entry["per_class"]
    if not isinstance(rows, list) or not all(isinstance(r, Mapping) for r in rows):
        return "per_class is not a list of rows"
    for row in rows:
        lacking = [c for c in metrics.PER_CLASS_COLUMNS if c not in row]
        if lacking:
            return f"a per_class row lacks {lacking}"
    if [r["class"] for r in rows] != list(classes):
        return "per_class rows are not the run's classes in order"
    if not isinstance(entry["subgroups"], Mapping):
        return "subgroups is not a mapping"
    return summary_problem(entry, classes)  # known fields, numbers in range, known reasons only


def build_summary_report(summaries: Mapping[str, Mapping], run_info: Mapping, *, split: str, n_boot: int,
                         seed: int, failed: Optional[Mapping[str, str]] = None,
                         cross_site: Optional[dict] = None) -> dict:
    """``report.json`` content from ``{site: summary}``; ``failed``: ``{site: reason}`` named in the report.

    Sites keep the order of ``run_info["eval_sites"]``; a summary that is malformed is listed with
    the failed sites instead of breaking the report.
    """
    classes = list(run_info["classes"])
    wanted = [str(s) for s in run_info.get("eval_sites") or []]
    order = [s for s in wanted if s in summaries] + [s for s in summaries if s not in wanted]
    missing = dict(failed or {})
    sites: dict[str, Any] = {}
    for site in order:
        problem = entry_problem(summaries[site], classes)
        if problem:
            missing[site] = f"unusable summary from the site: {problem}"
        else:
            sites[site] = upgrade_entry(summaries[site])
    for site in wanted:
        if site not in sites and site not in missing:
            missing[site] = "no summary from the site"
    return {
        **report_header(run_info, split, classes),
        "source": SOURCE,
        "ci": {"level": 1 - ALPHA,
               "method": ("patient-level bootstrap (percentile), at each site" if n_boot > 0
                          else "DeLong (normal approximation), at each site"),
               "n_boot": int(n_boot), "seed": int(seed), "small_sample": small_sample.rule_info()},
        "min_subgroup_rows": MIN_SUBGROUP_ROWS,
        "calibration": {"n_bins": None, "binning": "per site (see each site's calibration)"},
        "operating_points": None,
        "sites": sites,
        "sites_without_predictions": [{"site": s, "reason": r} for s, r in missing.items()],
        "cross_site": cross_site or {},
    }


def upgrade_entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A site entry with the schema-3 small-sample fields (:mod:`fedcxr.evaluation.small_sample`), filled in
    where a site running an older fedcxr, or a report written before schema 3, lacks them: per class
    ``small_sample`` from the image counts, the methods unknown (None); the mean's small-sample classes
    from its rows. Entries that have them are returned as they are (copied)."""
    out = dict(entry)
    out["per_class"] = [small_sample.fill_row(r) for r in entry["per_class"]]
    if "mean_auroc_small_sample_classes" not in out:
        small = {r["class"] for r in out["per_class"] if r["small_sample"]}
        out["mean_auroc_small_sample_classes"] = [c for c in out["mean_auroc_classes"] if c in small]
    out.setdefault("mean_auroc_ci_method", None)
    return out


def write_summary_report(run_dir: Path | str, report: dict) -> list[Path]:
    """Write ``report.json``, ``per_class.csv`` and ``report.md`` (no figures: no predictions here)."""
    run_dir = Path(run_dir)
    files = RunDir(run_dir)
    paths = [files.report_json, files.per_class_csv, files.report_md]
    write_json(paths[0], report)
    write_text(paths[1], to_csv_text(per_class_frame(report), float_format="%.6g"))
    text = render_markdown(report)
    models = (report.get("cross_site") or {}).get("models") or {}
    if len(models) > 1:
        text += "\n" + "\n".join(cross_site_markdown(report)) + "\n"
    write_text(paths[2], text)
    return paths


def cross_site_markdown(report: dict) -> list[str]:
    """The model × site matrix of mean AUROCs (global model and each site's own)."""
    models = report["cross_site"]["models"]
    sites = list(dict.fromkeys(s for cells in models.values() for s in cells))
    lines = ["## Cross-site matrix", "", "Mean AUROC of each model (rows) on each site's "
             f"{report['split']} split (columns); `SRV_server` is the final global model.", "",
             "| Model | " + " | ".join(md(s) for s in sites) + " |", "|---|" + "---|" * len(sites)]
    marked = False
    for owner, cells in models.items():
        values = []
        for site in sites:
            cell = cells.get(site) or {}
            value, small = cell.get("mean_auroc"), cell.get("small_sample_classes") or 0
            text = f"{value:.3f}" if isinstance(value, (int, float)) and value == value else "n/a"
            if small and text != "n/a":
                text += f" †{small}/{cell.get('n_classes', '?')}"
                marked = True
            values.append(text)
        lines.append(f"| {md(owner)} | " + " | ".join(values) + " |")
    if marked:
        lines += ["", f"†k/K: k of the K classes behind the mean have too few cases (fewer than "
                  f"{small_sample.MIN_CASES} positive or {small_sample.MIN_CASES} negative patients at that site)."]
    return lines


#: the entry's numbers that JSON stores as null when undefined (NaN again when read back)
_NUMBERS = ("mean_auroc", "mean_auroc_ci_low", "mean_auroc_ci_high", "accuracy", "accuracy_ci_low", "accuracy_ci_high")


def load_summary_results(run_dir: Path | str, split: str) -> Optional[dict[str, dict]]:
    """``{site: summary}`` of a report built from site summaries on ``split``; None when there is none.

    ``fedcxr report`` uses it for runs whose predictions never left the sites (FLARE).
    """
    path = RunDir(run_dir).report_json
    if not path.is_file():
        return None
    try:
        report = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(report, dict) or report.get("source") != SOURCE or report.get("split") != split:
        return None
    out = {}
    for site, entry in (report.get("sites") or {}).items():
        problem = entry_problem(entry, list(report.get("classes") or []))
        if problem:
            raise UserError(f"{path}: site {site!r}: {problem}")
        out[site] = {k: (float("nan") if v is None and k in _NUMBERS else v) for k, v in upgrade_entry(entry).items()}
        for row in out[site]["per_class"]:
            for key in ("auroc", "ci_low", "ci_high", "prevalence"):
                if row.get(key) is None:
                    row[key] = float("nan")
    return out
