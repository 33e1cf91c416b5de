"""``fedcxr train CONFIG.yaml [--out RUN_DIR] [--resume] [--device ...] [--set k=v ...]``.

A finished run directory is refused at once (before any site is read); ``--resume`` on a finished
run says so and changes no file (:func:`fedcxr.pipeline.run_driver.check_run_dir`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedcxr.logs import progress_wanted
from fedcxr.pipeline.config import config_fingerprint, load_config
from fedcxr.pipeline.run_driver import run_experiment
from fedcxr.rundir import RunDir, finished_run


def default_run_dir(cfg) -> Path:
    """``runs/<name>-<method>-seed<seed>`` when ``--out`` is not given."""
    return Path("runs") / f"{cfg.name}-{cfg.method_name}-seed{cfg.seed}"


def cli_train(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, overrides=args.overrides)
    run_dir = Path(args.out) if args.out else default_run_dir(cfg)
    done = finished_run(run_dir) if args.resume else None
    if done is not None:
        print(f"{run_dir}: this run is already finished ({done.get('method')}, {done.get('rounds')} rounds); "
              "nothing to resume, no file changed")
        if done.get("fingerprint") and done["fingerprint"] != config_fingerprint(cfg):
            print(f"  note: {args.config} differs from the config this run was trained with "
                  f"({RunDir(run_dir).config}); to train it, choose a new --out")
        print(f"  next: fedcxr evaluate {run_dir}")
        return 0
    payload = run_experiment(cfg, run_dir, resume=args.resume, device=args.device, progress=progress_wanted(args))
    print(f"{payload['method']}: finished {cfg.rounds} rounds; run directory {run_dir} "
          f"(log: {RunDir(run_dir).train_log})")
    if payload["missed"]:
        print(f"  {len(payload['missed'])} site replies missing or rejected (see run.json 'missed')")
    print(f"  next: fedcxr evaluate {run_dir}")
    return 0
