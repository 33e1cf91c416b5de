"""``fedcxr evaluate`` on a real (tiny) run: predictions, operating points from val, the report."""

from __future__ import annotations

import json

import pandas as pd

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
