"""``fedcxr train`` as a library function: one federated experiment, in-process.

:func:`train` is what the command runs and what a script or notebook calls
(``fedcxr.train("experiment.yaml", out="runs/a", rounds=2)``); it returns a
:class:`TrainResult` and prints nothing. The run directory's policy — its default name, what a
new run or a resume may start in — is :class:`fedcxr.rundir.RunDir`'s; the rounds are
:func:`fedcxr.pipeline.run_driver.run_experiment`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from fedcxr.rundir import RunDir
from fedcxr.workflows.experiment import ConfigLike, experiment_config


@dataclass(frozen=True)
class TrainResult:
    """A finished (or, with ``resume``, an already finished) run.

    ``run`` is its ``run.json`` (method, classes, sites, rounds, missed and refused replies, the
    resolved config). ``already_finished``: ``resume=True`` met a finished run, so nothing was
    trained and no file changed; ``config_differs`` then says the config given is not the one it
    was trained with (train it under a new ``out`` instead)."""

    run_dir: RunDir
    run: dict[str, Any] = field(repr=False)
    already_finished: bool = False
    config_differs: bool = False

    @property
    def method(self) -> str:
        return str(self.run.get("method"))

    @property
    def rounds(self) -> int:
        return int(self.run.get("rounds") or 0)

    @property
    def missed(self) -> list:
        """Site replies that were missing or refused (``run.json``'s ``missed``)."""
        return list(self.run.get("missed") or [])


class TrainingStopped(KeyboardInterrupt):
    """Training stopped by Ctrl-C (or SIGTERM where the caller turns it into one, as ``fedcxr train``
    does): still a :class:`KeyboardInterrupt`, and it knows the run it stopped (``run_dir``) and how
    many rounds the run was to train (``rounds``), so the caller can say where it stopped."""

    def __init__(self, run_dir: RunDir, rounds: int):
        super().__init__(f"{run_dir}: training stopped")
        self.run_dir, self.rounds = run_dir, rounds


def train(config: ConfigLike, out: "RunDir | str | None" = None, *, resume: bool = False,
          device: Optional[str] = None, progress: bool = True, settings: Sequence[str] = (),
          **overrides: Any) -> TrainResult:
    """Train one experiment into ``out`` (unset: ``runs/<name>-<method>-seed<seed>``).

    ``config``: a YAML path, a mapping or an ``ExperimentConfig``; ``overrides``: config keys to
    change (``rounds=2``, ``source={"lr": 1e-3}``), ``settings``: the same as ``--set KEY=VALUE``
    strings. ``resume``: continue an interrupted run from its last complete round (a finished run
    is returned as it is). ``device``: auto, cpu, cuda or cuda:N (unset: the config's).

    Raises :class:`~fedcxr.errors.UserError` for a bad config or a run directory that holds a
    finished or interrupted run (without ``resume``), :class:`~fedcxr.errors.RunFailed` when a
    round cannot complete (resume it); :class:`TrainingStopped` (a ``KeyboardInterrupt``) when it is
    interrupted — its ``run.json`` then says ``stopped``.
    """
    from fedcxr.pipeline.config import config_fingerprint
    from fedcxr.pipeline.run_driver import run_experiment

    cfg = experiment_config(config, settings=settings, overrides=overrides)
    run = RunDir.of(out) if out is not None else RunDir.default_for(cfg)
    done = run.finished() if resume else None
    if done is not None:
        differs = bool(done.get("fingerprint")) and done["fingerprint"] != config_fingerprint(cfg)
        return TrainResult(run, done, already_finished=True, config_differs=differs)
    try:
        payload = run_experiment(cfg, run, resume=resume, device=device, progress=progress)
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM where the caller turns it into one (`fedcxr train`)
        run.mark_stopped()
        raise TrainingStopped(run, cfg.rounds) from stop
    return TrainResult(run, payload)


__all__ = ["TrainResult", "TrainingStopped", "train"]
