"""``fedcxr sweep`` as a library function: methods × seeds from one config, each trained and
evaluated, then the comparison table.

Runs land in ``OUT/runs/<method>-seed<k>``; a finished run is skipped when the sweep is
re-run (a killed one is resumed), so a long sweep can be continued after an interruption.
The comparison table (``fedcxr report``'s) goes to ``OUT/``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from fedcxr.errors import UserError
from fedcxr.rundir import RunDir
from fedcxr.workflows.experiment import ConfigLike, experiment_config

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepResult:
    """``runs``: every (method, seed) run directory, in order; ``comparison``: ``comparison.json``'s
    content; ``files``: the comparison files."""

    out: Path
    runs: list[RunDir]
    comparison: dict[str, Any] = field(repr=False)
    files: list[Path] = field(default_factory=list)


def sweep(config: ConfigLike, methods: Sequence[str], *, out: "str | os.PathLike", seeds: int = 3,
          baseline: Optional[str] = None, device: Optional[str] = None, progress: bool = True,
          settings: Sequence[str] = (), announce: Optional[Callable[[str], None]] = None,
          **overrides: Any) -> SweepResult:
    """Train and evaluate every (method, seed in 0..seeds-1), then compare (``baseline``: the method the
    others are tested against). ``announce`` is told each run that trains (unset: logged at INFO)."""
    from fedcxr.evaluation.compare import compare_runs, write_comparison
    from fedcxr.pipeline.protocols import get_protocol
    from fedcxr.pipeline.run_driver import run_experiment
    from fedcxr.workflows.evaluate import evaluate

    say = announce or log.info
    for method in methods:
        get_protocol(method)  # fail fast on a typo, before hours of training
    if baseline and baseline not in methods:
        raise UserError(f"--baseline {baseline!r} is not among --methods")
    runs = []
    for method in methods:
        for seed in range(seeds):
            cfg = experiment_config(config, settings=[*settings, f"method={method}", f"seed={seed}"],
                                    overrides=overrides)
            run = RunDir(Path(out) / "runs" / f"{cfg.method_name}-seed{seed}")
            if not run.final_model.exists():
                resume = bool(run.checkpoint_files())
                say(f"{method} seed {seed}: training{' (resuming)' if resume else ''}")
                run_experiment(cfg, run, resume=resume, device=device, progress=progress)
            if not run.report_json.exists():
                evaluate(run, split="test", bootstrap=200, device=device)
            runs.append(run)
    result = compare_runs([r.root for r in runs], baseline=baseline)
    paths = write_comparison(result, Path(out))
    return SweepResult(Path(out), runs, result, list(paths))


__all__ = ["SweepResult", "sweep"]
