"""Method comparison across runs: table cells, best marks, seeds, tests against a baseline."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fedcxr.errors import UserError
from fedcxr.evaluation.compare import compare_runs, write_comparison


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
    assert saved["baseline"] == "FedAvg" and saved["schema_version"] == 1
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
