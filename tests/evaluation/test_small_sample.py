"""The small-sample rule: flags, words and intervals that stay honest with few cases (issue 28).

Before the rule, a class with 2 positives that both outscore every negative was reported as
``1.000 (1.000–1.000)`` and one test patient as ``0.429 (0.429–0.429)``.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fedcxr.evaluation import metrics, small_sample
from fedcxr.evaluation.report import build_report
from fedcxr.evaluation.report_files import per_class_frame, write_report
from fedcxr.evaluation.small_sample import (MIN_CASES, NEWCOMBE, count_cases, newcombe_interval, too_few_words,
                                            wilson_interval)

INFO = {"method": "FedAvg", "seed": 0, "target": None, "classes": ["edema", "effusion"], "sites": ["site-a"],
        "eval_sites": ["site-a"]}


def _frame(labels: dict[str, list], probs: dict[str, list], patients=None, site="site-a") -> pd.DataFrame:
    n = len(next(iter(labels.values())))
    cols = {"site": [site] * n, "row_key": [f"r{i}" for i in range(n)],
            "patient_key": patients if patients is not None else [f"p{i}" for i in range(n)]}
    for cls in labels:
        cols[f"label__{cls}"] = np.asarray(labels[cls], dtype=float)
        cols[f"prob__{cls}"] = np.asarray(probs[cls], dtype=float)
    return pd.DataFrame(cols)


def _separable(n_pos: int, n_neg: int, seed: int = 0):
    """Labels and scores where every positive outscores every negative (AUROC exactly 1)."""
    rng = np.random.default_rng(seed)
    y = np.r_[np.ones(n_pos), np.zeros(n_neg)]
    p = np.r_[rng.uniform(0.6, 1.0, n_pos), rng.uniform(0.0, 0.4, n_neg)]
    return y, p


# --------------------------------------------------------------------------- the intervals


def _newcombe_by_grid(auc, m, n, alpha=0.05):
    """Newcombe's Method 5 set {θ : (θ̂ − θ)² ≤ z² V(θ)} read off a fine grid (the slow reference)."""
    z2 = stats.norm.ppf(1 - alpha / 2) ** 2
    theta = np.linspace(0, 1, 2_000_001)
    n_star = (m + n) / 2 - 1
    v = theta * (1 - theta) * (1 + n_star * ((1 - theta) / (2 - theta) + theta / (1 + theta))) / (m * n)
    inside = theta[(auc - theta) ** 2 <= z2 * v]
    return inside.min(), inside.max()


@pytest.mark.parametrize("auc, m, n", [(1.0, 2, 4), (0.0, 3, 3), (0.5, 2, 4), (0.75, 1, 5), (0.8, 10, 10),
                                       (0.93, 40, 200), (1.0, 1, 1)])
def test_newcombe_interval_is_the_score_set_of_method_5(auc, m, n):
    low, high = newcombe_interval(auc, m, n)
    ref_low, ref_high = _newcombe_by_grid(auc, m, n)
    assert low == pytest.approx(ref_low, abs=2e-6) and high == pytest.approx(ref_high, abs=2e-6)
    assert 0.0 <= low <= auc <= high <= 1.0 and high - low > 0.01


def test_newcombe_interval_never_collapses_and_narrows_with_cases():
    assert f"{newcombe_interval(1.0, 2, 4)[0]:.3f}" == "0.472"  # README: 2 positives above 4 negatives
    assert newcombe_interval(1.0, 2, 4)[1] == 1.0 and newcombe_interval(0.0, 2, 4)[0] == 0.0
    widths = [np.subtract(*newcombe_interval(0.8, k, k)[::-1]) for k in (2, 10, 100, 1000)]
    assert all(a > b > 0 for a, b in zip(widths, widths[1:]))
    assert np.isnan(newcombe_interval(0.8, 0, 5)[0]) and np.isnan(newcombe_interval(float("nan"), 3, 3)[0])


@pytest.mark.parametrize("k, n", [(0, 1), (0, 7), (3, 7), (7, 7), (12, 40)])
def test_wilson_interval_equals_scipys(k, n):
    ref = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    low, high = wilson_interval(k / n, n)
    assert low == pytest.approx(ref.low, abs=1e-12) and high == pytest.approx(ref.high, abs=1e-12)
    assert (low == 0.0) == (k == 0) and (high == 1.0) == (k == n)  # exact ends, never 5e-17


def test_mean_of_bounds_is_the_mean_of_each_bound_and_needs_all_of_them():
    assert small_sample.mean_of_bounds([0.2, 0.6], [0.8, 1.0]) == pytest.approx((0.4, 0.9))
    assert small_sample.mean_of_bounds([0.2, 0.6], [0.8, 1.0], [3, 1]) == pytest.approx((0.3, 0.85))
    assert np.isnan(small_sample.mean_of_bounds([0.2, np.nan], [0.8, 1.0])[0])


def test_cases_are_counted_in_patients_and_ten_is_not_small():
    y = np.r_[np.ones(10), np.zeros(10)]
    assert not count_cases(y).small  # the 10/10 boundary: enough
    assert count_cases(y[1:]).small and count_cases(y[:-1]).small  # 9/10 and 10/9: too few
    # 20 positive images from 5 patients: 5 positive cases, however many images
    y = np.r_[np.ones(20), np.zeros(20), np.nan]
    patients = [f"p{i % 5}" for i in range(20)] + [f"n{i}" for i in range(20)] + ["x"]
    cases = count_cases(y, patients)
    assert cases == small_sample.Cases(pos=20, neg=20, pos_patients=5, neg_patients=20, patients=25) and cases.small


def test_words():
    assert too_few_words(2, 4) == "too few cases: 2 positive, 4 negative"
    assert too_few_words(2, 4, 2, 4) == "too few cases: 2 positive, 4 negative"
    assert too_few_words(3, 9, 1, 6) == ("too few cases: 3 positive images of 1 patient, "
                                         "9 negative images of 6 patients")


# --------------------------------------------------------------------------- per class


def test_a_class_with_two_positives_is_small_sample_with_a_newcombe_interval():
    y, p = _separable(2, 40)
    p[1] = 0.1  # one positive below most negatives: AUROC in (0, 1)
    table = metrics.per_class_auroc(_frame({"edema": y}, {"edema": p}), ["edema"], n_boot=200)
    row = table.iloc[0]
    assert bool(row["small_sample"]) and row["ci_method"] == NEWCOMBE
    assert (row["pos_patients"], row["neg_patients"]) == (2, 40)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(newcombe_interval(row["auroc"], 2, 40))
    assert row["ci_low"] < row["auroc"] < row["ci_high"] and pd.isna(row["reason"])


def test_a_perfectly_separable_tiny_class_is_not_one_to_one():
    y, p = _separable(2, 4)
    for n_boot in (200, 0):  # bootstrap and DeLong alike gave [1, 1] (DeLong: variance 0)
        row = metrics.per_class_auroc(_frame({"edema": y}, {"edema": p}), ["edema"], n_boot=n_boot).iloc[0]
        assert row["auroc"] == 1.0 and row["ci_high"] == 1.0
        assert row["ci_low"] == pytest.approx(newcombe_interval(1.0, 2, 4)[0]) and row["ci_low"] < 0.5


def test_the_ten_ten_boundary_keeps_the_bootstrap_and_nine_does_not():
    rng = np.random.default_rng(3)
    for n_pos, small in ((10, False), (9, True)):
        y = np.r_[np.ones(n_pos), np.zeros(10)]
        p = np.clip(0.5 * y + rng.uniform(0, 0.7, y.size), 0, 1)
        row = metrics.per_class_auroc(_frame({"edema": y}, {"edema": p}), ["edema"], n_boot=300).iloc[0]
        assert bool(row["small_sample"]) is small
        assert row["ci_method"] == (NEWCOMBE if small else small_sample.BOOTSTRAP)
        assert row["ci_high"] - row["ci_low"] > 0.05


def test_a_separable_class_with_enough_cases_replaces_its_collapsed_interval_and_says_so():
    y, p = _separable(15, 30)
    for n_boot, method in ((200, small_sample.BOOTSTRAP), (0, small_sample.DELONG)):
        row = metrics.per_class_auroc(_frame({"edema": y}, {"edema": p}), ["edema"], n_boot=n_boot).iloc[0]
        assert not row["small_sample"] and row["ci_method"] == NEWCOMBE
        assert row["ci_low"] == pytest.approx(newcombe_interval(1.0, 15, 30)[0]) and row["ci_low"] < 1
        assert row["reason"] == f"{method} interval collapsed: Newcombe score interval instead"


def test_multi_image_patients_count_once():
    # 12 positive images of 3 patients: 3 positive cases, small, and the interval uses 3, not 12
    y = np.r_[np.ones(12), np.zeros(30)]
    p = np.r_[np.linspace(0.3, 0.9, 12), np.linspace(0.0, 0.6, 30)]
    patients = [f"a{i % 3}" for i in range(12)] + [f"b{i}" for i in range(30)]
    row = metrics.per_class_auroc(_frame({"edema": y}, {"edema": p}, patients), ["edema"], n_boot=100).iloc[0]
    assert bool(row["small_sample"]) and (row["pos_patients"], row["neg_patients"]) == (3, 30)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(newcombe_interval(row["auroc"], 3, 30))


# --------------------------------------------------------------------------- the report


def _tiny_report(tmp_path, n_boot=300):
    """edema: 2 positives, 4 negatives, separable; effusion: 30/30 (large); 36 patients, one image each."""
    y_small, p_small = _separable(2, 4)
    rng = np.random.default_rng(1)
    y_big = np.r_[np.ones(18), np.zeros(18)]
    p_big = np.clip(0.3 * y_big + rng.uniform(0, 0.7, 36), 0, 1)
    frame = _frame({"edema": np.r_[y_small, np.full(30, np.nan)], "effusion": y_big},
                   {"edema": np.r_[p_small, rng.uniform(size=30)], "effusion": p_big})
    report = build_report(frame, INFO, split="test", n_boot=n_boot, seed=0)
    write_report(tmp_path, report, frame)
    return report, frame


def test_report_json_schema_3_carries_the_flags(tmp_path):
    _tiny_report(tmp_path)
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["schema_version"] == 3
    assert saved["ci"]["small_sample"]["min_cases"] == MIN_CASES and "Newcombe" in saved["ci"]["small_sample"]["rule"]
    site = saved["sites"]["site-a"]
    edema, effusion = site["per_class"]
    assert edema["small_sample"] is True and edema["ci_method"] == NEWCOMBE and edema["ci_low"] < edema["ci_high"]
    assert effusion["small_sample"] is False and effusion["ci_method"] == "patient bootstrap"
    assert site["mean_auroc_small_sample_classes"] == ["edema"]
    # the bootstrapped block (effusion alone: its own bootstrap interval) combined with edema's interval
    assert site["mean_auroc_ci_method"] == small_sample.MEAN_COMBINED
    assert site["mean_auroc_ci_low"] == pytest.approx((edema["ci_low"] + effusion["ci_low"]) / 2)
    assert site["mean_auroc_ci_high"] == pytest.approx((edema["ci_high"] + effusion["ci_high"]) / 2)


def test_per_class_csv_has_the_flag_and_the_method(tmp_path):
    _tiny_report(tmp_path)
    csv = pd.read_csv(tmp_path / "per_class.csv")
    assert list(csv.columns[:13]) == ["site"] + metrics.PER_CLASS_COLUMNS + ["small_sample", "ci_method",
                                                                              "pos_patients", "neg_patients"]
    assert csv["small_sample"].tolist() == [True, False]
    assert csv["ci_method"].tolist() == [NEWCOMBE, "patient bootstrap"]


def test_report_md_says_too_few_cases_in_words_and_the_headline_counts_them(tmp_path):
    report, _ = _tiny_report(tmp_path)
    text = (tmp_path / "report.md").read_text()
    edema = report["sites"]["site-a"]["per_class"][0]
    assert f"| edema | 1.000 ({edema['ci_low']:.3f}–1.000) | 6 | 2 |" in text
    assert "too few cases: 2 positive, 4 negative; Newcombe score interval |" in text
    assert "1.000 (1.000–1.000)" not in text
    assert "**Mean AUROC** (2 of 2 classes; 1 of them with too few cases): " in text
    assert "; bootstrap combined with class intervals)" in text
    assert "Small samples: An AUROC from fewer than 10 positive or 10 negative cases" in text


def test_one_test_patient_gets_no_interval_and_a_sentence(tmp_path):
    # NIH-like: one patient, seven follow-up images, findings that come and go
    y = np.array([1, 0, 0, 1, 0, 0, 0], dtype=float)
    p = np.array([0.2, 0.6, 0.1, 0.5, 0.3, 0.4, 0.7])
    frame = _frame({"edema": y, "effusion": y[::-1]}, {"edema": p, "effusion": p}, ["only"] * 7)
    report = build_report(frame, INFO, split="test", n_boot=200, seed=0)
    site = report["sites"]["site-a"]
    for row in site["per_class"]:
        assert np.isfinite(row["auroc"]) and np.isnan(row["ci_low"]) and np.isnan(row["ci_high"])
        assert row["reason"] == small_sample.ONE_PATIENT and row["ci_method"] is None and row["small_sample"]
    assert np.isnan(site["mean_auroc_ci_low"]) and site["mean_auroc_reason"] == small_sample.ONE_PATIENT
    write_report(tmp_path, report, frame)
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["sites"]["site-a"]["per_class"][0]["ci_low"] is None  # null, not a number
    text = (tmp_path / "report.md").read_text()
    assert f"**Mean AUROC** (2 of 2 classes; 2 of them with too few cases): {site['mean_auroc']:.3f} (one patient: " \
           "no interval (an interval needs several independent patients))" in text
    assert f"| edema | {site['per_class'][0]['auroc']:.3f} | 7 | 2 |" in text  # no "(x–x)"


def test_binary_accuracy_from_few_patients_gets_a_wilson_interval():
    y, p = _separable(3, 5)
    frame = _frame({"covid19": y}, {"covid19": p})
    site = build_report(frame, {**INFO, "classes": ["covid19"]}, split="test", n_boot=200, seed=0)["sites"]["site-a"]
    assert site["accuracy"] == 1.0 and site["accuracy_small_sample"] is True
    assert site["accuracy_ci_method"] == small_sample.WILSON
    assert (site["accuracy_ci_low"], site["accuracy_ci_high"]) == pytest.approx(wilson_interval(1.0, 8))


def test_subgroups_keep_the_flags_and_the_markdown_marks_them(tmp_path):
    rng = np.random.default_rng(0)
    n = 60
    y = np.zeros(n)
    y[:3] = 1  # 3 positives, all in sex code 0 (rows 0..29)
    frame = _frame({"edema": y, "effusion": (rng.random(n) < 0.5).astype(float)},
                   {"edema": rng.uniform(size=n), "effusion": rng.uniform(size=n)})
    frame["aux__sex"] = pd.array([0] * 30 + [1] * 30, dtype="Int64")
    report = build_report(frame, INFO, split="test", n_boot=100, seed=0)
    group = report["sites"]["site-a"]["subgroups"]["sex"]["groups"]["F"]
    assert group["per_class"][0]["small_sample"] and group["mean_auroc_small_sample_classes"] == ["edema"]
    write_report(tmp_path, report, frame)
    text = (tmp_path / "report.md").read_text()
    assert f"| edema | {group['per_class'][0]['auroc']:.3f} † |" in text
    assert "† too few cases: fewer than 10 positive or 10 negative patients in the group" in text


def test_operating_points_with_few_cases_get_wilson_intervals_and_words():
    rng = np.random.default_rng(0)
    y_val = np.r_[np.ones(20), np.zeros(20)]
    p_val = np.clip(0.4 * y_val + rng.uniform(0, 0.6, 40), 0, 1)
    y, p = np.r_[np.ones(3), np.zeros(40)], np.r_[np.full(3, 0.99), rng.uniform(0, 0.2, 40)]  # 3 positives, all found
    val = _frame({"edema": y_val, "effusion": y_val}, {"edema": p_val, "effusion": p_val})
    test = _frame({"edema": y, "effusion": np.r_[np.ones(20), np.zeros(23)]},
                  {"edema": p, "effusion": np.r_[np.full(20, 0.99), rng.uniform(0, 0.2, 23)]})
    report = build_report(test, INFO, split="test", n_boot=200, seed=0, val_predictions=val)
    points = {(op["class"], op["rule"]): op for op in report["sites"]["site-a"]["operating_points"]}
    edema = points[("edema", "youden")]
    assert edema["small_sample"] and edema["sensitivity"] == 1.0
    assert edema["sensitivity_ci_method"] == small_sample.WILSON
    assert (edema["sensitivity_ci_low"], edema["sensitivity_ci_high"]) == pytest.approx(wilson_interval(1.0, 3))
    assert "too few cases: 3 positive (sensitivity)" in edema["reason"]
    # 20 positives, every one detected: the bootstrap collapses to [1, 1]; Wilson instead, and said so
    effusion = points[("effusion", "youden")]
    assert effusion["sensitivity"] == 1.0 and effusion["sensitivity_ci_method"] == small_sample.WILSON
    assert effusion["sensitivity_ci_low"] == pytest.approx(wilson_interval(1.0, 20)[0])
    assert "patient bootstrap interval collapsed: Wilson score interval instead" in effusion["reason"]
    frame = per_class_frame(report)
    assert frame["youden_small_sample"].tolist() == [True, False]


def test_reports_written_before_schema_3_still_read():
    old_row = {"class": "edema", "auroc": 0.8, "ci_low": 0.8, "ci_high": 0.8, "n": 6, "n_pos": 2,
               "prevalence": 1 / 3, "reason": None}
    report = {"sites": {"site-a": {"per_class": [old_row]}}}
    row = per_class_frame(report).iloc[0]
    assert bool(row["small_sample"]) and row["ci_method"] is None  # from its image counts
    assert small_sample.fill_row({**old_row, "n_pos": 10, "n": 20})["small_sample"] is False


def test_a_class_without_an_interval_has_a_null_method_beside_one_with(tmp_path):
    y, p = _separable(2, 4)
    frame = _frame({"edema": y, "effusion": np.zeros(6)}, {"edema": p, "effusion": p})
    report = build_report(frame, INFO, split="test", n_boot=50, seed=0)
    edema, effusion = report["sites"]["site-a"]["per_class"]
    assert edema["ci_method"] == NEWCOMBE and effusion["ci_method"] is None  # None, not NaN (pandas' mixing)
    from fedcxr.evaluation.summary_check import summary_problem
    assert summary_problem({**report["sites"]["site-a"], "subgroups": {}}, INFO["classes"]) is None


def test_the_mean_keeps_the_bootstrap_of_its_large_classes_and_adds_the_small_ones_intervals():
    """Three large classes and one with 3 positives: the large classes' mean keeps its bootstrap
    interval, weighted 3 of 4, the small class its Newcombe interval, weighted 1 of 4."""
    rng = np.random.default_rng(5)
    n = 80
    classes = ["a", "b", "c", "small"]
    labels = {c: (rng.random(n) < 0.4).astype(float) for c in classes[:3]}
    labels["small"] = np.r_[np.ones(3), np.zeros(n - 3)]
    probs = {c: np.clip(0.3 * labels[c] + rng.uniform(0, 0.7, n), 0, 1) for c in classes}
    frame = _frame(labels, probs)
    report = build_report(frame, {**INFO, "classes": classes}, split="test", n_boot=300, seed=0)
    site = report["sites"]["site-a"]
    small = site["per_class"][3]
    assert small["small_sample"] and site["mean_auroc_small_sample_classes"] == ["small"]
    table, boot = metrics.per_class_auroc(frame, classes, n_boot=300, seed=0, return_bootstrap=True)
    block = metrics.bootstrap_mean_ci(boot[:, :3])
    assert site["mean_auroc_ci_method"] == small_sample.MEAN_COMBINED
    assert site["mean_auroc_ci_low"] == pytest.approx((3 * block.low + small["ci_low"]) / 4)
    assert site["mean_auroc_ci_high"] == pytest.approx((3 * block.high + small["ci_high"]) / 4)
    # narrower than averaging all four classes' own bounds, wider than the bootstrap of the four
    own = small_sample.mean_of_bounds(table["ci_low"], table["ci_high"])
    assert own[0] < site["mean_auroc_ci_low"] and site["mean_auroc_ci_high"] < own[1]
