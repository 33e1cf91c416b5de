"""Smoke test of ``benchmarks/bench_robust.py`` on a slice of real PneumoniaMNIST: three sources, one
round, the undefended and the defended mean plus the median, honest and with a 1e30 site — the
runs, the scoring, the failure accounting and the table."""

from __future__ import annotations

import pandas as pd

from .conftest import load_bench


def test_undefended_mean_breaks_on_a_huge_update_and_the_defended_rules_do_not(small_npz, tmp_path, one_torch_thread):
    bench = load_bench("bench_robust")
    out = tmp_path / "results"
    frame = bench.main(["--npz", str(small_npz), "--work", str(tmp_path / "work"), "--out", str(out),
                        "--rules", "mean_undefended", "mean", "median", "--attacks", "none", "huge",
                        "--seeds", "1", "--sources", "3", "--rounds", "2"])
    by = frame.set_index(["rule", "attack"])
    assert by.loc[("mean_undefended", "huge"), "status"] != "finished"  # the pre-issue-19 behaviour
    assert by.loc[("mean_undefended", "huge"), "auroc"] == 0.5
    for rule in ("mean", "median"):
        assert by.loc[(rule, "huge"), "status"] == "finished" and by.loc[(rule, "huge"), "refused"] == 2
        assert 0 <= by.loc[(rule, "huge"), "auroc"] <= 1
    # defences only refuse: the honest runs with and without them score the same
    assert by.loc[("mean", "none"), "auroc"] == by.loc[("mean_undefended", "none"), "auroc"]
    table = pd.read_csv(out / "robust.csv")
    assert set(table["rule"]) == {"mean_undefended", "mean", "median"}
    text = (out / "robust.md").read_text()
    assert "| `mean_undefended` |" in text and "(1/1 failed)" in text
    assert (out / "robust_runs.csv").stat().st_size > 0
