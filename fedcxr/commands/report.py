"""``fedcxr report RUN_DIR... --out DIR``: the method-comparison table of several runs."""

from __future__ import annotations

import argparse

from fedcxr.evaluation.compare import compare_runs, write_comparison


def cli_report(args: argparse.Namespace) -> int:
    """Compare runs; prints where comparison.md is."""
    result = compare_runs(list(args.run_dirs), baseline=getattr(args, "baseline", None),
                          split=getattr(args, "split", "test") or "test",
                          n_boot=int(getattr(args, "bootstrap", 1000)))
    paths = write_comparison(result, args.out)
    print(f"comparison of {len(result['runs'])} runs, {len(result['table'])} methods: {paths[0]}")
    return 0
