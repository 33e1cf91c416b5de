"""Smoke test of ``benchmarks/bench_regime.py`` on real PneumoniaMNIST: one cell (the shortcut shift),
two methods, one seed, a tiny slice of the data — sites, marker, runs and the three CSV tables."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedcxr.pipeline.config import load_config
from fedcxr.site_adapters.images import read_image_resized
from fedcxr.site_adapters.manifest import read_manifest, read_site_json

from .conftest import load_bench


def test_one_cell_two_methods_one_seed(small_npz, tmp_path, one_torch_thread):
    bench = load_bench("bench_regime")
    out, work = tmp_path / "results", tmp_path / "work"
    runs = bench.main(["--npz", str(small_npz), "--work", str(work), "--out", str(out), "--shifts", "shortcut",
                       "--labels", "10", "--rounds", "3", "--methods", "Target_Only", "FedGP_Auto", "--seeds", "1",
                       "--set", "source.steps=2"])
    assert sorted(runs["method"]) == ["FedGP_Auto", "Target_Only"] and runs["auroc"].between(0, 1).all()
    assert set(runs[["shift", "labels", "rounds"]].itertuples(index=False, name=None)) == {("shortcut", 10, 3)}
    cells = pd.read_csv(out / "regime_cells.csv")
    assert list(cells.columns) == ["shift", "labels", "rounds", "method", "n", "mean", "lo", "hi"]
    pairs = pd.read_csv(out / "regime_pairs.csv")
    assert len(pairs) == 1 and pairs["verdict"].iloc[0] == "unresolved"  # one seed: no interval
    assert "### shortcut, 10 target labels, 3 rounds" in (out / "regime.md").read_text()
    # the marker: 95 % of pneumonia images at a source, 5 % at the target (and the reverse for normal ones)
    cell = work / "sweep" / "default" / "shortcut-n10-r3"
    cfg = load_config(cell / "config.yaml")
    assert cfg.target_train.batch_size is None  # each method's own default
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


def test_label_noise_flips_the_sources_training_labels_only(small_npz, tmp_path):
    bench = load_bench("bench_regime")
    manifests = bench.bench_shift.prepare_sites(small_npz, tmp_path, n_sources=3, target_split=(0.45, 0.15, 0.40))
    sources, target = bench.cell_sites(manifests, tmp_path, "labelnoise40")
    assert target == (manifests / "target-base").resolve()
    flipped = kept = 0
    for k, site in enumerate(sources, start=1):
        before, after = read_manifest(manifests / f"site-{k}"), read_manifest(site)
        assert after["patient_id"].equals(before["patient_id"])
        changed = (after["label__pneumonia"] != before["label__pneumonia"]).to_numpy()
        assert not changed[(after["split"] != "train").to_numpy()].any()
        flipped, kept = flipped + changed.sum(), kept + (~changed[(after["split"] == "train").to_numpy()]).sum()
    assert 0.2 < flipped / (flipped + kept) < 0.6  # 40 % of about 55 training rows
