"""``fedcxr evaluate RUN_DIR`` as a library function: predictions from the training side, the report
from evaluation (the one place the two meet for a run's report).

Writes ``predictions/<split>.parquet`` (and ``predictions/val.parquet``) when missing
(:mod:`fedcxr.pipeline.predictions`: the model scores every evaluated site's split), chooses the
operating points on the validation split (Youden, 90% sensitivity, 90% specificity) and stores
them in ``operating_points.json`` (``fedcxr predict`` applies them to new images), then writes
``report.json``, ``per_class.csv``, ``report.md``, ``roc_<site>.png`` and
``calibration_<site>.png`` (:mod:`fedcxr.evaluation.report`,
:mod:`~fedcxr.evaluation.report_files`).

Two things a reader of the report must not have to guess:

* **A site without validation rows has no operating points.** Thresholds are chosen on
  validation rows, never on the test rows they are measured on; a site whose val split is empty
  gets none. ``operating_points.json`` then holds the site with every threshold undefined and
  the reason, ``report.json`` lists it under ``sites_without_operating_points``, ``report.md``
  says so, and ``fedcxr predict`` repeats the reason instead of "never evaluated".
* **A FLARE run's cross-site report is never replaced silently.** ``fedcxr flare`` leaves the
  sites' own evaluation (each site scored the final model on its own test split) in
  ``report.json``/``report.md``/``per_class.csv``; evaluating that run here would overwrite
  it with a central one, so it is refused unless ``replace_cross_site`` (``--replace-cross-site``)
  is given, which first moves the cross-site files to ``RUN_DIR/cross_site_report/``.

A missing or malformed run directory raises :class:`~fedcxr.errors.UserError` (exit code 2).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from fedcxr.errors import UserError
from fedcxr.rundir import RunDir


@dataclass(frozen=True)
class EvaluateResult:
    """An evaluated run: ``report`` is ``report.json``'s content (NaN where a number is undefined);
    ``files`` the report files written; ``operating_points`` the thresholds stored for
    ``fedcxr predict`` (``{site: {class: {rule: threshold | None, "reason": ...}}}``);
    ``without_operating_points`` the sites that have none, with why."""

    run_dir: RunDir
    report: dict[str, Any] = field(repr=False)
    files: list[Path] = field(default_factory=list, repr=False)
    operating_points: dict[str, Any] = field(default_factory=dict, repr=False)
    without_operating_points: list[dict[str, str]] = field(default_factory=list)
    cross_site_moved_to: Optional[Path] = None

    @property
    def report_md(self) -> Path:
        return self.run_dir.report_md

    @property
    def mean_auroc(self) -> dict[str, float]:
        """Each evaluated site's mean AUROC over its classes with a defined AUROC."""
        return {site: entry["mean_auroc"] for site, entry in self.report["sites"].items()}


def evaluate(run_dir: "RunDir | str | os.PathLike", *, split: str = "test", bootstrap: int = 1000, seed: int = 0,
             device: Optional[str] = None, cam: int = 0, replace_cross_site: bool = False) -> EvaluateResult:
    """Evaluate one finished run (writing its predictions first when missing) and write the report
    files into it. ``bootstrap``: patient-bootstrap resamples for the 95% CIs (0: DeLong CIs);
    ``cam`` > 0 (opt-in): Grad-CAM overlays of the ``cam`` top-scoring images per class and site
    under ``RUN_DIR/cam/`` and a gallery in report.md (images derived from patient pixels);
    ``replace_cross_site``: see the module doc."""
    run = RunDir.existing(run_dir)
    if bootstrap < 0:
        raise UserError(f"--bootstrap must be 0 (DeLong CIs) or a positive number of resamples, got {bootstrap}")
    from fedcxr.runlock import run_lock

    with run_lock(run.root, "fedcxr evaluate"):  # never beside a run still writing it (fedcxr.runlock)
        moved = _set_cross_site_report_aside(run, replace_cross_site)
        return _evaluate_locked(run, split=split, n_boot=bootstrap, seed=seed, device=device, cam=cam, moved=moved)


def evaluate_run(run_dir: "RunDir | str | os.PathLike", *, split: str = "test", n_boot: int = 1000, seed: int = 0,
                 device: Optional[str] = None, cam: int = 0, replace_cross_site: bool = False) -> dict:
    """:func:`evaluate`, returning the report dict only (``report.json``'s content; the benchmarks' form)."""
    return evaluate(run_dir, split=split, bootstrap=n_boot, seed=seed, device=device, cam=cam,
                    replace_cross_site=replace_cross_site).report


#: the files of a FLARE cross-site report (fedcxr.evaluation.report_table.write_summary_report)
def _cross_site_files(run: RunDir) -> list[Path]:
    return [run.report_json, run.per_class_csv, run.report_md]


def holds_cross_site_report(run: RunDir) -> bool:
    """Whether ``report.json`` is a FLARE cross-site report (built from the sites' summaries)."""
    from fedcxr.evaluation.report_table import SOURCE

    try:
        report = json.loads(run.report_json.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(report, dict) and report.get("source") == SOURCE


def _set_cross_site_report_aside(run: RunDir, replace: bool) -> Optional[Path]:
    """Refuse to overwrite a cross-site report, or (``replace``) move it to ``cross_site_report/``."""
    if not holds_cross_site_report(run):
        return None
    if not replace:
        raise UserError(
            f"{run.report_md} is the cross-site evaluation of this FLARE run (each site scored the final model "
            "on its own test split and sent back its summary); `fedcxr evaluate` would replace it with a central "
            "evaluation computed here from every site's images. Read it as it is, or pass --replace-cross-site: "
            f"the cross-site report is then moved to {run.cross_site_report}/ and the central one written in its "
            "place")
    run.cross_site_report.mkdir(exist_ok=True)
    for path in _cross_site_files(run):
        if path.is_file():
            os.replace(path, run.cross_site_report / path.name)
    return run.cross_site_report


def _evaluate_locked(run: RunDir, *, split: str, n_boot: int, seed: int, device: Optional[str], cam: int,
                     moved: Optional[Path]) -> EvaluateResult:
    from fedcxr.atomic import atomic_write_json
    from fedcxr.evaluation.report import build_report
    from fedcxr.evaluation.report_files import write_report
    from fedcxr.evaluation.runs import load_run_info

    info = load_run_info(run.root)
    predictions = _predictions(run, split, info["classes"], device)
    val = _predictions(run, "val", info["classes"], device, optional=True)
    sites = list(dict.fromkeys(predictions["site"].astype(str)))
    thresholds, without = _operating_points(val, info["classes"], sites)
    atomic_write_json(run.operating_points, thresholds)
    report = build_report(predictions, info, split=split, n_boot=n_boot, seed=seed, val_predictions=val)
    report["sites_without_operating_points"] = without
    files = write_report(run.root, report, predictions)
    if cam:
        from fedcxr.pipeline.explain import write_gallery  # torch only when asked for

        _append_gallery(run.report_md, write_gallery(run.root, split=split, top_n=int(cam), device=device), split)
    return EvaluateResult(run, report, files, thresholds, without, moved)


def no_validation_reason(site: str) -> str:
    """Why a site has no operating points: said the same way in report.json/.md, operating_points.json,
    the command's output and ``fedcxr predict``."""
    return (f"no validation rows at {site} (its val split is empty): operating points are chosen on validation rows, "
            "never on the test rows they are measured on, so there are none and `fedcxr predict` gives "
            "probabilities only; ingest with a validation share (--val-fraction) to have them")


def _operating_points(val, classes: list[str], sites: list[str]) -> tuple[dict, list[dict[str, str]]]:
    """``operating_points.json``'s content and the evaluated sites without validation rows (each kept
    in the file with its thresholds undefined and the reason, so a reader never guesses)."""
    from fedcxr.evaluation.operating import operating_point_thresholds, rule_names

    thresholds = operating_point_thresholds(val, classes) if val is not None else {}
    without = [{"site": s, "reason": no_validation_reason(s)} for s in sites if s not in thresholds]
    rules = list(rule_names().values())
    for item in without:
        thresholds[item["site"]] = {cls: {**dict.fromkeys(rules), "reason": item["reason"]} for cls in classes}
    return thresholds, without


def _append_gallery(report_md: Path, gallery: dict[str, dict[str, list[str]]], split: str) -> None:
    """A Grad-CAM section at the end of report.md, linking the PNGs under the run directory."""
    from fedcxr.atomic import atomic_write_bytes
    from fedcxr.escape import md

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


def _predictions(run: RunDir, split: str, classes: list[str], device: Optional[str], *, optional: bool = False):
    """``predictions/<split>.parquet``, written first by the training side when missing.

    ``optional``: a split with no rows at the evaluated sites gives None (no operating points)
    instead of an error.
    """
    from fedcxr.evaluation.runs import load_predictions

    if not run.predictions(split).is_file():
        from fedcxr.pipeline.predictions import write_predictions  # torch only when a model must run

        try:
            write_predictions(run.root, split, device=device)
        except UserError:
            if optional:
                return None
            raise
    return load_predictions(run.root, split, classes)


__all__ = ["EvaluateResult", "evaluate", "evaluate_run", "holds_cross_site_report", "no_validation_reason"]
