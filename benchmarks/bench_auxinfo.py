"""AuxInfo (demographic auxiliary heads) with and without GP, where demographics carry signal.

Why here: PneumoniaMNIST, the regime map's data, has no demographics, so AuxInfo cannot be
measured there. The synthetic hospitals of ``fedcxr synth`` can: their findings depend on sex, age
bin and view with the odds ratios of NIH ChestX-ray14's real metadata (``demographics: nih``,
``fedcxr/synth/cohort.py``, ``fedcxr/synth/demographics.py``), age moves the bones' brightness,
sex the chest's outline and AP views magnify the heart (``phantom.py``) — so the auxiliary tasks
(sex, age bin, race, view) share features with the findings, the AuxInfo+GP paper's premise. Race
carries no finding signal (NIH records none; a ±0.02 density offset only). (The covid-chestxray
subset in ``../shared/data`` has real sex and age, but 303 images over six sites leave test splits
of a handful of images per site; see BENCHMARKS.md.)

Setting: the demo's (``fedcxr demo``): four hospitals of 500 images each at 64 px in their native
formats, ingested with their real adapters; target ``dicom_style``, sources the other three; the
demo's config (:func:`fedcxr.workflows.demo.demo_config`: resnet_tiny, 10 rounds, sources lr 2e-3
one pass a round, target lr 1e-3 two passes a round, augmentation on) with ``target_train.labeled``
and ``rounds`` per setting (:data:`SETTINGS`). Scored: mean test AUROC over the target's classes.

The grid (issue 30 item 4): AuxInfo's loss weight ``alpha`` ∈ {0.25, 0.5, 1}, ``aux_reduction`` ∈
{sum (the paper's Eq. 2), mean over the tasks}, auxiliary tasks with and without ``view`` —
:data:`VARIANTS`, named ``a<alpha>-<reduction>-<view|noview>``. The methods without AuxInfo
(FedAvg_Finetune, GP, Target_Only) do not depend on them: one run per seed, in the variant ``noaux``,
paired with every AuxInfo variant. Per setting, variant and seed the paper's pairs are compared
paired by seed (95 % t-interval): ``AuxInfo+GP − GP`` and ``AuxInfo − FedAvg_Finetune``.

In parts, resumable: every run lives in ``WORK/sweep/<setting>/<variant>/runs/<method>-seed<s>``, a
finished run is never redone and a killed one resumes from its last checkpoint; ``--part K/N`` runs
every N-th job from the K-th (N machines or N sittings), ``--plan`` lists the jobs and stops, and
``--collect`` only rebuilds the tables from whatever has finished. The tables always cover every
finished run of the chosen settings, not only this call's::

    nice -n 15 python benchmarks/bench_auxinfo.py --variants a0.25-sum-view a1-sum-view --seeds 3 --workers 2
    nice -n 15 python benchmarks/bench_auxinfo.py --variants all --seeds 5 --workers 2 --part 1/4
"""

from __future__ import annotations

import argparse
import itertools
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
AUX_METHODS = ["FedAvg_Finetune_AuxInfo", "FedAvg_Finetune_AuxInfo_GP"]
BASE_METHODS = ["Target_Only", "FedAvg_Finetune", "FedAvg_Finetune_GP"]
METHODS = ["Target_Only", "FedAvg_Finetune", "FedAvg_Finetune_AuxInfo", "FedAvg_Finetune_GP",
           "FedAvg_Finetune_AuxInfo_GP"]
#: the paper's comparisons: (with AuxInfo, without), then each against the hospital's own baseline
PAIRS = [("FedAvg_Finetune_AuxInfo_GP", "FedAvg_Finetune_GP"), ("FedAvg_Finetune_AuxInfo", "FedAvg_Finetune"),
         ("FedAvg_Finetune_AuxInfo_GP", "FedAvg_Finetune"), ("FedAvg_Finetune_GP", "FedAvg_Finetune"),
         ("FedAvg_Finetune_AuxInfo_GP", "Target_Only"), ("FedAvg_Finetune", "Target_Only")]
#: setting name → config overrides on the demo's config. ``demo``: exactly ``fedcxr demo`` (half of the
#: target's training labels, 10 rounds); ``scarce50``: 50 labeled target rows, the papers' 50 rounds.
SETTINGS: dict[str, dict] = {
    "demo": {},
    "scarce50": {"target_train.labeled": 50, "rounds": 50},
}
TARGET = "dicom_style"
BASE = "noaux"
ALPHAS = (0.25, 0.5, 1.0)
REDUCTIONS = ("sum", "mean")
WITH_VIEW = ["sex", "age_bin", "race", "view"]  # fedcxr's default aux_tasks
WITHOUT_VIEW = ["sex", "age_bin", "race"]


def variant_name(alpha: float, reduction: str, view: bool) -> str:
    return f"a{alpha:g}-{reduction}-{'view' if view else 'noview'}"


#: AuxInfo variant name → config overrides (:func:`variant_name`); the paper's own setting is
#: ``a1-sum-*`` (α = 1, Eq. 2's sum; CheXpert's tasks include frontal/lateral, MIDRC's do not)
VARIANTS: dict[str, list[str]] = {
    variant_name(a, r, v): [f"alpha={a:g}", f"aux_reduction={r}",
                            f"aux_tasks=[{', '.join(WITH_VIEW if v else WITHOUT_VIEW)}]"]
    for a, r, v in itertools.product(ALPHAS, REDUCTIONS, (True, False))
}


def prepare(work: Path, images_per_site: int, image_size: int, demographics: Optional[str] = None) -> Path:
    """The demo's four hospitals, written and ingested once; returns the manifests dir."""
    from fedcxr.synth import ingest_synthetic, write_synthetic_export

    export, manifests = work / "export", work / "manifests"
    if not (manifests / TARGET / "site.json").is_file():
        write_synthetic_export(export, images_per_site=images_per_site, image_size=image_size, seed=0,
                               demographics=demographics)
        ingest_synthetic(export, manifests)
    return manifests


def variant_config(work: Path, manifests: Path, setting: str, variant: str, overrides: Sequence[str]) -> Path:
    """``WORK/sweep/<setting>/<variant>/config.yaml``: the demo's config, the setting's, the variant's."""
    from fedcxr.workflows.demo import demo_config
    from fedcxr.pipeline.config import apply_overrides

    sites = sorted(p.name for p in manifests.iterdir() if (p / "site.json").is_file())
    cfg = demo_config(manifests, sites, TARGET, quick=False)
    cfg.update({"device": "cpu", "eval_every": 0, "cache_dir": str((work / "cache").resolve())})
    extra = [] if variant == BASE else VARIANTS[variant]
    cfg = apply_overrides(cfg, [f"{k}={v}" for k, v in SETTINGS[setting].items()] + extra + list(overrides))
    out = work / "sweep" / setting / variant
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _job(config: Path, method: str, seed: int) -> tuple:
    """:func:`bench_regime.run_one`'s job: (config, ``--set`` strings, run_dir, evaluate on test). The
    target's labeled rows are the one fixed draw in every seed (no ``label_draw``), as in the
    preliminary grid."""
    settings = [f"strategy={method}", f"seed={seed}", *bench_regime.METHOD_OVERRIDES.get(method, [])]
    return (str(config), settings, str(config.parent / "runs" / f"{method}-seed{seed}"), True)


def plan_jobs(work: Path, manifests: Path, args: argparse.Namespace) -> list[tuple]:
    """Every (config, method, seed, run_dir) job of the chosen settings × variants × seeds, seeds outermost
    (a part that stops early leaves whole seeds); ``--part K/N`` keeps every N-th from the K-th."""
    jobs = []
    base_methods = [m for m in args.methods if m in BASE_METHODS]
    aux_methods = [m for m in args.methods if m in AUX_METHODS]
    for setting in args.settings:
        configs = {v: variant_config(work, manifests, setting, v, args.overrides) for v in args.variants}
        base = variant_config(work, manifests, setting, BASE, args.overrides) if base_methods else None
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            if base is not None:
                jobs += [_job(base, m, seed) for m in base_methods]
            for variant in args.variants:
                jobs += [_job(configs[variant], m, seed) for m in aux_methods]
    k, n = args.part
    return jobs[k - 1::n]


def collect(work: Path) -> pd.DataFrame:
    """Every finished run under ``WORK/sweep`` (all parts, all calls)."""
    rows = []
    for report in sorted((work / "sweep").glob("*/*/runs/*/report.json")):
        run_dir = report.parent
        method, seed = run_dir.name.rsplit("-seed", 1)
        site = json.loads(report.read_text())["sites"].get(TARGET, {})
        rows.append({"setting": run_dir.parents[2].name, "variant": run_dir.parents[1].name, "method": method,
                     "seed": int(seed), "auroc": float(site["mean_auroc"]) if site.get("mean_auroc") is not None
                     else float("nan")})
    return pd.DataFrame(rows, columns=["setting", "variant", "method", "seed", "auroc"])


def tables(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per setting × variant × method: mean [95 % t-interval]; per setting × variant × pair: the paired
    difference over the seeds both have (the methods without AuxInfo come from ``noaux``)."""
    cells, pairs = [], []
    for (setting, variant, method), group in runs.groupby(["setting", "variant", "method"]):
        mean, lo, hi = bench_shift.t_interval(group["auroc"].tolist())
        cells.append({"setting": setting, "variant": variant, "method": method, "n": len(group), "mean": mean,
                      "lo": lo, "hi": hi})
    for setting, group in runs.groupby("setting"):
        base = group.loc[group["variant"] == BASE].pivot_table(index="seed", columns="method", values="auroc")
        for variant in sorted(set(group["variant"]) - {BASE}):
            mine = group.loc[group["variant"] == variant].pivot_table(index="seed", columns="method", values="auroc")
            by_seed = pd.concat([base, mine], axis=1)
            for a, b in PAIRS:
                if a in by_seed and b in by_seed and (a in AUX_METHODS or b in AUX_METHODS):
                    pairs.append(_pair(setting, variant, a, b, by_seed))
        if len(base.columns):
            for a, b in PAIRS:
                if a in base and b in base:
                    pairs.append(_pair(setting, BASE, a, b, base))
    return pd.DataFrame(cells), pd.DataFrame(pairs)


def _pair(setting: str, variant: str, a: str, b: str, by_seed: pd.DataFrame) -> dict:
    both = by_seed[[a, b]].dropna()
    mean, lo, hi = bench_shift.t_interval((both[a] - both[b]).tolist())
    verdict = "better" if lo > 0 else "worse" if hi < 0 else "unresolved"
    return {"setting": setting, "variant": variant, "method": a, "versus": b, "n": len(both), "diff": mean,
            "lo": lo, "hi": hi, "verdict": verdict}


def markdown(cells: pd.DataFrame, pairs: pd.DataFrame) -> str:
    order = {m: i for i, m in enumerate(METHODS)}
    out = []
    for setting, group in cells.groupby("setting"):
        out += [f"### {setting}", "", "| variant | method | n | mean test AUROC over the target's classes [95 % "
                "t-interval] |", "|---|---|---|---|"]
        group = group.assign(_v=group["variant"].ne(BASE), _m=group["method"].map(order))
        for _, r in group.sort_values(["_v", "variant", "_m"]).iterrows():
            out.append(f"| {r['variant']} | {r['method']} | {r['n']} | {r['mean']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}] |")
        out += ["", "| variant | comparison | n | paired difference [95 % t-interval] | verdict |",
                "|---|---|---|---|---|"]
        for _, r in pairs.loc[pairs["setting"] == setting].iterrows():
            out.append(f"| {r['variant']} | {r['method']} − {r['versus']} | {r['n']} | {r['diff']:+.3f} "
                       f"[{r['lo']:+.3f}, {r['hi']:+.3f}] | {r['verdict']} |")
        out.append("")
    return "\n".join(out)


def _part(text: str) -> tuple[int, int]:
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected K/N, e.g. 1/4") from None
    if not 1 <= k <= n:
        raise argparse.ArgumentTypeError(f"{text!r}: K must be between 1 and N")
    return k, n


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=REPO / "runs" / "bench_auxinfo")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--stem", default="auxinfo_grid")
    p.add_argument("--settings", nargs="+", default=["demo"], choices=list(SETTINGS))
    p.add_argument("--variants", nargs="+", default=["a1-sum-view"], metavar="VARIANT",
                   help=f"AuxInfo variants, or `all` ({', '.join(VARIANTS)})")
    p.add_argument("--methods", nargs="+", default=["FedAvg_Finetune", "FedAvg_Finetune_GP"] + AUX_METHODS,
                   choices=METHODS)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--part", type=_part, default=(1, 1), metavar="K/N", help="run every N-th job from the K-th")
    p.add_argument("--plan", action="store_true", help="list the jobs (✓ finished) and stop")
    p.add_argument("--collect", action="store_true", help="run nothing: rebuild the tables from the finished runs")
    p.add_argument("--manifests", type=Path, default=None,
                   help="an already ingested synthetic federation (default: write and ingest the demo's in WORK)")
    p.add_argument("--demographics", default=None, choices=["nih", "nih_prevalence", "legacy"],
                   help="the synthetic hospitals' demographic model (default: nih; use a new --work for another)")
    p.add_argument("--images-per-site", type=int, default=500, help="the demo's 500")
    p.add_argument("--image-size", type=int, default=64, help="the demo's 64 px")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every run (the smoke test's speed settings)")
    p.add_argument("--workers", type=int, default=1)
    args = p.parse_args(argv)
    if args.variants == ["all"]:
        args.variants = list(VARIANTS)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {unknown}; choose from all, {', '.join(VARIANTS)}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> pd.DataFrame:
    import torch

    args = parse(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    start = time.time()
    if not args.collect:
        manifests = args.manifests or prepare(args.work, args.images_per_site, args.image_size, args.demographics)
        jobs = plan_jobs(args.work, manifests, args)
        if args.plan:
            for job in jobs:
                done = "✓" if bench_regime.finished(job) else " "
                print(f"{done} {Path(job[2]).relative_to(args.work)}")
            print(f"{len(jobs)} jobs, {sum(map(bench_regime.finished, jobs))} finished")
            return collect(args.work)
        if jobs:
            bench_shift.warm_caches(Path(jobs[0][0]))
        bench_regime.run_jobs([j for j in jobs if not bench_regime.finished(j)], args.workers)
    runs = collect(args.work)
    runs = runs.loc[runs["setting"].isin(args.settings)]
    cells, pairs = tables(runs)
    args.out.mkdir(parents=True, exist_ok=True)
    runs.sort_values(["setting", "variant", "method", "seed"]).to_csv(args.out / f"{args.stem}_runs.csv", index=False)
    cells.to_csv(args.out / f"{args.stem}.csv", index=False)
    pairs.to_csv(args.out / f"{args.stem}_pairs.csv", index=False)
    shown = sorted(set(runs["variant"]) - {BASE})  # the tables cover every finished run, not only this call's
    meta = {"settings": {s: SETTINGS[s] for s in args.settings}, "variants": {v: VARIANTS[v] for v in shown},
            "overrides": args.overrides, "seeds": sorted(int(s) for s in runs["seed"].unique()),
            "images_per_site": args.images_per_site, "image_size": args.image_size, "target": TARGET,
            "demographics": args.demographics or "nih", "part": "/".join(map(str, args.part)),
            "wall_s_this_call": round(time.time() - start)}
    md = markdown(cells, pairs)
    (args.out / f"{args.stem}.md").write_text(f"{md}\n```json\n{json.dumps(meta, indent=1)}\n```\n")
    print(md)
    print(f"total {time.time() - start:.0f} s; outputs in {args.out}")
    return runs


if __name__ == "__main__":
    main()
