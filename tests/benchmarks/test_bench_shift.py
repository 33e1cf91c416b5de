"""Smoke test of ``benchmarks/bench_shift.py`` on real PneumoniaMNIST: one shift level, two
methods, one seed, a tiny slice of the data — the whole pipeline (sites, shift, sweep, table,
figure) in well under a minute."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from fedcxr.site_adapters.manifest import read_manifest, read_site_json

from .conftest import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("bench_shift")


def test_one_level_two_methods_one_seed(bench, small_npz, tmp_path, one_torch_thread):
    out = tmp_path / "results"
    frame = bench.main(["--npz", str(small_npz), "--work", str(tmp_path / "work"), "--out", str(out),
                        "--levels", "3", "--methods", "FedAvg", "FedDA", "--seeds", "1", "--rounds", "1",
                        "--labeled", "10", "--set", "source.steps=2", "--set", "target_train.batch_size=10"])
    assert sorted(frame["method"]) == ["FedAvg", "FedDA"] and set(frame["level"]) == {3}
    assert frame["auroc"].between(0, 1).all()
    # the outputs the documentation points at
    for name in ("shift_mix.md", "shift_mix.csv", "shift_mix_runs.csv", "shift_mix.png",
                 "shift_mix_level3_comparison.md"):
        assert (out / name).stat().st_size > 0
    table = pd.read_csv(out / "shift_mix.csv")
    assert set(table["method"]) == {"FedAvg", "FedDA"} and (table["n"] == 1).all()
    assert "| FedAvg |" in (out / "shift_mix.md").read_text()
    # the target is the official test rows, shifted; the sources never see them
    work = tmp_path / "work"
    target = work / "targets" / "mix3" / "target"
    assert read_site_json(target)["options"]["shift"]["level"] == 3
    rows = read_manifest(target)
    assert len(rows) == 60 and rows["source_file"].str.endswith(":test").all()
    target_ids = set(rows["patient_id"])
    for k in (1, 2, 3):
        source = read_manifest(work / "manifests" / f"site-{k}")
        assert not target_ids & set(source["patient_id"])
        assert set(source["split"]) <= {"train", "val"}
