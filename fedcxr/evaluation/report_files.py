"""The files of one run's evaluation report: ``report.json``, ``per_class.csv``, ``report.md``, figures.

Why a module of its own: building a report (:mod:`fedcxr.evaluation.report`) is numbers only;
writing it touches the file system (atomic writes, :mod:`fedcxr.atomic`), names files after
sites that come from run directories and other sites' summaries (:func:`safe_name`,
:func:`figure_names`: never a path that leaves the run directory or hides a file) and draws the
figures (:mod:`fedcxr.evaluation.plots`, matplotlib imported only here and only when writing).
``report.json`` is written through :func:`fedcxr.atomic.json_safe` (NaN → null), in the
report's own key order.
"""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path
from typing import Any, Optional

import pandas as pd

from fedcxr.atomic import atomic_write_bytes, json_bytes
from fedcxr.escape import to_csv_text
from fedcxr.evaluation import metrics, operating, small_sample
from fedcxr.evaluation.report_markdown import render_markdown
from fedcxr.rundir import CURVES_FIGURE, RunDir
from fedcxr.wording import count


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
    """``per_class.csv``: one row per (site, class): the AUROC columns (:data:`~fedcxr.evaluation.metrics.
    PER_CLASS_COLUMNS`, then ``small_sample``, ``ci_method``, ``pos_patients``, ``neg_patients``; rows of
    reports older than schema 3 get them from :func:`~fedcxr.evaluation.small_sample.fill_row`). With
    operating points, per rule ``<rule>_threshold``, ``<rule>_small_sample`` and ``<rule>_<metric>``,
    ``<rule>_<metric>_ci_low``, ``<rule>_<metric>_ci_high`` for sensitivity, specificity, ppv, npv follow."""
    auroc_columns = metrics.PER_CLASS_COLUMNS + metrics.SMALL_SAMPLE_COLUMNS
    columns = ["site"] + auroc_columns
    rows = []
    for site, entry in report["sites"].items():
        points: dict[str, dict[str, Any]] = {}
        for op in entry.get("operating_points") or []:
            fields = {f"{op['rule']}_threshold": op["threshold"],
                      f"{op['rule']}_small_sample": op.get("small_sample")}
            for m in operating.METRICS:
                fields.update({f"{op['rule']}_{m}{suffix}": op[f"{m}{suffix}"] for suffix in ("", "_ci_low", "_ci_high")})
            points.setdefault(op["class"], {}).update(fields)
            columns += [c for c in fields if c not in columns]
        rows += [{"site": site, **{k: r[k] for k in auroc_columns}, **points.get(r["class"], {})}
                 for r in map(small_sample.fill_row, entry["per_class"])]
    return pd.DataFrame(rows, columns=columns)


def write_report(run_dir: Path | str, report: dict, predictions: pd.DataFrame) -> list[Path]:
    """Write ``report.json``, ``per_class.csv``, ``report.md``, ``roc_<site>.png``,
    ``calibration_<site>.png`` (``<site>``: :func:`figure_names`) and, from the run's
    ``metrics.jsonl``, ``training_curves.png`` into ``run_dir``."""
    from fedcxr.evaluation.plots import plot_reliability, plot_roc  # matplotlib only when writing

    run_dir = Path(run_dir)
    files = RunDir(run_dir)
    paths = [files.report_json, files.per_class_csv, files.report_md]
    write_json(paths[0], report)
    write_text(paths[1], to_csv_text(per_class_frame(report), float_format="%.6g"))
    figures: dict[str, dict[str, str]] = {}
    names = figure_names(report["sites"])
    site_col = predictions["site"].astype(str).to_numpy()
    for site, entry in report["sites"].items():
        rows = predictions[site_col == site]
        where = f"{site} ({report['split']}, {count(int(entry['n_rows']), 'image')})"
        roc = plot_roc(rows, report["classes"], run_dir / f"roc_{names[site]}.png",
                       title=f"{report['method']}: ROC on {where}",
                       aurocs={r["class"]: r["auroc"] for r in entry["per_class"]})
        reliability = plot_reliability(rows, report["classes"], run_dir / f"calibration_{names[site]}.png",
                                       title=f"{report['method']}: calibration on {where}",
                                       n_bins=entry["calibration"]["n_bins"])
        figures[site] = {"roc": roc.name, "calibration": reliability.name}
        paths += [roc, reliability]
    curves, note = write_training_curves(run_dir, report["method"])
    if curves is not None:
        paths.append(curves)
    write_text(paths[2], render_markdown(report, figures, curves=(curves.name if curves else None), curves_note=note))
    return paths




def write_training_curves(run_dir: Path, method: str) -> tuple[Optional[Path], Optional[str]]:
    """``(training_curves.png, None)`` drawn from ``metrics.jsonl``, or ``(None, why not)``."""
    from fedcxr.errors import UserError
    from fedcxr.evaluation.curves import read_metrics, training_series
    from fedcxr.evaluation.plots import plot_training_curves

    try:
        series = training_series(read_metrics(run_dir))
    except UserError as exc:  # a damaged metrics file costs the figure, not the report
        logging.getLogger(__name__).warning("training curves not drawn: %s", exc)
        return None, "not drawn: metrics.jsonl is malformed (the warning of `fedcxr evaluate` names the line)"
    if series.empty():
        return None, "not drawn: the run directory has no per-round metrics (metrics.jsonl)"
    return plot_training_curves(series, run_dir / CURVES_FIGURE, title=f"{method}: training, per round"), None


__all__ = ["CURVES_FIGURE", "MAX_NAME", "figure_names", "per_class_frame", "safe_name", "write_json", "write_report", "write_text", "write_training_curves"]
