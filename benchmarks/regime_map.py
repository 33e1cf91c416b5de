"""The regime map on real PneumoniaMNIST, planned in parts: which method wins where, and by how much.

The grid of the map with fresh draws (fixed before any of its results was seen, issue 30):

* shift type: ``none``; ``mix4`` (pixel: gamma 2.5, blur σ 0.05 of the side, noise σ 0.15 on the
  target); ``shortcut`` (a corner marker on 95 % of pneumonia / 5 % of normal images at every source,
  reversed at the target: the FedGP papers' ColoredMNIST −90 % case); ``labelnoise40`` (every
  source's training labels flipped at rate 0.4);
* target labels 10, 25, 50, 100, 500; rounds 20, 50 (counting the warm-up rounds);
* methods :data:`METHODS`; :data:`SEEDS` seeds for every method of every cell, each seed its own
  initial weights, batch order **and draw of the labeled target rows** (``target_train.label_draw``);
* ``bench_regime.REGIME_CONFIG``: the sources train one epoch a round (the authors' local training);
  the target one pass over its labeled rows a round (Finetune_Offline: as many passes as rounds,
  after the last); verdicts corrected for the winner's selection and the number of cells
  (:mod:`fedcxr.advice.verdicts`).

Sites: sources = the official *train* rows dealt to 3 sites by patient hash (~1,400 training rows
each); target = the official *val + test* rows (1,145 images) split 50/10/40 by patient hash: 533
training rows (enough for 500 labels), 108 validation, 504 test.

Grids (``--grid``; every part is one cell × a block of seeds, sized to ~30 minutes with 2 workers by
:func:`estimate_seconds`, measured from one run):

* ``core``   — :data:`CORE`: the 14 cells to run first (the first map's resolved cells and the cells
  the README's advice rests on);
* ``map``    — every cell of the grid (the core's parts are among them: finished runs are skipped);
* ``select`` — the chooser's fold runs (``Selected``: :data:`bench_regime.SELECT_CANDIDATES`, 3 folds)
  in the core cells;
* ``steps8`` — the first map's 8 source steps a round, a labelled variant in :data:`STEPS8_CELLS`,
  compared run by run with the default (``--tables`` writes ``regime_map_versus_steps8.csv``);
* ``papers`` — closer to the papers (item 5): sources that differ from each other (``hetero``, each
  source its own shift), 133 target labels (25 % of the target's 533, the AuxInfo+GP paper's setting);
* ``kermany`` — the resolution check: the 224 px originals of PneumoniaMNIST at 64 px with ResNet-18,
  in its own work folder (its estimate from one timed part: see :data:`KERMANY_FACTOR`).

Run, from scratch (finished runs are skipped — those in the runs folder and those in the committed ledger,
:mod:`regime_ledger`, so parts run in any order, interrupted and re-run, in this checkout or a new one)::

    python benchmarks/regime_map.py --plan                            # every grid: parts, runs, hours
    python benchmarks/regime_map.py --list --grid core                # the core's parts, one per line
    for part in $(python benchmarks/regime_map.py --list --grid core); do
        nice -n 15 python benchmarks/regime_map.py --part "$part" --workers 2
    done
    python benchmarks/regime_map.py --tables                          # CSVs, Markdown, heatmap
    python benchmarks/build_regime_map.py                             # fedcxr/advice/regime_map.csv

Outputs (``benchmarks/results/``): ``regime_map_runs.csv`` (one row per run), ``_cells.csv``,
``_pairs.csv``, ``_verdicts.csv`` (bench_regime's), ``_papers.csv`` (each papers' method per cell),
``regime_map.md``, ``regime_map_summary.md``, ``regime_map.png``, ``regime_map_parts.csv`` (each
part's wall time, runs, commit and load), ``regime_map_ledger.csv`` (every finished run of every grid,
complete cell or not: what a new checkout resumes from), ``regime_map_choices.csv`` (per cell and seed
the chooser chose in: each candidate's out-of-fold AUROC on the N labeled rows, and the choice's margin).

The tables (``--tables``, and the ones each part writes when it ends) hold only the cells whose plan
has fully run — every method, every planned seed (:func:`complete_cells`); a cell with a part still
to run is named on the console and left out, so no verdict or Holm correction rests on half a plan.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_regime  # noqa: E402
import regime_figures  # noqa: E402
import regime_ledger  # noqa: E402
import regime_tables  # noqa: E402

REPO = HERE.parent
SHIFTS = ["none", "mix4", "shortcut", "labelnoise40"]
LABELS = [10, 25, 50, 100, 500]
ROUNDS = [20, 50]
METHODS = ["Target_Only", "Finetune_Offline", "FedAvg", "FedAvg_Finetune", "FedDA", "FedDA_Auto", "FedGP",
           "FedGP_Auto", "FedAvg_Finetune_GP", "FedProx_Finetune", "SCAFFOLD_Finetune", "FedAdam_Finetune"]
#: the papers' methods (FedDA/FedGP and their auto versions: Jiang et al.; GP: the AuxInfo+GP paper)
PAPERS = ["FedDA", "FedDA_Auto", "FedGP", "FedGP_Auto", "FedAvg_Finetune_GP"]
#: seeds 0..SEEDS-1 for every method of every cell, fixed before any result: with 12 methods and 40
#: cells, the first Holm step needs p_iut < 0.05 / 480 — a winner ahead of every other method by
#: about 1.9 standard deviations of the paired differences with 10 seeds (5.8 with 5).
SEEDS = 10
TARGET_FROM, TARGET_SPLIT = ["val", "test"], [0.5, 0.1, 0.4]
VARIANT, STEM = "epoch1", "regime_map"
#: every finished run of every grid, complete cell or not (:mod:`regime_ledger`), in ``--out``
LEDGER = f"{STEM}_ledger.csv"
#: the chooser's choices, one row per cell and seed: each candidate's out-of-fold AUROC and the margin
CHOICES = f"{STEM}_choices.csv"
#: the map's shift names (fedcxr/advice/regime.py SHIFT_TYPES) for the grid's
SHIFT_TYPE = {"none": "none", "mix4": "pixel", "shortcut": "shortcut", "labelnoise40": "label_noise"}

#: The cells to run first: the six the first map resolved (none 500 / 20 rounds; pixel 10, 25 / 20;
#: label noise 500 / 20; pixel 25, 50 / 50), and those the README's advice rests on (no shift with
#: few labels; the shortcut with 10–50; label noise with 10 and 50; pixel 50 at 20 rounds).
CORE = [("none", 10, 20), ("none", 50, 20), ("none", 500, 20),
        ("mix4", 10, 20), ("mix4", 25, 20), ("mix4", 50, 20),
        ("shortcut", 10, 20), ("shortcut", 25, 20), ("shortcut", 50, 20),
        ("labelnoise40", 10, 20), ("labelnoise40", 50, 20), ("labelnoise40", 500, 20),
        ("mix4", 25, 50), ("mix4", 50, 50)]
#: the 8-steps-a-round variant (the first map's setting) where issue 30 saw it decide a verdict
STEPS8_CELLS = [("mix4", 25, 20), ("shortcut", 25, 20), ("labelnoise40", 50, 20), ("none", 50, 20)]
STEPS8 = ("steps8", ["source.steps=8"])
#: item 5: sources that differ from each other, and 25 % target labels (133 of 533)
PAPERS_CELLS = [("hetero", 25, 20), ("hetero", 133, 20), ("hetero_mix4", 25, 20), ("hetero_mix4", 133, 20),
                ("mix4", 133, 20), ("shortcut", 133, 20), ("labelnoise40", 133, 20)]
#: the resolution check: Kermany's originals at 64 px, ResNet-18 (its own work folder and variant)
KERMANY_CELLS = [("none", 25, 20), ("none", 100, 20), ("mix4", 25, 20), ("mix4", 100, 20)]
KERMANY_METHODS = ["Target_Only", "Finetune_Offline", "FedAvg_Finetune", "FedAvg_Finetune_GP", "FedGP"]
KERMANY = ("kermany64", ["image_size=64", "model.backbone=resnet18", "model.hidden=128"])
#: Kermany's sites: 1,081 train images in 3 sources (~330 rows each, a quarter of the 28 px map's) at
#: 64 px with ResNet-18 (~8× resnet_tiny's work per pixel, 5.2× the pixels). Measured: the first part
#: (none, 25 labels, seed 0: its 5 runs and the building of the 64 px sites) took 768 s with 2 workers
#: against 1,309 s estimated at the first guess of × 10, so × 5.9 (2026-11-29; 2 seeds a part, not 1).
KERMANY_FACTOR = 5.9

#: Seconds of one 20-round run of a federated method, one torch thread, measured: FedAvg_Finetune_GP,
#: no shift, 50 labels, seed 0, this config: 54.1 s of training + ~8 s to start, validate and evaluate
#: (62 s in all; nice 15, load 3.5–4.7 on the 2 shared cores; 8 steps a round: 13.7 s of training).
SECONDS_PER_ROUND, RUN_OVERHEAD_S = 54.1 / 20, 8.0
#: Target_Only trains no source: about a tenth of a federated round; 500 labels add ~12 % (the
#: target's 500 rows beside 3 × ~1,400 source rows)
TARGET_ONLY_SHARE, MANY_LABELS_FACTOR = 0.1, 1.12
#: a part's budget: 30 minutes with 2 workers
PART_SECONDS, WORKERS = 1800, 2


def estimate_seconds(method: str, labels: int, rounds: int, factor: float = 1.0) -> float:
    """The estimated wall seconds of one run of ``method`` (one worker)."""
    per_round = SECONDS_PER_ROUND * (TARGET_ONLY_SHARE if method == "Target_Only" else 1.0)
    return factor * (RUN_OVERHEAD_S + rounds * per_round * (MANY_LABELS_FACTOR if labels >= 500 else 1.0))


def cell_seed_seconds(cell: tuple, methods: Sequence[str], kind: str, factor: float = 1.0) -> float:
    """One seed of a cell: its runs (``main``) or its fold runs (``select``), in worker-seconds."""
    _, labels, rounds = cell
    if kind == "select":
        return bench_regime.SELECT_FOLDS * sum(estimate_seconds(m, labels, rounds, factor)
                                               for m in bench_regime.SELECT_CANDIDATES)
    return sum(estimate_seconds(m, labels, rounds, factor) for m in methods)


# --------------------------------------------------------------------------- grids and parts


def grids() -> dict[str, dict]:
    """Grid name → its cells, methods, kind (runs or the chooser's fold runs), variant and settings."""
    every = [(s, n, r) for r in ROUNDS for s in SHIFTS for n in LABELS]
    return {
        "core": {"cells": CORE, "methods": METHODS, "kind": "main", "variant": VARIANT, "set": [], "factor": 1.0},
        "map": {"cells": every, "methods": METHODS, "kind": "main", "variant": VARIANT, "set": [], "factor": 1.0},
        "select": {"cells": CORE, "methods": METHODS, "kind": "select", "variant": VARIANT, "set": [], "factor": 1.0},
        "steps8": {"cells": STEPS8_CELLS, "methods": METHODS, "kind": "main", "variant": STEPS8[0], "set": STEPS8[1],
                   "factor": 13.7 / 54.1},
        "papers": {"cells": PAPERS_CELLS, "methods": METHODS, "kind": "main", "variant": VARIANT, "set": [],
                   "factor": 1.0},
        "kermany": {"cells": KERMANY_CELLS, "methods": KERMANY_METHODS, "kind": "main", "variant": KERMANY[0],
                    "set": KERMANY[1], "factor": KERMANY_FACTOR, "dataset": "kermany"},
    }


def parts(grid: str) -> dict[str, dict]:
    """Part name → {grid, cell, seeds (a range), est_s}: one cell × the most seeds that fit :data:`PART_SECONDS`."""
    spec = grids()[grid]
    out = {}
    for cell in spec["cells"]:
        per_seed = cell_seed_seconds(cell, spec["methods"], spec["kind"], spec["factor"]) / WORKERS
        block = max(1, min(SEEDS, int(PART_SECONDS // per_seed)))
        blocks = -(-SEEDS // block)
        block = -(-SEEDS // blocks)  # even blocks: 10 seeds as 5 + 5, not 7 + 3
        for start in range(0, SEEDS, block):
            seeds = range(start, min(SEEDS, start + block))
            name = f"{grid}:{bench_regime.cell_name(*cell)}:s{seeds.start}-{seeds.stop - 1}"
            out[name] = {"grid": grid, "cell": cell, "seeds": seeds, "est_s": per_seed * len(seeds)}
    return out


def all_parts() -> dict[str, dict]:
    return {name: part for grid in grids() for name, part in parts(grid).items()}


def part_argv(part: dict, *, work: Path, out: Path, workers: int, npz: Optional[Path] = None,
              extra: Sequence[str] = ()) -> list[str]:
    """``bench_regime.py`` arguments of one part."""
    spec = grids()[part["grid"]]
    shift, labels, rounds = part["cell"]
    argv = ["--work", str(part_work(work, part["grid"])), "--out", str(out), "--stem", STEM,
            "--variant", spec["variant"], "--dataset", spec.get("dataset", "pneumoniamnist"),
            "--target-from", *TARGET_FROM, "--target-split", *map(str, TARGET_SPLIT),
            "--shifts", shift, "--labels", str(labels), "--rounds", str(rounds),
            "--seeds", str(part["seeds"].stop), "--from-seed", str(part["seeds"].start), "--workers", str(workers)]
    argv += [a for s in spec["set"] for a in ("--set", s)] + list(extra)
    if spec["kind"] == "select":  # the candidates' own runs and their fold runs
        argv += ["--methods", *bench_regime.SELECT_CANDIDATES, "--select"]
    else:
        argv += ["--methods", *spec["methods"]]
    return argv + (["--npz", str(npz)] if npz and not spec.get("dataset") else [])


def part_work(work: Path, grid: str) -> Path:
    """Kermany's sites are not PneumoniaMNIST's: its own work folder beside the map's."""
    return work.parent / f"{work.name}_kermany" if grids()[grid].get("dataset") == "kermany" else work


def plan_table(log: Optional[Path] = None, ledger: Optional[Path] = None) -> pd.DataFrame:
    """Per grid: cells, parts, runs, estimated hours with 2 workers; with the parts ``log``, also what is left.

    A part is done (:func:`done_parts`) once the ledger holds its runs, or once every part of its cell is in
    the log (a cell's tables were written then). ``pace`` is the median
    measured/estimated wall time of the grid's full parts in the log, so ``left_hours`` is the estimate
    corrected by what this machine did, not a second guess. A grid with no full part logged borrows the
    pace of a grid of the same kind of runs (the same variant, kind and dataset: the map and the papers'
    cells take the core's; ``pace_of`` names it), or has none (Kermany's until its first part is timed)."""
    done, paces = done_parts(log, ledger), _logged(log)[1]
    rows = []
    for grid, spec in grids().items():
        mine = parts(grid)
        runs_per_seed = (bench_regime.SELECT_FOLDS * len(bench_regime.SELECT_CANDIDATES) if spec["kind"] == "select"
                         else len(spec["methods"]))
        row = {"grid": grid, "cells": len(spec["cells"]), "parts": len(mine),
               "runs": len(spec["cells"]) * SEEDS * runs_per_seed,
               "est_hours": round(sum(p["est_s"] for p in mine.values()) / 3600, 1),
               "longest_part_min": round(max(p["est_s"] for p in mine.values()) / 60)}
        if log is not None:
            left = [p for name, p in mine.items() if name not in done]
            source = grid if grid in paces else next((g for g in paces if _kind(g) == _kind(grid)), None)
            pace = paces.get(source)
            row.update(parts_left=len(left), left_est_hours=round(sum(p["est_s"] for p in left) / 3600, 1),
                       pace=None if pace is None else round(pace, 2), pace_of=source,
                       left_hours=None if pace is None else round(pace * sum(p["est_s"] for p in left) / 3600, 1))
        rows.append(row)
    return pd.DataFrame(rows)


def _logged(log: Optional[Path]) -> tuple[set[tuple], dict[str, float]]:
    """The runs of the parts log's finished parts (:func:`same_runs`), and per grid the median
    wall/estimate of the parts that trained all their runs (a part re-run over finished runs is quick
    and says nothing of the pace)."""
    if log is None or not log.exists():
        return set(), {}
    rows = pd.read_csv(log)
    known = all_parts()
    full = rows[[name in known and n >= _runs_of(known[name]) for name, n in zip(rows["part"], rows["new_runs"])]]
    paces = (full["wall_s"] / full["est_s"]).groupby(full["part"].str.split(":").str[0]).median()
    done = {same_runs(known[name]) for name in rows["part"] if name in known}
    return done, {str(g): float(v) for g, v in paces.items()}


def done_parts(log: Optional[Path], ledger: Optional[Path]) -> set[str]:
    """The parts (of every grid) with nothing left to train: the ledger holds every run they train, or
    every part of their cell is in the parts log (logged parts of the same runs count, as the map's
    parts in the core's cells).

    Why both: the ledger came after the first cells were run (the 8-step variant's runs, in no
    ledger, gave a table when its cells completed), while a part logged in another checkout whose
    cell is still open lost its runs with that checkout's runs folder — the log says done, no run
    says so, and only the ledger can tell."""
    logged = _logged(log)[0]
    table = regime_ledger.load(ledger, bench_regime.RUN_COLUMNS) if ledger is not None else None
    done = set()
    for grid, spec in grids().items():
        known = regime_ledger.keys(regime_ledger.rows_of(table, spec["variant"])) if table is not None else set()
        mine = parts(grid)
        for name, part in mine.items():
            if {*part_keys(part)} <= known or all(same_runs(p) in logged for p in mine.values()
                                                  if p["cell"] == part["cell"]):
                done.add(name)
    return done


def part_keys(part: dict) -> list[tuple]:
    """The ledger keys of the runs a part trains (a ``select`` part: its ``Selected`` rows)."""
    spec = grids()[part["grid"]]
    methods = [regime_tables.SELECTED] if spec["kind"] == "select" else spec["methods"]
    return [(*part["cell"], m, s) for m in methods for s in part["seeds"]]


def _kind(grid: str) -> tuple:
    spec = grids()[grid]
    return spec["variant"], spec["kind"], spec.get("dataset"), tuple(spec["set"])


def same_runs(part: dict) -> tuple:
    """What a part trains: two parts with this key train the same runs (the second finds them finished)."""
    return (*_kind(part["grid"]), tuple(grids()[part["grid"]]["methods"]), part["cell"], part["seeds"].start,
            part["seeds"].stop)


def _runs_of(part: dict) -> int:
    """The runs a part trains when none of them is finished yet (a ``select`` part logs its Selected rows)."""
    spec = grids()[part["grid"]]
    return len(part["seeds"]) * (1 if spec["kind"] == "select" else len(spec["methods"]))


# --------------------------------------------------------------------------- tables


def papers_table(runs: pd.DataFrame, pairs: pd.DataFrame, papers: Sequence[str] = PAPERS,
                 baseline: str = "FedAvg_Finetune") -> pd.DataFrame:
    """Each papers' method per cell: its mean, where it stands against the cell's winner (``winner``,
    ``tied`` or ``behind``: Holm's p_adj of the pair below α) and against ``baseline`` (``better``,
    ``same`` or ``worse``: the same family of every pair of every cell)."""
    from fedcxr.advice.verdicts import pair_lookup, pair_tests

    cells = regime_tables.by_cell(runs)
    lookup = pair_lookup(pair_tests(cells))
    rows = []
    for key, methods in cells.items():
        mine = pairs.loc[(pairs[regime_tables.CELL] == pd.Series(dict(zip(regime_tables.CELL, key)))).all(axis=1)]
        for method in papers:
            if method not in methods:
                continue
            row = {**dict(zip(regime_tables.CELL, key)), "method": method,
                   "mean": float(np.mean(list(methods[method].values())))}
            versus = mine.loc[mine["other"] == method]
            if versus.empty:
                row.update(vs_winner="winner", winner_minus=0.0, winner_lo=np.nan, winner_hi=np.nan, winner_p_adj=np.nan)
            else:
                v = versus.iloc[0]
                row.update(vs_winner=v["verdict"], winner_minus=v["diff"], winner_lo=v["lo"], winner_hi=v["hi"],
                           winner_p_adj=v["p_adj"])
            if baseline in methods and method != baseline:
                test = lookup[(key, method, baseline)]
                diff = float(np.mean([methods[method][s] - methods[baseline][s]
                                      for s in methods[method] if s in methods[baseline]]))
                verdict = "same" if not test["significant"] else "better" if diff > 0 else "worse"
                row.update(vs_baseline=verdict, baseline_diff=diff, baseline_p_adj=test["p_adj"])
            rows.append(row)
    columns = [*regime_tables.CELL, "method", "mean", "vs_winner", "winner_minus", "winner_lo", "winner_hi",
               "winner_p_adj", "vs_baseline", "baseline_diff", "baseline_p_adj"]
    return pd.DataFrame(rows, columns=columns)


def map_only(runs: pd.DataFrame) -> pd.DataFrame:
    """The map's runs among its variant's: its shifts, labels and methods (and the chooser's Selected rows)."""
    return runs.loc[runs["method"].isin([*METHODS, regime_tables.SELECTED]) & runs["shift"].isin(SHIFTS)
                    & runs["labels"].isin(LABELS)]


CELL = ["shift", "labels", "rounds"]


def complete_cells(runs: pd.DataFrame, seeds: int, methods: Sequence[str]) -> tuple[pd.DataFrame, list[str]]:
    """The runs of the cells whose plan has fully run — every method of ``methods`` for seeds
    0..``seeds``−1 — and the names of the cells left out (with how many of their runs are in).

    Why: a part writes the tables when it ends, and a cell's first part ends with half its seeds;
    a verdict (and the Holm correction over the cells) from half a plan would be the optional
    stopping issue 30 removed. Seeds past the plan are dropped too (``build_regime_map.planned``), and so
    are a cell's ``Selected`` rows until the chooser has chosen for every planned seed."""
    if runs.empty:
        return runs, []
    planned = runs.loc[runs["seed"].between(0, seeds - 1)]
    need = {(m, s) for m in methods for s in range(seeds)}
    keep, left = [], []
    for cell, rows in planned.groupby(CELL, sort=True):
        have = set(zip(rows["method"], rows["seed"]))
        name = "{}-n{}-r{}".format(*cell)
        if not need <= have:
            left.append(f"{name} ({len(need & have)} of {len(need)} runs)")
            continue
        chosen = rows["method"] == regime_tables.SELECTED  # the chooser's plan: every seed chose, or none counts
        if chosen.any() and rows.loc[chosen, "seed"].nunique() < seeds:
            left.append(f"{name}'s {regime_tables.SELECTED} rows ({rows.loc[chosen, 'seed'].nunique()} of {seeds})")
            rows = rows.loc[~chosen]
        keep.append(rows)
    return (pd.concat(keep, ignore_index=True) if keep else planned.iloc[0:0]), left


def write_tables(work: Path, out: Path, meta: dict, *, planned: Optional[tuple[int, Sequence[str]]] = None
                 ) -> pd.DataFrame:
    """Every finished run of the map → the CSVs, ``regime_map.md``, the summary and the heatmap; the
    papers' cells (with their own ``_papers`` file: each papers' method against FedAvg_Finetune, Holm
    over the papers' cells' pairs), the 8-step variant and Kermany get their own files. ``planned`` = (seeds, the map's
    methods): in every table only the cells whose plan has fully run (:func:`complete_cells`, each
    grid with its own methods; the others are named on stdout), so no file holds a half cell."""
    def complete(rows: pd.DataFrame, methods: Sequence[str], what: str) -> pd.DataFrame:
        if planned is None:
            return rows
        kept, left = complete_cells(rows, planned[0], methods)
        if left:
            print(f"{what}: left out of the tables until their planned seeds have run: {', '.join(left)}", flush=True)
        return kept

    ledger = regime_ledger.load(out / LEDGER, bench_regime.RUN_COLUMNS)

    def finished(folder: Path, variant: str) -> pd.DataFrame:
        """The variant's runs in the ledger and the runs folder; the ledger then holds them all."""
        nonlocal ledger
        rows = bench_regime.collect(folder, variant, known=regime_ledger.rows_of(ledger, variant))
        ledger = regime_ledger.add(ledger, rows, variant)
        return rows

    every = finished(work, VARIANT)
    steps8 = finished(work, STEPS8[0])
    kermany = finished(part_work(work, "kermany"), KERMANY[0])
    regime_ledger.save(ledger, out / LEDGER)
    keep_choices(work, out / CHOICES)
    runs = complete(map_only(every), planned[1] if planned else METHODS, "the map")
    bench_regime.write_outputs(runs, out, STEM, METHODS, meta)
    pairs, verdicts = pd.read_csv(out / f"{STEM}_pairs.csv"), pd.read_csv(out / f"{STEM}_verdicts.csv")
    papers = papers_table(runs, pairs)
    papers.to_csv(out / f"{STEM}_papers.csv", index=False)
    regime_figures.heatmap(verdicts, out / f"{STEM}.png", METHODS, SHIFTS, ROUNDS, LABELS, SHIFT_TYPE)
    (out / f"{STEM}_summary.md").write_text(regime_figures.summary_markdown(verdicts, runs, papers, SHIFTS,
                                                                              SHIFT_TYPE, PAPERS))
    steps8 = complete(steps8, METHODS, "the 8-step variant")
    if len(steps8):
        regime_tables.versus_table(steps8, runs).to_csv(out / f"{STEM}_versus_steps8.csv", index=False)
    extra = every.loc[~every["shift"].isin(SHIFTS) | ~every["labels"].isin(LABELS)]
    extra = complete(extra, METHODS, "the papers' cells")
    if len(extra):
        bench_regime.write_outputs(extra, out, f"{STEM}_papers_cells", METHODS, meta)
        extra_pairs = pd.read_csv(out / f"{STEM}_papers_cells_pairs.csv")  # the papers' claim vs plain fine-tuning
        papers_table(extra, extra_pairs).to_csv(out / f"{STEM}_papers_cells_papers.csv", index=False)
    kermany = complete(kermany, KERMANY_METHODS, "Kermany")
    if len(kermany):
        bench_regime.write_outputs(kermany, out, f"{STEM}_kermany", KERMANY_METHODS, {**meta, "kermany": KERMANY})
    print(f"{len(runs)} runs in {len(verdicts)} cells → {out}/{STEM}_*.csv, {STEM}.md, {STEM}.png")
    return runs


def keep_choices(work: Path, path: Path) -> pd.DataFrame:
    """The chooser's choices of the map's variant in the runs folder, added to those kept at ``path`` (the
    ledger's rule: a kept row stays). Why: the fold runs behind a choice stay in the runs folder, which a
    new checkout lacks; without their scores no selection analysis (issue 30) outlives the session."""
    kept = regime_ledger.load(path, bench_regime.CHOICE_COLUMNS)
    found = bench_regime.choices(work, VARIANT)
    if kept.empty and found.empty:
        return kept
    merged = regime_ledger.merge(regime_ledger.rows_of(kept, VARIANT), found, "the chooser's choices",
                                 key=bench_regime.CHOICE_KEY, value="margin")
    kept = regime_ledger.add(kept, merged, VARIANT)
    regime_ledger.save(kept, path, key=["variant", *bench_regime.CHOICE_KEY])
    return kept


def finished_runs(work: Path, variant: str, ledger: Path) -> int:
    """The variant's finished runs, the ledger's among them: a chooser's ``Selected`` row needs the chosen
    candidate's own run, which a new checkout has in the ledger only (counted without it, a ``select``
    part logged 0 new runs and its time was left out of the grid's pace)."""
    known = regime_ledger.known(ledger, bench_regime.RUN_COLUMNS, variant)
    return len(bench_regime.collect(work, variant, known=known))


def log_part(path: Path, name: str, started: float, new_runs: int, est_s: float) -> None:
    """Append one line to the parts log: which part, when, how long (and the estimate), new runs, commit, load."""
    import os
    import subprocess

    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    row = pd.DataFrame([{"part": name, "started": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
                         "wall_s": round(time.time() - started), "est_s": round(est_s), "new_runs": new_runs,
                         "commit": commit, "load_1min_at_end": round(os.getloadavg()[0], 1)}])
    row.to_csv(path, mode="a", header=not path.exists(), index=False)


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--list", action="store_true", help="print the parts of --grid, one per line")
    what.add_argument("--plan", action="store_true", help="every grid: cells, parts, runs, estimated hours")
    what.add_argument("--part", nargs="+", metavar="PART", help="train these parts (names from --list)")
    what.add_argument("--tables", action="store_true", help="write the tables and the heatmap from every finished run")
    p.add_argument("--grid", default="core", choices=sorted(grids()), help="--list: which grid (default core)")
    p.add_argument("--left", action="store_true", help="--list: only the parts the parts log does not have yet")
    p.add_argument("--work", type=Path, default=REPO / "runs" / "regime_map")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--workers", type=int, default=WORKERS)
    p.add_argument("--npz", type=Path, default=None, help="PneumoniaMNIST npz (default: ../shared/data/medmnist)")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse(argv)
    log, ledger = args.out / f"{STEM}_parts.csv", args.out / LEDGER
    if args.list:
        done = done_parts(log, ledger) if args.left else set()
        print("\n".join(name for name in parts(args.grid) if name not in done))
        return
    if args.plan:
        print(plan_table(log, ledger).to_string(index=False, na_rep="—"))
        done = done_parts(log, ledger)
        for grid in grids():
            for name, part in parts(grid).items():
                print(f"  {name}  ~{part['est_s'] / 60:.0f} min{'  (done)' if name in done else ''}")
        return
    meta = {"grid": {"shifts": SHIFTS, "labels": LABELS, "rounds": ROUNDS, "methods": METHODS, "seeds": SEEDS,
                     "target_from": TARGET_FROM, "target_split": TARGET_SPLIT, "core": CORE},
            "config": bench_regime.REGIME_CONFIG, "method_overrides": bench_regime.METHOD_OVERRIDES,
            "round_matched": bench_regime.ROUND_MATCHED,
            "select": {"candidates": bench_regime.SELECT_CANDIDATES, "folds": bench_regime.SELECT_FOLDS}}
    if args.tables:
        write_tables(args.work, args.out, meta, planned=(SEEDS, METHODS))
        return
    known = all_parts()
    unknown = [p for p in args.part if p not in known]
    if unknown:
        raise SystemExit(f"--part: unknown part(s) {unknown}; see --list --grid GRID")
    for name in args.part:
        part = known[name]
        print(f"== part {name}: ~{part['est_s'] / 60:.0f} min estimated", flush=True)
        variant = grids()[part["grid"]]["variant"]
        work = part_work(args.work, part["grid"])
        started, before = time.time(), finished_runs(work, variant, ledger)
        bench_regime.main(part_argv(part, work=args.work, out=args.work / "part_tables", workers=args.workers,
                                    npz=args.npz, extra=["--ledger", str(ledger)]))
        log_part(log, name, started, finished_runs(work, variant, ledger) - before, part["est_s"])
    write_tables(args.work, args.out, {**meta, "last_parts": args.part}, planned=(SEEDS, METHODS))
    print(json.dumps({"parts": args.part}))


if __name__ == "__main__":
    main()
