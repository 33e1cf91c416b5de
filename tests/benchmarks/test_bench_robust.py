"""Smoke test of ``benchmarks/bench_robust.py`` on a slice of real PneumoniaMNIST: three sources, two
rounds, the mean and the median honest, each alone against a 1e30 site, and the mean with the default
reply checks — the runs, the scoring, the failure accounting and the tables."""

from __future__ import annotations

import pandas as pd
import pytest

from .conftest import load_bench

pytestmark = pytest.mark.slow  # five small training runs: ~10 s of CPU


def test_a_huge_update_breaks_the_undefended_mean_not_the_median_nor_the_checks(small_npz, tmp_path,
                                                                                 one_torch_thread):
    bench = load_bench("bench_robust")
    out = tmp_path / "results"
    frame = bench.main(["--npz", str(small_npz), "--work", str(tmp_path / "work"), "--out", str(out),
                        "--rules", "mean", "median", "--attacks", "none", "huge", "--defended", "mean",
                        "--seeds", "1", "--sources", "3", "--rounds", "2"])
    by = frame.set_index(["rule", "attack"])
    assert sorted(by.index) == [("mean", "huge"), ("mean", "none"), ("mean_undefended", "huge"),
                                ("median", "none"), ("median_undefended", "huge")]
    assert by.loc[("mean_undefended", "huge"), "status"] != "finished"  # the pre-issue-19 behaviour
    assert by.loc[("mean_undefended", "huge"), "auroc"] == 0.5
    assert by.loc[("median_undefended", "huge"), "status"] == "finished"  # the median alone outvotes it
    assert by.loc[("median_undefended", "huge"), "refused"] == 0
    assert by.loc[("mean", "huge"), "status"] == "finished" and by.loc[("mean", "huge"), "refused"] == 2
    for key in (("mean", "huge"), ("median_undefended", "huge"), ("mean", "none")):
        assert 0 <= by.loc[key, "auroc"] <= 1
    table = pd.read_csv(out / "robust.csv")
    assert set(table["rule"]) == {"mean", "median", "mean_undefended", "median_undefended"}
    text = (out / "robust.md").read_text()
    assert "Each rule alone" in text and "(1/1 failed)" in text and "2 refused/run" in text
    assert (out / "robust_runs.csv").stat().st_size > 0
