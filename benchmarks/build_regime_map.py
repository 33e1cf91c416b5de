"""Write ``fedcxr/advice/regime_map.csv`` from the regime map's runs (``benchmarks/regime_map.py``).

One row per cell of the grid (shift type × target labels × rounds on real PneumoniaMNIST), from
``benchmarks/results/regime_map_runs.csv`` (one row per run: shift, labels, rounds, method, seed,
auroc, …). The grid's shift names become the advice's shift types (``mix4`` → ``pixel``,
``labelnoise40`` → ``label_noise``; ``none``, ``shortcut`` as they are).

Only the planned seeds count (``--seeds N``: seeds 0..N-1, the same for every method of every
cell): a cell where a method lacks one of them stops the build, naming it, and seeds beyond N — the
first map's top-ups where a margin looked close — are left out, so no verdict rests on optional
stopping. Winner, runner-up, margin and interval per cell, and the corrected verdict over the whole
map (the intersection-union test with the winner's selection, Holm over the cells) come from
:mod:`fedcxr.advice.cells` / :mod:`fedcxr.advice.verdicts`; the chooser's regret from the
``Selected`` rows when the runs have them. Run::

    python benchmarks/regime_map.py --tables      # benchmarks/results/regime_map_runs.csv
    python benchmarks/build_regime_map.py         # rewrites fedcxr/advice/regime_map.csv

The runs file holds only the cells whose plan has fully run (``regime_map.py`` writes it so), and
the shipped map is built from them as they complete; on 2026-11-29, the 14 core cells::

    python benchmarks/build_regime_map.py --note "new map, its complete cells only (each with every \\
        planned seed 0-9 of its 12 methods; the others pending, BENCHMARKS.md Regime map); one source \\
        epoch a round, each seed its own draw of labeled rows; Holm over these cells"

(The first map — 8 source steps a round, one label draw — re-analysed the same way with
``--runs benchmarks/results/regime_map_first_runs.csv --seeds 3`` resolves no cell.)
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from fedcxr.advice.cells import by_method, cell_row, map_rows
from fedcxr.advice.regime import map_path
from fedcxr.advice.verdicts import selected_regret

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_regime import SELECT_CANDIDATES  # noqa: E402  (the chooser's candidates in the map's select grid)

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "benchmarks" / "results" / "regime_map_runs.csv"
SHIFT_TYPE = {"none": "none", "mix4": "pixel", "shortcut": "shortcut", "labelnoise40": "label_noise"}
SOURCE = ("BENCHMARKS.md regime map ({runs}): PneumoniaMNIST, resnet_tiny 28 px, sources = official train rows "
          "(3 sites), target = official val+test rows (533 train / 504 test), shift {shift}")
SEEDS = 10


def planned(runs: pd.DataFrame, seeds: int, name: str) -> pd.DataFrame:
    """The runs of seeds 0..seeds-1; a cell where a method lacks one stops the build (exit 2)."""
    kept = runs.loc[runs["seed"].astype(int) < seeds]
    for key, cell in kept.groupby(["shift", "labels", "rounds"]):
        for method, group in cell.groupby("method"):  # the chooser's Selected rows too: no half a regret
            missing = sorted(set(range(seeds)) - set(group["seed"].astype(int)))
            if missing:
                raise SystemExit(f"{name}: cell {key}: {method} lacks planned seed(s) {missing} (of 0..{seeds - 1}); "
                                 "finish the cell's parts or build with fewer --seeds")
    return kept


def map_table(runs: pd.DataFrame, runs_name: str, note: str = "",
              candidates: Sequence[str] = SELECT_CANDIDATES) -> list[dict]:
    """One advice-map row per (shift, labels, rounds) of the runs, in grid order, verdicts adjusted over all;
    a cell with ``Selected`` rows gets the chooser's regret and the ``candidates`` it picked among."""
    rows = []
    order = {s: i for i, s in enumerate(SHIFT_TYPE)}
    keys = sorted(runs.groupby(["shift", "labels", "rounds"]).groups, key=lambda k: (order.get(k[0], 99), k[2], k[1]))
    for shift, labels, rounds in keys:
        if shift not in SHIFT_TYPE:
            raise SystemExit(f"{runs_name}: shift {shift!r} has no advice shift type ({', '.join(SHIFT_TYPE)})")
        cell = runs.loc[(runs["shift"] == shift) & (runs["labels"] == labels) & (runs["rounds"] == rounds)]
        source = SOURCE.format(runs=runs_name, shift=shift) + (f"; {note}" if note else "")
        row = cell_row(cell.to_dict("records"), shift=SHIFT_TYPE[shift], target_labels=int(labels),
                       rounds=int(rounds), source=source)
        chosen = cell.loc[cell["method"] == "Selected"]
        if len(chosen) and row["winner"]:
            regret = selected_regret(by_method(cell.to_dict("records")),
                                     dict(zip(chosen["seed"].astype(int), chosen["auroc"].astype(float))), row["winner"])
            row.update(selected_regret=f"{regret['regret']:.4f}", selected_lo=_bound(regret["lo"]),
                       selected_hi=_bound(regret["hi"]), selected_among=" ".join(candidates))
        rows.append(row)
    return map_rows(rows)


def _bound(value: float) -> str:
    return "" if value != value else f"{value:.4f}"


def write_map(rows: list[dict], path: Path) -> None:
    fixed = ["shift", "target_labels", "rounds", "winner", "runner_up", "margin", "ci_low", "ci_high", "p_best",
             "p_adj", "resolved", "n_seeds", "n_methods", "selected_regret", "selected_lo", "selected_hi",
             "selected_among"]
    methods = sorted({k for r in rows for k in r if k.startswith("auroc__")})
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fixed + methods + ["source"], restval="")
        writer.writeheader()
        for row in rows:
            writer.writerow(row)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=RUNS, help="the regime map's runs CSV")
    parser.add_argument("--out", type=Path, default=map_path())
    parser.add_argument("--seeds", type=int, default=SEEDS, help="the planned seeds 0..N-1 (the same in every cell)")
    parser.add_argument("--note", default="", help="appended to every row's source (e.g. what the runs are)")
    args = parser.parse_args(argv)
    runs = pd.read_csv(args.runs)
    try:  # the runs file as the repository names it (no machine path in the shipped map)
        name = str(args.runs.resolve().relative_to(REPO))
    except ValueError:
        name = args.runs.name
    rows = map_table(planned(runs, args.seeds, name), name, args.note)
    write_map(rows, args.out)
    resolved = sum(r["resolved"] == "true" for r in rows)
    print(f"{len(rows)} cells → {args.out}; {resolved} resolved (Holm over the {len(rows)} cells)", file=sys.stderr)


if __name__ == "__main__":
    main()
