"""Smoke tests of ``benchmarks/bench_regime.py`` on real PneumoniaMNIST: one cell, a tiny slice of the data —
sites, marker, fresh label draws, the runs file's columns, the corrected tables, the chooser's Selected row."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedcxr.pipeline.config import load_config
from fedcxr.site_adapters.images import read_image_resized
from fedcxr.site_adapters.manifest import read_manifest, read_site_json

from .conftest import load_bench


@pytest.mark.slow  # three runs, evaluated, and the tables: ~20 s on 2 cores at load 5
def test_one_cell_two_methods_one_seed(small_npz, tmp_path, one_torch_thread):
    bench = load_bench("bench_regime")
    out, work = tmp_path / "results", tmp_path / "work"
    runs = bench.main(["--npz", str(small_npz), "--work", str(work), "--out", str(out), "--shifts", "shortcut",
                       "--labels", "10", "--rounds", "3", "--methods", "Target_Only", "FedGP_Auto", "--seeds", "1",
                       "--set", "source.steps=2"])
    assert sorted(runs["method"]) == ["FedGP_Auto", "Target_Only"] and runs["auroc"].between(0, 1).all()
    assert set(runs[["shift", "labels", "rounds"]].itertuples(index=False, name=None)) == {("shortcut", 10, 3)}
    saved = pd.read_csv(out / "regime_runs.csv")
    assert {"label_draw", "val_auroc", "target_passes", "wall_s"} <= set(saved.columns)
    assert (saved["label_draw"] == 0).all() and saved["val_auroc"].between(0, 1).all()  # the scored round's val
    passes = saved.set_index("method")["target_passes"]
    assert passes["Target_Only"] == 3 and passes["FedGP_Auto"] == 1  # a pass a round; FedGP_Auto: 2 warm-up rounds
    cells = pd.read_csv(out / "regime_cells.csv")
    assert list(cells.columns) == ["shift", "labels", "rounds", "method", "n", "mean", "lo", "hi", "val_mean",
                                   "target_passes", "wall_s"]
    pairs = pd.read_csv(out / "regime_pairs.csv")
    assert len(pairs) == 1 and pairs["verdict"].iloc[0] == "tied" and pairs["p_adj"].iloc[0] == 1  # one seed: no test
    verdicts = pd.read_csv(out / "regime_verdicts.csv")
    assert len(verdicts) == 1 and not verdicts["resolved"].iloc[0] and verdicts["p_adj"].iloc[0] == 1
    assert "### shortcut, 10 target labels, 3 rounds" in (out / "regime.md").read_text()
    # the marker: 95 % of pneumonia images at a source, 5 % at the target (and the reverse for normal ones)
    cell = work / "sweep" / "default" / "shortcut-n10-r3"
    cfg = load_config(cell / "config.yaml")
    assert cfg.target_train.batch_size is None and cfg.eval_every == 3  # each method's default; val at the end
    assert cfg.source.steps == 2 and cfg.source.epochs == 1  # --set over the default: one epoch a round
    for site, rate in ((cfg.sites[0], 0.95), (cfg.target, 0.05)):
        frame, root = read_manifest(site), read_site_json(site)["export_root"]
        marked = np.array([(read_image_resized(f"{root}/{p}", 28)[:4, :4] == 255).all() for p in frame["image_path"]])
        positives = (frame["label__pneumonia"] == 1).to_numpy()
        assert abs(marked[positives].mean() - rate) < 0.1, site
    metrics = (cell / "runs" / "FedGP_Auto-seed0" / "metrics.jsonl").read_text().splitlines()
    assert '"sigma2"' in metrics[-1]
    # a second call trains nothing (finished runs are kept) and compares variants paired by seed
    bench.main(["--npz", str(small_npz), "--work", str(work), "--out", str(out), "--shifts", "shortcut", "--labels",
                "10", "--rounds", "3", "--methods", "Target_Only", "--seeds", "1", "--set", "source.steps=2",
                "--versus", "default"])
    versus = pd.read_csv(out / "regime_versus_default.csv")
    assert len(versus) == 2 and (versus["diff"] == 0).all()


def test_each_method_makes_at_most_the_rounds_target_passes_and_each_seed_its_own_label_draw():
    bench = load_bench("bench_regime")
    offline = bench.run_settings("Finetune_Offline", 3, 20)
    assert "finetune_offline_epochs=20" in offline and "target_train.label_draw=3" in offline and "seed=3" in offline
    assert not any("finetune_offline" in s for s in bench.run_settings("FedAvg_Finetune", 3, 20))
    assert not any("finetune_offline" in s  # a cell that sets the passes itself (the first map's 50) keeps them
                   for s in bench.run_settings("Finetune_Offline", 3, 20, cell_keys={"finetune_offline_epochs"}))
    assert not any("label_draw" in s for s in bench.run_settings("FedGP", 1, 20, label_draw="fixed"))
    assert "steps" not in bench.REGIME_CONFIG["source"] and bench.REGIME_CONFIG["source"]["epochs"] == 1


@pytest.mark.slow  # 4 runs and 8 fold runs of the tiny slice: ~15-40 s on 2 cores
def test_the_chooser_gets_a_selected_row_per_seed_from_its_fold_runs(small_npz, tmp_path, one_torch_thread):
    bench = load_bench("bench_regime")
    out, work = tmp_path / "results", tmp_path / "work"
    runs = bench.main(["--npz", str(small_npz), "--work", str(work), "--out", str(out), "--shifts", "none",
                       "--labels", "12", "--rounds", "2", "--methods", "Target_Only", "FedAvg_Finetune",
                       "--seeds", "2", "--set", "source.steps=1", "--select", "--select-candidates", "Target_Only",
                       "FedAvg_Finetune", "--select-folds", "2"])
    selected = runs.loc[runs["method"] == "Selected"].sort_values("seed")
    assert list(selected["seed"]) == [0, 1] and set(selected["chosen"]) <= {"Target_Only", "FedAvg_Finetune"}
    for _, row in selected.iterrows():  # the Selected row is the chosen method's own run of that seed
        own = runs.loc[(runs["method"] == row["chosen"]) & (runs["seed"] == row["seed"])]
        assert own["auroc"].iloc[0] == row["auroc"]
    select = work / "sweep" / "default" / "none-n12-r2" / "select"
    assert len(list(select.glob("*-fold*"))) == 8 and not list(select.glob("*/report.json"))  # never scored on test
    verdicts = pd.read_csv(out / "regime_verdicts.csv")
    assert verdicts["selected_n"].iloc[0] == 2 and np.isfinite(verdicts["selected_regret"].iloc[0])
    # the two seeds drew different labeled rows
    draws = runs.loc[runs["method"] != "Selected", "label_draw"]
    assert set(draws) == {0, 1}
    # each choice's scores and margin, kept beyond the runs folder (a new checkout has no fold runs)
    table = bench.choices(work, "default").sort_values("seed")
    assert list(table["chosen"]) == list(selected["chosen"])
    for _, row in table.iterrows():
        assert {row["chosen"], row["runner_up"]} == {"Target_Only", "FedAvg_Finetune"}
        assert row["margin"] == pytest.approx(row[f"oof_{row['chosen']}"] - row[f"oof_{row['runner_up']}"])
        assert row["margin"] >= 0 and (np.isnan(row["margin_lo"]) or row["margin_lo"] <= row["margin"] <= row["margin_hi"])
    maps = load_bench("regime_map")
    kept = tmp_path / "choices.csv"
    maps.keep_choices(work.parent / "work_default_as_map", kept)  # nothing there, nothing kept yet
    assert not kept.exists()
    (work / "sweep" / maps.VARIANT).symlink_to(work / "sweep" / "default")  # the map's variant name
    maps.keep_choices(work, kept)
    maps.keep_choices(tmp_path / "fresh", kept)  # a new checkout's empty runs folder keeps them
    assert len(pd.read_csv(kept)) == 2 and set(pd.read_csv(kept)["variant"]) == {maps.VARIANT}
    # a new checkout (an empty runs folder) with the ledger of these runs trains nothing, fold runs included
    ledger = tmp_path / "ledger.csv"
    bench.regime_ledger.save(runs.assign(variant="default")[["variant", *bench.RUN_COLUMNS]], ledger)
    fresh = tmp_path / "fresh"
    again = bench.main(["--npz", str(small_npz), "--work", str(fresh), "--out", str(out), "--shifts", "none",
                        "--labels", "12", "--rounds", "2", "--methods", "Target_Only", "FedAvg_Finetune",
                        "--seeds", "2", "--set", "source.steps=1", "--select", "--select-candidates", "Target_Only",
                        "FedAvg_Finetune", "--select-folds", "2", "--ledger", str(ledger)])
    cell = fresh / "sweep" / "default" / "none-n12-r2"
    assert not list(cell.glob("runs/*/final_model.pt")) and not list(cell.glob("select/*-fold*"))
    def facts(frame: pd.DataFrame) -> list[tuple]:
        return sorted(zip(frame["method"], frame["seed"], frame["auroc"], frame["chosen"].fillna("")))

    assert facts(again) == facts(runs)  # every run and each seed's choice, from the ledger alone


def test_label_noise_flips_the_sources_training_labels_only(small_npz, tmp_path):
    sites = load_bench("regime_sites")
    manifests = sites.bench_shift.prepare_sites(small_npz, tmp_path, n_sources=3, target_split=(0.45, 0.15, 0.40))
    sources, target = sites.cell_sites(manifests, tmp_path, "labelnoise40")
    assert target == (manifests / "target-base").resolve()
    flipped = kept = 0
    for k, site in enumerate(sources, start=1):
        before, after = read_manifest(manifests / f"site-{k}"), read_manifest(site)
        assert after["patient_id"].equals(before["patient_id"])
        changed = (after["label__pneumonia"] != before["label__pneumonia"]).to_numpy()
        assert not changed[(after["split"] != "train").to_numpy()].any()
        flipped, kept = flipped + changed.sum(), kept + (~changed[(after["split"] == "train").to_numpy()]).sum()
    assert 0.2 < flipped / (flipped + kept) < 0.6  # 40 % of about 55 training rows


def test_hetero_sources_each_get_their_own_shift(small_npz, tmp_path):
    sites = load_bench("regime_sites")
    manifests = sites.bench_shift.prepare_sites(small_npz, tmp_path, n_sources=3, target_split=(0.45, 0.15, 0.40))
    sources, target = sites.cell_sites(manifests, tmp_path, "hetero")
    assert target == (manifests / "target-base").resolve()
    means = []
    for k, site in enumerate(sources, start=1):
        meta = read_site_json(site)
        assert sites.HETERO_SOURCES[k][0] in str(meta.get("options")), meta.get("options")
        frame, root = read_manifest(site), meta["export_root"]
        means.append(np.mean([read_image_resized(f"{root}/{p}", 28).mean() for p in frame["image_path"][:10]]))
    assert len({round(m, 1) for m in means}) == 3  # three different looks
    _, shifted = sites.cell_sites(manifests, tmp_path, "hetero_mix4")
    assert shifted.parent.name == "mix4"
    with pytest.raises(SystemExit, match="hetero_"):
        sites.cell_sites(manifests, tmp_path, "hetero_shortcut")


def test_kermanys_real_224_px_xrays_become_the_same_sites_at_any_resolution(shared_data, tmp_path):
    """The resolution check's sites: Kermany's labels.csv through `fedcxr ingest csv` (every 20th row here), its
    official train rows dealt to 3 sources, its test rows the target; a patient is `<split>-<id>` (ids repeat
    across the release's splits), so no child straddles sources and target and no row is lost."""
    sites = load_bench("regime_sites")
    manifests = sites.prepare_kermany_sites(shared_data / "kermany-pediatric-pneumonia", tmp_path,
                                            target_split=(0.5, 0.1, 0.4), every=20)
    frames = {name: read_manifest(manifests / name) for name in ("site-1", "site-2", "site-3", "target-base")}
    assert sum(len(f) for f in frames.values()) == len(range(0, 1705, 20))
    source_ids = set().union(*(set(frames[f"site-{k}"]["patient_id"]) for k in (1, 2, 3)))
    assert all(p.startswith("train-") for p in source_ids)
    assert all(p.startswith("test-") for p in frames["target-base"]["patient_id"])
    assert set(frames["target-base"]["split"]) <= {"train", "val", "test"}
    assert frames["target-base"]["label__pneumonia"].isin([0, 1]).all()
    meta = read_site_json(manifests / "target-base")
    image = read_image_resized(f"{meta['export_root']}/{frames['target-base']['image_path'].iloc[0]}", 64)
    assert image.shape == (64, 64)
