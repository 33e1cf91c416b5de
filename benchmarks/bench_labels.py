"""Label scarcity: how the target's number of labels changes each method's gain (PneumoniaMNIST,
moderate covariate shift).

The AuxInfo+GP paper's claim: GP's gain over FedAvg_Finetune grows with the number of target
labels. Same sources, shift and network as ``bench_shift.py``, but the target is built from the
official *val and test* images (1,145; 50/10/40 patient-hash split → about 570 training rows)
so that 500 labels exist; 8 rounds so that GP (5 FedAvg warm-up rounds by default) projects
in 3 of them.

    nice -n 10 python benchmarks/bench_labels.py --work runs/bench_labels --out benchmarks/results
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # a real module: its functions must pickle into the worker processes
import bench_shift  # noqa: E402

LABELS = [20, 50, 200, 500]


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    defaults = ["--levels", "2", "--methods", "FedAvg_Finetune", "FedAvg_Finetune_GP", "FedGP", "Target_Only",
                "--seeds", "3", "--stem", "labels", "--rounds", "8", "--target-from", "val", "test",
                "--target-split", "0.5", "0.1", "0.4"]
    args = bench_shift.parse(defaults + argv)
    start = time.time()
    frame = bench_shift.run_grid(args, "labels", LABELS, lambda n: [], labeled_of=lambda n: n)
    meta = {"kind": args.kind, "level": args.levels[0], "labels": LABELS, "seeds": args.seeds,
            "rounds": args.rounds, "target_from": args.target_from, "target_split": args.target_split,
            "base_config": bench_shift.BASE_CONFIG, "wall_s": round(time.time() - start)}
    bench_shift.write_outputs(frame, "labels", args.methods, args.out, args.stem, header="n =",
                              xlabel="labeled target rows",
                              title=f"PneumoniaMNIST, `{args.kind}` shift level {args.levels[0]}, {args.seeds} seeds: "
                                    "label scarcity", meta=meta)
    return frame


if __name__ == "__main__":
    main()
