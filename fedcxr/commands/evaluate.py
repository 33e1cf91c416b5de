"""``fedcxr evaluate RUN_DIR``: predictions from the training side, the report from evaluation.

Writes ``predictions/<split>.parquet`` (and ``predictions/val.parquet``) when missing
(:mod:`fedcxr.pipeline.predictions`: the model scores every evaluated site's split), chooses the
operating points on the validation split (Youden, 90% sensitivity, 90% specificity) and stores
them in ``operating_points.json`` (``fedcxr predict`` applies them to new images), then writes
``report.json``, ``per_class.csv``, ``report.md``, ``roc_<site>.png`` and
``calibration_<site>.png`` (:mod:`fedcxr.evaluation.report`, :mod:`~fedcxr.evaluation.report_files`). A missing or malformed run directory
raises :class:`~fedcxr.errors.UserError` (exit code 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

import pandas as pd

from fedcxr.atomic import atomic_write_bytes, atomic_write_json
from fedcxr.errors import UserError
from fedcxr.escape import md
from fedcxr.evaluation.operating import operating_point_thresholds
from fedcxr.evaluation.report import build_report
from fedcxr.evaluation.report_files import write_report
from fedcxr.evaluation.report_markdown import fmt, fmt_ci
from fedcxr.evaluation.runs import check_run_dir, load_predictions, load_run_info, predictions_path
from fedcxr.rundir import OPERATING_POINTS, RunDir
from fedcxr.runlock import run_lock


def evaluate_run(run_dir: Path | str, *, split: str = "test", n_boot: int = 1000, seed: int = 0,
                 device: Optional[str] = None, cam: int = 0) -> dict:
    """Evaluate one run (writing its predictions first if missing) and write the report files
    into ``run_dir``; returns the report dict (``report.json`` content, NaN where undefined).

    ``cam`` > 0 (opt-in): Grad-CAM overlays of the ``cam`` top-scoring images per class and site
    under ``run_dir/cam/`` and a gallery section in report.md (images derived from patient pixels)."""
    run_dir = check_run_dir(run_dir)
    if n_boot < 0:
        raise UserError(f"--bootstrap must be 0 (DeLong CIs) or a positive number of resamples, got {n_boot}")
    with run_lock(run_dir, "fedcxr evaluate"):  # never beside a run still writing it (fedcxr.runlock)
        return _evaluate_locked(run_dir, split=split, n_boot=n_boot, seed=seed, device=device, cam=cam)


def _evaluate_locked(run_dir: Path, *, split: str, n_boot: int, seed: int, device: Optional[str],
                     cam: int) -> dict:
    info = load_run_info(run_dir)
    predictions = _predictions(run_dir, split, info["classes"], device)
    val = _predictions(run_dir, "val", info["classes"], device, optional=True)
    if val is not None:
        thresholds = operating_point_thresholds(val, info["classes"])
        atomic_write_json(RunDir(run_dir).operating_points, thresholds)
    report = build_report(predictions, info, split=split, n_boot=n_boot, seed=seed, val_predictions=val)
    write_report(run_dir, report, predictions)
    if cam:
        from fedcxr.pipeline.explain import write_gallery  # torch only when asked for

        _append_gallery(RunDir(run_dir).report_md, write_gallery(run_dir, split=split, top_n=int(cam),
                                                                  device=device), split)
    return report


def _append_gallery(report_md: Path, gallery: dict[str, dict[str, list[str]]], split: str) -> None:
    """A Grad-CAM section at the end of report.md, linking the PNGs under the run directory."""
    lines = ["", "## Grad-CAM gallery", "",
             f"Top-scoring {md(split)} images per class, with Grad-CAM of that class (left: the image as the model "
             "saw it). **These PNGs are derived from patient pixels**: they were written because `--cam` was "
             "given, they are named by pseudonymous row key only, and they must stay where the images are "
             "(do not share the run directory's `cam/` folder).", ""]
    for site, per_class in gallery.items():
        lines += [f"### {md(site)}", ""]
        for cls, files in per_class.items():
            lines.append(f"**{md(cls)}**: " + " ".join(f"[![{Path(f).stem}]({f})]({f})" for f in files))
            lines.append("")
    text = report_md.read_text(encoding="utf-8").rstrip("\n") + "\n" + "\n".join(lines) + "\n"
    atomic_write_bytes(report_md, text.encode("utf-8"))


def _predictions(run_dir: Path, split: str, classes: list[str], device: Optional[str], *,
                 optional: bool = False) -> Optional[pd.DataFrame]:
    """``predictions/<split>.parquet``, written first by the training side when missing.

    ``optional``: a split with no rows at the evaluated sites gives None (no operating points)
    instead of an error.
    """
    if not predictions_path(run_dir, split).is_file():
        from fedcxr.pipeline.predictions import write_predictions  # torch only when a model must run

        try:
            write_predictions(run_dir, split, device=device)
        except UserError:
            if optional:
                return None
            raise
    return load_predictions(run_dir, split, classes)


def cli_evaluate(args: argparse.Namespace) -> int:
    """Evaluate one run; prints where report.md is and the mean AUROC per site."""
    report = evaluate_run(args.run_dir, split=getattr(args, "split", "test") or "test",
                          n_boot=int(getattr(args, "bootstrap", 1000)), seed=int(getattr(args, "seed", 0) or 0),
                          device=getattr(args, "device", None), cam=int(getattr(args, "cam", 0) or 0))
    print(f"report: {RunDir(args.run_dir).report_md}")
    for site, entry in report["sites"].items():
        line = (f"  {site}: mean AUROC {fmt_ci(entry['mean_auroc'], entry['mean_auroc_ci_low'], entry['mean_auroc_ci_high'])}"
                f" over {len(entry['mean_auroc_classes'])}/{len(report['classes'])} classes"
                + (f" ({len(entry['mean_auroc_small_sample_classes'])} with too few cases, see report.md)"
                   if entry.get("mean_auroc_small_sample_classes") else "") + f", {entry['n_rows']} images")
        if "accuracy" in entry:
            line += f", accuracy {fmt(entry['accuracy'])}"
        print(line)
    for item in report["sites_without_predictions"]:
        print(f"  {item['site']}: not evaluated ({item['reason']})")
    return 0
