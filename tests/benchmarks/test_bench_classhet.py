"""Smoke test of ``benchmarks/bench_classhet.py``: the four synthetic hospitals (tiny), one norm
mode, one seed, Individual and FL_Surgical — the whole pipeline (export, ingest, sweeps, class
groups, tables, figure, per-class comparison) in well under a minute."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from .conftest import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("bench_classhet")


@pytest.mark.slow  # export, ingest and two sweeps of the benchmark (~8 s on 2 cores)
def test_one_cell_one_seed(bench, tmp_path, one_torch_thread):
    out, work = tmp_path / "results", tmp_path / "work"
    frame = bench.main(["--work", str(work), "--out", str(out), "--images-per-site", "60", "--export-size", "32",
                        "--methods", "Individual", "FL_Surgical", "--norms", "fedbn_plus", "--seeds", "1",
                        "--rounds", "1", "--pretrain", "none", "--set", "image_size=16",
                        "--set", "head_warmup.epochs=0"])
    assert set(frame["method"]) == {"Individual", "FL_Surgical"} and set(frame["norm"]) == {"fedbn_plus"}
    sites = ["nih_style", "chexpert_style", "dicom_style", "midrc_style"]
    assert {"sites", "shared", "unique", *(f"site:{s}" for s in sites)} <= set(frame["metric"])
    values = frame["auroc"].to_numpy(dtype=float)
    assert np.all(np.isnan(values) | ((values >= 0) & (values <= 1)))
    assert frame.loc[frame["metric"] == "sites", "auroc"].notna().all()
    # the classes a site does not label are scored against the synthetic truth, for the global
    # model only (a site's own model never learned them)
    unlabelled = frame.loc[frame["metric"] == "unlabelled"]
    assert list(unlabelled["method"]) == ["FL_Surgical"] and unlabelled["auroc"].between(0, 1).all()

    # the heterogeneity is real: classes only one hospital labels, classes several share
    sharing = bench.class_sharing(work / "manifests", sites)
    assert sharing["nih_style"]["mass"] == "unique" and sharing["chexpert_style"]["fracture"] == "unique"
    assert sharing["nih_style"]["atelectasis"] == "shared" and sharing["midrc_style"] == {"covid19": "shared"}

    # every run's head covers the union; each site is scored on its own classes only
    sweep = work / "sweep" / "classhet"
    config = yaml.safe_load((sweep / "fedbn_plus" / "config.yaml").read_text())
    assert config["class_source"] == "union" and config["backbone_aggregation"] == "fedbn_plus"
    report = json.loads((sweep / "fedbn_plus" / "runs" / "FL_Surgical-seed0" / "report.json").read_text())
    assert set(report["classes"]) >= set(sharing["nih_style"]) | set(sharing["chexpert_style"])
    assert set(report["sites"]["midrc_style"]["mean_auroc_classes"]) <= {"covid19"}
    # Individual does not federate: trained once, shown under the norm mode
    assert (sweep / "individual" / "runs" / "Individual-seed0" / "final_model.pt").is_file()
    assert not (sweep / "fedbn_plus" / "runs" / "Individual-seed0").exists()

    for name in ("classhet.md", "classhet.csv", "classhet_runs.csv", "classhet.png",
                 "classhet_fedbn_plus_comparison.md"):
        assert (out / name).stat().st_size > 0
    table = pd.read_csv(out / "classhet.csv")
    assert set(table["method"]) == {"Individual", "FL_Surgical"} and (table["n"] == 1).all()
    md = (out / "classhet.md").read_text()
    assert "| FL_Surgical |" in md and "FL_Surgical ≈ Individual" in md
    assert "Significance against FL_Surgical" in (out / "classhet_fedbn_plus_comparison.md").read_text()


def test_pretrained_backbone_on_real_pneumoniamnist(bench, shared_data, tmp_path, one_torch_thread):
    """The default backbone is pretrained on real X-rays (official train/val rows only) and given
    to every run as ``model.weights``."""
    data = np.load(shared_data / "medmnist" / "pneumoniamnist_merged.npz")
    small = tmp_path / "pneumoniamnist_small.npz"
    np.savez(small, **{f"{s}_{k}": data[f"{s}_{k}"][:n] for s, n in {"train": 40, "val": 10, "test": 10}.items()
                       for k in ("images", "labels")})
    weights = bench.pretrain(small, tmp_path / "work")
    assert weights.is_file()
    assert json.loads((weights.parent / "run.json").read_text())["method"] == "Central"
    from fedcxr.site_adapters.manifest import read_manifest

    rows = read_manifest(tmp_path / "work" / "pretrain" / "manifests" / "pneumoniamnist")
    assert set(rows["split"]) <= {"train", "val"} and len(rows) == 50
    config = bench.sweep_config(tmp_path / "work", tmp_path / "work" / "pretrain" / "manifests", ["pneumoniamnist"],
                                "fedbn_plus", 1, weights, tmp_path / "sweep")
    from fedcxr.pipeline.config import load_config

    assert Path(load_config(config).model.weights) == weights.resolve()
