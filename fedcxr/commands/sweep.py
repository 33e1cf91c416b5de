"""``fedcxr sweep CONFIG.yaml --methods ... --seeds N --out DIR``: methods × seeds, then the table.

The work is :func:`fedcxr.workflows.sweep.sweep` (a re-run skips finished runs and resumes a
killed one); this prints each run it trains and where the comparison is.
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
    add_device(p)
    add_set(p, "override a config key for every run; repeatable")


def run(args: argparse.Namespace) -> int:
    from fedcxr.logs import progress_wanted
    from fedcxr.workflows.sweep import sweep

    result = sweep(args.config, args.methods, seeds=args.seeds, out=args.out, baseline=args.baseline,
                   device=args.device, settings=args.overrides, progress=progress_wanted(args), announce=print)
    print("comparison: " + ", ".join(str(p) for p in result.files))
    return 0
