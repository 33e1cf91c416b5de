"""``fedcxr train CONFIG.yaml [--out RUN_DIR] [--resume] [--device ...] [--set k=v ...]``."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedcxr.logs import progress_wanted
from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.federation import run_experiment


def default_run_dir(cfg) -> Path:
    """``runs/<name>-<strategy>-seed<seed>`` when ``--out`` is not given."""
    return Path("runs") / f"{cfg.name}-{cfg.strategy}-seed{cfg.seed}"


def cli_train(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, overrides=args.overrides)
    run_dir = Path(args.out) if args.out else default_run_dir(cfg)
    payload = run_experiment(cfg, run_dir, resume=args.resume, device=args.device, progress=progress_wanted(args))
    print(f"{payload['method']}: finished {cfg.rounds} rounds; run directory {run_dir}")
    if payload["missed"]:
        print(f"  {len(payload['missed'])} site replies missing or rejected (see run.json 'missed')")
    print(f"  next: fedcxr evaluate {run_dir}")
    return 0
