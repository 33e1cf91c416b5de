"""Smoke test of ``benchmarks/bench_fact.py`` on real PneumoniaMNIST: one shift level, Source_Only
and FACT (plus the training-free AdaBN and last-round diagnostics), one seed, a tiny slice of the data — the
unlabeled target, the runs, the scoring on the labeled test split, table and figure."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from fedcxr.site_adapters.manifest import read_manifest, read_site_json
from fedcxr.vocab import label_column

from .conftest import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("bench_fact")


def test_one_level_fact_vs_source_only_one_seed(bench, small_npz, tmp_path, one_torch_thread):
    out, work = tmp_path / "results", tmp_path / "work"
    frame = bench.main(["--npz", str(small_npz), "--work", str(work), "--out", str(out), "--levels", "3",
                        "--methods", "Source_Only", "Source_Only_AdaBN", "FACT", "FACT_last", "FACT_AdaBN",
                        "--seeds", "1", "--rounds", "2",
                        "--set", "source.steps=2", "--set", "target_train.batch_size=10"])
    assert sorted(frame["method"]) == ["FACT", "FACT_AdaBN", "FACT_last", "Source_Only", "Source_Only_AdaBN"]
    assert set(frame["level"]) == {3}
    assert frame["auroc"].between(0, 1).all()
    for name in ("fact_mix.md", "fact_mix.csv", "fact_mix_runs.csv", "fact_mix.png"):
        assert (out / name).stat().st_size > 0
    assert "| FACT > Source_Only | 3 |" in (out / "fact_mix.md").read_text()

    # FACT and Source_Only trained with a target that has no label at all
    unlabeled = work / "targets" / "mix3-unlabeled" / "target"
    meta = read_site_json(unlabeled)
    assert meta["unlabeled"] is True and meta["class_set"] == []
    assert read_manifest(unlabeled)[label_column("pneumonia")].isna().all()
    runs = work / "sweep" / "fact_mix" / "level3" / "runs"
    for method in ("FACT", "Source_Only"):
        run = json.loads((runs / f"{method}-seed0" / "run.json").read_text())
        assert run["class_sets"]["target"] == [] and run["site_dirs"]["target"] == str(unlabeled.resolve())
    # ... and were scored on the labeled shifted target's test rows (the same images)
    labeled = read_manifest(work / "targets" / "mix3" / "target")
    test = labeled.loc[labeled["split"] == "test"]
    score = json.loads((runs / "FACT-seed0" / "target_test.json").read_text())
    assert score["target_unlabeled"] and score["n"] == len(test)
    assert score["positives"]["pneumonia"] == int((test[label_column("pneumonia")] == 1).sum())
    assert score["selected_round"] in (0, 1)  # FACT's lowest-IDD round
    adabn = json.loads((runs / "Source_Only_AdaBN-seed0" / "target_test.json").read_text())
    assert adabn["derived_from"] == "Source_Only-seed0" and adabn["n"] == len(test)
    assert json.loads((runs / "FACT_AdaBN-seed0" / "target_test.json").read_text())["derived_from"] == "FACT-seed0"
    last = json.loads((runs / "FACT_last-seed0" / "target_test.json").read_text())
    assert last["derived_from"] == "FACT-seed0" and last["selected_round"] is None
    if score["selected_round"] == 1:  # the lowest-IDD round is the last one: the same model
        assert last["mean_auroc"] == pytest.approx(score["mean_auroc"])
    table = pd.read_csv(out / "fact_mix.csv")
    assert (table["n"] == 1).all()


def test_adabn_changes_only_batchnorm_statistics(bench, small_npz, tmp_path, one_torch_thread):
    """The diagnostic re-estimates BatchNorm running statistics on target images; nothing else moves."""
    import torch

    from fedcxr.pipeline.predictions import load_final

    work = tmp_path / "work"
    bench.main(["--npz", str(small_npz), "--work", str(work), "--out", str(tmp_path / "results"), "--levels", "3",
                "--methods", "Source_Only", "--seeds", "1", "--rounds", "1", "--set", "source.steps=2"])
    run = work / "sweep" / "fact_mix" / "level3" / "runs" / "Source_Only-seed0"
    captured = {}
    real = bench.score_run

    def spy(run_dir, labeled, cache, *, params=None, out=None):
        captured["params"] = params
        return real(run_dir, labeled, cache, params=params, out=out)

    bench.score_run = spy
    try:
        bench.adabn_run(run, tmp_path / "adabn", work / "targets" / "mix3-unlabeled" / "target",
                        work / "targets" / "mix3" / "target", work / "cache")
    finally:
        bench.score_run = real
    before, after = load_final(run)[1]["global"], captured["params"]
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(k.endswith(("running_mean", "running_var", "num_batches_tracked")) for k in moved)


def test_a_diagnostic_without_its_method_says_which_is_missing(bench, small_npz, tmp_path):
    from fedcxr.errors import UserError

    with pytest.raises(UserError, match="FACT_last needs FACT among --methods"):
        bench.main(["--npz", str(small_npz), "--work", str(tmp_path / "work"), "--out", str(tmp_path / "results"),
                    "--levels", "3", "--methods", "FACT_last", "--seeds", "1"])


def test_source_shift_gives_each_source_its_own_domain(bench, small_npz, tmp_path, one_torch_thread):
    """``--source-shift noise gamma blur``: site-k is shifted with the k-th kind (the paper's distinct domains)."""
    work = tmp_path / "work"
    frame = bench.main(["--npz", str(small_npz), "--work", str(work), "--out", str(tmp_path / "results"),
                        "--levels", "0", "--methods", "Source_Only", "--seeds", "1", "--rounds", "1",
                        "--source-shift", "noise", "gamma", "blur", "--source-level", "2", "--stem", "fact_domains",
                        "--set", "source.steps=2"])
    assert len(frame) == 1 and frame["auroc"].between(0, 1).all()
    run_dir = work / "sweep" / "fact_domains" / "level0" / "runs" / "Source_Only-seed0"
    run = json.loads((run_dir / "run.json").read_text())
    for k, kind in enumerate(("noise", "gamma", "blur"), start=1):
        site = work / "sources" / f"{kind}2" / f"site-{k}"
        assert run["site_dirs"][f"site-{k}"] == str(site.resolve())
        assert read_site_json(site)["options"]["shift"] == {**read_site_json(site)["options"]["shift"],
                                                            "kind": kind, "level": 2}
    assert "sources noise/gamma/blur 2" in (tmp_path / "results" / "fact_domains.md").read_text()
    from fedcxr.errors import UserError

    with pytest.raises(UserError, match="one kind per source site"):
        bench.parse(["--source-shift", "noise", "gamma"])
