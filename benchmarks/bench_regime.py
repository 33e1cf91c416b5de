"""Regime runner on real X-rays: shift × target labels × rounds × methods × seeds → CSV.

Where do the papers' methods help? Each **cell** of the grid is one (shift, labels, rounds)
setting; every method × seed of a cell is one run (``fedcxr`` in-process), scored on the target's
test split. Results are machine-readable so later analyses (the regime map, the method advice)
read them rather than this script's prose:

* ``<stem>_runs.csv``     — one row per run: ``shift, labels, rounds, method, seed, label_draw, auroc,
  val_auroc, target_passes, wall_s`` (``val_auroc``: the target's validation AUROC of the scored
  round — the last; never used to pick anything here; ``chosen`` on the ``Selected`` rows);
* ``<stem>_cells.csv``    — per cell × method: mean AUROC, 95 % t-interval over seeds, n, mean
  validation AUROC, the target's passes over its labeled rows, training seconds;
* ``<stem>_pairs.csv``    — per cell, the winner against every other method: paired difference, its
  unadjusted 95 % t-interval, two-sided p and ``p_adj`` (Holm over every pair of every cell);
* ``<stem>_verdicts.csv`` — per cell: ``p_best`` ("the winner beats every other method",
  intersection-union test × the number of methods) and ``p_adj`` (Holm over the cells), ``resolved``,
  and the chooser's regret (:mod:`fedcxr.advice.verdicts` states the procedure and its sources);
* ``<stem>.md``           — the same as tables.

**Every seed draws everything random**: initial weights, batch order and the target's labeled rows
(``target_train.label_draw = seed``: another set of whole patients of the same size per seed;
``--label-draw fixed`` keeps the one draw of the runs made before the knob). The test split is
fixed. The number of seeds is ``--seeds`` for every method of every cell — no seeds are added where
a margin looks close (that optional stopping made the first map's verdicts).

**Local training, the authors'**: every source trains one epoch over its rows a round
(:data:`REGIME_CONFIG`; the first map's 8 steps a round is the variant ``--set source.steps=8``).
The target makes one pass over its labeled rows a round in every method that fine-tunes each
round; Finetune_Offline's passes after the last round are set to the cell's rounds
(:data:`ROUND_MATCHED`), so no method makes more target passes than the rounds (the tables report
each method's passes).

**The chooser** (``--select``): per cell and seed, :data:`SELECT_CANDIDATES` are cross-fitted on the
seed's labeled rows only (:mod:`fedcxr.workflows.choose`, ``--select-folds`` folds by patient; the
fold runs never see a test label), the best out-of-fold AUROC is chosen, and the ``Selected`` row
is that method's run of the seed (trained on all N labels) — its regret against the cell's winner
is what choosing within the budget costs.

Sites (:mod:`regime_sites`; ``--dataset pneumoniamnist`` or ``kermany``): sources ``site-1..3`` =
the official *train* rows dealt by patient hash; target = the official *test* rows (``--target-from``)
re-split by patient hash. Finished runs are skipped, so a grid can be built in parts and the tables
are rebuilt from every finished run of the variant::

    nice -n 15 python benchmarks/bench_regime.py --shifts shortcut --labels 50 --rounds 20 \\
        --methods Target_Only FedGP FedGP_Auto --seeds 10 --workers 2
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
sys.path.insert(0, str(HERE))  # a real module: its functions must pickle into the worker processes
import bench_shift  # noqa: E402
import regime_ledger  # noqa: E402
import regime_sites  # noqa: E402
import regime_tables  # noqa: E402

REPO = HERE.parent
METHODS = ["Target_Only", "Finetune_Offline", "FedAvg_Finetune", "FedAvg_Finetune_GP", "FedGP", "FedGP_Auto",
           "FedDA", "FedDA_Auto"]

#: Overrides one method needs to run at all in this setting, applied to its runs only (after the
#: cell's ``--set``). SCAFFOLD refuses Adam at the sources (option II's control variate assumes
#: plain SGD steps; it defaults to plain SGD, momentum 0), and plain SGD at the house lr 1e-3
#: barely moves: lr 0.03 is bench_baselines.py's choice (≈ Reddi et al.'s best client lr on
#: CIFAR-10, 10^-1.5; not tuned here). Every other knob — rows, local training, target budget — is the cell's.
METHOD_OVERRIDES: dict[str, list[str]] = {
    "SCAFFOLD": ["source.lr=0.03"],
    "SCAFFOLD_Finetune": ["source.lr=0.03"],
}
#: Per method, a config key set to the cell's rounds: Finetune_Offline fine-tunes after the last
#: round, 50 passes by default (FedGP paper App. C) — at 20 rounds 2.5 times the target passes of
#: every other method. Set to the rounds, no method makes more target passes than any other can.
ROUND_MATCHED: dict[str, str] = {"Finetune_Offline": "finetune_offline_epochs"}

#: Methods that never read a target label: their runs do not depend on ``labels``, so one run per
#: (shift, rounds, seed) serves every label count of the grid (``WORK/sweep/<variant>/_shared/<shift>-r<rounds>``,
#: linked into each cell's ``runs/``) — the same model and score, trained once instead of five times.
LABEL_FREE = ("FedAvg", "FedProx", "SCAFFOLD", "FedAdam", "FedYogi", "FedAdagrad", "Source_Only")

#: One config for every run: bench_shift's network and data; the sources the authors' local
#: training (one epoch a round: AuxInfo+GP ``--num_source_epochs 1``, AutoFedGP "local update epoch
#: 1"); the target at the papers' learning rate, 1/5 of the sources' (AutoFedGP ``--lr_ratio 0.2``;
#: AuxInfo+GP paper App. A.3: 1e-3 / 2e-4), one pass over its labeled rows a round. Its batch size is
#: each method's default unless ``--set`` says otherwise.
REGIME_CONFIG: dict = {
    "name": "regime",
    "source": {"lr": 1.0e-3, "batch_size": 32, "epochs": 1},
    "target_train": {"lr": 2.0e-4, "epochs": 1},
    "model": {"backbone": "resnet_tiny", "hidden": 64},
    "image_size": 28,
    "augment": False,
    "device": "cpu",
}

#: The chooser's candidates in the map (fixed before any result of the map with fresh draws): the
#: hospital alone, the offline fine-tune, the federated fine-tune and GP — the four families that led
#: cells of the first map. Each reads target labels (a label-free candidate needs no cross-fitting).
SELECT_CANDIDATES = ["Target_Only", "Finetune_Offline", "FedAvg_Finetune", "FedAvg_Finetune_GP"]
SELECT_FOLDS = 3

log = logging.getLogger("bench_regime")


def cell_name(shift: str, labels: int, rounds: int) -> str:
    return f"{shift}-n{labels}-r{rounds}"


def cell_config(work: Path, manifests: Path, shift: str, labels: int, rounds: int, overrides: Sequence[str],
                variant: str = "default") -> Path:
    """Write the cell's YAML (``work/sweep/<variant>/<cell>/config.yaml``) and warm its image caches.

    Validation only at the last round (``eval_every = rounds``): the scored round's validation
    AUROC is recorded beside the test AUROC, and costs one pass over 108 images a run."""
    from fedcxr.pipeline.config import apply_overrides

    sources, target = regime_sites.cell_sites(manifests, work, shift)
    cfg = json.loads(json.dumps(REGIME_CONFIG))
    cfg.update({"manifests": str(manifests.resolve()), "sites": sources, "target": str(target),
                "cache_dir": str((work / "cache").resolve()), "rounds": rounds, "eval_every": rounds})
    cfg["target_train"]["labeled"] = labels
    cfg = apply_overrides(cfg, list(overrides))
    out = work / "sweep" / variant / cell_name(shift, labels, rounds)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    bench_shift.warm_caches(path)
    return path


# --------------------------------------------------------------------------- runs


def run_settings(method: str, seed: int, rounds: int, label_draw: str = "seed", cell_keys=()) -> list[str]:
    """The ``--set`` strings of one (method, seed) of a cell: the method, the seed, the seed's label
    draw, the method's own overrides and its round-matched target passes (unless the cell's config
    sets that key itself: ``--set finetune_offline_epochs=50`` reproduces the first map's 50)."""
    settings = [f"strategy={method}", f"seed={seed}", *METHOD_OVERRIDES.get(method, [])]
    if label_draw == "seed":
        settings.append(f"target_train.label_draw={seed}")
    if method in ROUND_MATCHED and ROUND_MATCHED[method] not in cell_keys:
        settings.append(f"{ROUND_MATCHED[method]}={rounds}")
    return settings


def cell_keys(config) -> set[str]:
    """The top-level keys a cell's config sets (its ``--set`` ones among them)."""
    return set(yaml.safe_load(Path(config).read_text()) or {})


def run_one(job: tuple) -> float:
    """One run in a worker process (one torch thread): train, then (not a fold run) evaluate on test.
    ``job`` = (config, settings, run_dir, evaluate); returns the wall time."""
    import torch

    from fedcxr.pipeline.config import load_config
    from fedcxr.pipeline.run_driver import run_experiment
    from fedcxr.rundir import RunDir
    from fedcxr.workflows.evaluate import evaluate_run

    config, settings, run_dir, evaluate = job
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    t0 = time.time()
    run = RunDir(Path(run_dir))
    if not run.final_model.exists():
        cfg = load_config(config, overrides=list(settings))
        run_experiment(cfg, run.root, resume=bool(run.checkpoint_files()), device="cpu", progress=False)
    if evaluate and not run.report_json.exists():
        evaluate_run(run.root, split="test", n_boot=0, device="cpu")
    return time.time() - t0


def finished(job: tuple) -> bool:
    """Whether :func:`run_one` has nothing left to do for ``job``: its test report written (an evaluated
    job) or its final model (a fold run, never evaluated on test)."""
    from fedcxr.rundir import RunDir

    _config, _settings, run_dir, evaluate = job
    run = RunDir(Path(run_dir))
    return (run.report_json if evaluate else run.final_model).is_file()


def cell_jobs(configs: dict, methods: Sequence[str], seeds, label_draw: str = "seed", skip: set = frozenset()
              ) -> list[tuple]:
    """The jobs of some cells' runs; a label-free method's run is shared by every label count of its
    (shift, rounds) — one job, linked into each cell's ``runs/``. A run whose (shift, labels, rounds,
    method, seed) is in ``skip`` (the ledger's: finished in another checkout) is not trained again."""
    jobs: dict[str, tuple] = {}
    for (shift, labels, rounds), config in configs.items():
        runs = Path(config).parent / "runs"
        for method in methods:
            for seed in seeds:
                if (shift, labels, rounds, method, seed) in skip:
                    continue
                run_dir = runs / f"{method}-seed{seed}"
                if method in LABEL_FREE:
                    shared = Path(config).parents[1] / "_shared" / f"{shift}-r{rounds}" / "runs" / run_dir.name
                    runs.mkdir(parents=True, exist_ok=True)
                    if not run_dir.is_symlink() and not run_dir.exists():
                        run_dir.symlink_to(Path("..", "..", "_shared", f"{shift}-r{rounds}", "runs", run_dir.name))
                    run_dir = shared
                jobs.setdefault(str(run_dir), (str(config), run_settings(method, seed, rounds, label_draw,
                                                                         cell_keys(config)), str(run_dir), True))
    return list(jobs.values())


def select_jobs(configs: dict, candidates: Sequence[str], seeds, folds: int, label_draw: str = "seed",
                skip: set = frozenset()) -> list[tuple]:
    """The chooser's fold runs (``<cell>/select/<method>-seed<k>-fold<i>``): never evaluated on test;
    none for a seed whose ``Selected`` row is in ``skip`` (the ledger's: it has chosen already)."""
    from fedcxr.workflows.choose import holdout_settings

    jobs = []
    for (shift, labels, rounds), config in configs.items():
        for method in candidates:
            for seed in seeds:
                if (shift, labels, rounds, regime_tables.SELECTED, seed) in skip:
                    continue
                for fold in range(folds):
                    run_dir = Path(config).parent / "select" / f"{method}-seed{seed}-fold{fold}"
                    jobs.append((str(config), [*run_settings(method, seed, rounds, label_draw, cell_keys(config)),
                                               *holdout_settings(folds, fold)], str(run_dir), False))
    return jobs


def run_jobs(jobs: list[tuple], workers: int) -> None:
    def name(job: tuple) -> str:
        return f"{Path(job[2]).parents[1].name}/{Path(job[2]).name}"

    if workers <= 1:
        for job in jobs:
            print(f"{name(job)}: {run_one(job):.0f} s", flush=True)
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        for job, wall in zip(jobs, pool.map(run_one, jobs)):
            print(f"{name(job)}: {wall:.0f} s", flush=True)


# --------------------------------------------------------------------------- collecting


RUN_COLUMNS = ["shift", "labels", "rounds", "method", "seed", "label_draw", "auroc", "val_auroc", "target_passes",
               "wall_s", "chosen"]


def collect(work: Path, variant: str = "default", *, candidates: Sequence[str] = SELECT_CANDIDATES,
            folds: int = SELECT_FOLDS, known: Optional[pd.DataFrame] = None) -> pd.DataFrame:
    """Every finished run of a variant (all its cells ever run, not only this call's), and a
    ``Selected`` row per cell and seed whose fold runs are all finished; with ``known`` (the
    ledger's runs of the variant, :mod:`regime_ledger`), those too, the ledger's row where both have a run."""
    rows = []
    for report in sorted((work / "sweep" / variant).glob("*/runs/*/report.json")):
        run_dir = report.parent
        shift, labels, rounds = _cell_of(run_dir.parent.parent.name)
        method, seed = run_dir.name.rsplit("-seed", 1)
        rows.append({"shift": shift, "labels": labels, "rounds": rounds, "method": method,
                     "seed": int(seed), **run_facts(run_dir)})
    runs = pd.DataFrame(rows, columns=RUN_COLUMNS)
    if known is not None:
        runs = regime_ledger.merge(known[RUN_COLUMNS], runs, variant)
    chosen = regime_ledger.keys(runs.loc[runs["method"] == regime_tables.SELECTED])
    selected = [choice_row(cell, runs, seed, candidates, folds)
                for cell in sorted((work / "sweep" / variant).glob("*/select"))
                for seed in sorted({int(p.name.split("-seed")[1].split("-")[0]) for p in cell.glob("*-fold*")})
                if (*_cell_of(cell.parent.name), regime_tables.SELECTED, seed) not in chosen]
    selected = [r for r in selected if r is not None]
    return pd.concat([runs, pd.DataFrame(selected, columns=RUN_COLUMNS)], ignore_index=True) if selected else runs


def _cell_of(name: str) -> tuple[str, int, int]:
    """``mix4-n25-r20`` → ("mix4", 25, 20)."""
    shift, labels, rounds = name.rsplit("-", 2)
    return shift, int(labels[1:]), int(rounds[1:])


def run_facts(run_dir: Path) -> dict:
    """The test AUROC of the run's target, its validation AUROC of the scored round (the last), its
    label draw, the target's passes over its labeled rows and the training seconds."""
    sites = json.loads((run_dir / "report.json").read_text())["sites"]
    name = "target" if "target" in sites else "target-base"
    value = sites[name].get("mean_auroc")
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    config = json.loads((run_dir / "run.json").read_text())["config"]
    val = (history[-1].get("val") or {}).get(name, {}).get("mean_auroc") if history else None
    epochs = (config.get("target_train") or {}).get("epochs") or 1
    passes = sum(int((h.get("target") or {}).get("passes", 1)) * epochs for h in history if h.get("target"))
    return {"label_draw": (config.get("target_train") or {}).get("label_draw"),
            "auroc": float(value) if value is not None else float("nan"),
            "val_auroc": float(val) if val is not None else float("nan"),
            "target_passes": passes, "wall_s": round(sum(float(h.get("seconds", 0)) for h in history), 1)}


def choice_row(select_dir: Path, runs: pd.DataFrame, seed: int, candidates: Sequence[str], folds: int) -> Optional[dict]:
    """The ``Selected`` row of one cell and seed: the chooser's pick from its fold runs (cached in
    ``select/choice-seed<k>.json``) and that method's own run of the seed (all N labels) — or None
    while a fold run or the chosen run is unfinished."""
    from fedcxr.workflows.choose import choice_margin, heldout_predictions, pick, pooled_auroc

    cache = select_dir / f"choice-seed{seed}.json"
    choice = json.loads(cache.read_text()) if cache.is_file() else {}
    if choice.get("candidates") != list(candidates) or choice.get("folds") != folds or "margin" not in choice:
        fold_runs = {m: [select_dir / f"{m}-seed{seed}-fold{f}" for f in range(folds)] for m in candidates}
        if not all((r / "final_model.pt").is_file() for rs in fold_runs.values() for r in rs):
            return None
        heldout = {m: [heldout_predictions(r, "cpu") for r in rs] for m, rs in fold_runs.items()}
        scores = {m: pooled_auroc(parts) for m, parts in heldout.items()}
        chosen = pick(scores, candidates)
        margin = choice_margin(heldout, scores, chosen)
        choice = {"chosen": chosen, "scores": scores, "candidates": list(candidates), "folds": folds,
                  "margin": margin.as_dict() if margin else None}
        cache.write_text(json.dumps(choice, indent=1))
    shift, labels, rounds = _cell_of(select_dir.parent.name)
    mine = runs.loc[(runs["shift"] == shift) & (runs["labels"] == labels) & (runs["rounds"] == rounds)
                    & (runs["method"] == choice["chosen"]) & (runs["seed"] == seed)]
    if mine.empty:
        return None
    return {**mine.iloc[0].to_dict(), "method": regime_tables.SELECTED, "chosen": choice["chosen"]}


#: one row per cell and seed the chooser chose in: every candidate's out-of-fold AUROC (``oof_<method>``)
#: and the margin of the choice over the runner-up (:func:`fedcxr.workflows.choose.choice_margin`)
CHOICE_KEY = ["shift", "labels", "rounds", "seed"]
CHOICE_COLUMNS = [*CHOICE_KEY, "chosen", "runner_up", "margin", "margin_lo", "margin_hi", "ahead", "resamples"]


def choices(work: Path, variant: str = "default") -> pd.DataFrame:
    """The chooser's choices cached in the runs folder (``<cell>/select/choice-seed<k>.json``), one row
    per cell and seed: what a selection analysis needs (which candidate scored what on the N labeled
    rows, and how far apart), kept beside the runs because the fold runs themselves are not."""
    rows = []
    for cache in sorted((work / "sweep" / variant).glob("*/select/choice-seed*.json")):
        choice = json.loads(cache.read_text())
        margin = choice.get("margin") or {}
        shift, labels, rounds = _cell_of(cache.parents[1].name)
        rows.append({"shift": shift, "labels": labels, "rounds": rounds,
                     "seed": int(cache.stem.split("-seed")[1]), "chosen": choice["chosen"],
                     "runner_up": margin.get("runner_up"), "margin": margin.get("diff"), "margin_lo": margin.get("low"),
                     "margin_hi": margin.get("high"), "ahead": margin.get("ahead"), "resamples": margin.get("resamples"),
                     **{f"oof_{m}": v for m, v in choice["scores"].items()}})
    frame = pd.DataFrame(rows)
    return frame if len(frame) else pd.DataFrame(columns=CHOICE_COLUMNS)


# --------------------------------------------------------------------------- outputs


def write_outputs(runs: pd.DataFrame, out: Path, stem: str, methods: Sequence[str], meta: dict) -> pd.DataFrame:
    out.mkdir(parents=True, exist_ok=True)
    cells = regime_tables.cell_table(runs)
    pairs, verdicts = regime_tables.pair_table(runs), regime_tables.verdict_table(runs)
    runs.sort_values([*regime_tables.CELL, "method", "seed"]).to_csv(out / f"{stem}_runs.csv", index=False)
    cells.to_csv(out / f"{stem}_cells.csv", index=False)
    pairs.to_csv(out / f"{stem}_pairs.csv", index=False)
    verdicts.to_csv(out / f"{stem}_verdicts.csv", index=False)
    md = regime_tables.markdown(cells, pairs, verdicts, methods)
    (out / f"{stem}.md").write_text(f"{md}\n```json\n{json.dumps(meta, indent=1, default=str)}\n```\n")
    print(md)
    return cells


# --------------------------------------------------------------------------- main


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", choices=["pneumoniamnist", "kermany"], default="pneumoniamnist",
                   help="pneumoniamnist (28 px npz) or kermany (the 224 px originals; give it its own --work)")
    p.add_argument("--npz", type=Path, default=None, help="PneumoniaMNIST npz (default ../shared/data/medmnist) or "
                   "the Kermany folder (default ../shared/data/kermany-pediatric-pneumonia)")
    p.add_argument("--work", type=Path, default=REPO / "runs" / "bench_regime", help="sites, caches and runs")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results", help="CSV and Markdown tables")
    p.add_argument("--stem", default="regime", help="output file stem")
    p.add_argument("--shifts", nargs="+", default=["shortcut"],
                   help="none | shortcut | labelnoise<percent> | <kind><level> (mix4, noise3, …) | hetero | hetero_<shift>")
    p.add_argument("--labels", type=int, nargs="+", default=[50], help="labeled target rows")
    p.add_argument("--rounds", type=int, nargs="+", default=[20])
    p.add_argument("--methods", nargs="+", default=METHODS)
    p.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 for every method of every cell (fixed in "
                   "advance: no seeds are added where a margin looks close)")
    p.add_argument("--from-seed", type=int, default=0, metavar="K",
                   help="train seeds K..N-1 only (a part of a long grid; the tables still cover every finished seed)")
    p.add_argument("--label-draw", choices=["seed", "fixed"], default="seed",
                   help="seed: each seed draws its own labeled target rows (target_train.label_draw = seed); "
                        "fixed: the one draw of the runs made before the knob")
    p.add_argument("--select", action="store_true",
                   help="also the chooser's fold runs, and a Selected row per cell and seed (SELECT_CANDIDATES)")
    p.add_argument("--select-folds", type=int, default=SELECT_FOLDS, help="folds of the labeled rows for --select")
    p.add_argument("--select-candidates", nargs="+", default=SELECT_CANDIDATES, metavar="METHOD",
                   help="the chooser's candidates (default: SELECT_CANDIDATES, fixed for the map)")
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
    p.add_argument("--ledger", type=Path, default=None,
                   help="the regime ledger (regime_ledger.py): its runs of --variant are not trained again and join the "
                        "tables")
    p.add_argument("--versus", nargs="+", default=[], metavar="VARIANT",
                   help="also compare with these variants' finished runs, paired by seed: <stem>_versus_<variant>.csv")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> pd.DataFrame:
    import torch

    from fedcxr.pipeline.protocols import get_protocol

    args = parse(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    for method in [*args.methods, *args.select_candidates]:
        get_protocol(method)  # a typo fails before any training
    start = time.time()
    manifests = regime_sites.prepare(args.dataset, args.npz, args.work, target_split=args.target_split,
                                     target_from=args.target_from)
    configs = {}
    for shift in args.shifts:
        for labels in args.labels:
            for rounds in args.rounds:
                configs[(shift, labels, rounds)] = cell_config(args.work, manifests, shift, labels, rounds,
                                                               args.overrides, args.variant)
    seeds = range(args.from_seed, args.seeds)
    known = regime_ledger.known(args.ledger, RUN_COLUMNS, args.variant) if args.ledger else None
    done = regime_ledger.keys(known) if known is not None else set()
    jobs = cell_jobs(configs, args.methods, seeds, args.label_draw, skip=done)
    if args.select:
        candidates = args.select_candidates
        jobs += cell_jobs(configs, [m for m in candidates if m not in args.methods], seeds, args.label_draw, skip=done)
        jobs += select_jobs(configs, candidates, seeds, args.select_folds, args.label_draw, skip=done)
    if done:
        print(f"the ledger {args.ledger} holds {len(known)} finished run(s) of {args.variant}: "
              f"{len(jobs)} job(s) left to train", flush=True)
    run_jobs(jobs, args.workers)
    runs = collect(args.work, args.variant, candidates=args.select_candidates, folds=args.select_folds, known=known)
    meta = {"config": REGIME_CONFIG, "dataset": args.dataset, "variant": args.variant, "overrides": args.overrides,
            "shortcut_rates": regime_sites.SHORTCUT_RATES, "hetero_sources": regime_sites.HETERO_SOURCES,
            "method_overrides": {m: METHOD_OVERRIDES[m] for m in args.methods if m in METHOD_OVERRIDES},
            "round_matched": ROUND_MATCHED, "label_draw": args.label_draw,
            "select": {"candidates": args.select_candidates, "folds": args.select_folds} if args.select else None,
            "target_from": args.target_from, "target_split": args.target_split,
            "this_call": {"shifts": args.shifts, "labels": args.labels, "rounds": args.rounds,
                          "methods": args.methods, "seeds": [args.from_seed, args.seeds],
                          "wall_s": round(time.time() - start)}}
    write_outputs(runs, args.out, args.stem, args.methods, meta)
    for variant in args.versus:
        table = regime_tables.versus_table(runs, collect(args.work, variant))
        table.to_csv(args.out / f"{args.stem}_versus_{variant}.csv", index=False)
        print(f"\n{args.variant} − {variant}, paired by seed:\n" + table.to_string(index=False, float_format="%.3f"))
    print(f"total {time.time() - start:.0f} s; outputs in {args.out}")
    return runs


if __name__ == "__main__":
    main()
