"""Class heterogeneity (surgical aggregation paper): FL_Surgical vs FL_PartialLoss vs FL vs Individual.

The paper's claim: when sites label different subsets of a multi-label class set, FL_Surgical
(head rows averaged per class over the sites that label it) beats FL_PartialLoss (one global
head, each site's loss over its own classes) and FL (missing classes taken as negatives), above
all on the classes only one site labels, comparably on the shared ones, and matches or beats
Individual (each site alone) on the sites' own test sets while being one model for every class;
FedBN+ is its best norm variant. This script measures those orderings.

**Synthetic on purpose**: the only real multi-label chest X-ray data here is too small (NIH
sample: 25 images; covid-chestxray-dataset: 303 images, site-confounded). The four synthetic
hospitals of :mod:`fedcxr.synth` (the ``fedcxr demo`` data) label different class subsets by
construction and go through the real adapters (native export → ``fedcxr ingest``):

* ``nih_style``: NIH-14 + no_finding (7 classes only it labels: infiltration, mass, ...);
* ``chexpert_style``: CheXpert-14 (6 classes only it labels: lung_opacity, fracture, ...);
* ``dicom_style``: 8 findings shared with both, plus covid19;
* ``midrc_style``: covid19 only.

Every run's head covers the union (22 classes, ``class_source: union``). Each site's test split
is scored on the classes it labels with the model it would deploy (its own for Individual, the
global one with its own BatchNorm statistics under FedBN/FedBN+). Per run: the mean over sites
of each site's mean AUROC, and the mean AUROC over (site, class) pairs of **shared** classes
(labelled at ≥ 2 sites) and of **unique** classes (labelled at one site only), as the paper's
Table 3; and — what only synthetic data allows — the mean AUROC over (site, class) pairs the
site does **not** label (another site does), scored against the generator's truth
(:mod:`fedcxr.synth.truth`; the paper's closest analysis is its fully labelled external MIMIC
test set). Tables: mean with a 95% t-interval over seeds; the paper's orderings as paired
differences over seeds; per norm mode ``fedcxr compare``'s patient-clustered DeLong per class
(BH q-values) and paired t over class AUROCs, FL_Surgical as the baseline.

Backbone: ``resnet_tiny`` (BatchNorm), optionally pretrained (``--pretrain``, default on) by a
``Central`` run on real PneumoniaMNIST (its official train + val rows; disjoint from the synthetic
hospitals) — the stand-in for the paper's ImageNet weights, so that FedBN+ (BatchNorm frozen at
the pretrained statistics) means what it means there rather than "no normalisation".
Individual does not federate, so its runs do not depend on the norm mode: it is trained once
per seed and shown (the same runs) in every norm column.

Nothing is tuned on the test split: :data:`BASE_CONFIG` and the data sizes were fixed (for
speed on 2 CPU cores) before any comparison was seen. Re-run (about 13 min on 2 busy CPU cores)::

    nice -n 10 python benchmarks/bench_classhet.py --work runs/bench_classhet --out benchmarks/results

Finished runs are skipped, so an interrupted sweep continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # a real module: its functions must pickle into the worker processes
import bench_shift  # noqa: E402

REPO = HERE.parent
SITES = ["nih_style", "chexpert_style", "dicom_style", "midrc_style"]
FEDERATED = ["FL", "FL_PartialLoss", "FL_Surgical"]
METHODS = ["Individual", *FEDERATED]
NORMS = ["fedavg", "fedbn", "fedbn_plus"]
METRICS = {"sites": "mean over sites (each on its own classes)", "shared": "shared classes (≥ 2 sites)",
           "unique": "unique classes (1 site)", "unlabelled": "classes the site does not label (synthetic truth)"}

#: One config for every run (fixed before any result was seen; only `strategy`, `seed`,
#: `backbone_aggregation`, `model.weights` and what the command line sets vary).
BASE_CONFIG: dict = {
    "name": "classhet",
    "class_source": "union",
    "rounds": 10,
    "source": {"lr": 2.0e-3, "batch_size": 32, "epochs": 1},
    "head_warmup": {"epochs": 3, "lr": 1.0e-3},
    "model": {"backbone": "resnet_tiny", "hidden": 64},
    "image_size": 48,
    "augment": False,
    "device": "cpu",
    "eval_every": 0,
}

#: The pretraining run (Central on PneumoniaMNIST's official train rows).
PRETRAIN_CONFIG: dict = {
    "name": "classhet-pretrain",
    "strategy": "Central",
    "class_source": "union",
    "rounds": 2,
    "source": {"lr": 2.0e-3, "batch_size": 64, "epochs": 1},
    "model": {"backbone": "resnet_tiny", "hidden": 64},
    "image_size": 48,
    "augment": False,
    "device": "cpu",
    "eval_every": 0,
    "seed": 0,
}

log = logging.getLogger("bench_classhet")


# --------------------------------------------------------------------------- data


def prepare_sites(work: Path, sites: Sequence[str], *, images_per_site: int, export_size: int) -> Path:
    """The synthetic hospitals' exports (seed 0), ingested by their real adapters; returns the manifests dir."""
    from fedcxr.synth import ingest_synthetic, write_synthetic_export

    manifests = work / "manifests"
    stamp = work / "prepared.json"
    wanted = {"sites": list(sites), "images_per_site": images_per_site, "export_size": export_size}
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        return manifests
    for path in (work / "export", manifests):
        if path.exists():
            shutil.rmtree(path)
    write_synthetic_export(work / "export", sites=sites, images_per_site=images_per_site, image_size=export_size,
                           seed=0)
    ingest_synthetic(work / "export", manifests)
    stamp.write_text(json.dumps(wanted))
    return manifests


def class_sharing(manifests: Path, sites: Sequence[str]) -> dict[str, dict[str, str]]:
    """``{site: {class: "shared"|"unique"}}`` from the sites' ``site.json`` class sets."""
    from fedcxr.site_adapters.manifest import read_site_json

    sets = {s: list(read_site_json(manifests / s)["class_set"]) for s in sites}
    count = pd.Series([c for cs in sets.values() for c in cs]).value_counts()
    return {s: {c: "shared" if count[c] >= 2 else "unique" for c in cs} for s, cs in sets.items()}


def pretrain(npz: Path, work: Path, rows: Optional[int] = None) -> Path:
    """``final_model.pt`` of a Central run on PneumoniaMNIST's official train rows (once per --work)."""
    from fedcxr.pipeline.config import load_config
    from fedcxr.pipeline.run_driver import run_experiment
    from fedcxr.site_adapters.ingest import run_ingest
    from fedcxr.site_adapters.manifest import read_manifest, read_site_json, write_site

    run_dir = work / "pretrain" / "run"
    if (run_dir / "final_model.pt").is_file():
        return run_dir / "final_model.pt"
    whole = work / "pretrain" / "whole"
    run_ingest("medmnist", npz, whole, progress=False)
    meta, frame = read_site_json(whole / "medmnist"), read_manifest(whole / "medmnist")
    frame = frame.loc[frame["split"].isin(["train", "val"])]  # the official test rows stay unused
    if rows:
        frame = frame.head(rows)
    write_site(work / "pretrain" / "manifests", "pneumoniamnist", frame, classes=list(meta["class_set"]),
               source="medmnist", adapter_version=meta["adapter_version"], export_root=Path(meta["export_root"]),
               set_aside=[], options={"bench_classhet": "pretraining: official train/val rows"})
    data = {**json.loads(json.dumps(PRETRAIN_CONFIG)), "manifests": str((work / "pretrain" / "manifests").resolve()),
            "sites": ["pneumoniamnist"], "cache_dir": str((work / "cache").resolve())}
    run_experiment(load_config(data=data), run_dir, progress=False)
    return run_dir / "final_model.pt"


# --------------------------------------------------------------------------- runs


def sweep_config(work: Path, manifests: Path, sites: Sequence[str], norm: str, rounds: int,
                 weights: Optional[Path], out: Path) -> Path:
    """The YAML every run of one norm mode shares (written into its sweep folder ``out``)."""
    cfg = json.loads(json.dumps(BASE_CONFIG))
    cfg.update({"manifests": str(manifests.resolve()), "sites": list(sites), "rounds": rounds,
                "backbone_aggregation": norm, "cache_dir": str((work / "cache").resolve())})
    if weights is not None:
        cfg["model"]["weights"] = str(Path(weights).resolve())
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def site_truth(export: Path, manifests: Path, sites: Sequence[str]) -> dict[str, pd.DataFrame]:
    """Per site: every image's true label of every class (:mod:`fedcxr.synth.truth`), indexed by
    the ``row_key`` its predictions carry (the bench holds the manifests, as a site does)."""
    from fedcxr.pipeline.data import load_site
    from fedcxr.pipeline.predictions import row_keys
    from fedcxr.synth import read_synth_json
    from fedcxr.synth.truth import true_labels

    spec = read_synth_json(export)
    out = {}
    for site in sites:
        manifest = load_site(manifests / site).manifest
        truth = true_labels(spec, site, manifest["image_path"])
        truth.index = row_keys(manifest).to_numpy()
        out[site] = truth
    return out


def unlabelled_auroc(run_dir: Path, sharing: dict[str, dict[str, str]], truths: dict[str, pd.DataFrame]) -> float:
    """Mean test AUROC over (site, class) pairs the site does not label but another site does,
    scored against the synthetic truth (``no_finding`` left out: it means "none of *my* classes")."""
    from fedcxr.evaluation.metrics import auroc

    predictions = pd.read_parquet(run_dir / "predictions" / "test.parquet")
    union = {c for kinds in sharing.values() for c in kinds} - {"no_finding"}
    values = []
    for site, kinds in sharing.items():
        rows = predictions.loc[predictions["site"] == site]
        truth = truths[site].loc[rows["row_key"].to_numpy()]
        for cls in sorted(union - set(kinds)):
            values.append(auroc(truth[f"truth__{cls}"].to_numpy(), rows[f"prob__{cls}"].to_numpy()))
    values = [v for v in values if np.isfinite(v)]
    return float(np.mean(values)) if values else float("nan")


def run_metrics(run_dir: Path, sharing: dict[str, dict[str, str]],
                truths: Optional[dict[str, pd.DataFrame]] = None) -> dict[str, float]:
    """One run's test AUROCs: per site (``site:<name>``), mean over sites, shared and unique
    classes, and (given ``truths``) the classes each site does not label."""
    report = json.loads((run_dir / "report.json").read_text())
    out, groups = {}, {"shared": [], "unique": []}
    for site, kinds in sharing.items():
        entry = report["sites"].get(site)
        if entry is None:
            continue
        value = entry.get("mean_auroc")
        out[f"site:{site}"] = float(value) if value is not None else float("nan")
        for record in entry["per_class"]:
            kind = kinds.get(record["class"])
            if kind and record["auroc"] is not None and np.isfinite(record["auroc"]):
                groups[kind].append(float(record["auroc"]))
    site_means = [v for k, v in out.items() if k.startswith("site:") and np.isfinite(v)]
    out["sites"] = float(np.mean(site_means)) if site_means else float("nan")
    for kind, values in groups.items():
        out[kind] = float(np.mean(values)) if values else float("nan")
    if truths is not None:
        out["unlabelled"] = unlabelled_auroc(run_dir, sharing, truths)
    return out


def collect(sweep: Path, methods: Sequence[str], norms: Sequence[str], seeds: int,
            sharing: dict[str, dict[str, str]], truths: Optional[dict[str, pd.DataFrame]] = None) -> pd.DataFrame:
    """Long frame ``norm, method, seed, metric, auroc`` (Individual repeated under every norm;
    it has no ``unlabelled`` score: a site's own model never learned the classes it lacks)."""
    rows = []
    for norm in norms:
        for method in methods:
            folder = sweep / ("individual" if method == "Individual" else norm) / "runs"
            for seed in range(seeds):
                run_dir = folder / f"{method}-seed{seed}"
                if not (run_dir / "report.json").is_file():
                    continue
                own = method == "Individual"
                for metric, value in run_metrics(run_dir, sharing, None if own else truths).items():
                    rows.append({"norm": norm, "method": method, "seed": seed, "metric": metric, "auroc": value})
    return pd.DataFrame(rows, columns=["norm", "method", "seed", "metric", "auroc"])


def compare_with_individual(sweep: Path, methods: Sequence[str], norm: str, seeds: int) -> Optional[Path]:
    """``fedcxr compare`` of one norm mode's runs (and Individual's), FL_Surgical the baseline."""
    from fedcxr.evaluation.compare import compare_runs, write_comparison

    runs = [sweep / ("individual" if m == "Individual" else norm) / "runs" / f"{m}-seed{s}"
            for m in methods for s in range(seeds)]
    runs = [r for r in runs if (r / "report.json").is_file()]
    if not runs:
        return None
    baseline = "FL_Surgical" if any(r.name.startswith("FL_Surgical-") for r in runs) else None
    folder = sweep / norm / "comparison_all"
    write_comparison(compare_runs(runs, baseline=baseline), folder)
    return folder / "comparison.md"


# --------------------------------------------------------------------------- summary


#: The paper's predicted orderings: (claim, better, worse, metric). Against the individually
#: trained models on their own test sets it reports parity (Table 2: NIH n.s.) or a gain
#: (CheXpert), and on unique classes parity (NIH) or a gain (CheXpert, Table 3).
PREDICTIONS = [
    ("FL_Surgical > FL_PartialLoss", "FL_Surgical", "FL_PartialLoss", "sites"),
    ("FL_Surgical > FL", "FL_Surgical", "FL", "sites"),
    ("FL_Surgical ≈ Individual", "FL_Surgical", "Individual", "sites"),
    ("FL_Surgical > FL_PartialLoss", "FL_Surgical", "FL_PartialLoss", "unique"),
    ("FL_Surgical > FL", "FL_Surgical", "FL", "unique"),
    ("FL_Surgical ≥ Individual", "FL_Surgical", "Individual", "unique"),
    ("FL_Surgical > FL_PartialLoss", "FL_Surgical", "FL_PartialLoss", "unlabelled"),
    ("FL_Surgical > FL", "FL_Surgical", "FL", "unlabelled"),
    ("FL_Surgical ≈ FL_PartialLoss", "FL_Surgical", "FL_PartialLoss", "shared"),
    ("FL_Surgical ≈ Individual", "FL_Surgical", "Individual", "shared"),
]


def prediction_table(frame: pd.DataFrame, norms: Sequence[str]) -> str:
    """Each predicted ordering per norm mode: paired difference over seeds and the verdict."""
    lines = ["| claim | classes | norm | mean diff [95% interval], n seeds | verdict |", "|---|---|---|---|---|"]
    for claim, a, b, metric in PREDICTIONS:
        part = frame.loc[frame["metric"] == metric]
        for norm in norms:
            mean, lo, hi, n = bench_shift.paired_diff(part, "norm", norm, a, b)
            if n == 0:
                continue
            lines.append(f"| {claim} | {metric} | {norm} | {mean:+.3f} [{lo:+.3f}, {hi:+.3f}], n={n} | "
                         f"{bench_shift.verdict(claim, lo, hi)} |")
    return "\n".join(lines)


def norm_table(frame: pd.DataFrame, methods: Sequence[str]) -> str:
    """FL_Surgical's norm modes against each other (the paper reports FedBN+ as best), paired over seeds."""
    part = frame.loc[frame["method"] == "FL_Surgical"]
    lines = ["| FL_Surgical | classes | mean diff [95% interval], n seeds | verdict |", "|---|---|---|---|"]
    for metric in METRICS:
        sub = part.loc[part["metric"] == metric].assign(method=lambda f: f["norm"], norm="all")
        for a, b in (("fedbn_plus", "fedavg"), ("fedbn_plus", "fedbn")):
            mean, lo, hi, n = bench_shift.paired_diff(sub, "norm", "all", a, b)
            if n:
                claim = f"{a} > {b}"
                lines.append(f"| {claim} | {metric} | {mean:+.3f} [{lo:+.3f}, {hi:+.3f}], n={n} | "
                             f"{bench_shift.verdict(claim, lo, hi)} |")
    return "\n".join(lines)


def summary(frame: pd.DataFrame, methods: Sequence[str]) -> pd.DataFrame:
    """Mean and 95% t-interval over seeds per (metric, method, norm)."""
    parts = []
    for metric, group in frame.groupby("metric"):
        table = bench_shift.summary_table(group, "norm", methods)
        parts.append(table.assign(metric=metric))
    return pd.concat(parts, ignore_index=True)[["metric", "method", "norm", "n", "mean", "lo", "hi"]]


def plot(table: pd.DataFrame, methods: Sequence[str], norms: Sequence[str], path: Path, title: str) -> None:
    """Grouped bars (norm modes × methods) with 95% intervals, one panel per class group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(METRICS), figsize=(15, 4.2), sharey=True)
    cmap = plt.get_cmap("tab10")
    width = 0.8 / max(len(methods), 1)
    for ax, (metric, label) in zip(np.atleast_1d(axes), METRICS.items()):
        for i, method in enumerate(methods):
            rows = table.loc[(table["metric"] == metric) & (table["method"] == method)].set_index("norm")
            x = np.arange(len(norms)) + (i - (len(methods) - 1) / 2) * width
            mean = np.array([rows["mean"].get(n, np.nan) for n in norms], dtype=float)
            lo = np.array([rows["lo"].get(n, np.nan) for n in norms], dtype=float)
            hi = np.array([rows["hi"].get(n, np.nan) for n in norms], dtype=float)
            err = np.vstack([np.nan_to_num(mean - lo), np.nan_to_num(hi - mean)])
            ax.bar(x, mean, width, yerr=err, capsize=2, color=cmap(i % 10), label=method,
                   hatch="//" if method == "Individual" else None, alpha=0.85)
        ax.set_xticks(np.arange(len(norms)), norms)
        ax.set_title(label, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    finite = table[["lo", "mean"]].to_numpy(dtype=float)
    low = np.nanmin(finite) if np.isfinite(finite).any() else 0.5
    np.atleast_1d(axes)[0].set_ylim(max(0.0, low - 0.05), 1.0)
    np.atleast_1d(axes)[0].set_ylabel("test AUROC (mean, 95% interval over seeds)")
    np.atleast_1d(axes)[-1].legend(fontsize=8, loc="upper right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(frame: pd.DataFrame, methods: Sequence[str], norms: Sequence[str], out: Path, stem: str, *,
                  title: str, meta: dict) -> pd.DataFrame:
    table = summary(frame, methods)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / f"{stem}_runs.csv", index=False)
    table.to_csv(out / f"{stem}.csv", index=False)
    sections = []
    for metric, label in METRICS.items():
        part = table.loc[table["metric"] == metric]
        if not part.empty:
            sections.append(f"**{label}**\n\n" + bench_shift.markdown_table(part, "norm", methods, "norm"))
    sites = sorted(m for m in table["metric"].unique() if m.startswith("site:"))
    for metric in sites:
        part = table.loc[table["metric"] == metric]
        sections.append(f"**{metric[5:]} test split (its own classes)**\n\n"
                        + bench_shift.markdown_table(part, "norm", methods, "norm"))
    md = "\n\n".join(sections)
    md += "\n\nThe paper's predicted orderings (paired over seeds):\n\n" + prediction_table(frame, norms)
    if "FL_Surgical" in methods and len(norms) > 1:
        md += "\n\nFL_Surgical's norm modes (paired over seeds):\n\n" + norm_table(frame, methods)
    (out / f"{stem}.md").write_text(f"{title}\n\n{md}\n\n```json\n{json.dumps(meta, indent=1, default=str)}\n```\n")
    plot(table.loc[table["metric"].isin(list(METRICS))], methods, norms, out / f"{stem}.png", title)
    print(md)
    return table


# --------------------------------------------------------------------------- main


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=REPO / "runs" / "bench_classhet", help="exports, manifests, caches, runs")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results", help="tables, CSV and figure")
    p.add_argument("--sites", nargs="+", default=SITES, help="synthetic hospitals (fedcxr.synth.hospitals)")
    p.add_argument("--images-per-site", type=int, default=800)
    p.add_argument("--export-size", type=int, default=64, help="fedcxr synth --image-size (detector short side)")
    p.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    p.add_argument("--norms", nargs="+", default=NORMS, choices=NORMS, help="backbone_aggregation values")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--rounds", type=int, default=BASE_CONFIG["rounds"])
    p.add_argument("--pretrain", type=Path, default=bench_shift.DEFAULT_NPZ,
                   help="PneumoniaMNIST npz the backbone is pretrained on (Central); 'none': random init")
    p.add_argument("--pretrain-rows", type=int, default=None, help="use only the first N rows (tests)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override for every run (e.g. head_warmup.epochs=0)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--workers", type=int, default=1, help="sweeps trained at once (processes, one thread each)")
    p.add_argument("--stem", default="classhet", help="output file stem")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> pd.DataFrame:
    import torch

    args = parse(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    start = time.time()
    manifests = prepare_sites(args.work, args.sites, images_per_site=args.images_per_site,
                              export_size=args.export_size)
    sharing = class_sharing(manifests, args.sites)
    weights = None if str(args.pretrain) == "none" else pretrain(args.pretrain, args.work, args.pretrain_rows)
    sweep = args.work / "sweep" / args.stem
    jobs = []
    federated = [m for m in args.methods if m != "Individual"]
    if "Individual" in args.methods:  # no federation: one sweep whatever the norm mode
        config = sweep_config(args.work, manifests, args.sites, "fedavg", args.rounds, weights, sweep / "individual")
        jobs.append((config, ["Individual"], args.seeds, sweep / "individual", args.overrides))
    for norm in args.norms if federated else []:
        config = sweep_config(args.work, manifests, args.sites, norm, args.rounds, weights, sweep / norm)
        jobs.append((config, federated, args.seeds, sweep / norm, args.overrides))
    for job in jobs:
        bench_shift.warm_caches(job[0])
    bench_shift.run_levels(jobs, args.workers)
    args.out.mkdir(parents=True, exist_ok=True)
    for norm in args.norms:  # per-class patient-clustered DeLong (BH q) and paired t, FL_Surgical the baseline
        comparison = compare_with_individual(sweep, args.methods, norm, args.seeds)
        if comparison is not None:
            shutil.copyfile(comparison, args.out / f"{args.stem}_{norm}_comparison.md")
    frame = collect(sweep, args.methods, args.norms, args.seeds, sharing,
                    site_truth(args.work / "export", manifests, args.sites))
    meta = {"sites": args.sites, "images_per_site": args.images_per_site, "export_size": args.export_size,
            "norms": args.norms, "seeds": args.seeds, "rounds": args.rounds,
            "pretrain": None if weights is None else {"data": str(args.pretrain.name), "rows": args.pretrain_rows,
                                                       "config": PRETRAIN_CONFIG},
            "class_sharing": sharing, "overrides": args.overrides, "base_config": BASE_CONFIG,
            "wall_s": round(time.time() - start)}
    write_outputs(frame, args.methods, args.norms, args.out, args.stem, meta=meta,
                  title=f"Synthetic class-heterogeneous hospitals ({', '.join(args.sites)}; "
                        f"{args.images_per_site} images each), {args.seeds} seeds")
    print(f"total {time.time() - start:.0f} s; outputs in {args.out}")
    return frame


if __name__ == "__main__":
    main()
