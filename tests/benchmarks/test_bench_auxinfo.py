"""Smoke test of ``benchmarks/bench_auxinfo.py``: the session's tiny synthetic federation, one setting,
one AuxInfo variant, AuxInfo+GP against GP, one seed, one short round — runs, the paired table, the
Markdown; a second call resumes (nothing is run again) and the plan lists the jobs of each part."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from .conftest import load_bench

FAST = ["--set", "rounds=1", "--set", "image_size=32", "--set", "augment=false", "--set", "source.steps=1",
        "--set", "target_train.steps=1", "--set", "model.hidden=16"]


@pytest.mark.slow  # two runs on the synthetic hospitals, each evaluated over nine classes: ~16 s on busy cores
def test_one_variant_two_methods_one_seed_then_resume(tiny_manifests, tmp_path, one_torch_thread, capsys):
    bench = load_bench("bench_auxinfo")
    out, work = tmp_path / "results", tmp_path / "work"
    argv = ["--manifests", str(tiny_manifests), "--work", str(work), "--out", str(out), "--settings", "scarce50",
            "--variants", "a0.25-mean-noview", "--methods", "FedAvg_Finetune_GP", "FedAvg_Finetune_AuxInfo_GP",
            "--seeds", "1", *FAST]
    runs = bench.main(argv)
    assert sorted(zip(runs["variant"], runs["method"])) == [("a0.25-mean-noview", "FedAvg_Finetune_AuxInfo_GP"),
                                                            ("noaux", "FedAvg_Finetune_GP")]
    assert runs["auroc"].between(0, 1).all() and set(runs["setting"]) == {"scarce50"}
    cfg = yaml.safe_load((work / "sweep" / "scarce50" / "a0.25-mean-noview" / "config.yaml").read_text())
    assert cfg["target"] == "dicom_style" and cfg["target_train"]["labeled"] == 50  # the setting's budget
    assert (cfg["alpha"], cfg["aux_reduction"], cfg["aux_tasks"]) == (0.25, "mean", ["sex", "age_bin", "race"])
    base = yaml.safe_load((work / "sweep" / "scarce50" / "noaux" / "config.yaml").read_text())
    assert "aux_reduction" not in base and base["rounds"] == 1
    pairs = pd.read_csv(out / "auxinfo_grid_pairs.csv")
    (row,) = pairs.to_dict("records")
    assert (row["variant"], row["method"], row["versus"], row["n"], row["verdict"]) == (
        "a0.25-mean-noview", "FedAvg_Finetune_AuxInfo_GP", "FedAvg_Finetune_GP", 1, "unresolved")  # one seed
    assert "| a0.25-mean-noview | FedAvg_Finetune_AuxInfo_GP − FedAvg_Finetune_GP |" in (out / "auxinfo_grid.md").read_text()
    capsys.readouterr()
    again = bench.main(argv)  # resumes: both runs finished, nothing runs again
    assert "seed 0:" not in capsys.readouterr().out
    pd.testing.assert_frame_equal(again.reset_index(drop=True), runs.reset_index(drop=True))


def test_variants_parts_and_plan(tmp_path, capsys):
    bench = load_bench("bench_auxinfo")
    assert len(bench.VARIANTS) == 12 and bench.VARIANTS["a1-sum-view"] == [
        "alpha=1", "aux_reduction=sum", "aux_tasks=[sex, age_bin, race, view]"]
    assert bench.parse(["--variants", "all"]).variants == list(bench.VARIANTS)
    with pytest.raises(SystemExit):
        bench.parse(["--variants", "a2-sum-view"])
    with pytest.raises(SystemExit):
        bench.parse(["--part", "3/2"])
    manifests = tmp_path / "manifests"
    (manifests / "dicom_style").mkdir(parents=True)
    (manifests / "dicom_style" / "site.json").write_text("{}")
    (manifests / "nih_style").mkdir()
    (manifests / "nih_style" / "site.json").write_text("{}")
    args = bench.parse(["--variants", "a1-sum-view", "a0.5-mean-view", "--seeds", "2", "--work", str(tmp_path)])
    jobs = bench.plan_jobs(tmp_path, manifests, args)
    # per seed: FedAvg_Finetune and GP once (noaux), AuxInfo and AuxInfo+GP per variant; seeds outermost
    assert len(jobs) == 2 * (2 + 2 * 2) and [j[1][1] for j in jobs] == ["seed=0"] * 6 + ["seed=1"] * 6
    assert not any("label_draw" in setting for j in jobs for setting in j[1]), "one fixed draw, as measured"
    assert [j[2].split("sweep/demo/")[1] for j in jobs[:3]] == [
        "noaux/runs/FedAvg_Finetune-seed0", "noaux/runs/FedAvg_Finetune_GP-seed0",
        "a1-sum-view/runs/FedAvg_Finetune_AuxInfo-seed0"]
    parts = [bench.plan_jobs(tmp_path, manifests, bench.parse([*map(str, ["--variants", "a1-sum-view", "a0.5-mean-view",
                                                                          "--seeds", 2, "--part", f"{k}/3"])]))
             for k in (1, 2, 3)]
    assert sorted(j[2] for p in parts for j in p) == sorted(j[2] for j in jobs)  # the parts cover the jobs once
    (Path(jobs[1][2]) / "report.json").parent.mkdir(parents=True)
    (Path(jobs[1][2]) / "report.json").write_text('{"sites": {}}')
    capsys.readouterr()
    bench.main(["--variants", "a1-sum-view", "a0.5-mean-view", "--seeds", "2", "--work", str(tmp_path),
                "--manifests", str(manifests), "--plan"])  # lists the jobs, runs none
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["  sweep/demo/noaux/runs/FedAvg_Finetune-seed0", "✓ sweep/demo/noaux/runs/FedAvg_Finetune_GP-seed0"]
    assert "12 jobs, 1 finished" in lines
