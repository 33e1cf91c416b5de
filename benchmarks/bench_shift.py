"""Covariate-shift sweep on real PneumoniaMNIST: where do FedDA / FedGP (and _Auto) help?

The FedDA/FedGP paper's claim, in its own terms: with no shift between the sources and the
target, FedAvg ≈ FedDA > FedGP; as the target drifts away, FedGP(_Auto) ≥ Target_Only > FedDA >
FedAvg and FedDA_Auto ≫ FedDA. This script measures that ordering on real chest X-rays.

Setting (everything built from ``pneumoniamnist_merged.npz``, see ``../shared/data/medmnist``):

* **sources** ``site-1..site-K``: the official *train* rows, dealt to K sites by patient hash
  (IID); inside each site 90% train / 10% val by patient hash;
* **target**: the official *test* images (never seen by the sources), re-split by patient
  hash into its own train / val / test (``--target-split``, default 45/15/40); the target
  fine-tunes on only ``--labeled`` of its train rows (Oracle: on all of them);
* **shift**: the whole target (all its splits) goes through ``fedcxr shift --kind KIND --level
  L`` (:mod:`fedcxr.site_adapters.shift`, seed 0) for each level; the sources stay as they are;
* every method × level × seed is one ``fedcxr sweep`` run (``runs/<method>-seed<k>``) scored
  on the target's test split; the table shows mean AUROC with a 95% t-interval over seeds.

Nothing is tuned on the test split: the network, rounds and learning rates are fixed in
:data:`BASE_CONFIG` (chosen for speed on 2 CPU cores) before any test AUROC was seen.

Re-run (about 3–4 min on 2 idle CPU cores with ``--levels 0 2 3 4 --workers 2``; 30–40 min when
the cores are shared)::

    nice -n 10 python benchmarks/bench_shift.py --work runs/bench_shift --out benchmarks/results

Finished runs are skipped, so an interrupted sweep continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[1]
DEFAULT_NPZ = REPO.parent / "shared" / "data" / "medmnist" / "pneumoniamnist_merged.npz"

METHODS = ["FedAvg", "FedAvg_Finetune", "Finetune_Offline", "FedDA", "FedGP", "FedDA_Auto", "FedGP_Auto",
           "Target_Only", "Oracle"]

#: One config for every run (fixed before any result was seen; only `strategy`, `seed`,
#: `target`, `target_train.labeled` and what the command line sets vary).
BASE_CONFIG: dict = {
    "name": "shift",
    "rounds": 5,
    "source": {"lr": 1.0e-3, "batch_size": 32, "steps": 8},
    "target_train": {"lr": 1.0e-3, "batch_size": 25, "epochs": 1},
    "model": {"backbone": "resnet_tiny", "hidden": 64},
    "image_size": 28,
    "augment": False,
    "device": "cpu",
    "eval_every": 0,
}

log = logging.getLogger("bench_shift")


# --------------------------------------------------------------------------- data


def prepare_sites(npz: Path, work: Path, *, n_sources: int, target_split: Sequence[float],
                  target_from: Sequence[str] = ("test",)) -> Path:
    """Ingest the npz once, write the source sites and the unshifted target; returns the manifests dir.

    ``target_from``: the official splits the target is built from (``test``; ``val test`` for a
    target with enough training rows for 500 labels). Sources are always the official train rows."""
    from fedcxr.site_adapters.ingest import run_ingest
    from fedcxr.site_adapters.manifest import patient_bucket, read_manifest, read_site_json, write_site

    manifests = work / "manifests"
    if (manifests / "target-base" / "site.json").is_file() and (manifests / f"site-{n_sources}" / "site.json").is_file():
        return manifests
    whole = work / "whole"
    run_ingest("medmnist", npz, whole, progress=False)
    meta, frame = read_site_json(whole / "medmnist"), read_manifest(whole / "medmnist")
    # MedMNIST has no patient ids (every image is its own patient); ingest names each by a hash
    # keyed with a fresh random site secret, which would re-deal sites, splits and the labeled
    # target rows on every fresh --work. Name them by their official split and index instead
    # (`<split>-<index>`, the adapter's own names before keying; nothing identifying), so every
    # re-run builds the very sites the published numbers came from.
    official = frame["source_file"].astype(str).str.rsplit(":", n=1).str[-1]
    frame["patient_id"] = official + "-" + (frame["source_row"].astype(int) - 1).astype(str)
    frame["study_id"] = frame["patient_id"]
    root = Path(meta["export_root"])
    classes = list(meta["class_set"])
    train = frame.loc[frame["split"] == "train"].copy()
    bucket = patient_bucket(train["patient_id"], salt="bench-shift-sources")
    train["site"] = (bucket * n_sources).astype(int) + 1
    inner = patient_bucket(train["patient_id"], salt="bench-shift-source-val")
    train["split"] = np.where(inner < 0.1, "val", "train")
    for k in range(1, n_sources + 1):
        write_site(manifests, f"site-{k}", train.loc[train["site"] == k], classes=classes, source="medmnist",
                   adapter_version=meta["adapter_version"], export_root=root, set_aside=[],
                   options={"bench_shift": f"official train rows, patient-hash share {k}/{n_sources}"})
    target = frame.loc[frame["split"].isin(list(target_from))].copy()
    f_train, f_val, _ = target_split
    u = patient_bucket(target["patient_id"], salt="bench-shift-target")
    target["split"] = np.where(u < f_train, "train", np.where(u < f_train + f_val, "val", "test"))
    write_site(manifests, "target-base", target, classes=classes, source="medmnist",
               adapter_version=meta["adapter_version"], export_root=root, set_aside=[],
               options={"bench_shift": f"official {'+'.join(target_from)} rows, re-split {list(target_split)} by patient hash"})
    return manifests


def shifted_target(manifests: Path, work: Path, kind: str, level: int) -> Path:
    """``fedcxr shift`` of the target at one level (seed 0); returns the new site folder."""
    from fedcxr.site_adapters.shift import shift_site

    out = work / "targets" / f"{kind}{level}"
    if not (out / "target" / "site.json").is_file():
        shift_site(manifests / "target-base", out, kind=kind, level=level, seed=0, site_name="target", progress=False)
    return out / "target"


# --------------------------------------------------------------------------- runs


def level_config(work: Path, manifests: Path, target: Path, n_sources: int, labeled: Optional[int], rounds: int,
                 out: Path, *, name: str = "config.yaml", extra: Optional[dict] = None,
                 sites: Optional[Sequence[str]] = None) -> Path:
    """The YAML every run of one level shares (written into the level's sweep folder ``out``);
    ``extra``: more top-level keys (``bench_fact.py``: ``class_source``); ``sites``: the source
    sites (names under ``manifests`` or folders; default ``site-1..site-K``)."""
    cfg = json.loads(json.dumps(BASE_CONFIG))
    cfg.update({"manifests": str(manifests.resolve()),
                "sites": list(sites) if sites else [f"site-{k}" for k in range(1, n_sources + 1)],
                "target": str(target.resolve()), "cache_dir": str((work / "cache").resolve()), "rounds": rounds})
    cfg["target_train"]["labeled"] = labeled
    cfg.update(extra or {})
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def warm_caches(config: Path) -> None:
    """Decode every site once before the runs start (parallel runs must not race to build a cache)."""
    from fedcxr.pipeline.config import load_config
    from fedcxr.pipeline.data import cache_images, load_site

    cfg = load_config(config)
    for site in cfg.all_sites():
        cache_images(load_site(cfg.site_dir(site)), cfg.image_size, cfg.cache_dir, progress=False)


def _run_level_job(job: tuple) -> float:
    """One level in a worker process (one torch thread each); returns its wall time."""
    import torch

    config, methods, seeds, out, overrides = job
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    t0 = time.time()
    run_level(config, methods, seeds, out, overrides)
    return time.time() - t0


def run_levels(jobs: list[tuple], workers: int, job_fn=None) -> None:
    """Every level's sweep, ``workers`` levels at a time (spawned processes); ``job_fn(job)`` runs
    one level and returns its wall time (default: one ``fedcxr sweep``; it must be a module-level
    function of an importable module to reach the workers)."""
    job_fn = job_fn or _run_level_job
    if workers <= 1:
        for job in jobs:
            print(f"{job[3].name}: {job_fn(job):.0f} s")
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        for job, wall in zip(jobs, pool.map(job_fn, jobs)):
            print(f"{job[3].name}: {wall:.0f} s")


def run_level(config: Path, methods: Sequence[str], seeds: int, out: Path, overrides: Sequence[str] = ()) -> None:
    from fedcxr.workflows.sweep import sweep

    sweep(config, methods, seeds=seeds, out=out, baseline="FedAvg_Finetune" if "FedAvg_Finetune" in methods else None,
              device="cpu", settings=list(overrides), progress=False, announce=print)


def run_auroc(run_dir: Path) -> float:
    """Mean test AUROC of the run's target (``report.json``; one class here: pneumonia)."""
    report = json.loads((run_dir / "report.json").read_text())
    value = report["sites"]["target"].get("mean_auroc")
    return float(value) if value is not None else float("nan")


def collect(out: Path, methods: Sequence[str], seeds: int, levels: Sequence[int], key: str = "level", *,
            scored: str = "report.json", score=None) -> pd.DataFrame:
    """Every finished run's AUROC: ``score(run_dir)`` (default :func:`run_auroc`) for each run
    that has the file ``scored``."""
    score = score or run_auroc
    rows = []
    for level in levels:
        for method in methods:
            for seed in range(seeds):
                run_dir = out / f"{key}{level}" / "runs" / f"{method}-seed{seed}"
                if (run_dir / scored).is_file():
                    rows.append({key: level, "method": method, "seed": seed, "auroc": score(run_dir)})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- summary


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and the Student-t interval of the mean over seeds (NaN half-width for one value)."""
    from scipy import stats

    x = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
    if len(x) == 0:
        return math.nan, math.nan, math.nan
    mean = float(x.mean())
    if len(x) < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + confidence / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return mean, mean - half, mean + half


def summary_table(frame: pd.DataFrame, key: str, methods: Sequence[str]) -> pd.DataFrame:
    rows = []
    for (method, value), group in frame.groupby(["method", key]):
        mean, lo, hi = t_interval(group["auroc"].tolist())
        rows.append({"method": method, key: value, "n": len(group), "mean": mean, "lo": lo, "hi": hi})
    table = pd.DataFrame(rows)
    order = {m: i for i, m in enumerate(methods)}
    return table.sort_values(["method", key], key=lambda s: s.map(order) if s.name == "method" else s)


def markdown_table(table: pd.DataFrame, key: str, methods: Sequence[str], header: str) -> str:
    values = sorted(table[key].unique())
    lines = [f"| Method | " + " | ".join(f"{header} {v}" for v in values) + " |",
             "|---|" + "---|" * len(values)]
    best = {v: table.loc[table[key] == v, "mean"].max() for v in values}
    for method in methods:
        cells = []
        for v in values:
            row = table.loc[(table["method"] == method) & (table[key] == v)]
            if row.empty:
                cells.append("–")
                continue
            r = row.iloc[0]
            text = f"{r['mean']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]" if np.isfinite(r["lo"]) else f"{r['mean']:.3f}"
            cells.append(f"**{text}**" if np.isclose(r["mean"], best[v]) else text)
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(table: pd.DataFrame, key: str, methods: Sequence[str], path: Path, *, xlabel: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    cmap = plt.get_cmap("tab10")
    for i, method in enumerate(methods):
        rows = table.loc[table["method"] == method].sort_values(key)
        if rows.empty:
            continue
        x = rows[key].to_numpy(dtype=float)
        style = "--" if method in ("Oracle", "Target_Only") else "-"
        ax.plot(x, rows["mean"], style, marker="o", ms=3.5, color=cmap(i % 10), label=method)
        ax.fill_between(x, rows["lo"], rows["hi"], color=cmap(i % 10), alpha=0.12, linewidth=0)
    if key == "labels":  # 20 … 500: a log axis spaces the counts evenly
        ax.set_xscale("log")
        ax.set_xticks(sorted(table[key].unique()), [str(v) for v in sorted(table[key].unique())])
    ax.set_xlabel(xlabel)
    ax.set_ylabel("target test AUROC (mean, 95% interval over seeds)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2, loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


#: The FedDA/FedGP paper's predicted orderings: (name, better, worse, applies at level 0?).
#: "≈" claims pass when the paired interval contains 0.
PREDICTIONS = [
    ("FedAvg ≈ FedDA", "FedAvg", "FedDA", "none", True),
    ("FedDA > FedGP", "FedDA", "FedGP", "none", True),
    ("FedGP ≥ Target_Only", "FedGP", "Target_Only", "shift", False),
    ("FedGP_Auto ≥ Target_Only", "FedGP_Auto", "Target_Only", "shift", False),
    ("Target_Only > FedDA", "Target_Only", "FedDA", "shift", False),
    ("FedDA > FedAvg", "FedDA", "FedAvg", "shift", False),
    ("FedDA_Auto ≫ FedDA", "FedDA_Auto", "FedDA", "shift", False),
    ("FedGP > FedDA (implied by the chain)", "FedGP", "FedDA", "shift", False),
    ("FedGP_Auto > FedAvg (implied by the chain)", "FedGP_Auto", "FedAvg", "shift", False),
]


def paired_diff(frame: pd.DataFrame, key: str, value, a: str, b: str) -> tuple[float, float, float, int]:
    """Mean of AUROC(a) − AUROC(b) over seeds both have, with its 95% t-interval."""
    at = frame.loc[frame[key] == value]
    x = at.loc[at["method"] == a].set_index("seed")["auroc"]
    y = at.loc[at["method"] == b].set_index("seed")["auroc"]
    both = x.index.intersection(y.index)
    mean, lo, hi = t_interval((x[both] - y[both]).tolist())
    return mean, lo, hi, len(both)


def verdict(claim: str, lo: float, hi: float) -> str:
    """holds / reversed / unresolved for a paired interval (≈: holds when it contains 0)."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "n/a"
    if "≈" in claim:
        return "holds (no difference detected)" if lo <= 0 <= hi else "does not hold (they differ)"
    if lo > 0:
        return "holds"
    if hi < 0:
        return "reversed"
    return "unresolved (interval spans 0)"


def prediction_table(frame: pd.DataFrame, key: str = "level", claims: Optional[Sequence[tuple]] = None) -> str:
    """Each predicted ordering at the levels it applies to: paired difference over seeds and the verdict.

    ``claims``: rows as :data:`PREDICTIONS` (default), whose ``when`` is ``"none"`` (level 0 only),
    ``"shift"`` (levels > 0) or ``"all"``."""
    lines = ["| claim | level | mean diff [95% interval], n seeds | verdict |", "|---|---|---|---|"]
    for claim, a, b, when, _ in (PREDICTIONS if claims is None else claims):
        for value in sorted(frame[key].unique()):
            if when != "all" and (when == "none") != (value == 0):
                continue
            mean, lo, hi, n = paired_diff(frame, key, value, a, b)
            if n == 0:
                continue
            lines.append(f"| {claim} | {value} | {mean:+.3f} [{lo:+.3f}, {hi:+.3f}], n={n} | {verdict(claim, lo, hi)} |")
    return "\n".join(lines)


def write_outputs(frame: pd.DataFrame, key: str, methods: Sequence[str], out: Path, stem: str, *,
                  header: str, xlabel: str, title: str, meta: dict,
                  claims: Optional[Sequence[tuple]] = None) -> pd.DataFrame:
    table = summary_table(frame, key, methods)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / f"{stem}_runs.csv", index=False)
    table.to_csv(out / f"{stem}.csv", index=False)
    md = markdown_table(table, key, methods, header)
    if key == "level":
        md += "\n\nThe papers' predicted orderings (paired over seeds):\n\n" + prediction_table(frame, key, claims)
    (out / f"{stem}.md").write_text(f"{title}\n\n{md}\n\n```json\n{json.dumps(meta, indent=1, default=str)}\n```\n")
    plot(table, key, methods, out / f"{stem}.png", xlabel=xlabel, title=title)
    print(md)
    return table


# --------------------------------------------------------------------------- other grids


def run_grid(args: argparse.Namespace, key: str, values: Sequence, overrides_of, labeled_of=None) -> pd.DataFrame:
    """One shift level (``args.levels[0]``), a grid over ``key``: each value is one sweep with
    ``overrides_of(value)`` (and ``labeled_of(value)`` target labels); returns the runs' AUROCs.
    Used by ``bench_beta.py`` and ``bench_labels.py``."""
    import torch

    torch.set_num_threads(args.threads)
    manifests = prepare_sites(args.npz, args.work, n_sources=args.sources, target_split=args.target_split,
                              target_from=args.target_from)
    target = shifted_target(manifests, args.work, args.kind, args.levels[0])
    sweep = args.work / "sweep" / args.stem
    jobs = []
    for value in values:
        labeled = labeled_of(value) if labeled_of else args.labeled
        out = sweep / f"{key}{value}"
        config = level_config(args.work, manifests, target, args.sources, labeled, args.rounds, out)
        warm_caches(config)
        jobs.append((config, args.methods, args.seeds, out, [*args.overrides, *overrides_of(value)]))
    run_levels(jobs, args.workers)
    return collect(sweep, args.methods, args.seeds, values, key=key)


# --------------------------------------------------------------------------- main


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--npz", type=Path, default=DEFAULT_NPZ)
    p.add_argument("--work", type=Path, default=REPO / "runs" / "bench_shift", help="manifests, caches and runs")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results", help="table, CSV and figure")
    p.add_argument("--kind", default="mix", choices=["noise", "gamma", "blur", "mix"])
    p.add_argument("--levels", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--methods", nargs="+", default=METHODS)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--sources", type=int, default=3)
    p.add_argument("--labeled", type=int, default=50, help="labeled target rows (Oracle: all)")
    p.add_argument("--rounds", type=int, default=BASE_CONFIG["rounds"])
    p.add_argument("--target-from", nargs="+", default=["test"], choices=["val", "test"],
                   help="official splits the target is built from (sources: always official train)")
    p.add_argument("--target-split", type=float, nargs=3, default=[0.45, 0.15, 0.40], metavar=("TRAIN", "VAL", "TEST"))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override for every run (e.g. beta=0.3)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for resnet_tiny at 28 px)")
    p.add_argument("--workers", type=int, default=1, help="levels trained at once (processes, one thread each)")
    p.add_argument("--stem", default=None, help="output file stem; unset: shift_<kind>")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> pd.DataFrame:
    import torch

    args = parse(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    start = time.time()
    stem = args.stem or f"shift_{args.kind}"
    sweep = args.work / "sweep" / stem
    manifests = prepare_sites(args.npz, args.work, n_sources=args.sources, target_split=args.target_split,
                              target_from=args.target_from)
    jobs = []
    for level in args.levels:
        target = shifted_target(manifests, args.work, args.kind, level)
        config = level_config(args.work, manifests, target, args.sources, args.labeled, args.rounds,
                              sweep / f"level{level}")
        warm_caches(config)
        jobs.append((config, args.methods, args.seeds, sweep / f"level{level}", args.overrides))
    run_levels(jobs, args.workers)
    frame = collect(sweep, args.methods, args.seeds, args.levels)
    for level in args.levels:  # fedcxr sweep's per-level table: clustered DeLong vs FedAvg_Finetune, BH q-values
        comparison = sweep / f"level{level}" / "comparison.md"
        if comparison.is_file():
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{stem}_level{level}_comparison.md").write_text(comparison.read_text())
    meta = {"kind": args.kind, "levels": args.levels, "seeds": args.seeds, "sources": args.sources,
            "labeled": args.labeled, "rounds": args.rounds, "target_split": args.target_split,
            "overrides": args.overrides, "base_config": BASE_CONFIG, "wall_s": round(time.time() - start)}
    write_outputs(frame, "level", args.methods, args.out, stem, header="level", xlabel=f"{args.kind} shift level (0 = none)",
                  title=f"PneumoniaMNIST, target = official test images under `{args.kind}` shift, "
                        f"{args.labeled} target labels, {args.seeds} seeds", meta=meta)
    print(f"total {time.time() - start:.0f} s; outputs in {args.out}")
    return frame


if __name__ == "__main__":
    main()
