"""Smoke test of ``benchmarks/bench_auxinfo.py``: the session's tiny synthetic federation, one setting,
AuxInfo+GP against GP, one seed, one short round — runs, the paired table and the Markdown."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from .conftest import load_bench


@pytest.mark.slow  # two runs on the synthetic hospitals, each evaluated over nine classes: ~16 s on busy cores
def test_one_setting_two_methods_one_seed(tiny_manifests, tmp_path, one_torch_thread):
    bench = load_bench("bench_auxinfo")
    out, work = tmp_path / "results", tmp_path / "work"
    runs = bench.main(["--manifests", str(tiny_manifests), "--work", str(work), "--out", str(out), "--settings",
                       "scarce50", "--methods", "FedAvg_Finetune_GP", "FedAvg_Finetune_AuxInfo_GP", "--seeds", "1",
                       "--set", "rounds=1", "--set", "image_size=32", "--set", "augment=false",
                       "--set", "source.steps=1", "--set", "target_train.steps=1", "--set", "model.hidden=16"])
    assert sorted(runs["method"]) == ["FedAvg_Finetune_AuxInfo_GP", "FedAvg_Finetune_GP"]
    assert runs["auroc"].between(0, 1).all() and set(runs["setting"]) == {"scarce50"}
    cfg = yaml.safe_load((work / "sweep" / "scarce50" / "config.yaml").read_text())
    assert cfg["target"] == "dicom_style" and cfg["target_train"]["labeled"] == 50  # the setting's budget
    pairs = pd.read_csv(out / "auxinfo_pairs.csv")
    (row,) = pairs.to_dict("records")
    assert (row["method"], row["versus"], row["n"], row["verdict"]) == (
        "FedAvg_Finetune_AuxInfo_GP", "FedAvg_Finetune_GP", 1, "unresolved")  # one seed: no interval
    assert "FedAvg_Finetune_AuxInfo_GP − FedAvg_Finetune_GP" in (out / "auxinfo.md").read_text()
