"""One run's report: content of report.json, per_class.csv, report.md and the ROC figures."""

from __future__ import annotations

import copy
import json

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from fedcxr.evaluation import metrics
from fedcxr.evaluation.report import build_report
from fedcxr.evaluation.report_files import write_report
from fedcxr.evaluation.report_markdown import render_markdown

from .conftest import synthetic_predictions

INFO = {"method": "FedAvg", "seed": 3, "target": None, "classes": ["atelectasis", "cardiomegaly", "edema",
                                                                      "pleural_effusion", "hernia"],
        "sites": ["site-a", "site-b"], "eval_sites": ["site-a", "site-b"]}


def _strict_json(path):
    def reject(token):
        raise AssertionError(f"{path.name} holds {token}, not valid JSON")
    return json.loads(path.read_text(), parse_constant=reject)


@pytest.fixture
def predictions(make_predictions):
    return make_predictions(patients_per_site=60)


@pytest.fixture(scope="module")
def _built_report():
    """The 200-resample report of :func:`predictions`' rows, built once for the module: the synthetic
    rows and the bootstrap (seed 0) are deterministic, so every build is the same report (six tests
    built it again, ~0.4 s each)."""
    return build_report(synthetic_predictions(patients_per_site=60), INFO, split="test", n_boot=200, seed=0)


@pytest.fixture
def report(_built_report):
    """A test's own copy of the report (a test may edit it)."""
    return copy.deepcopy(_built_report)


def test_report_per_site_per_class_and_mean(report, predictions):
    assert report["schema_version"] == 3  # 2: calibration and operating points; 3: small-sample rule
    assert (report["method"], report["seed"], report["split"]) == ("FedAvg", 3, "test")
    assert list(report["sites"]) == ["site-a", "site-b"]
    site = report["sites"]["site-a"]
    rows = predictions[predictions["site"] == "site-a"]
    assert site["n_rows"] == len(rows) and site["n_patients"] == rows["patient_key"].nunique()
    by_class = {r["class"]: r for r in site["per_class"]}
    assert by_class["edema"]["auroc"] == pytest.approx(metrics.auroc(rows["label__edema"], rows["prob__edema"]))
    assert by_class["edema"]["ci_low"] < by_class["edema"]["auroc"] < by_class["edema"]["ci_high"]
    # hernia: every test row negative → undefined, with the reason, and left out of the mean
    assert np.isnan(by_class["hernia"]["auroc"])
    assert by_class["hernia"]["reason"] == "no positive rows in test split"
    defined = [r["auroc"] for r in site["per_class"] if np.isfinite(r["auroc"])]
    assert site["mean_auroc"] == pytest.approx(np.mean(defined))
    assert site["mean_auroc_classes"] == ["atelectasis", "cardiomegaly", "edema", "pleural_effusion"]
    assert site["mean_auroc_ci_low"] < site["mean_auroc"] < site["mean_auroc_ci_high"]
    assert "accuracy" not in site  # multi-label run


def test_subgroups_decoded_and_small_ones_skipped_with_reason(report):
    sub = report["sites"]["site-a"]["subgroups"]
    assert set(sub) == {"sex", "age_bin", "race"}
    assert set(sub["sex"]["groups"]) == {"F", "M"}
    assert sum(g["n_rows"] for g in sub["sex"]["groups"].values()) == 120 - 3
    assert {"value": "unknown", "n_rows": 3, "reason": "value not recorded (null)"} in sub["sex"]["skipped"]
    assert set(sub["age_bin"]["groups"]) <= {"20-39", "40-59", "60-79"}
    small = {s["value"]: s for s in sub["age_bin"]["skipped"]}
    assert small["80+"]["reason"] == "fewer than 20 rows" and 0 < small["80+"]["n_rows"] < 20
    male = sub["sex"]["groups"]["M"]
    assert np.isfinite(male["mean_auroc"]) and len(male["per_class"]) == 5


def test_binary_task_reports_accuracy(make_predictions):
    frame = make_predictions(classes=["covid19"], all_negative=(), sites=("midrc",))
    info = {"method": "FedAvg_Finetune_GP", "seed": 0, "target": "midrc", "classes": ["covid19"]}
    report = build_report(frame, info, split="test", n_boot=100, seed=0)
    site = report["sites"]["midrc"]
    assert report["binary_task"] is True
    assert site["accuracy"] == pytest.approx(metrics.accuracy(frame["label__covid19"], frame["prob__covid19"]))
    assert site["accuracy_ci_low"] <= site["accuracy"] <= site["accuracy_ci_high"]


def test_missing_eval_site_is_listed(predictions):
    info = dict(INFO, eval_sites=["site-a", "site-b", "site-c"])
    report = build_report(predictions, info, split="test", n_boot=0, seed=0)
    assert report["sites_without_predictions"] == [{"site": "site-c", "reason": "no rows in predictions/test.parquet"}]
    # DeLong CIs without the bootstrap; the mean then has no CI, and says why
    site = report["sites"]["site-a"]
    assert site["per_class"][0]["ci_low"] < site["per_class"][0]["auroc"]
    assert site["mean_auroc_reason"].startswith("CI of the mean needs the patient bootstrap")


def test_written_files(tmp_path, report, predictions):
    paths = write_report(tmp_path, report, predictions)
    names = sorted(p.name for p in paths)
    assert names == ["calibration_site-a.png", "calibration_site-b.png", "per_class.csv", "report.json",
                     "report.md", "roc_site-a.png", "roc_site-b.png"]

    saved = _strict_json(tmp_path / "report.json")
    hernia = saved["sites"]["site-b"]["per_class"][4]
    assert hernia["class"] == "hernia" and hernia["auroc"] is None
    assert hernia["reason"] == "no positive rows in test split"

    csv = pd.read_csv(tmp_path / "per_class.csv")
    assert list(csv.columns) == ["site", "class", "auroc", "ci_low", "ci_high", "n", "n_pos", "prevalence", "reason",
                                 "small_sample", "ci_method", "pos_patients", "neg_patients"]
    assert csv["small_sample"].dtype == bool and set(csv["ci_method"].dropna()) == {"patient bootstrap"}
    assert len(csv) == 2 * 5
    row = csv[(csv["site"] == "site-a") & (csv["class"] == "hernia")].iloc[0]
    assert np.isnan(row["auroc"]) and row["reason"] == "no positive rows in test split"

    md = (tmp_path / "report.md").read_text()
    assert "| Class | AUROC (95% CI) | n | Positives | Prevalence | Note |" in md
    edema = report["sites"]["site-a"]["per_class"][2]
    assert f"| edema | {edema['auroc']:.3f} ({edema['ci_low']:.3f}–{edema['ci_high']:.3f}) |" in md
    assert "| hernia | n/a |" in md and "no positive rows in test split" in md
    assert "### Sex" in md and "| AUROC | F | M |" in md

    for name in ("roc_site-a.png", "roc_site-b.png", "calibration_site-a.png", "calibration_site-b.png"):
        with Image.open(tmp_path / name) as image:
            image.verify()
        with Image.open(tmp_path / name) as image:
            assert image.format == "PNG" and image.size[0] >= 600 and image.size[1] >= 500


def test_markdown_says_when_bootstrap_resamples_were_skipped(report):
    # a class bootstrapped under the small-sample rule has >= 10 positive and negative patients, so
    # a resample losing every positive is rare (p ~ e^-10 per resample): the note is set by hand here
    report["sites"]["site-a"]["per_class"][2]["ci_skipped"] = 7
    md = render_markdown(report)
    assert "CI from 193 of 200 resamples (rest had one label value)" in md


def test_no_patient_or_row_key_in_any_output(tmp_path, report, predictions):
    write_report(tmp_path, report, predictions)
    identifiers = set(predictions["patient_key"]) | set(predictions["row_key"])
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) == 7
    for path in files:
        data = path.read_bytes()
        leaked = [i for i in identifiers if i.encode() in data]
        assert not leaked, f"{path.name} contains identifiers, e.g. {leaked[0]}"
    # the probe is sensitive: patient keys do show up if written
    assert "PX000000QZ".encode() in predictions.to_csv().encode()


# --------------------------------------------------------------------------- calibration, operating points


@pytest.fixture
def val_predictions(make_predictions):
    """Other rows of the same sites (a different draw), as the run's val split."""
    return make_predictions(patients_per_site=50, data_seed=1)


def test_calibration_in_every_report(report, predictions):
    from fedcxr.evaluation import calibration
    assert report["calibration"]["n_bins"] == 10 and report["operating_points"] is None
    site = report["sites"]["site-a"]
    rows = predictions[predictions["site"] == "site-a"]
    from fedcxr.atomic import json_safe  # NaN → None, so empty bins compare equal
    assert json_safe(site["calibration"]) == json_safe(calibration.calibration_summary(rows, INFO["classes"]))
    edema = next(r for r in site["calibration"]["per_class"] if r["class"] == "edema")
    assert edema["brier"] == pytest.approx(calibration.brier_score(rows["label__edema"], rows["prob__edema"]))
    assert edema["ece"] == pytest.approx(calibration.expected_calibration_error(rows["label__edema"],
                                                                                rows["prob__edema"]))
    assert "operating_points" not in site


def test_operating_points_from_val_predictions(predictions, val_predictions):
    from fedcxr.evaluation import operating
    report = build_report(predictions, INFO, split="test", n_boot=200, seed=0, val_predictions=val_predictions)
    info = report["operating_points"]
    assert info["selected_on"] == "val" and info["evaluated_on"] == "test" and info["same_rows"] is False
    assert info["targets"] == {"sensitivity": 0.9, "specificity": 0.9}
    assert list(info["rules"]) == ["youden", "sens90", "spec90"]
    thresholds = operating.operating_point_thresholds(val_predictions, INFO["classes"])
    for site in ("site-a", "site-b"):
        points = report["sites"][site]["operating_points"]
        assert len(points) == 5 * 3
        want = operating.operating_point_rows(predictions[predictions["site"] == site],
                                              val_predictions[val_predictions["site"] == site], INFO["classes"],
                                              n_boot=200, seed=0)
        assert [p["sensitivity"] for p in points] == pytest.approx([w["sensitivity"] for w in want], nan_ok=True)
        for p in points:
            stored = thresholds[site][p["class"]][p["rule"]]
            assert (stored is None and np.isnan(p["threshold"])) or stored == p["threshold"]
    hernia = [p for p in report["sites"]["site-a"]["operating_points"] if p["class"] == "hernia"]
    assert all(np.isnan(p["threshold"]) and p["reason"] == "no positive rows in val split" for p in hernia)
    edema = next(p for p in report["sites"]["site-a"]["operating_points"]
                 if p["class"] == "edema" and p["rule"] == "youden")
    assert edema["sensitivity_ci_low"] <= edema["sensitivity"] <= edema["sensitivity_ci_high"]
    assert edema["reason"] is None


def test_operating_points_written_to_json_csv_and_markdown(tmp_path, predictions, val_predictions):
    report = build_report(predictions, INFO, split="test", n_boot=100, seed=0, val_predictions=val_predictions,
                          target_sensitivity=0.95, target_specificity=0.8)
    write_report(tmp_path, report, predictions)
    saved = _strict_json(tmp_path / "report.json")
    assert saved["schema_version"] == 3 and list(saved["operating_points"]["rules"]) == ["youden", "sens95", "spec80"]
    hernia = next(p for p in saved["sites"]["site-b"]["operating_points"] if p["class"] == "hernia")
    assert hernia["threshold"] is None and hernia["sensitivity"] is None and hernia["reason"]
    csv = pd.read_csv(tmp_path / "per_class.csv")
    base = ["site", "class", "auroc", "ci_low", "ci_high", "n", "n_pos", "prevalence", "reason"]
    assert list(csv.columns[:9]) == base
    for rule in ("youden", "sens95", "spec80"):
        assert f"{rule}_threshold" in csv.columns
        for m in ("sensitivity", "specificity", "ppv", "npv"):
            assert {f"{rule}_{m}", f"{rule}_{m}_ci_low", f"{rule}_{m}_ci_high"} <= set(csv.columns)
    row = csv[(csv["site"] == "site-a") & (csv["class"] == "edema")].iloc[0]
    point = next(p for p in saved["sites"]["site-a"]["operating_points"]
                 if p["class"] == "edema" and p["rule"] == "sens95")
    assert row["sens95_threshold"] == pytest.approx(point["threshold"], rel=1e-5)
    assert row["sens95_ppv_ci_high"] == pytest.approx(point["ppv_ci_high"], rel=1e-5)
    md = (tmp_path / "report.md").read_text()
    assert "### Operating points" in md and "### Calibration" in md
    assert "| Class | Rule | Threshold | Sensitivity | Specificity | PPV | NPV | Note |" in md
    assert (f"| edema | sens95 | {point['threshold']:.3f} | {point['sensitivity']:.3f} "
            f"({point['sensitivity_ci_low']:.3f}–{point['sensitivity_ci_high']:.3f}) |") in md
    assert "chosen per class on the val split, measured on the test split" in md
    assert "![Reliability diagram, site site-a](calibration_site-a.png)" in md
    # keys of neither split leak into any file
    keys = set(predictions["patient_key"]) | set(predictions["row_key"]) | set(val_predictions["row_key"])
    for path in tmp_path.iterdir():
        data = path.read_bytes()
        assert not [k for k in keys if k.encode() in data], path.name


def test_operating_points_edge_cases(predictions, val_predictions):
    only_a = val_predictions[val_predictions["site"] == "site-a"]
    report = build_report(predictions, INFO, split="test", n_boot=0, seed=0, val_predictions=only_a)
    assert {p["reason"] for p in report["sites"]["site-b"]["operating_points"]} == {
        "no val predictions for this site"}
    edema = next(p for p in report["sites"]["site-a"]["operating_points"] if p["class"] == "edema")
    assert np.isfinite(edema["sensitivity"]) and np.isnan(edema["sensitivity_ci_low"])
    assert report["operating_points"]["ci"].startswith("none")
    same = build_report(val_predictions, INFO, split="val", n_boot=0, seed=0, val_predictions=val_predictions)
    assert same["operating_points"]["same_rows"] is True
    from fedcxr.evaluation.report_markdown import render_markdown
    assert "so these numbers are optimistic" in render_markdown(same)
    assert "measured on the test split (no CIs (n_boot = 0))" in render_markdown(report)


def test_a_site_of_one_patient_is_one_patient_in_report_md(predictions, tmp_path):
    """Counted nouns agree with their number: "1 patient", not "1 patients"."""
    from fedcxr.evaluation.report_markdown import render_markdown

    one = predictions.assign(patient_key=np.where(predictions["site"] == "site-a", "p0", predictions["patient_key"]))
    text = render_markdown(build_report(one, INFO, split="test", n_boot=0, seed=0))
    n_rows = int((one["site"] == "site-a").sum())
    assert f"{n_rows} images of 1 patient." in text and "1 patients" not in text


def test_a_subgroup_of_one_image_is_one_image_in_report_md(report):
    """Issue 28 item 9 ("1 images"): the own-data flow's report.md listed
    "- not reported: 20-39 (1 images): fewer than 20 rows"."""
    from fedcxr.evaluation.report_markdown import render_markdown

    skipped = report["sites"]["site-a"]["subgroups"]["age_bin"]["skipped"]
    skipped[:] = [{"value": "80+", "n_rows": 1, "reason": "fewer than 20 rows"},
                  {"value": "20-39", "n_rows": 2, "reason": "fewer than 20 rows"}]
    text = render_markdown(report)
    assert "- not reported: 80+ (1 image): fewer than 20 rows" in text
    assert "- not reported: 20-39 (2 images): fewer than 20 rows" in text
    assert "1 images" not in text
