"""Site summaries (FLARE cross-site evaluation) and the small-sample rule: the flag travels, is
checked against the counts, is filled in for sites running an older fedcxr, and shows in the report."""

from __future__ import annotations

import copy
import json

import numpy as np
import pandas as pd
import pytest

from fedcxr.evaluation import small_sample
from fedcxr.evaluation.report import evaluate_rows
from fedcxr.evaluation.report_table import (build_summary_report, cross_site_markdown, load_summary_results,
                                            write_summary_report)
from fedcxr.evaluation.summary_check import summary_problem

CLASSES = ["edema", "effusion"]
INFO = {"method": "FedAvg", "seed": 0, "target": None, "classes": CLASSES, "sites": ["a", "b"], "eval_sites": ["a", "b"]}


@pytest.fixture(scope="module")
def summary() -> dict:
    """A site's summary: edema from 2 positives and 20 negatives (small), effusion 15/15 (not small)."""
    rng = np.random.default_rng(0)
    n = 30
    edema = np.r_[np.ones(2), np.zeros(20), np.full(8, np.nan)]
    effusion = np.r_[np.ones(15), np.zeros(15)]
    frame = pd.DataFrame({"site": "a", "row_key": [f"r{i}" for i in range(n)],
                          "patient_key": [f"p{i}" for i in range(n)],
                          "label__edema": edema, "prob__edema": rng.uniform(size=n),
                          "label__effusion": effusion, "prob__effusion": np.clip(0.4 * effusion + rng.uniform(0, 0.6, n), 0, 1)})
    entry = evaluate_rows(frame, CLASSES, n_boot=100, seed=0, split="test", binary=False)
    entry["subgroups"] = {}
    return json.loads(json.dumps(entry, allow_nan=True))  # as it arrives: plain JSON types


def _old(summary: dict) -> dict:
    """The same summary as a site running fedcxr before schema 3 sends it (no small-sample fields)."""
    old = copy.deepcopy(summary)
    for key in ("mean_auroc_small_sample_classes", "mean_auroc_ci_method"):
        old.pop(key)
    for row in old["per_class"]:
        for key in ("small_sample", "ci_method", "pos_patients", "neg_patients"):
            row.pop(key)
    return old


def test_a_summary_carries_the_flag_and_passes(summary):
    edema, effusion = summary["per_class"]
    assert edema["small_sample"] is True and edema["ci_method"] == small_sample.NEWCOMBE
    assert effusion["small_sample"] is False and summary["mean_auroc_small_sample_classes"] == ["edema"]
    assert summary_problem(summary, CLASSES) is None
    assert summary_problem(_old(summary), CLASSES) is None  # an older site is still reported


@pytest.mark.parametrize("change, problem", [
    (lambda s: s["per_class"][0].update(small_sample=False), "small_sample: false with 2 positive and 20 negative"),
    (lambda s: s["per_class"][0].update(small_sample="no"), "small_sample: 'no' is not true or false"),
    (lambda s: s["per_class"][0].update(ci_method="=HYPERLINK(1)"), "is not an interval method fedcxr uses"),
    (lambda s: s["per_class"][0].update(pos_patients=3), "pos_patients: 3 patients but 2 images"),
    (lambda s: s.update(mean_auroc_small_sample_classes=["hernia"]), "is not behind the mean"),
    (lambda s: s.update(mean_auroc_ci_method="magic"), "is not an interval method fedcxr uses"),
])
def test_a_flag_that_contradicts_the_counts_is_refused(summary, change, problem):
    lying = copy.deepcopy(summary)
    change(lying)
    assert problem in (summary_problem(lying, CLASSES) or "")


def test_the_report_from_summaries_marks_small_samples_and_fills_old_sites(summary, tmp_path):
    report = build_summary_report({"a": summary, "b": _old(summary)}, INFO, split="test", n_boot=100, seed=0)
    assert report["ci"]["small_sample"]["min_cases"] == small_sample.MIN_CASES
    old_edema = report["sites"]["b"]["per_class"][0]
    assert old_edema["small_sample"] is True and old_edema["ci_method"] is None  # from its image counts
    assert report["sites"]["b"]["mean_auroc_small_sample_classes"] == ["edema"]
    write_summary_report(tmp_path, report)
    csv = pd.read_csv(tmp_path / "per_class.csv")
    assert csv["small_sample"].tolist() == [True, False, True, False]
    text = (tmp_path / "report.md").read_text()
    assert text.count("too few cases: 2 positive, 20 negative") == 2
    assert text.count("(2 of 2 classes; 1 of them with too few cases)") == 2


def test_an_old_summary_report_reads_back_for_fedcxr_report(summary, tmp_path):
    report = build_summary_report({"a": summary}, INFO, split="test", n_boot=100, seed=0)
    report["schema_version"] = 2
    report["sites"]["a"] = _old(summary)  # as a schema-2 report.json holds it
    (tmp_path / "report.json").write_text(json.dumps(report))
    results = load_summary_results(tmp_path, "test")
    assert results["a"]["per_class"][0]["small_sample"] is True
    assert results["a"]["mean_auroc_small_sample_classes"] == ["edema"]
    assert results["a"]["mean_auroc_reason"] is None


def test_the_cross_site_matrix_marks_small_sample_cells():
    report = {"split": "test", "cross_site": {"models": {
        "SRV_server": {"a": {"mean_auroc": 0.8, "n_classes": 3, "small_sample_classes": 2},
                       "b": {"mean_auroc": 0.7, "n_classes": 3, "small_sample_classes": 0}}}}}
    text = "\n".join(cross_site_markdown(report))
    assert "| SRV_server | 0.800 †2/3 | 0.700 |" in text
    assert "†k/K: k of the K classes behind the mean have too few cases" in text
