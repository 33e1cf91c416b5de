"""What a run says while it trains: one line per round, and ``RUN_DIR/train.log``.

On a terminal the round bar (tqdm) shows progress; when the output goes to a file (``nohup``,
SLURM, CI) tqdm draws nothing, so each round is logged as one line instead
(:func:`round_line`). Whatever the console, :func:`run_log` copies fedcxr's log records into
``RUN_DIR/train.log`` (appended: a resumed run continues the same file) with time stamps:
the run's header, every round's line, and fedcxr's warnings and messages (at the console's
verbosity; the header and round lines always).

Rounds are numbered from 1 wherever people read them (the console, ``train.log``, reports and
error messages: ``round 1/5`` is the first round); the files a program reads (``metrics.jsonl``,
``run.json``, checkpoint names ``round_0000.pt``, TensorBoard steps) keep the 0-based round
*index* under ``round``. :func:`round_number` turns one into the other.

The round lines are records of the ``fedcxr.rounds`` logger, whose level is INFO whatever the
console's (``--quiet`` hides them from the console by the console handler's level, not from
the file). Like every file of a run directory, the log holds no patient identifier and no
image path: site names, class names, numbers and the run's own paths only.
"""

from __future__ import annotations

import contextlib
import logging
import math
from pathlib import Path
from typing import Any, Iterator, Mapping

from fedcxr import rundir

#: the log file of a run directory (fedcxr.rundir)
TRAIN_LOG = rundir.TRAIN_LOG
#: the logger of the header and the per-round lines (always INFO: they reach train.log under --quiet too)
ROUNDS_LOGGER = "fedcxr.rounds"

rounds_log = logging.getLogger(ROUNDS_LOGGER)
rounds_log.setLevel(logging.INFO)


def _number(value: Any) -> str:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "n/a"
    return f"{value:.3f}" if math.isfinite(value) else "n/a"


def round_number(index: int) -> int:
    """The round as people count it (1 = the first) from the 0-based index that ``metrics.jsonl``,
    ``run.json`` and the checkpoint names (``round_0000.pt``) keep."""
    return int(index) + 1


def round_line(metrics: Mapping[str, Any], rounds: int) -> str:
    """``round 3/10 (4.2 s): loss a 0.612, b 0.587, target 0.650; val AUROC c 0.712``.

    ``metrics`` is the round's ``metrics.jsonl`` entry: ``train`` (site → ``{"loss", ...}``),
    ``target`` (the target's fine-tuning, ``{"loss", ...}``), ``val`` (site → ``{"mean_auroc"}``),
    ``seconds``. Parts a method does not have are left out; an undefined number is ``n/a``.
    """
    head = f"round {round_number(metrics.get('round', 0))}/{rounds}"
    if metrics.get("seconds") is not None:
        head += f" ({float(metrics['seconds']):.1f} s)"
    losses = [f"{site} {_number(entry.get('loss'))}" for site, entry in (metrics.get("train") or {}).items()
              if isinstance(entry, Mapping) and "loss" in entry]
    target = metrics.get("target")
    if isinstance(target, Mapping) and "loss" in target:
        losses.append(f"target {_number(target.get('loss'))}")
    val = [f"{site} {_number(entry.get('mean_auroc'))}" for site, entry in (metrics.get("val") or {}).items()
           if isinstance(entry, Mapping)]
    parts = [f"loss {', '.join(losses)}"] if losses else []
    if val:
        parts.append(f"val AUROC {', '.join(val)}")
    return head + (": " + "; ".join(parts) if parts else "")


@contextlib.contextmanager
def run_log(run_dir: Path | str) -> Iterator[Path]:
    """Copy fedcxr's log records into ``RUN_DIR/train.log`` (appending) while the block runs."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / TRAIN_LOG
    handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("fedcxr")
    logger.addHandler(handler)
    try:
        yield path
    finally:
        logger.removeHandler(handler)
        handler.close()
