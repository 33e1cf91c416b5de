"""Regime runner on real PneumoniaMNIST: shift × target labels × rounds × methods × seeds → CSV.

Where do the papers' methods help? Each **cell** of the grid is one (shift, labels, rounds)
setting; every method × seed of a cell is one run (``fedcxr`` in-process), scored on the target's
test split. Results are machine-readable so later analyses (the regime map, the method advice)
read them rather than this script's prose:

* ``<stem>_runs.csv``  — one row per run: ``shift, labels, rounds, method, seed, auroc``;
* ``<stem>_cells.csv`` — one row per cell × method: mean AUROC, 95 % t-interval over seeds, n;
* ``<stem>_pairs.csv`` — per cell, the winner against every other method: paired difference of
  AUROCs over the seeds both have, its 95 % t-interval and a verdict (``resolved`` when the
  interval excludes 0);
* ``<stem>.md``        — the same as tables.

Setting (the sites of ``bench_shift.py``): sources ``site-1..3`` = the official *train* rows
dealt by patient hash; target = the official *test* rows re-split 45/15/40 (260 training rows,
of which ``labels`` are used). Shifts (``--shifts``):

* ``none`` — target as it is;
* ``<kind><level>`` (``mix4``, ``noise3``, ``gamma2``, ``blur4`` …) — ``fedcxr shift`` of the
  target only (:mod:`fedcxr.site_adapters.shift`, seed 0);
* ``shortcut`` — a bright corner marker on 95 % of pneumonia / 5 % of normal images at every
  source and the reverse (5 % / 95 %) at the target: the FedGP papers' ColoredMNIST −90 % case
  (``fedcxr shift --kind shortcut``);
* ``labelnoise<percent>`` (``labelnoise40``) — every source's training labels flipped at that rate
  (rows chosen by patient hash); the target untouched. (The FedGP papers' "noise" is feature
  noise on the target, the ``noise<level>`` shifts here.)

Every run: :data:`REGIME_CONFIG` (fixed before any result was seen), plus ``strategy``,
``seed``, ``rounds``, ``target_train.labeled`` and ``--set`` overrides. Finished runs are
skipped, so a grid can be built in parts (``--shifts``/``--labels``/``--rounds``/``--methods``
select the part) and the tables are rebuilt from every finished run of the whole grid::

    nice -n 10 python benchmarks/bench_regime.py --shifts shortcut --labels 50 --rounds 20 \\
        --methods Target_Only FedGP FedGP_Auto --seeds 3 --workers 2
"""

from __future__ import annotations

import argparse
import json
import logging
import math
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
METHODS = ["Target_Only", "Finetune_Offline", "FedAvg_Finetune", "FedAvg_Finetune_GP", "FedGP", "FedGP_Auto",
           "FedDA", "FedDA_Auto"]

#: Overrides one method needs to run at all in this setting, applied to its runs only (after the
#: cell's ``--set``). SCAFFOLD refuses Adam at the sources (option II's control variate assumes
#: plain SGD steps; it defaults to plain SGD, momentum 0), and plain SGD at the house lr 1e-3
#: barely moves in 8 steps: lr 0.03 is bench_baselines.py's choice (≈ Reddi et al.'s best client lr
#: on CIFAR-10, 10^-1.5; not tuned here). Every other knob — rows, steps, target budget — is the cell's.
METHOD_OVERRIDES: dict[str, list[str]] = {
    "SCAFFOLD": ["source.lr=0.03"],
    "SCAFFOLD_Finetune": ["source.lr=0.03"],
}

#: Methods that never read a target label: their runs do not depend on ``labels``, so one run per
#: (shift, rounds, seed) serves every label count of the grid (``WORK/sweep/<variant>/_shared/<shift>-r<rounds>``,
#: linked into each cell's ``runs/``) — the same model and score, trained once instead of five times.
LABEL_FREE = ("FedAvg", "FedProx", "SCAFFOLD", "FedAdam", "FedYogi", "FedAdagrad", "Source_Only")

#: One config for every run: bench_shift's network, data and source training; the target at the
#: papers' learning rate, 1/5 of the sources' (AutoFedGP ``--lr_ratio 0.2``; AuxInfo+GP paper App.
#: A.3: 1e-3 / 2e-4). Its batch size is each method's default unless ``--set`` says otherwise.
REGIME_CONFIG: dict = {
    "name": "regime",
    "source": {"lr": 1.0e-3, "batch_size": 32, "steps": 8},
    "target_train": {"lr": 2.0e-4, "epochs": 1},
    "model": {"backbone": "resnet_tiny", "hidden": 64},
    "image_size": 28,
    "augment": False,
    "device": "cpu",
    "eval_every": 0,
}

#: The shortcut shift's marker rates (positive, negative) at the sources; the target gets them reversed.
SHORTCUT_RATES = (0.95, 0.05)

log = logging.getLogger("bench_regime")


# --------------------------------------------------------------------------- sites


def cell_sites(manifests: Path, work: Path, shift: str) -> tuple[list[str], Path]:
    """The source site folders and the target site folder of one shift type."""
    from fedcxr.site_adapters.shift import Shortcut, shift_site

    sources = [str((manifests / f"site-{k}").resolve()) for k in (1, 2, 3)]
    if shift == "none":
        return sources, (manifests / "target-base").resolve()
    if shift == "shortcut":
        pos, neg = SHORTCUT_RATES
        marked = []
        for k in (1, 2, 3):
            out = work / "sources" / "shortcut"
            if not (out / f"site-{k}" / "site.json").is_file():
                shift_site(manifests / f"site-{k}", out, kind="shortcut", shortcut=Shortcut("pneumonia", pos, neg),
                           seed=0, site_name=f"site-{k}", progress=False)
            marked.append(str((out / f"site-{k}").resolve()))
        out = work / "targets" / "shortcut"
        if not (out / "target" / "site.json").is_file():
            shift_site(manifests / "target-base", out, kind="shortcut", shortcut=Shortcut("pneumonia", neg, pos),
                       seed=0, site_name="target", progress=False)
        return marked, (out / "target").resolve()
    kind, level = shift.rstrip("0123456789"), shift[len(shift.rstrip("0123456789")):]
    if kind == "labelnoise" and level:
        return noisy_sources(manifests, work, int(level) / 100), (manifests / "target-base").resolve()
    if kind not in ("noise", "gamma", "blur", "mix") or not level:
        raise SystemExit(f"--shifts: unknown shift {shift!r} (none, shortcut, labelnoise<percent>, or "
                         "noise|gamma|blur|mix + level 0-4)")
    return sources, bench_shift.shifted_target(manifests, work, kind, int(level)).resolve()


def noisy_sources(manifests: Path, work: Path, rate: float) -> list[str]:
    """The sources with each training label flipped with probability ``rate`` (chosen by a hash of the
    patient id, so the same rows every run); validation rows and the target are untouched."""
    from fedcxr.site_adapters.manifest import patient_bucket, read_manifest, read_site_json, write_site

    out, folders = work / "sources" / f"labelnoise{round(100 * rate)}", []
    for k in (1, 2, 3):
        site = manifests / f"site-{k}"
        if not (out / f"site-{k}" / "site.json").is_file():
            meta, frame = read_site_json(site), read_manifest(site)
            flip = (patient_bucket(frame["patient_id"], salt="bench-regime-label-noise") < rate) & (
                frame["split"] == "train").to_numpy() & frame["label__pneumonia"].notna().to_numpy()
            frame.loc[flip, "label__pneumonia"] = 1.0 - frame.loc[flip, "label__pneumonia"]
            write_site(out, f"site-{k}", frame, classes=list(meta["class_set"]), source=meta["source"],
                       adapter_version=meta["adapter_version"], export_root=Path(meta["export_root"]), set_aside=[],
                       options={**(meta.get("options") or {}), "bench_regime": f"training labels flipped at rate {rate}"})
        folders.append(str((out / f"site-{k}").resolve()))
    return folders


def cell_name(shift: str, labels: int, rounds: int) -> str:
    return f"{shift}-n{labels}-r{rounds}"


def cell_config(work: Path, manifests: Path, shift: str, labels: int, rounds: int, overrides: Sequence[str],
                variant: str = "default") -> Path:
    """Write the cell's YAML (``work/sweep/<variant>/<cell>/config.yaml``) and warm its image caches."""
    from fedcxr.pipeline.config import apply_overrides

    sources, target = cell_sites(manifests, work, shift)
    cfg = json.loads(json.dumps(REGIME_CONFIG))
    cfg.update({"manifests": str(manifests.resolve()), "sites": sources, "target": str(target),
                "cache_dir": str((work / "cache").resolve()), "rounds": rounds})
    cfg["target_train"]["labeled"] = labels
    cfg = apply_overrides(cfg, list(overrides))
    out = work / "sweep" / variant / cell_name(shift, labels, rounds)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    bench_shift.warm_caches(path)
    return path


# --------------------------------------------------------------------------- runs


def run_one(job: tuple) -> float:
    """One (method, seed) of a cell in a worker process (one torch thread); returns its wall time."""
    import torch

    from fedcxr.workflows.evaluate import evaluate_run
    from fedcxr.pipeline.checkpoints import latest_checkpoint
    from fedcxr.pipeline.config import load_config
    from fedcxr.pipeline.run_driver import run_experiment

    config, method, seed, run_dir = job
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    t0 = time.time()
    run_dir = Path(run_dir)
    if not (run_dir / "final_model.pt").exists():
        cfg = load_config(config, overrides=[f"strategy={method}", f"seed={seed}", *METHOD_OVERRIDES.get(method, [])])
        run_experiment(cfg, run_dir, resume=latest_checkpoint(run_dir) is not None, device="cpu", progress=False)
    if not (run_dir / "report.json").exists():
        evaluate_run(run_dir, split="test", n_boot=0, device="cpu")
    return time.time() - t0


def cell_jobs(configs: dict, methods: Sequence[str], seeds) -> list[tuple]:
    """The (config, method, seed, run_dir) jobs of some cells; a label-free method's run is shared by every
    label count of its (shift, rounds) — one job, linked into each cell's ``runs/``."""
    jobs: dict[str, tuple] = {}
    for (shift, _, rounds), config in configs.items():
        runs = Path(config).parent / "runs"
        for method in methods:
            for seed in seeds:
                run_dir = runs / f"{method}-seed{seed}"
                if method in LABEL_FREE:
                    shared = Path(config).parents[1] / "_shared" / f"{shift}-r{rounds}" / "runs" / run_dir.name
                    runs.mkdir(parents=True, exist_ok=True)
                    if not run_dir.is_symlink() and not run_dir.exists():
                        run_dir.symlink_to(Path("..", "..", "_shared", f"{shift}-r{rounds}", "runs", run_dir.name))
                    run_dir = shared
                jobs.setdefault(str(run_dir), (str(config), method, seed, str(run_dir)))
    return list(jobs.values())


def top_up(configs: dict, args: argparse.Namespace, collect_fn) -> None:
    """More seeds where a cell's winner and runner-up are close (issue 18: 5 seeds where a margin is under
    0.03): seeds ``--seeds``…``--close-seeds``−1 for the winner and the runner-up of each such cell,
    repeated while the new seeds change who they are (a third method may overtake the runner-up)."""
    for _ in range(6):
        runs = collect_fn(args.work, args.variant)
        jobs = []
        for (shift, labels, rounds), config in configs.items():
            cell = runs.loc[(runs["shift"] == shift) & (runs["labels"] == labels) & (runs["rounds"] == rounds)
                            & runs["method"].isin(args.methods)]
            for method in close_methods(cell, args.close):
                done = set(cell.loc[cell["method"] == method, "seed"])
                missing = [s for s in range(args.close_seeds) if s not in done]
                jobs += cell_jobs({(shift, labels, rounds): config}, [method], missing)
        if not jobs:
            return
        run_jobs(list({job[3]: job for job in jobs}.values()), args.workers)


def close_methods(cell: pd.DataFrame, close: float) -> list[str]:
    """The winner and the runner-up (by mean AUROC) when their margin is under ``close``; none otherwise
    (the winner is clear: more seeds are not needed)."""
    means = cell.groupby("method")["auroc"].mean().sort_values(ascending=False)
    if len(means) < 2 or means.iloc[0] - means.iloc[1] >= close:
        return []
    return list(means.index[:2])


def run_jobs(jobs: list[tuple], workers: int) -> None:
    if workers <= 1:
        for job in jobs:
            print(f"{Path(job[3]).parents[1].name} {job[1]} seed {job[2]}: {run_one(job):.0f} s", flush=True)
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        for job, wall in zip(jobs, pool.map(run_one, jobs)):
            print(f"{Path(job[3]).parents[1].name} {job[1]} seed {job[2]}: {wall:.0f} s", flush=True)


def collect(work: Path, variant: str = "default") -> pd.DataFrame:
    """Every finished run of a variant (``work/sweep/<variant>``: all its cells ever run, not only this call's)."""
    rows = []
    for report in sorted((work / "sweep" / variant).glob("*/runs/*/report.json")):
        run_dir = report.parent
        cell = run_dir.parent.parent.name
        shift, labels, rounds = cell.rsplit("-", 2)
        method, seed = run_dir.name.rsplit("-seed", 1)
        rows.append({"shift": shift, "labels": int(labels[1:]), "rounds": int(rounds[1:]), "method": method,
                     "seed": int(seed), "auroc": target_auroc(run_dir)})
    return pd.DataFrame(rows, columns=["shift", "labels", "rounds", "method", "seed", "auroc"])


def target_auroc(run_dir: Path) -> float:
    """Mean test AUROC of the run's target: the site ``target`` (a shifted copy), or ``target-base`` (the
    unshifted target of the ``none`` and ``labelnoise`` cells) — a run's report holds only its target."""
    sites = json.loads((run_dir / "report.json").read_text())["sites"]
    name = "target" if "target" in sites else "target-base"
    value = sites[name].get("mean_auroc")
    return float(value) if value is not None else float("nan")


# --------------------------------------------------------------------------- summaries

CELL = ["shift", "labels", "rounds"]


def cell_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean AUROC and 95 % t-interval over seeds per cell × method."""
    rows = []
    for key, group in runs.groupby([*CELL, "method"]):
        mean, lo, hi = bench_shift.t_interval(group["auroc"].tolist())
        rows.append({**dict(zip([*CELL, "method"], key)), "n": len(group), "mean": mean, "lo": lo, "hi": hi})
    return pd.DataFrame(rows, columns=[*CELL, "method", "n", "mean", "lo", "hi"])


def pair_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per cell: the winner (highest mean) minus every other method, paired by seed."""
    rows = []
    for key, cell in runs.groupby(CELL):
        means = cell.groupby("method")["auroc"].mean().sort_values(ascending=False)
        winner = means.index[0]
        by_seed = cell.pivot_table(index="seed", columns="method", values="auroc")
        for rank, other in enumerate(means.index[1:], start=2):
            both = by_seed[[winner, other]].dropna()
            mean, lo, hi = bench_shift.t_interval((both[winner] - both[other]).tolist())
            verdict = "resolved" if np.isfinite(lo) and lo > 0 else "unresolved"
            rows.append({**dict(zip(CELL, key)), "winner": winner, "other": other, "other_rank": rank,
                         "n": len(both), "diff": mean, "lo": lo, "hi": hi, "verdict": verdict})
    return pd.DataFrame(rows, columns=[*CELL, "winner", "other", "other_rank", "n", "diff", "lo", "hi", "verdict"])


def versus_table(runs: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
    """This variant − another, per cell × method, paired by seed (e.g. a code fix, a changed default)."""
    keys = [*CELL, "method", "seed"]
    both = runs.merge(other, on=keys, suffixes=("", "_other"))
    rows = []
    for key, group in both.groupby([*CELL, "method"]):
        mean, lo, hi = bench_shift.t_interval((group["auroc"] - group["auroc_other"]).tolist())
        verdict = "resolved" if np.isfinite(lo) and (lo > 0 or hi < 0) else "unresolved"
        rows.append({**dict(zip([*CELL, "method"], key)), "n": len(group), "mean": group["auroc"].mean(),
                     "mean_other": group["auroc_other"].mean(), "diff": mean, "lo": lo, "hi": hi, "verdict": verdict})
    return pd.DataFrame(rows, columns=[*CELL, "method", "n", "mean", "mean_other", "diff", "lo", "hi", "verdict"])


def markdown(cells: pd.DataFrame, pairs: pd.DataFrame, methods: Sequence[str]) -> str:
    """Per cell: each method's mean [interval], the winner in bold, then its paired margins."""
    out = []
    for key, group in cells.groupby(CELL):
        shift, labels, rounds = key
        out.append(f"### {shift}, {labels} target labels, {rounds} rounds\n")
        out.append("| method | n | target test AUROC, mean [95% t-interval over seeds] | winner − method, paired |")
        out.append("|---|---|---|---|")
        best = group["mean"].max()
        margins = pairs.loc[(pairs[CELL] == pd.Series(dict(zip(CELL, key)))).all(axis=1)].set_index("other")
        order = {m: i for i, m in enumerate(methods)}
        for _, row in group.sort_values("method", key=lambda s: s.map(lambda m: order.get(m, 99))).iterrows():
            text = _interval(row["mean"], row["lo"], row["hi"])
            if math.isclose(row["mean"], best):
                text, margin = f"**{text}**", "winner"
            elif row["method"] in margins.index:
                m = margins.loc[row["method"]]
                margin = f"{_interval(m['diff'], m['lo'], m['hi'], signed=True)} ({m['verdict']})"
            else:
                margin = ""
            out.append(f"| {row['method']} | {row['n']} | {text} | {margin} |")
        out.append("")
    return "\n".join(out)


def _interval(mean: float, lo: float, hi: float, signed: bool = False) -> str:
    f = "{:+.3f}" if signed else "{:.3f}"
    if not np.isfinite(lo):
        return f.format(mean)
    return f"{f.format(mean)} [{f.format(lo)}, {f.format(hi)}]"


def write_outputs(runs: pd.DataFrame, out: Path, stem: str, methods: Sequence[str], meta: dict) -> pd.DataFrame:
    out.mkdir(parents=True, exist_ok=True)
    cells, pairs = cell_table(runs), pair_table(runs)
    runs.sort_values([*CELL, "method", "seed"]).to_csv(out / f"{stem}_runs.csv", index=False)
    cells.to_csv(out / f"{stem}_cells.csv", index=False)
    pairs.to_csv(out / f"{stem}_pairs.csv", index=False)
    md = markdown(cells, pairs, methods)
    (out / f"{stem}.md").write_text(f"{md}\n```json\n{json.dumps(meta, indent=1, default=str)}\n```\n")
    print(md)
    return cells


# --------------------------------------------------------------------------- main


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--npz", type=Path, default=bench_shift.DEFAULT_NPZ)
    p.add_argument("--work", type=Path, default=REPO / "runs" / "bench_regime", help="sites, caches and runs")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results", help="CSV and Markdown tables")
    p.add_argument("--stem", default="regime", help="output file stem")
    p.add_argument("--shifts", nargs="+", default=["shortcut"], help="none | shortcut | labelnoise<percent> | <kind><level> (mix4, noise3, …)")
    p.add_argument("--labels", type=int, nargs="+", default=[50], help="labeled target rows")
    p.add_argument("--rounds", type=int, nargs="+", default=[20])
    p.add_argument("--methods", nargs="+", default=METHODS)
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per method")
    p.add_argument("--close-seeds", type=int, default=0, metavar="N",
                   help="in a cell whose winner − runner-up margin is under --close after --seeds, run seeds up to "
                        "N for the winner and the runner-up (issue 18: 5 where a margin is under 0.03)")
    p.add_argument("--close", type=float, default=0.03, help="the margin --close-seeds looks at")
    p.add_argument("--target-from", nargs="+", default=["test"], choices=["val", "test"],
                   help="official splits the target is built from (val test: 1,145 images, enough for 500 labels); "
                        "sites are built once per --work, so a different target needs its own --work")
    p.add_argument("--target-split", type=float, nargs=3, default=[0.45, 0.15, 0.40], metavar=("TRAIN", "VAL", "TEST"),
                   help="the target's train/val/test shares by patient hash")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every run of this call's cells (written into the cell's config; "
                        "give a grid with overrides its own --variant)")
    p.add_argument("--variant", default="default",
                   help="name of this grid's configuration (runs in WORK/sweep/<variant>/<cell>); the tables "
                        "cover every finished run of the variant")
    p.add_argument("--workers", type=int, default=1, help="runs trained at once (processes, one thread each)")
    p.add_argument("--versus", nargs="+", default=[], metavar="VARIANT",
                   help="also compare with these variants' finished runs, paired by seed: <stem>_versus_<variant>.csv")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> pd.DataFrame:
    import torch

    from fedcxr.pipeline.protocols import get_protocol

    args = parse(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    for method in args.methods:
        get_protocol(method)  # a typo fails before any training
    start = time.time()
    manifests = bench_shift.prepare_sites(args.npz, args.work, n_sources=3, target_split=tuple(args.target_split),
                                          target_from=tuple(args.target_from))
    configs = {}
    for shift in args.shifts:
        for labels in args.labels:
            for rounds in args.rounds:
                configs[(shift, labels, rounds)] = cell_config(args.work, manifests, shift, labels, rounds,
                                                               args.overrides, args.variant)
    run_jobs(cell_jobs(configs, args.methods, range(args.seeds)), args.workers)
    if args.close_seeds > args.seeds:
        top_up(configs, args, collect)
    runs = collect(args.work, args.variant)
    meta = {"config": REGIME_CONFIG, "variant": args.variant, "overrides": args.overrides, "shortcut_rates": SHORTCUT_RATES,
            "method_overrides": {m: METHOD_OVERRIDES[m] for m in args.methods if m in METHOD_OVERRIDES},
            "target_from": args.target_from, "target_split": args.target_split,
            "this_call": {"shifts": args.shifts, "labels": args.labels, "rounds": args.rounds,
                          "methods": args.methods, "seeds": args.seeds, "close_seeds": args.close_seeds,
                          "close": args.close, "wall_s": round(time.time() - start)}}
    write_outputs(runs, args.out, args.stem, args.methods, meta)
    for variant in args.versus:
        table = versus_table(runs, collect(args.work, variant))
        table.to_csv(args.out / f"{args.stem}_versus_{variant}.csv", index=False)
        print(f"\n{args.variant} − {variant}, paired by seed:\n" + table.to_string(index=False, float_format="%.3f"))
    print(f"total {time.time() - start:.0f} s; outputs in {args.out}")
    return runs


if __name__ == "__main__":
    main()
