"""Smoke test of ``benchmarks/bench_baselines.py`` on real PneumoniaMNIST: SCAFFOLD against FedAvg
(the plain-SGD group), one seed, one round, a tiny slice of the data — ingest with label skew,
sweep, paired table and CSVs."""

from __future__ import annotations

import pandas as pd

from .conftest import load_bench


def test_two_methods_one_seed_one_round(small_npz, tmp_path, one_torch_thread):
    bench = load_bench("bench_baselines")
    out = tmp_path / "results"
    frame = bench.main(["--npz", str(small_npz), "--work", str(tmp_path / "work"), "--out", str(out),
                        "--groups", "sgd", "--methods", "FedAvg", "SCAFFOLD", "--seeds", "1",
                        "--set", "rounds=1", "--set", "source.steps=2"])
    assert sorted(frame["method"]) == ["FedAvg", "SCAFFOLD"] and set(frame["group"]) == {"sgd"}
    table = pd.read_csv(out / "baselines.csv")
    row = table.loc[table["method"] == "SCAFFOLD"].iloc[0]
    assert row["vs"] == "FedAvg" and row["n"] == 1
    # one round from c = c_i = 0 with η_g = 1 is FedAvg with plain-SGD sources: the same target AUROC
    assert frame.set_index("method")["auroc"].nunique(dropna=False) == 1
    assert "| plain SGD, lr 0.03 | SCAFFOLD |" in (out / "baselines.md").read_text()
    assert (out / "baselines_runs.csv").stat().st_size > 0
    assert all((tmp_path / "work" / "manifests" / f"site-{k}" / "site.json").is_file() for k in (1, 2, 3, 4))
