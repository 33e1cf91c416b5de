"""``fedcxr train CONFIG.yaml [--out RUN_DIR] [--resume] [--device ...] [--set k=v ...]``.

The work is :func:`fedcxr.workflows.train.train`. A finished run directory is refused at once
(before any site is read); ``--resume`` on a finished run says so and changes no file
(:meth:`fedcxr.rundir.RunDir.check_start`). A run stopped by Ctrl-C or SIGTERM (a scheduler's
time limit, ``kill``) says where it stopped and the command that continues it.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from fedcxr.commands.options import add_device, add_set

HELP = "run a federated experiment from a YAML config"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=Path, metavar="CONFIG.yaml",
                   help="experiment YAML (README: `fedcxr train` — a federated experiment; a commented "
                        "starter: `fedcxr init DIR`)")
    p.add_argument("--out", type=Path, default=None, metavar="RUN_DIR",
                   help="run directory (a finished one is refused: choose a new one); "
                        "unset: runs/<name>-<method>-seed<seed>")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted run from its last complete round (a finished run is left as it is)")
    add_device(p)
    add_set(p, "override a config key (dotted keys allowed, YAML values); repeatable")


def run(args: argparse.Namespace) -> int:
    from fedcxr.logs import progress_wanted
    from fedcxr.workflows.train import TrainingStopped, train

    with stop_signals() as stopped:
        try:
            result = train(args.config, args.out, resume=args.resume, device=args.device,
                           progress=progress_wanted(args), settings=args.overrides)
        except TrainingStopped as stop:
            command = resume_command(args, stop.run_dir)
            print(stopped_message(stop.run_dir, stop.rounds, stopped.get("signal", "Ctrl-C"), command), file=sys.stderr)
            return 143 if stopped.get("signal") == "SIGTERM" else 130
    run_dir = result.run_dir
    if result.already_finished:
        print(f"{run_dir}: this run is already finished ({result.method}, {result.rounds} rounds); "
              "nothing to resume, no file changed")
        if result.config_differs:
            print(f"  note: {args.config} differs from the config this run was trained with "
                  f"({run_dir.config}); to train it, choose a new --out")
        print(f"  next: fedcxr evaluate {run_dir}")
        return 0
    print(f"{result.method}: finished {result.rounds} rounds; run directory {run_dir} (log: {run_dir.train_log})")
    if result.missed:
        print(f"  {len(result.missed)} site replies missing or rejected (see run.json 'missed')")
    print(f"  next: fedcxr evaluate {run_dir}")
    return 0


@contextmanager
def stop_signals() -> Iterator[dict]:
    """SIGTERM behaves like Ctrl-C while the run trains (the run directory's lock is released, the site
    workers are closed) and the dict yielded records which signal stopped it."""
    stopped: dict = {}

    def handler(signum, frame):
        stopped["signal"] = signal.Signals(signum).name
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (an embedding application): leave signals alone
        yield stopped
        return
    try:
        yield stopped
    finally:
        signal.signal(signal.SIGTERM, previous)


def resume_command(args: argparse.Namespace, run_dir) -> str:
    """The command line that continues this run: the same config, ``--set`` keys and device, ``--resume``."""
    parts = ["fedcxr", "train", str(args.config), "--out", str(run_dir)]
    for item in args.overrides or []:
        parts += ["--set", item]
    if args.device:
        parts += ["--device", args.device]
    return shlex.join(parts + ["--resume"])


def stopped_message(run_dir, rounds: int, what: str, command: str) -> str:
    """Where a stopped run stopped — the rounds its checkpoints hold, which a resume continues after
    (a round finished but not yet checkpointed is trained again) — and how to go on."""
    done = run_dir.rounds_checkpointed()
    if done:
        where = (f"after round {done} of {rounds} (its last checkpoint: {run_dir.checkpoint_files()[-1]}; "
                 f"the rounds so far: {run_dir.train_log})")
    else:
        where = f"before its first round finished (no checkpoint yet; {rounds} rounds to go)"
    return (f"fedcxr train: stopped by {what} {where}\n"
            f"  continue it with: {command}")
