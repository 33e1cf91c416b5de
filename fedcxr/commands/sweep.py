"""``fedcxr sweep``: run methods × seeds from one config, evaluate each, write the table.

Runs land in ``OUT/runs/<method>-seed<k>``; a finished run is skipped when the sweep is
re-run (a killed one is resumed), so a long sweep can be continued after an interruption.
The comparison table (``fedcxr report``'s) goes to ``OUT/``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Optional, Sequence

from fedcxr.errors import UserError
from fedcxr.rundir import RunDir

log = logging.getLogger(__name__)


def run_sweep(config: Path, methods: Sequence[str], *, seeds: int, out: Path, baseline: Optional[str] = None,
              device: Optional[str] = None, overrides: Sequence[str] = (), progress: bool = True) -> dict:
    """Train and evaluate every (method, seed), then compare; returns the comparison result."""
    from fedcxr.commands.evaluate import evaluate_run
    from fedcxr.evaluation.compare import compare_runs, write_comparison
    from fedcxr.pipeline.checkpoints import latest_checkpoint
    from fedcxr.pipeline.config import load_config
    from fedcxr.pipeline.run_driver import run_experiment
    from fedcxr.pipeline.protocols import get_protocol

    for method in methods:
        get_protocol(method)  # fail fast on a typo, before hours of training
    if baseline and baseline not in methods:
        raise UserError(f"--baseline {baseline!r} is not among --methods")
    run_dirs = []
    for method in methods:
        for seed in range(seeds):
            cfg = load_config(config, overrides=[*overrides, f"method={method}", f"seed={seed}"])
            run_dir = Path(out) / "runs" / f"{cfg.method_name}-seed{seed}"
            if not RunDir(run_dir).final_model.exists():
                resume = latest_checkpoint(run_dir) is not None
                print(f"{method} seed {seed}: training{' (resuming)' if resume else ''}")
                run_experiment(cfg, run_dir, resume=resume, device=device, progress=progress)
            if not RunDir(run_dir).report_json.exists():
                evaluate_run(run_dir, split="test", n_boot=200, device=device)
            run_dirs.append(run_dir)
    result = compare_runs(run_dirs, baseline=baseline)
    paths = write_comparison(result, Path(out))
    print("comparison: " + ", ".join(str(p) for p in paths))
    return result


def cli_sweep(args: argparse.Namespace) -> int:
    run_sweep(args.config, args.methods, seeds=args.seeds, out=args.out, baseline=args.baseline,
              device=args.device, overrides=args.overrides)
    return 0
