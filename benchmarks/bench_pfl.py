"""Personalised FL: Ditto, FedRep, FedPer, APFL and FedBABU beside FedAvg_Finetune and FedBN (issue 29 item 2).

Every method is judged the way personalised methods are: **each site's own model on its own test
split** (its personal model, head or BatchNorm statistics, or for FedAvg_Finetune the model it
fine-tuned as the target), and a run's number is the mean over the sites of each site's mean test
AUROC. Methods are paired over seeds with FedBN and with FedAvg_Finetune (Student-t 95 % intervals of
the per-seed differences, as ``bench_baselines.py``).

Two settings, fixed before any result was seen:

* ``pneumonia`` — real PneumoniaMNIST with Dirichlet label skew, ``skew:4:alpha=0.3`` under
  ``bench_baselines.py``'s fixed pseudonym key (the same four sites it deals); all four sites
  federate; ``resnet_tiny`` at 28 px, 20 rounds, each site 16 steps of 32 images per round
  (:data:`PNEUMONIA`);
* ``classhet`` — the synthetic class-heterogeneous hospitals of ``bench_classhet.py`` (four sites
  labelling different class subsets, through the real adapters; the head covers the union, each site
  is scored on the classes it labels), its ``BASE_CONFIG`` (10 rounds, one local epoch), random init.

Methods and their budgets (every one the same local budget per round and site, except where said):

* ``Ditto`` (λ = 0.1), ``FedRep``, ``FedPer`` (head personal), ``APFL`` (α from 0.5, adaptive),
  ``FedBABU`` (5 fine-tuning epochs after the last round) at their defaults, except FedRep's head budget: the paper's 10 head epochs per body epoch is set to
  the body's budget here (``fedrep.head_steps`` = the round's steps; ``head_epochs: 1`` on
  ``classhet``), so every method spends comparable compute; Ditto and APFL train two models a round
  (twice the local compute: the methods' own cost);
* ``FedBN`` — ``FedAvg`` with ``backbone_aggregation: fedbn``, each site with its own BN statistics;
* ``FedAvg_Finetune`` — each site in turn the target: the other three federate (FedAvg) and the
  target fine-tunes the round's model on all its training labels with the sources' budget
  (``target_train`` = ``source``), scored on its own test split (four runs per seed);
* for context ``FedAvg`` (the one global model on every site) and ``Individual`` (each site alone).

Outputs (``--out``): ``pfl_runs.csv`` (dataset, method, seed, site, AUROC), ``pfl.csv`` and
``pfl.md`` (mean [95 % interval] per method; paired differences with FedBN and FedAvg_Finetune).

Re-run (the full grid: 2 × 5 seeds × 12 runs; estimated 1 h 50 min with one worker, about 1 h 5 min with
``--workers 2`` on two idle CPU cores — BENCHMARKS.md "Personalised FL" says how it was estimated)::

    nice -n 15 python benchmarks/bench_pfl.py --work runs/bench_pfl --out benchmarks/results --seeds 5 --workers 2

A small version (3 min here): ``--seeds 2 --rounds 3 --set source.steps=4 --images-per-site 200``.
Finished runs are skipped (they are ``fedcxr sweep`` runs), so an interrupted grid continues.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # real modules: their functions must pickle into the worker processes
import bench_baselines  # noqa: E402
import bench_classhet  # noqa: E402
import bench_shift  # noqa: E402

REPO = HERE.parent
PERSONAL = ["Ditto", "FedRep", "FedPer", "APFL", "FedBABU"]
CONTEXT = ["FedAvg", "Individual"]
REFERENCES = ["FedBN", "FedAvg_Finetune"]
LABELS = [*PERSONAL, *REFERENCES, *CONTEXT]
DATASETS = ("pneumonia", "classhet")

#: PneumoniaMNIST label skew: bench_baselines' setting with every site federating (no target).
PNEUMONIA: dict = {
    "name": "pfl-pneumonia",
    "rounds": 20,
    "source": {"lr": 1.0e-3, "batch_size": 32, "steps": 16},
    "model": {"backbone": "resnet_tiny", "hidden": 64},
    "image_size": 28,
    "augment": False,
    "device": "cpu",
    "eval_every": 0,
}

log = logging.getLogger("bench_pfl")


# --------------------------------------------------------------------------- settings


def setting(dataset: str, args: argparse.Namespace) -> tuple[dict, list[str]]:
    """The base config (manifests resolved) and the sites of one dataset."""
    work = args.work / dataset
    if dataset == "pneumonia":
        manifests = bench_baselines.prepare(args.npz, work)
        base = json.loads(json.dumps(PNEUMONIA))
        sites = ["site-1", "site-2", "site-3", "site-4"]
    else:
        manifests = bench_classhet.prepare_sites(work, bench_classhet.SITES, images_per_site=args.images_per_site,
                                                 export_size=args.export_size)
        base = {k: v for k, v in json.loads(json.dumps(bench_classhet.BASE_CONFIG)).items() if k != "head_warmup"}
        base["name"] = "pfl-classhet"
        sites = list(bench_classhet.SITES)
    base.update({"manifests": str(manifests.resolve()), "cache_dir": str((work / "cache").resolve()),
                 "sites": sites, "rounds": args.rounds or base["rounds"]})
    return base, sites


def local_budget(base: dict, overrides: Sequence[str]) -> dict:
    """The sources' ``source:`` block after the command line's overrides: FedRep's head and
    FedAvg_Finetune's target get the same budget."""
    from fedcxr.pipeline.config import apply_overrides

    return dict(apply_overrides(base, list(overrides))["source"])


def jobs(dataset: str, args: argparse.Namespace) -> list[tuple]:
    """``(config, methods, seeds, out, overrides)`` of every sweep of a dataset (``bench_shift.run_levels``)."""
    base, sites = setting(dataset, args)
    sweep = args.work / dataset / "sweep"
    source = local_budget(base, args.overrides)
    base["fedrep"] = {"head_steps": source["steps"]} if source.get("steps") else {"head_epochs": source.get("epochs", 1)}

    def write(name: str, cfg: dict) -> Path:
        (sweep / name).mkdir(parents=True, exist_ok=True)
        path = sweep / name / "config.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return path

    out = [(write("personal", base), [*PERSONAL, *CONTEXT], args.seeds, sweep / "personal", args.overrides),
           (write("fedbn", {**base, "backbone_aggregation": "fedbn"}), ["FedAvg"], args.seeds, sweep / "fedbn",
            args.overrides)]
    for target in sites:
        cfg = {**base, "sites": [s for s in sites if s != target], "target": target,
               "target_train": {**source}}  # the target fine-tunes with the sources' budget, every label
        out.append((write(f"finetune-{target}", cfg), ["FedAvg_Finetune"], args.seeds, sweep / f"finetune-{target}",
                    args.overrides))
    return out


# --------------------------------------------------------------------------- results


def site_aurocs(run_dir: Path, sites: Optional[Sequence[str]] = None) -> dict[str, float]:
    """Each evaluated site's mean test AUROC (NaN where undefined) from ``report.json``."""
    report = json.loads((run_dir / "report.json").read_text())
    out = {}
    for site, row in report["sites"].items():
        if sites is None or site in sites:
            value = row.get("mean_auroc")
            out[site] = float(value) if value is not None else math.nan
    return out


def collect(work: Path, datasets: Sequence[str], seeds: int) -> pd.DataFrame:
    """One row per (dataset, method, seed, site): that site's own model on its own test split."""
    rows = []
    for dataset in datasets:
        sweep = work / dataset / "sweep"
        if not sweep.is_dir():
            continue
        for seed in range(seeds):
            found = {m: sweep / "personal" / "runs" / f"{m}-seed{seed}" for m in [*PERSONAL, *CONTEXT]}
            found["FedBN"] = sweep / "fedbn" / "runs" / f"FedAvg-seed{seed}"
            for method, run_dir in found.items():
                if (run_dir / "report.json").is_file():
                    rows += [{"dataset": dataset, "method": method, "seed": seed, "site": s, "auroc": a}
                             for s, a in site_aurocs(run_dir).items()]
            for target_dir in sorted(sweep.glob("finetune-*")):
                run_dir = target_dir / "runs" / f"FedAvg_Finetune-seed{seed}"
                target = target_dir.name.removeprefix("finetune-")
                if (run_dir / "report.json").is_file():
                    rows += [{"dataset": dataset, "method": "FedAvg_Finetune", "seed": seed, "site": s, "auroc": a}
                             for s, a in site_aurocs(run_dir, [target]).items()]
    return pd.DataFrame(rows, columns=["dataset", "method", "seed", "site", "auroc"])


def per_seed(frame: pd.DataFrame) -> pd.DataFrame:
    """(dataset, method, seed) → the mean over sites of each site's AUROC (sites with a defined AUROC)."""
    if frame.empty:
        return pd.DataFrame(columns=["dataset", "method", "seed", "auroc", "sites"])
    grouped = frame.dropna(subset=["auroc"]).groupby(["dataset", "method", "seed"])["auroc"]
    return grouped.agg(auroc="mean", sites="count").reset_index()


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (dataset, method): mean [95 % t-interval] over seeds, and paired differences with FedBN and
    FedAvg_Finetune over the seeds both ran (same sites: a seed counts when both cover every site)."""
    seeds = per_seed(frame)
    rows = []
    for (dataset, method), runs in seeds.groupby(["dataset", "method"], sort=False):
        mean, lo, hi = bench_baselines.t_interval(runs["auroc"].tolist())
        row = {"dataset": dataset, "method": method, "n": len(runs), "mean": mean, "lo": lo, "hi": hi}
        mine = runs.set_index("seed")["auroc"]
        for ref in REFERENCES:
            if method == ref:
                continue
            base = seeds.loc[(seeds["dataset"] == dataset) & (seeds["method"] == ref)].set_index("seed")["auroc"]
            both = mine.index.intersection(base.index)
            d, dlo, dhi = bench_baselines.t_interval((mine[both] - base[both]).tolist())
            row.update({f"vs_{ref}": d, f"vs_{ref}_lo": dlo, f"vs_{ref}_hi": dhi, f"vs_{ref}_n": len(both)})
        rows.append(row)
    order = {m: i for i, m in enumerate(LABELS)}
    table = pd.DataFrame(rows)
    return table.sort_values(["dataset", "method"], key=lambda c: c.map(order) if c.name == "method" else c) \
        if not table.empty else table


def _cell(mean: float, lo: float, hi: float, signed: bool = False) -> str:
    if not np.isfinite(mean):
        return "–"
    fmt = "{:+.3f}" if signed else "{:.3f}"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return fmt.format(mean)
    star = " *" if signed and (lo > 0 or hi < 0) else ""
    return f"{fmt.format(mean)} [{fmt.format(lo)}, {fmt.format(hi)}]{star}"


def markdown(table: pd.DataFrame) -> str:
    lines = ["| setting | method | each site's own model, mean test AUROC [95% interval] | vs FedBN | "
             "vs FedAvg_Finetune |", "|---|---|---|---|---|"]
    for _, r in table.iterrows():
        cells = [_cell(r.get(f"vs_{ref}", math.nan), r.get(f"vs_{ref}_lo", math.nan),
                       r.get(f"vs_{ref}_hi", math.nan), signed=True) if r["method"] != ref else "reference"
                 for ref in REFERENCES]
        lines.append(f"| {r['dataset']} | {r['method']} | {_cell(r['mean'], r['lo'], r['hi'])} (n={r['n']}) | "
                     f"{cells[0]} | {cells[1]} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--npz", type=Path, default=bench_baselines.DEFAULT_NPZ)
    p.add_argument("--work", type=Path, default=REPO / "runs" / "bench_pfl", help="manifests, caches and runs")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results", help="tables and CSVs")
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=None, help="default: the setting's (20 pneumonia, 10 classhet)")
    p.add_argument("--images-per-site", type=int, default=800, help="classhet: images per synthetic hospital")
    p.add_argument("--export-size", type=int, default=64, help="classhet: fedcxr synth --image-size")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override for every run (the small version: source.steps=4)")
    p.add_argument("--workers", type=int, default=1, help="sweeps trained at once (processes, one thread each)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for resnet_tiny)")
    p.add_argument("--stem", default="pfl", help="output file stem")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> pd.DataFrame:
    import torch

    args = parse(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    start = time.time()
    todo = [job for dataset in args.datasets for job in jobs(dataset, args)]
    for job in todo:
        bench_shift.warm_caches(job[0])
    bench_shift.run_levels(todo, args.workers)
    frame = collect(args.work, args.datasets, args.seeds)
    table = summary(frame)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / f"{args.stem}_runs.csv", index=False)
    table.to_csv(args.out / f"{args.stem}.csv", index=False)
    meta = {"datasets": args.datasets, "seeds": args.seeds, "rounds": args.rounds, "overrides": args.overrides,
            "pneumonia": {"partition": bench_baselines.PARTITION, "base_config": PNEUMONIA},
            "classhet": {"sites": bench_classhet.SITES, "images_per_site": args.images_per_site,
                         "base_config": bench_classhet.BASE_CONFIG},
            "wall_s": round(time.time() - start), "loadavg": os.getloadavg()}
    md = markdown(table)
    title = (f"Personalised FL, each site's own model on its own test split, {args.seeds} seeds; paired "
             "differences over seeds; * = interval excludes 0")
    (args.out / f"{args.stem}.md").write_text(f"{title}\n\n{md}\n\n```json\n{json.dumps(meta, indent=1)}\n```\n")
    print(md)
    print(f"total {time.time() - start:.0f} s; outputs in {args.out}")
    return frame


if __name__ == "__main__":
    main()
