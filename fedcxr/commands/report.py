"""``fedcxr report RUN_DIR... --out DIR``: the method-comparison table of several runs.

The work is :func:`fedcxr.workflows.report.report`; this prints where comparison.md is.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "method-comparison table across runs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="evaluated run directories")
    p.add_argument("--out", required=True, type=Path, help="folder for comparison.md/csv/json")
    p.add_argument("--baseline", default=None, help="method the others are tested against; unset: no tests")


def run(args: argparse.Namespace) -> int:
    """Compare runs; prints where comparison.md is."""
    from fedcxr.workflows.report import report

    result = report(list(args.run_dirs), args.out, baseline=args.baseline)
    comparison = result.comparison
    print(f"comparison of {len(comparison['runs'])} runs, {len(comparison['table'])} methods: {result.files[0]}")
    return 0
