"""Write ``fedcxr/advice/regime_map.csv`` from the cells measured so far (until the full map lands).

The regime map (issue 18 §3: shift type × target labels × rounds, ≥ 3 seeds per method) is a
benchmark of its own. Until it exists, ``fedcxr stats`` reads a map holding only what was
already measured, each row naming its source:

* ``benchmarks/results/shift_mix_runs.csv`` (BENCHMARKS.md "PneumoniaMNIST under covariate
  shift", re-run on main 22fc989; 5 rounds, 50 target labels, 5 seeds): ``fedcxr shift --kind
  mix`` level 0 → shift ``none``, level 4 → ``pixel`` (levels 2 and 3 are left out: the map
  has one cell per shift type, labels and rounds);
* ``benchmarks/results/labels_runs.csv`` (BENCHMARKS.md "Label scarcity"; mix level 2, 8
  rounds, 20/50/200/500 labels, 3 seeds; only FedAvg_Finetune, FedAvg_Finetune_GP and
  Target_Only were run there) → ``pixel`` cells;
* the outside reviewer's table in issue 18 (PneumoniaMNIST, resnet_tiny 28 px, 3 seeds; the
  issue gives means, not per-seed values or intervals, so those rows have no interval and are
  never "resolved"; "GP" there is fedcxr's FedAvg_Finetune_GP). Its "gamma 0.5 + noise σ 0.35"
  row (pixel, 50 labels, 20 rounds) is left out: the level-4 row holds that cell.

Winner, runner-up and the paired interval come from :func:`fedcxr.advice.cells.cell_row`
(Oracle, which uses every target label, never counts). Run::

    python benchmarks/build_regime_map.py            # rewrites fedcxr/advice/regime_map.csv
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import pandas as pd

from fedcxr.advice.cells import cell_row
from fedcxr.advice.regime import map_path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
SHIFT_SOURCE = ("BENCHMARKS.md covariate shift (benchmarks/results/shift_mix_runs.csv, main 22fc989): "
                "PneumoniaMNIST, fedcxr shift --kind mix --level {level}, resnet_tiny 28 px")
LABELS_SOURCE = ("BENCHMARKS.md label scarcity (benchmarks/results/labels_runs.csv): PneumoniaMNIST, mix level 2, "
                 "only FedAvg_Finetune, FedAvg_Finetune_GP, Target_Only run")
REVIEWER = "issue 18 reviewer table (means over 3 seeds, no per-seed values): PneumoniaMNIST resnet_tiny 28 px"
#: Issue 18's table, as printed there: (shift, labels, rounds, {method: mean AUROC}, ordering note).
REVIEWER_CELLS = [
    ("pixel", 50, 20, {"Finetune_Offline": 0.922, "FedAvg_Finetune_GP": 0.901, "FedGP": 0.875,
                       "FedAvg_Finetune": 0.875, "FedGP_Auto": 0.858, "Target_Only": 0.729}, "level 4"),
    ("shortcut", 50, 20, {"Target_Only": 0.954, "Finetune_Offline": 0.948, "FedAvg_Finetune_GP": 0.757,
                          "FedGP": 0.742, "FedAvg_Finetune": 0.677, "FedGP_Auto": 0.314},
     "Target_Only ≈ Finetune_Offline"),
    ("shortcut", 50, 50, {"Target_Only": 0.971, "Finetune_Offline": 0.937, "FedGP": 0.923, "FedAvg_Finetune": 0.698},
     "FedGP − Target_Only −0.048 resolved; Target_Only vs Finetune_Offline not reported"),
    ("shortcut", 10, 20, {"FedGP": 0.464}, "all methods noisy (FedGP 0.464 ± 0.153): no winner"),
    ("shortcut", 100, 20, {"Target_Only": 0.980, "Finetune_Offline": 0.975, "FedGP": 0.917},
     "Target_Only ≈ Finetune_Offline"),
]


def measured_rows() -> list[dict]:
    rows = []
    shift = pd.read_csv(RESULTS / "shift_mix_runs.csv")
    for level, kind in ((0, "none"), (4, "pixel")):
        runs = shift.loc[shift["level"] == level].to_dict("records")
        rows.append(cell_row(runs, shift=kind, target_labels=50, rounds=5, source=SHIFT_SOURCE.format(level=level)))
    labels = pd.read_csv(RESULTS / "labels_runs.csv")
    for n in sorted(labels["labels"].unique()):
        runs = labels.loc[labels["labels"] == n].to_dict("records")
        rows.append(cell_row(runs, shift="pixel", target_labels=int(n), rounds=8, source=LABELS_SOURCE))
    return rows


def reviewer_rows() -> list[dict]:
    rows = []
    for shift, labels, rounds, means, note in REVIEWER_CELLS:
        ranked = sorted(means, key=lambda m: -means[m])
        winner = ranked[0] if len(ranked) >= 2 else ""
        runner = ranked[1] if len(ranked) >= 2 else ""
        row = {"shift": shift, "target_labels": labels, "rounds": rounds, "winner": winner, "runner_up": runner,
               "margin": f"{means[winner] - means[runner]:.4f}" if winner else "", "ci_low": "", "ci_high": "",
               "resolved": "false", "n_seeds": 3}
        row.update({f"auroc__{m}": f"{v:.4f}" for m, v in means.items()})
        row["source"] = f"{REVIEWER}; {note}"
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
    parser.add_argument("--out", type=Path, default=map_path())
    args = parser.parse_args(argv)
    rows = measured_rows() + reviewer_rows()
    write_map(rows, args.out)
    print(f"{len(rows)} cells → {args.out}")


if __name__ == "__main__":
    main()
