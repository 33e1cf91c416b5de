"""Write ``fedcxr/advice/regime_map.csv`` from the regime map's runs (``benchmarks/regime_map.py``).

One row per cell of the grid (issue 18 §3: shift type × target labels × rounds on real
PneumoniaMNIST), from ``benchmarks/results/regime_map_runs.csv`` (one row per run: shift,
labels, rounds, method, seed, auroc). The grid's shift names become the advice's shift types
(``mix4`` → ``pixel``, ``labelnoise40`` → ``label_noise``; ``none``, ``shortcut`` as they are).
Winner, runner-up and the paired interval come from :func:`fedcxr.advice.cells.cell_row`
(Oracle, which uses every target label, never counts); ``n_seeds`` is the number of seeds the
winner and the runner-up were paired over (5 where their margin was under 0.03, else 3).

This replaces the interim map (the covariate-shift and label-scarcity sweeps' 5- and 8-round
cells and the issue-18 reviewer's means), whose settings differ from the grid's. Run::

    python benchmarks/regime_map.py --tables      # benchmarks/results/regime_map_runs.csv
    python benchmarks/build_regime_map.py         # rewrites fedcxr/advice/regime_map.csv
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import pandas as pd

from fedcxr.advice.cells import cell_row
from fedcxr.advice.regime import map_path

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "benchmarks" / "results" / "regime_map_runs.csv"
SHIFT_TYPE = {"none": "none", "mix4": "pixel", "shortcut": "shortcut", "labelnoise40": "label_noise"}
SOURCE = ("BENCHMARKS.md regime map ({runs}): PneumoniaMNIST, resnet_tiny 28 px, sources = official train rows "
          "(3 sites), target = official val+test rows (533 train / 504 test), shift {shift}")


def map_rows(runs: pd.DataFrame, runs_name: str) -> list[dict]:
    """One advice-map row per (shift, labels, rounds) of the runs, in grid order."""
    rows = []
    order = {s: i for i, s in enumerate(SHIFT_TYPE)}
    keys = sorted(runs.groupby(["shift", "labels", "rounds"]).groups, key=lambda k: (order.get(k[0], 99), k[2], k[1]))
    for shift, labels, rounds in keys:
        if shift not in SHIFT_TYPE:
            raise SystemExit(f"{runs_name}: shift {shift!r} has no advice shift type ({', '.join(SHIFT_TYPE)})")
        cell = runs.loc[(runs["shift"] == shift) & (runs["labels"] == labels) & (runs["rounds"] == rounds)]
        row = cell_row(cell.to_dict("records"), shift=SHIFT_TYPE[shift], target_labels=int(labels), rounds=int(rounds),
                       source=SOURCE.format(runs=runs_name, shift=shift))
        if row["winner"] and row["runner_up"]:
            by_seed = cell.pivot_table(index="seed", columns="method", values="auroc")
            row["n_seeds"] = int(by_seed[[row["winner"], row["runner_up"]]].dropna().shape[0])
        rows.append(row)
    return rows


def write_map(rows: list[dict], path: Path) -> None:
    fixed = ["shift", "target_labels", "rounds", "winner", "runner_up", "margin", "ci_low", "ci_high",
             "resolved", "n_seeds"]
    methods = sorted({k for r in rows for k in r if k.startswith("auroc__")})
    columns = fixed + methods + ["source"]
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, restval="")
        writer.writeheader()
        for row in rows:
            writer.writerow(row)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=RUNS, help="the regime map's runs CSV")
    parser.add_argument("--out", type=Path, default=map_path())
    args = parser.parse_args(argv)
    runs = pd.read_csv(args.runs)
    name = args.runs.name if args.runs.resolve() != RUNS.resolve() else "benchmarks/results/regime_map_runs.csv"
    rows = map_rows(runs, name)
    write_map(rows, args.out)
    print(f"{len(rows)} cells → {args.out}")


if __name__ == "__main__":
    main()
