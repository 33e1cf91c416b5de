"""β sweep: FedDA and FedGP on PneumoniaMNIST at a moderate covariate shift, β from 0 to 1.

β is the weight of the sources' (projected) update against the target's own
(``beta`` in the config; DESIGN §5): β = 0 is Target_Only exactly, β = 1 the sources only
(after the warm-up rounds). Same sites, target, shift and network as ``bench_shift.py``
(whose module doc describes the setting); only β varies.

    nice -n 10 python benchmarks/bench_beta.py --work runs/bench_shift --out benchmarks/results
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # a real module: its functions must pickle into the worker processes
import bench_shift  # noqa: E402

BETAS = [0.0, 0.25, 0.5, 0.75, 1.0]


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    betas = BETAS
    if "--betas" in argv:
        i = argv.index("--betas")
        j = i + 1
        while j < len(argv) and not argv[j].startswith("--"):
            j += 1
        betas = [float(v) for v in argv[i + 1:j]]
        del argv[i:j]
    defaults = ["--levels", "2", "--methods", "FedDA", "FedGP", "--seeds", "3", "--stem", "beta"]
    args = bench_shift.parse(defaults + argv)
    start = time.time()
    frame = bench_shift.run_grid(args, "beta", betas, lambda b: [f"beta={b}"])
    meta = {"kind": args.kind, "level": args.levels[0], "betas": betas, "seeds": args.seeds,
            "labeled": args.labeled, "rounds": args.rounds, "base_config": bench_shift.BASE_CONFIG,
            "wall_s": round(time.time() - start)}
    bench_shift.write_outputs(frame, "beta", args.methods, args.out, args.stem, header="β =", xlabel="β (weight of the sources)",
                              title=f"PneumoniaMNIST, `{args.kind}` shift level {args.levels[0]}, {args.labeled} target "
                                    f"labels, {args.seeds} seeds: β sweep", meta=meta)
    return frame


if __name__ == "__main__":
    main()
