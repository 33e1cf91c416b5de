"""``fedcxr evaluate RUN_DIR``: the per-class AUROC report of a run.

The work is :func:`fedcxr.workflows.evaluate.evaluate` (predictions from the training side, the
report from evaluation, the operating points ``fedcxr predict`` applies); this prints where
report.md is, each site's mean AUROC, and every site that has no operating points, with why.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedcxr.commands.options import add_bootstrap, add_device
from fedcxr.wording import count

HELP = "per-class AUROC report of a run"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a finished run directory")
    p.add_argument("--split", default="test", choices=["train", "val", "test"], help="split to evaluate")
    add_bootstrap(p, "patient-level bootstrap resamples for 95%% CIs (0: DeLong CIs)")
    add_device(p, what="the run's device")
    p.add_argument("--cam", type=int, nargs="?", const=3, default=0, metavar="N",
                   help="opt-in: Grad-CAM gallery of the N top-scoring images per class in report.md "
                        "(PNGs under RUN_DIR/cam/, derived from patient pixels); `--cam` alone: N = 3; "
                        "unset: no gallery")
    p.add_argument("--replace-cross-site", action="store_true",
                   help="a FLARE run's report.md is its cross-site evaluation (each site on its own test split) "
                        "and is never replaced silently: move it to RUN_DIR/cross_site_report/ and write the "
                        "central evaluation in its place (unset: such a run is refused)")


def run(args: argparse.Namespace) -> int:
    """Evaluate one run; prints where report.md is and the mean AUROC per site."""
    from fedcxr.evaluation.report_markdown import fmt, fmt_ci
    from fedcxr.workflows.evaluate import evaluate

    result = evaluate(args.run_dir, split=args.split, bootstrap=int(args.bootstrap), device=args.device,
                      cam=int(args.cam or 0), replace_cross_site=bool(args.replace_cross_site))
    report = result.report
    if result.cross_site_moved_to is not None:
        print(f"the cross-site report (each site on its own test split) moved to {result.cross_site_moved_to}")
    print(f"report: {result.report_md}")
    for site, entry in report["sites"].items():
        line = (f"  {site}: mean AUROC {fmt_ci(entry['mean_auroc'], entry['mean_auroc_ci_low'], entry['mean_auroc_ci_high'])}"
                f" over {len(entry['mean_auroc_classes'])}/{len(report['classes'])} classes"
                + (f" ({len(entry['mean_auroc_small_sample_classes'])} with too few cases, see report.md)"
                   if entry.get("mean_auroc_small_sample_classes") else "") + f", {count(entry['n_rows'], 'image')}")
        if "accuracy" in entry:
            line += f", accuracy {fmt(entry['accuracy'])}"
        print(line)
    for item in report["sites_without_predictions"]:
        print(f"  {item['site']}: not evaluated ({item['reason']})")
    for item in result.without_operating_points:
        print(f"  {item['site']}: no operating points: {item['reason']}")
    return 0
