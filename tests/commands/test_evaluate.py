"""``fedcxr evaluate`` on a real (tiny) run: predictions, operating points from val, the report."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from fedcxr.cli import main
from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.run_driver import run_experiment

from ..conftest import tiny_config


def test_evaluate_chooses_operating_points_on_val_and_reports_them(tiny_manifests, tmp_path, capsys):
    run = tmp_path / "run"
    run_experiment(load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", rounds=1)), run, progress=False)
    assert main(["evaluate", str(run), "--bootstrap", "20", "-q"]) == 0
    thresholds = json.loads((run / "operating_points.json").read_text())
    assert set(thresholds) == {"dicom_style"}
    classes = json.loads((run / "run.json").read_text())["classes"]
    assert set(thresholds["dicom_style"]) == set(classes)
    for entry in thresholds["dicom_style"].values():
        assert {"youden", "sens90", "spec90"} <= set(entry)
        assert all(entry[r] is None or 0.0 <= entry[r] <= 1.0 for r in ("youden", "sens90", "spec90"))
    report = json.loads((run / "report.json").read_text())
    assert report["operating_points"]["selected_on"] == "val" and report["operating_points"]["evaluated_on"] == "test"
    rules = {row["rule"] for row in report["sites"]["dicom_style"]["operating_points"]}
    assert rules == {"youden", "sens90", "spec90"}
    assert (run / "calibration_dicom_style.png").stat().st_size > 5_000
    val = pd.read_parquet(run / "predictions" / "val.parquet")
    assert set(val.columns) >= {"site", "row_key", "patient_key"} and "patient_id" not in val.columns


def test_evaluate_cam_adds_an_opt_in_gallery(evaluated_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(evaluated_run, run)
    assert "Grad-CAM" not in (run / "report.md").read_text() and not (run / "cam").exists()  # off by default
    assert main(["evaluate", str(run), "--bootstrap", "0", "--cam", "1", "-q"]) == 0
    report = (run / "report.md").read_text()
    assert "## Grad-CAM gallery" in report and "derived from patient pixels" in report
    test = pd.read_parquet(run / "predictions" / "test.parquet")
    classes = json.loads((run / "run.json").read_text())["classes"]
    for cls in classes:
        top = test.loc[test[f"prob__{cls}"].idxmax(), "row_key"]
        link = f"cam/dicom_style/{cls}/{top}.png"
        assert link in report and (run / link).stat().st_size > 1000


@pytest.mark.slow  # a run on a re-split site (its images decoded again), evaluate, predict: ~30 s on 2 cores
def test_a_target_without_validation_rows_says_why_it_has_no_operating_points(tiny_manifests, tmp_path, capsys):
    """Thresholds are chosen on validation rows: a target without any has none — said by evaluate (console,
    report.json, report.md, operating_points.json) and repeated by predict, never "the run was never evaluated"."""
    import shutil

    from fedcxr.site_adapters.manifest import read_manifest

    from .test_stats import copy_site

    manifests = tmp_path / "manifests"
    for site in ("nih_style", "chexpert_style"):
        shutil.copytree(tiny_manifests / site, manifests / site)
    frame = read_manifest(tiny_manifests / "dicom_style")
    copy_site(tiny_manifests / "dicom_style", manifests / "dicom_style",
              frame.assign(split=frame["split"].replace("val", "train")))
    run = tmp_path / "run"
    run_experiment(load_config(data=tiny_config(manifests, tmp_path / "cache", rounds=1, eval_every=0)), run,
                   progress=False)
    assert main(["evaluate", str(run), "--bootstrap", "0", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    why = "no validation rows at dicom_style (its val split is empty)"
    assert f"dicom_style: no operating points: {why}" in printed
    report = json.loads((run / "report.json").read_text())
    assert [item["site"] for item in report["sites_without_operating_points"]] == ["dicom_style"]
    assert f"Site dicom_style: no operating points ({why}" in (run / "report.md").read_text().replace("\\", "")
    stored = json.loads((run / "operating_points.json").read_text())["dicom_style"]
    assert all(entry["youden"] is None and why in entry["reason"] for entry in stored.values())

    assert main(["predict", str(run), "--input", str(manifests / "dicom_style"), "--out", str(tmp_path / "p.csv"),
                 "--device", "cpu", "-q"]) == 0
    printed = capsys.readouterr().out
    assert "never evaluated" not in printed
    assert f"no decisions, probabilities only: operating_points.json has no threshold for site 'dicom_style': {why}" \
        in printed


def test_a_flare_cross_site_report_is_never_replaced_silently(evaluated_run, tmp_path, capsys):
    """`fedcxr evaluate` of a FLARE run used to overwrite the sites' own cross-site report.md: it now
    refuses, naming --replace-cross-site, which moves the cross-site files aside before writing."""
    import shutil

    from fedcxr.evaluation.report_table import SOURCE

    run = tmp_path / "run"
    shutil.copytree(evaluated_run, run)
    cross_site = {**json.loads((run / "report.json").read_text()), "source": SOURCE}
    (run / "report.json").write_text(json.dumps(cross_site))
    (run / "report.md").write_text("# cross-site evaluation, as the sites sent it\n")
    assert main(["evaluate", str(run), "--bootstrap", "0", "-q"]) == 2
    err = capsys.readouterr().err
    assert "is the cross-site evaluation of this FLARE run" in err and "--replace-cross-site" in err
    assert (run / "report.md").read_text() == "# cross-site evaluation, as the sites sent it\n"  # untouched

    assert main(["evaluate", str(run), "--bootstrap", "0", "--replace-cross-site"]) == 0
    assert f"moved to {run / 'cross_site_report'}" in capsys.readouterr().out
    kept = run / "cross_site_report"
    assert (kept / "report.md").read_text() == "# cross-site evaluation, as the sites sent it\n"
    assert json.loads((kept / "report.json").read_text())["source"] == SOURCE
    assert "source" not in json.loads((run / "report.json").read_text())  # the central report, from predictions
