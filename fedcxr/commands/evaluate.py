"""``fedcxr evaluate RUN_DIR``: predictions from the training side, the report from evaluation.

Writes ``predictions/<split>.parquet`` when missing (:mod:`fedcxr.pipeline.predict`: the model
scores every evaluated site's split), then ``report.json``, ``per_class.csv``, ``report.md`` and
``roc_<site>.png`` (:mod:`fedcxr.evaluation.report`). A missing or malformed run directory
raises :class:`~fedcxr.errors.UserError` (exit code 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from fedcxr.errors import UserError
from fedcxr.evaluation.report import build_report, fmt, fmt_ci, write_report
from fedcxr.evaluation.runs import check_run_dir, load_predictions, load_run_info, predictions_path


def evaluate_run(run_dir: Path | str, *, split: str = "test", n_boot: int = 1000, seed: int = 0,
                 device: Optional[str] = None) -> dict:
    """Evaluate one run (writing its predictions first if missing) and write the report files
    into ``run_dir``; returns the report dict (``report.json`` content, NaN where undefined)."""
    run_dir = check_run_dir(run_dir)
    if n_boot < 0:
        raise UserError(f"--bootstrap must be 0 (DeLong CIs) or a positive number of resamples, got {n_boot}")
    info = load_run_info(run_dir)
    if not predictions_path(run_dir, split).is_file():
        from fedcxr.pipeline.predict import write_predictions  # torch only when a model must run

        write_predictions(run_dir, split, device=device)
    predictions = load_predictions(run_dir, split, info["classes"])
    report = build_report(predictions, info, split=split, n_boot=n_boot, seed=seed)
    write_report(run_dir, report, predictions)
    return report


def cli_evaluate(args: argparse.Namespace) -> int:
    """Evaluate one run; prints where report.md is and the mean AUROC per site."""
    report = evaluate_run(args.run_dir, split=getattr(args, "split", "test") or "test",
                          n_boot=int(getattr(args, "bootstrap", 1000)), seed=int(getattr(args, "seed", 0) or 0),
                          device=getattr(args, "device", None))
    print(f"report: {Path(args.run_dir) / 'report.md'}")
    for site, entry in report["sites"].items():
        line = (f"  {site}: mean AUROC {fmt_ci(entry['mean_auroc'], entry['mean_auroc_ci_low'], entry['mean_auroc_ci_high'])}"
                f" over {len(entry['mean_auroc_classes'])}/{len(report['classes'])} classes, {entry['n_rows']} images")
        if "accuracy" in entry:
            line += f", accuracy {fmt(entry['accuracy'])}"
        print(line)
    for item in report["sites_without_predictions"]:
        print(f"  {item['site']}: not evaluated ({item['reason']})")
    return 0
