"""Smoke test of ``benchmarks/regime_map.py`` on real PneumoniaMNIST: one cell (two label counts of it),
two methods, one seed, a tiny slice of the data — a label-free method trained once for both label counts,
the tables, the heatmap and the map rows ``build_regime_map.py`` writes from them."""

from __future__ import annotations

import pandas as pd
import pytest

from fedcxr.advice import regime

from .conftest import load_bench


@pytest.mark.slow  # four runs, the tables and the heatmap: ~28 s on 2 cores at load 4
def test_one_cell_two_methods_one_seed_to_the_advice_map(small_npz, tmp_path, one_torch_thread):
    bench, maps, build = load_bench("bench_regime"), load_bench("regime_map"), load_bench("build_regime_map")
    work, out = tmp_path / "work", tmp_path / "results"
    argv = maps.part_argv("labelnoise40", [5, 10], 2, work=work, out=tmp_path / "parts", workers=1,
                          methods=["Target_Only", "FedAvg"], seeds=1, close_seeds=0, npz=small_npz,
                          extra=["--set", "source.steps=1"])
    bench.main(argv)
    # FedAvg never reads a target label: one run serves both label counts (a link in each cell)
    cells = work / "sweep" / maps.VARIANT
    linked = [cells / f"labelnoise40-n{n}-r2" / "runs" / "FedAvg-seed0" for n in (5, 10)]
    assert all(p.is_symlink() for p in linked) and linked[0].resolve() == linked[1].resolve()
    assert not (cells / "labelnoise40-n5-r2" / "runs" / "Target_Only-seed0").is_symlink()

    runs = maps.write_tables(work, out, {"smoke": True})
    assert set(runs["labels"]) == {5, 10} and len(runs) == 4 and runs["auroc"].between(0, 1).all()
    for name in ("runs", "cells", "pairs", "papers", "winners"):
        assert (out / f"regime_map_{name}.csv").is_file(), name
    assert (out / "regime_map.png").stat().st_size > 10_000

    path = tmp_path / "map.csv"
    build.main(["--runs", str(out / "regime_map_runs.csv"), "--out", str(path)])
    rows = regime.load_regime_map(path)
    assert [(c.shift, c.target_labels, c.rounds) for c in rows] == [("label_noise", 5, 2), ("label_noise", 10, 2)]
    assert all(c.n_seeds == 1 and not c.resolved and set(c.auroc) == {"Target_Only", "FedAvg"} for c in rows)
    assert all("regime_map_runs.csv" in c.source for c in rows)


def test_more_seeds_only_where_the_winner_is_close():
    maps = load_bench("regime_map")
    close = maps.bench_regime.close_methods
    cell = pd.DataFrame({"method": ["A", "A", "B", "B", "C", "C"], "auroc": [0.90, 0.92, 0.90, 0.91, 0.89, 0.90]})
    assert close(cell, 0.03) == ["A", "B"]  # A 0.910, B 0.905: the winner and the runner-up (C, 0.895, waits)
    cell.loc[cell["method"] == "B", "auroc"] = [0.85, 0.86]
    assert close(cell, 0.03) == ["A", "C"]  # B fell back: C is the runner-up now
    cell.loc[cell["method"] == "C", "auroc"] = [0.85, 0.86]
    assert close(cell, 0.03) == []  # A leads by 0.055: clear
