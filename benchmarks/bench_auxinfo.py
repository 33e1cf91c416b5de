"""AuxInfo (demographic auxiliary heads) with and without GP, where demographics carry signal.

Why here: PneumoniaMNIST, the regime map's data, has no demographics, so AuxInfo cannot be
measured there. The synthetic hospitals of ``fedcxr synth`` can: each patient's age moves the
bones' brightness and every finding's prevalence, sex changes the chest's outline, and AP views
come with acute findings (``fedcxr/synth/cohort.py``, ``phantom.py``), so the auxiliary tasks (sex,
age bin, race, view) share features with the findings — the AuxInfo+GP paper's premise. (The
covid-chestxray subset in ``../shared/data`` has real sex and age, but 303 images over six sites
leave test splits of a handful of images per site; see BENCHMARKS.md.)

Setting: the demo's (``fedcxr demo``): four hospitals of 500 images each at 64 px in their native
formats, ingested with their real adapters; target ``dicom_style``, sources the other three; the
demo's config (:func:`fedcxr.workflows.demo.demo_config`: resnet_tiny, 10 rounds, sources lr 2e-3
one pass a round, target lr 1e-3 two passes a round, augmentation on) with ``target_train.labeled``
and ``rounds`` per setting (:data:`SETTINGS`). Scored: mean test AUROC over the target's classes.
Per setting and seed, the paper's pairs are compared paired by seed (95 % t-interval):
``FedAvg_Finetune_AuxInfo_GP − FedAvg_Finetune_GP`` and ``FedAvg_Finetune_AuxInfo − FedAvg_Finetune``.

    nice -n 10 python benchmarks/bench_auxinfo.py --work runs/bench_auxinfo --seeds 5 --workers 2
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_regime  # noqa: E402
import bench_shift  # noqa: E402

REPO = HERE.parent
METHODS = ["Target_Only", "FedAvg_Finetune", "FedAvg_Finetune_AuxInfo", "FedAvg_Finetune_GP",
           "FedAvg_Finetune_AuxInfo_GP"]
#: the paper's comparisons: (with AuxInfo, without)
PAIRS = [("FedAvg_Finetune_AuxInfo_GP", "FedAvg_Finetune_GP"), ("FedAvg_Finetune_AuxInfo", "FedAvg_Finetune"),
         ("FedAvg_Finetune_AuxInfo_GP", "Target_Only"), ("FedAvg_Finetune", "Target_Only")]
#: setting name → config overrides on the demo's config. ``demo``: exactly ``fedcxr demo`` (half of the
#: target's training labels, 10 rounds); ``scarce50``: 50 labeled target rows, the papers' 50 rounds.
SETTINGS: dict[str, dict] = {
    "demo": {},
    "scarce50": {"target_train.labeled": 50, "rounds": 50},
}
TARGET = "dicom_style"


def prepare(work: Path, images_per_site: int, image_size: int) -> Path:
    """The demo's four hospitals, written and ingested once; returns the manifests dir."""
    from fedcxr.synth import ingest_synthetic, write_synthetic_export

    export, manifests = work / "export", work / "manifests"
    if not (manifests / TARGET / "site.json").is_file():
        write_synthetic_export(export, images_per_site=images_per_site, image_size=image_size, seed=0)
        ingest_synthetic(export, manifests)
    return manifests


def setting_config(work: Path, manifests: Path, setting: str, overrides: Sequence[str]) -> Path:
    from fedcxr.workflows.demo import demo_config
    from fedcxr.pipeline.config import apply_overrides

    sites = sorted(p.name for p in manifests.iterdir() if (p / "site.json").is_file())
    cfg = demo_config(manifests, sites, TARGET, quick=False)
    cfg.update({"device": "cpu", "eval_every": 0, "cache_dir": str((work / "cache").resolve())})
    cfg = apply_overrides(cfg, [f"{k}={v}" for k, v in SETTINGS[setting].items()] + list(overrides))
    out = work / "sweep" / setting
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    bench_shift.warm_caches(path)
    return path


def collect(work: Path) -> pd.DataFrame:
    rows = []
    for report in sorted((work / "sweep").glob("*/runs/*/report.json")):
        run_dir = report.parent
        method, seed = run_dir.name.rsplit("-seed", 1)
        site = json.loads(report.read_text())["sites"].get(TARGET, {})
        rows.append({"setting": run_dir.parents[1].name, "method": method, "seed": int(seed),
                     "auroc": float(site.get("mean_auroc") if site.get("mean_auroc") is not None else "nan")})
    return pd.DataFrame(rows, columns=["setting", "method", "seed", "auroc"])


def tables(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per setting × method: mean [95 % t-interval]; per setting × pair: paired difference."""
    cells, pairs = [], []
    for (setting, method), group in runs.groupby(["setting", "method"]):
        mean, lo, hi = bench_shift.t_interval(group["auroc"].tolist())
        cells.append({"setting": setting, "method": method, "n": len(group), "mean": mean, "lo": lo, "hi": hi})
    for setting, group in runs.groupby("setting"):
        by_seed = group.pivot_table(index="seed", columns="method", values="auroc")
        for a, b in PAIRS:
            if a in by_seed and b in by_seed:
                both = by_seed[[a, b]].dropna()
                mean, lo, hi = bench_shift.t_interval((both[a] - both[b]).tolist())
                verdict = "better" if lo > 0 else "worse" if hi < 0 else "unresolved"
                pairs.append({"setting": setting, "method": a, "versus": b, "n": len(both), "diff": mean, "lo": lo,
                              "hi": hi, "verdict": verdict})
    return pd.DataFrame(cells), pd.DataFrame(pairs)


def markdown(cells: pd.DataFrame, pairs: pd.DataFrame) -> str:
    out = []
    for setting, group in cells.groupby("setting"):
        out += [f"### {setting}", "", "| method | n | mean test AUROC over the target's classes [95 % t-interval] |",
                "|---|---|---|"]
        order = {m: i for i, m in enumerate(METHODS)}
        for _, r in group.sort_values("method", key=lambda s: s.map(order)).iterrows():
            out.append(f"| {r['method']} | {r['n']} | {r['mean']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}] |")
        out += ["", "| comparison | n | paired difference [95 % t-interval] | verdict |", "|---|---|---|---|"]
        for _, r in pairs.loc[pairs["setting"] == setting].iterrows():
            out.append(f"| {r['method']} − {r['versus']} | {r['n']} | {r['diff']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}] "
                       f"| {r['verdict']} |")
        out.append("")
    return "\n".join(out)


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=REPO / "runs" / "bench_auxinfo")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--stem", default="auxinfo")
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--methods", nargs="+", default=METHODS)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--manifests", type=Path, default=None,
                   help="an already ingested synthetic federation (default: write and ingest the demo's in WORK)")
    p.add_argument("--images-per-site", type=int, default=500, help="the demo's 500")
    p.add_argument("--image-size", type=int, default=64, help="the demo's 64 px")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every run (the smoke test's speed settings)")
    p.add_argument("--workers", type=int, default=1)
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> pd.DataFrame:
    import torch

    args = parse(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    start = time.time()
    manifests = args.manifests or prepare(args.work, args.images_per_site, args.image_size)
    jobs = []
    for setting in args.settings:
        config = setting_config(args.work, manifests, setting, args.overrides)
        jobs += [(str(config), m, s, str(config.parent / "runs" / f"{m}-seed{s}"))
                 for s in range(args.seeds) for m in args.methods]
    bench_regime.run_jobs(jobs, args.workers)
    runs = collect(args.work)
    cells, pairs = tables(runs)
    args.out.mkdir(parents=True, exist_ok=True)
    runs.sort_values(["setting", "method", "seed"]).to_csv(args.out / f"{args.stem}_runs.csv", index=False)
    cells.to_csv(args.out / f"{args.stem}.csv", index=False)
    pairs.to_csv(args.out / f"{args.stem}_pairs.csv", index=False)
    meta = {"settings": {s: SETTINGS[s] for s in args.settings}, "overrides": args.overrides, "seeds": args.seeds,
            "images_per_site": args.images_per_site, "image_size": args.image_size, "target": TARGET,
            "wall_s": round(time.time() - start)}
    md = markdown(cells, pairs)
    (args.out / f"{args.stem}.md").write_text(f"{md}\n```json\n{json.dumps(meta, indent=1)}\n```\n")
    print(md)
    print(f"total {time.time() - start:.0f} s; outputs in {args.out}")
    return runs


if __name__ == "__main__":
    main()
