"""Smoke test of ``benchmarks/bench_anchor.py`` on real PneumoniaMNIST: ingest, Central with the
small stem and best-validation selection, evaluation on the official test split, table — on a
tiny slice of the data and a tiny network, in seconds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from .conftest import load_bench, write_small_npz


@pytest.fixture(scope="module")
def bench():
    return load_bench("bench_anchor")


@pytest.fixture
def small_npz(shared_data, tmp_path):
    """The first 80/40/60 train/val/test rows (enough validation rows of both classes for a curve)."""
    return write_small_npz(shared_data, tmp_path / "pneumoniamnist_small.npz", {"train": 80, "val": 40, "test": 60})


def test_anchor_trains_selects_the_best_validation_epoch_and_scores_the_test_split(bench, small_npz, tmp_path,
                                                                                   one_torch_thread):
    out = tmp_path / "results"
    rows = bench.main(["--npz", str(small_npz), "--work", str(tmp_path / "work"), "--out", str(out),
                       "--epochs", "3", "--backbone", "resnet_tiny", "--stem", "small", "--bootstrap", "20"])
    (row,) = rows
    curve = [v for v in row["val_curve"] if v is not None and not math.isnan(v)]
    assert len(row["val_curve"]) == 3 and curve
    assert row["val_auroc"] == pytest.approx(max(curve))
    assert row["val_curve"][row["selected_epoch"]] == pytest.approx(max(curve))
    assert 0 <= row["test_auroc"] <= 1 and row["n_test"] == 60
    assert row["ci"][0] <= row["test_auroc"] <= row["ci"][1]
    table = (out / "anchor_resnet_tiny_small.md").read_text()
    assert "0.944" in table and "resnet_tiny (small stem)" in table
    saved = json.loads((out / "anchor_resnet_tiny_small.json").read_text())
    assert saved["published"]["auc"] == 0.944 and saved["runs"][0]["seed"] == 0
