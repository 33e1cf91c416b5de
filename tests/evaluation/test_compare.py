"""Method comparison across runs: table cells, best marks, seeds, tests against a baseline."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fedcxr.errors import UserError
from fedcxr.evaluation import metrics
from fedcxr.evaluation import compare
from fedcxr.evaluation.compare import bh_adjust, compare_runs, patient_clusters, render_markdown, write_comparison


@pytest.fixture
def runs(tmp_path, make_predictions, make_run):
    """FedAvg ×3 seeds (weak), Surgical ×3 seeds (strong), Local ×1 seed, Copy = FedAvg seed 0."""
    dirs = []
    for seed in (0, 1, 2):
        dirs.append(make_run(tmp_path / f"fedavg-{seed}", make_predictions(skill=0.8, model_seed=seed),
                             method="FedAvg", seed=seed))
        dirs.append(make_run(tmp_path / f"surgical-{seed}", make_predictions(skill=3.0, model_seed=10 + seed),
                             method="Surgical", seed=seed))
    dirs.append(make_run(tmp_path / "local", make_predictions(skill=1.5, model_seed=20), method="Local", seed=0))
    dirs.append(make_run(tmp_path / "copy", make_predictions(skill=0.8, model_seed=0), method="Copy", seed=0))
    return dirs


@pytest.fixture
def result(runs):
    return compare_runs(runs, baseline="FedAvg", n_boot=100)


def _cell(result, method, column):
    return next(r for r in result["table"] if r["method"] == method)["cells"][column]


def test_table_cells_seeds_and_best(result):
    assert [r["method"] for r in result["table"]] == ["FedAvg", "Surgical", "Local", "Copy"]
    assert [c["label"] for c in result["columns"]] == ["site-a", "site-b"]
    fedavg = _cell(result, "FedAvg", "site-a")
    assert fedavg["n_runs"] == 3 and fedavg["seeds"] == [0, 1, 2]
    assert fedavg["auroc_mean"] == pytest.approx(np.mean(fedavg["per_seed_auroc"]))
    assert fedavg["auroc_sd"] == pytest.approx(np.std(fedavg["per_seed_auroc"], ddof=1))
    assert np.isnan(fedavg["auroc_ci_low"])  # several seeds: spread, not a CI
    local = _cell(result, "Local", "site-a")
    assert local["n_runs"] == 1 and np.isnan(local["auroc_sd"])
    assert local["auroc_ci_low"] < local["auroc_mean"] < local["auroc_ci_high"]
    for column in ("site-a", "site-b"):
        best = [r["method"] for r in result["table"] if r["cells"][column]["best_auroc"]]
        assert best == ["Surgical"]
    assert "acc_mean" not in fedavg  # multi-label: no accuracy


def test_tests_against_baseline(result):
    tests = {(t["method"], t["column"]): t for t in result["tests"]}
    assert set(tests) == {(m, c) for m in ("Surgical", "Local", "Copy") for c in ("site-a", "site-b")}
    better = tests[("Surgical", "site-a")]
    assert better["paired_by"] == "seed" and better["seed_pairs"] == [[0, 0], [1, 1], [2, 2]]
    assert better["ttest"]["n_pairs"] == 3 * 4  # 3 seed pairs × 4 defined classes (hernia undefined)
    assert better["ttest"]["p_value"] < 1e-4 and better["ttest"]["mean_difference"] > 0.1
    delong = {d["class"]: d for d in better["delong"]}
    assert all(delong[c]["p_value"] < 0.01 for c in ("atelectasis", "cardiomegaly", "edema"))
    assert np.isnan(delong["hernia"]["p_value"]) and delong["hernia"]["reason"] == "no positive rows in test split"
    assert better["n_rows_joined"] == 120 and better["n_rows_only_method"] == 0
    same = tests[("Copy", "site-a")]
    assert same["seed_pairs"] == [[0, 0]]
    assert same["ttest"]["p_value"] == 1.0
    assert all(d["p_value"] == 1.0 for d in same["delong"] if d["class"] != "hernia")


def test_seed_pairing_falls_back_to_lowest_seeds(tmp_path, runs, make_predictions, make_run):
    late = make_run(tmp_path / "late", make_predictions(skill=1.0, model_seed=7), method="Late", seed=7)
    result = compare_runs(runs[:2] + [late], baseline="FedAvg", n_boot=0)
    test = next(t for t in result["tests"] if t["method"] == "Late")
    assert test["seed_pairs"] == [[7, 0]] and test["paired_by"].startswith("lowest seed")


def test_written_comparison(tmp_path, result):
    paths = write_comparison(result, tmp_path / "cmp")
    assert sorted(p.name for p in paths) == ["comparison.csv", "comparison.json", "comparison.md",
                                             "comparison_tests.csv"]
    md = (tmp_path / "cmp" / "comparison.md").read_text()
    surgical = _cell(result, "Surgical", "site-a")
    assert f"**{surgical['auroc_mean']:.3f} ± {surgical['auroc_sd']:.3f} (n=3)**" in md
    assert "| Method | site-a | site-b |" in md
    assert "## Significance against FedAvg" in md and "***" in md
    csv = pd.read_csv(tmp_path / "cmp" / "comparison.csv")
    assert csv.loc[csv["best_auroc"], "method"].tolist() == ["Surgical", "Surgical"]
    saved = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    assert saved["baseline"] == "FedAvg" and saved["schema_version"] == 3  # 2: clustered DeLong, q-values; 3: small samples
    assert saved["table"][0]["cells"]["site-a"]["auroc_ci_low"] is None
    tests_csv = pd.read_csv(tmp_path / "cmp" / "comparison_tests.csv")
    assert set(tests_csv["test"]) == {"paired t-test over class AUROCs", "DeLong"}
    # no patient key or row key in any output
    for path in paths:
        assert "PX0" not in path.read_text() and "RK0" not in path.read_text()


def test_binary_task_columns_with_accuracy_and_targets(tmp_path, make_predictions, make_run):
    dirs = []
    for method, skill in (("FedAvg", 0.5), ("FedAvg_Finetune_GP", 2.5)):
        frame = make_predictions(classes=["covid19"], all_negative=(), skill=skill)
        dirs.append(make_run(tmp_path / method, frame, method=method, target="site-a", classes=["covid19"]))
    result = compare_runs(dirs, baseline="FedAvg", n_boot=100)
    assert [c["label"] for c in result["columns"]] == ["site-a", "site-b (target site-a)"]
    gp = _cell(result, "FedAvg_Finetune_GP", "site-a")
    assert gp["best_auroc"] and gp["best_acc"] and gp["acc_ci_low"] <= gp["acc_mean"] <= gp["acc_ci_high"]
    md_path = write_comparison(result, tmp_path / "out")[0]
    assert "| Method | site-a AUROC | site-a ACC |" in md_path.read_text()
    # one class: too few class AUROCs for a t-test, DeLong still runs
    test = result["tests"][0]
    assert np.isnan(test["ttest"]["p_value"]) and test["delong"][0]["p_value"] < 0.05


def test_bad_inputs(tmp_path, runs, make_predictions, make_run):
    with pytest.raises(UserError, match="--baseline 'Nope' is not among the methods"):
        compare_runs(runs, baseline="Nope", n_boot=0)
    dup = make_run(tmp_path / "dup", make_predictions(model_seed=0), method="FedAvg", seed=0)
    with pytest.raises(UserError, match="both method 'FedAvg', target None, seed 0"):
        compare_runs([runs[0], dup], n_boot=0)
    empty = make_run(tmp_path / "nopred", None, method="X")
    with pytest.raises(UserError, match="predictions for split 'test' are missing"):
        compare_runs([empty], n_boot=0)


# --------------------------------------------------------------------------- clustered DeLong, FDR


def test_bh_adjust_by_hand_and_against_scipy():
    # sorted finite p: 0.01, 0.03, 0.04, 0.2 (m = 4); m·p/rank: 0.04, 0.06, 0.0533, 0.2;
    # running minimum from the largest: 0.04, 0.0533, 0.0533, 0.2
    q = bh_adjust([0.01, 0.04, 0.03, np.nan, 0.2])
    assert q[:3] == pytest.approx([0.04, 0.16 / 3, 0.16 / 3]) and np.isnan(q[3]) and q[4] == pytest.approx(0.2)
    from scipy.stats import false_discovery_control
    p = np.random.default_rng(0).random(9)
    assert bh_adjust(p) == pytest.approx(false_discovery_control(p, method="bh").tolist())
    assert np.isnan(bh_adjust([np.nan])[0])  # NaN stays NaN and is not counted
    assert bh_adjust([]) == []


def test_per_class_delong_is_patient_clustered_with_q_values(result, runs):
    from fedcxr.evaluation.runs import load_predictions
    tests = {(t["method"], t["column"]): t for t in result["tests"]}
    better = tests[("Surgical", "site-a")]
    classes = ["atelectasis", "cardiomegaly", "edema", "pleural_effusion", "hernia"]
    method = load_predictions(runs[1], "test", classes)  # Surgical seed 0
    base = load_predictions(runs[0], "test", classes)  # FedAvg seed 0
    method, base = method[method["site"] == "site-a"], base[base["site"] == "site-a"]
    base = base.sample(frac=1.0, random_state=0)  # rows are paired by row_key, not by position
    joined = method.merge(base, on="row_key", suffixes=("", "__b"))
    edema = next(d for d in better["delong"] if d["class"] == "edema")
    want = metrics.clustered_delong_paired_test(joined["label__edema"], joined["prob__edema"],
                                                joined["prob__edema__b"], joined["patient_key"])
    assert (edema["auroc"], edema["auroc_baseline"], edema["z"], edema["p_value"]) == pytest.approx(want)
    assert edema["n_patients"] == joined.loc[joined["label__edema"].notna(), "patient_key"].nunique()
    # two images per patient: the clustered test is not the naive one
    naive = metrics.delong_paired_test(joined["label__edema"], joined["prob__edema"], joined["prob__edema__b"])
    assert naive[3] != pytest.approx(edema["p_value"], rel=1e-3)
    p = [d["p_value"] for d in better["delong"]]
    assert [d["q_value"] for d in better["delong"]] == pytest.approx(bh_adjust(p), nan_ok=True)
    assert all(d["significant"] == (np.isfinite(d["q_value"]) and d["q_value"] < 0.05) for d in better["delong"])
    hernia = next(d for d in better["delong"] if d["class"] == "hernia")
    assert np.isnan(hernia["q_value"]) and hernia["significant"] is False
    assert "Obuchowski" in result["delong"]["method"] and "Benjamini-Hochberg" in result["delong"]["fdr"]


def test_patient_clusters_follow_patients_and_merge_disagreements():
    a = np.array(["p1", "p1", "p2", "p3", "p3"], dtype=object)
    codes = patient_clusters(a, a.copy())
    assert codes[0] == codes[1] and codes[3] == codes[4] and len({codes[0], codes[2], codes[3]}) == 3
    # run b puts rows 1 and 2 together: p1 and p2 become one cluster, p3 stays apart
    b = np.array(["q1", "q2", "q2", "q3", "q3"], dtype=object)
    merged = patient_clusters(a, b)
    assert merged[0] == merged[1] == merged[2] and merged[3] == merged[4] != merged[0]
    assert patient_clusters(np.array([], dtype=object), np.array([], dtype=object)).size == 0


def _tiny_result(delong_rows):
    column = {"label": "site-a", "target": None, "site": "site-a", "binary": False}
    cell = {"n_runs": 1, "seeds": [0], "auroc_mean": 0.8, "auroc_sd": np.nan, "auroc_ci_low": 0.7,
            "auroc_ci_high": 0.9, "auroc_n": 1, "best_auroc": True}
    test = {"method": "New", "baseline": "Old", "column": "site-a", "site": "site-a", "target": None,
            "paired_by": "seed", "seed_pairs": [[0, 0]],
            "ttest": {"t": 2.5, "p_value": 0.04, "n_pairs": 3, "mean_difference": 0.02},
            "delong_seeds": [0, 0], "n_rows_joined": 10, "n_rows_only_method": 0, "n_rows_only_baseline": 0,
            "delong": delong_rows}
    return {"split": "test", "baseline": "Old", "ci": {"n_boot": 10}, "columns": [column],
            "runs": [{"method": m, "seed": 0, "target": None} for m in ("Old", "New")],
            "table": [{"method": "Old", "cells": {"site-a": cell}}, {"method": "New", "cells": {"site-a": cell}}],
            "tests": [test]}


def test_markdown_stars_use_q_and_say_so():
    rows = [{"class": c, "auroc": 0.8, "auroc_baseline": 0.75, "z": 2.0, "p_value": p, "q_value": q,
             "significant": q < 0.05, "n": 10, "n_pos": 3, "n_patients": 5, "n_label_mismatch": 0, "reason": None}
            for c, p, q in (("edema", 0.04, 0.16 / 3), ("effusion", 0.0004, 0.0008))]
    md = render_markdown(_tiny_result(rows))
    assert "| New | edema | 0.800 vs 0.750, p=0.040, q=0.053 ns |" in md  # p < 0.05 but q is not
    assert "| New | effusion | 0.800 vs 0.750, p<0.001, q<0.001 *** |" in md
    assert "Benjamini–Hochberg" in md and "significance marks use q" in md and "clustered by patient" in md
    assert "+0.020, p=0.040 *" in md  # the single t-test per cell keeps its p-value stars
    frame = compare.tests_frame(_tiny_result(rows))
    assert frame["q_value"].iloc[1:].tolist() == pytest.approx([0.16 / 3, 0.0008])
    assert frame["significant"].tolist() == [True, False, True]


def test_runs_with_and_without_a_target_get_distinct_columns(tmp_path, make_predictions, make_run):
    """Site A scored by a run without a target and by a run targeting A: two columns, two labels."""
    frame = make_predictions(classes=["covid19"], all_negative=(), skill=1.0)
    dirs = [make_run(tmp_path / "plain", frame, method="FedAvg", classes=["covid19"]),
            make_run(tmp_path / "adapted", frame, method="FedAvg_Finetune", target="site-a", classes=["covid19"])]
    labels = [c["label"] for c in compare_runs(dirs, n_boot=0)["columns"]]
    assert len(labels) == len(set(labels))
    assert "site-a (no target)" in labels and "site-a" in labels


# --------------------------------------------------------------------------- small samples


def test_comparison_marks_means_and_tests_resting_on_too_few_cases(tmp_path, make_predictions, make_run, result):
    dirs = []
    for method, skill in (("Local", 0.5), ("FedAvg", 2.5)):  # 12 test patients, one image each
        frame = make_predictions(sites=("site-a",), patients_per_site=12, images_per_patient=1, skill=skill,
                                 all_negative=(), prevalence=0.4)
        dirs.append(make_run(tmp_path / method, frame, method=method))
    small = compare_runs(dirs, baseline="Local", n_boot=100)
    cell = _cell(small, "FedAvg", "site-a")
    assert cell["auroc_classes"] >= 2 and cell["auroc_small_sample_classes"] == cell["auroc_classes"]
    assert cell["auroc_ci_method"] == "mean of the class intervals"
    assert cell["auroc_ci_low"] < cell["auroc_mean"] < cell["auroc_ci_high"]
    assert small["ci"]["small_sample"]["min_cases"] == 10
    delong = small["tests"][0]["delong"]
    assert all(d["small_sample"] for d in delong)
    assert small["tests"][0]["ttest"]["n_small_sample_pairs"] == small["tests"][0]["ttest"]["n_pairs"]
    paths = write_comparison(small, tmp_path / "out")
    md = paths[0].read_text()
    k = cell["auroc_small_sample_classes"]
    assert f" †{k}/{k} |" in md and "†k/K: k of the K classes behind the mean have too few cases" in md
    assert "the z-test is unreliable" in md and "too few cases: " in md
    assert f"({k} of {k} pairs with too few cases)" in md
    csv = pd.read_csv(paths[1])
    assert csv["auroc_small_sample_classes"].tolist() == [k, k]
    assert pd.read_csv(paths[3])["small_sample"].all()
    # runs with enough cases carry no mark
    assert all(c["auroc_small_sample_classes"] == 0 for row in result["table"] for c in row["cells"].values())
    assert "†" not in render_markdown(result)


def test_the_rows_note_counts_one_image_as_one_image():
    """Issue 28 item 9 ("1 images"): the note under the tests agrees with its numbers."""
    rows = [{"class": "edema", "auroc": 0.8, "auroc_baseline": 0.75, "z": 2.0, "p_value": 0.04, "q_value": 0.04,
             "significant": True, "n": 1, "n_pos": 1, "n_patients": 1, "n_label_mismatch": 1, "reason": None}]
    result = _tiny_result(rows)
    result["tests"][0].update(n_rows_joined=1, n_rows_only_method=1, n_rows_only_baseline=2)
    md = render_markdown(result)
    assert "- New vs Old on site-a: 1 image in both, 1 only in New, 2 only in Old; 1 label disagreement left " \
           "out of DeLong" in md
    assert "1 images" not in md and "1 label disagreements" not in md
