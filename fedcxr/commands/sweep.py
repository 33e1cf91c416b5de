"""``fedcxr sweep CONFIG.yaml --methods ... --seeds N --out DIR``: methods × seeds, then the table.

The work is :func:`fedcxr.workflows.sweep.sweep` (a re-run skips finished runs and resumes a
killed one); this prints each run it trains and where the comparison is. ``--select`` chooses
one of the methods on the target's labeled rows only, then trains that one
(:func:`fedcxr.workflows.choose.select_and_train`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedcxr.commands.options import add_device, add_set

HELP = "run methods × seeds and write the comparison table"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=Path, metavar="CONFIG.yaml", help="experiment YAML shared by every run")
    p.add_argument("--methods", nargs="+", required=True, metavar="METHOD",
                   help="method names (README: `fedcxr train` — a federated experiment, table of methods)")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per method")
    p.add_argument("--out", type=Path, required=True, help="folder: runs/<method>-seed<k>, comparison files")
    p.add_argument("--baseline", default=None, help="method the others are tested against; unset: no tests")
    p.add_argument("--select", action="store_true",
                   help="choose one of --methods within the label budget: cross-fit them on the target's labeled "
                        "rows (--folds folds by patient; no validation or test label is read), then train the "
                        "choice on all of them (OUT/select/choice.md says why)")
    p.add_argument("--folds", type=int, default=3, help="--select: folds of the labeled rows (default 3)")
    add_device(p)
    add_set(p, "override a config key for every run; repeatable")


def run(args: argparse.Namespace) -> int:
    from fedcxr.logs import progress_wanted
    from fedcxr.workflows.sweep import sweep

    if args.select:
        from fedcxr.workflows.choose import select_and_train

        choice, result = select_and_train(args.config, args.methods, out=args.out, seeds=args.seeds, folds=args.folds,
                                          device=args.device, settings=args.overrides,
                                          progress=progress_wanted(args), announce=print)
        print(f"chose {choice.chosen}: " + ", ".join(str(p) for p in [*choice.files, *result.files]))
        return 0
    result = sweep(args.config, args.methods, seeds=args.seeds, out=args.out, baseline=args.baseline,
                   device=args.device, settings=args.overrides, progress=progress_wanted(args), announce=print)
    print("comparison: " + ", ".join(str(p) for p in result.files))
    return 0
