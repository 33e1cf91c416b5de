"""Smoke test of ``benchmarks/bench_pfl.py``: the synthetic class-heterogeneous hospitals (tiny), one
seed, one round — every method, FedBN and FedAvg_Finetune with each site as the target, the per-site
table and the paired columns."""

from __future__ import annotations

import pytest
import yaml

from .conftest import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("bench_pfl")


@pytest.mark.slow  # export, ingest and eleven one-round runs (~30 s on 2 cores)
def test_every_method_is_scored_site_by_site_with_its_own_model(bench, tmp_path, one_torch_thread):
    out, work = tmp_path / "results", tmp_path / "work"
    frame = bench.main(["--work", str(work), "--out", str(out), "--datasets", "classhet", "--images-per-site", "60",
                        "--export-size", "32", "--seeds", "1", "--rounds", "1", "--set", "image_size=16"])
    sites = ["nih_style", "chexpert_style", "dicom_style", "midrc_style"]
    assert set(frame["method"]) == set(bench.LABELS)
    for method in bench.LABELS:  # every site's own model on its own test split, once per site
        assert sorted(frame.loc[frame["method"] == method, "site"]) == sorted(sites), method
    values = frame["auroc"].dropna()
    assert len(values) and values.between(0, 1).all()
    sweep = work / "classhet" / "sweep"
    target = yaml.safe_load((sweep / "finetune-dicom_style" / "config.yaml").read_text())
    assert target["target"] == "dicom_style" and "dicom_style" not in target["sites"]
    assert target["target_train"] == target["source"]  # the target's budget is the sources'
    personal = yaml.safe_load((sweep / "personal" / "config.yaml").read_text())
    assert personal["fedrep"] == {"head_epochs": personal["source"]["epochs"]}
    table = (out / "pfl.md").read_text()
    assert "| classhet | Ditto |" in table and "vs FedAvg_Finetune" in table
    summary = bench.summary(frame)
    assert set(summary.columns) >= {"vs_FedBN", "vs_FedAvg_Finetune"}
