"""The README's main command, `fedcxr demo`, end to end (the quick variant keeps CI fast)."""

from __future__ import annotations

import json
import math
import re

from fedcxr.commands.demo import print_table
from fedcxr.workflows.demo import METHODS


def test_demo_quick_compares_three_ways_side_by_side(quick_demo):
    out_dir, out, logged = quick_demo  # `fedcxr demo --out DIR --quick --device cpu`, shared with test_use_the_model
    assert f"Comparison: {out_dir / 'comparison.md'}" in out
    for method, _ in METHODS:
        run = out_dir / "runs" / method
        report = json.loads((run / "report.json").read_text())
        mean = report["sites"]["dicom_style"]["mean_auroc"]
        assert math.isfinite(mean), method
        if method == "FedAvg_Finetune":  # the federated model beats chance even in two quick rounds
            assert mean > 0.55, mean
        assert (run / "roc_dicom_style.png").stat().st_size > 10_000
        assert f"  {method:<28} {mean:.3f} (" in out  # the console table shows each method's mean and CI
        small = report["sites"]["dicom_style"]["mean_auroc_small_sample_classes"]
        if small:  # the quick demo's tiny test split: the console marks it, never a bare 1.000 (1.000–1.000)
            assert f" †{len(small)}/{len(report['sites']['dicom_style']['mean_auroc_classes'])}" in out
    comparison = json.loads((out_dir / "comparison.json").read_text())
    assert [row["method"] for row in comparison["table"]] == [m for m, _ in METHODS]
    assert comparison["baseline"] == "Target_Only" and len(comparison["tests"]) == 2
    # every hospital contributes: midrc_style (COVID-19 only) is aggregated, not skipped
    rows = [json.loads(line) for line in (out_dir / "runs" / "FedAvg_Finetune" / "metrics.jsonl").read_text().splitlines()]
    assert all("midrc_style" in row["train"] for row in rows)
    assert "not aggregated" not in out + logged
    # the quick numbers come from a tiny test set: the demo says they mean nothing
    n_test = json.loads((out_dir / "runs" / "Target_Only" / "report.json").read_text())["sites"]["dicom_style"]["n_rows"]
    assert f"dicom_style's test split holds only {n_test} images, so these AUROCs and p-values mean nothing" in out


def test_the_console_table_marks_means_resting_on_too_few_cases(capsys):
    column = {"label": "dicom_style", "site": "dicom_style", "target": "dicom_style", "binary": False}
    cells = {"Target_Only": {"auroc_mean": 0.7, "auroc_ci_low": 0.4, "auroc_ci_high": 0.9, "auroc_classes": 3,
                             "auroc_small_sample_classes": 2},
             "FedAvg_Finetune": {"auroc_mean": 0.8, "auroc_ci_low": 0.75, "auroc_ci_high": 0.85, "auroc_classes": 3,
                                 "auroc_small_sample_classes": 0}}
    comparison = {"columns": [column], "baseline": "Target_Only", "tests": [],
                  "table": [{"method": m, "cells": {"dicom_style": c}} for m, c in cells.items()]}
    assert print_table(comparison, "dicom_style") == {"Target_Only": 0.7, "FedAvg_Finetune": 0.8}
    out = capsys.readouterr().out
    assert "  Target_Only                  0.700 (0.400–0.900) †2/3" in out
    assert "  FedAvg_Finetune              0.800 (0.750–0.850) " in out and "0.850) †" not in out
    assert "†k/K: k of the K classes behind the mean have too few cases" in out


def test_the_demo_console_has_one_format(quick_demo):
    """Its steps and the rounds' lines read alike: no `INFO fedcxr.rounds:` prefix among plain lines."""
    _, out, logged = quick_demo
    assert "[3/4] training for target dicom_style" in out
    assert re.search(r"^round 1/2 \([\d.]+ s\): loss ", logged, re.M), logged[-2000:]
    assert not re.search(r"^(INFO|DEBUG) fedcxr", out + logged, re.M), logged[-2000:]
