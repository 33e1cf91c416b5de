"""A fedcxr run on NVIDIA FLARE, whatever system runs it: config, run directories, job, waiting, results.

``fedcxr flare export|simulate|poc`` (:mod:`fedcxr.commands.flare`):

* ``export`` writes a job folder for a provisioned (production) FLARE system; each hospital
  reads its own manifest path from its own configuration (:mod:`fedcxr.flare.client`).
* ``simulate`` runs the job in FLARE's simulator (:mod:`fedcxr.flare.simulator`).
* ``poc`` runs it on a POC system provisioned and started on loopback (:mod:`fedcxr.flare.poc`).

Both runs write the run directory of ``fedcxr train`` (so ``fedcxr evaluate RUN_DIR`` works)
plus ``RUN_DIR/flare/``: the job, each site's ``fedcxr_site.json``, the sites' resume state,
the scalars the sites streamed through FLARE's experiment tracking (``flare/tensorboard/<site>``),
the global model as FLARE's persistor wrote it (``flare/FL_global_model.pt``)
and the FLARE logs of every attempt (``flare/logs/attempt-N``; startup kits and keys are never
copied: :mod:`fedcxr.flare.processes`).

This module holds what both runners share: the refusals of ``fedcxr train`` for a run directory,
its lock while the job runs, the sites' configurations and the job (:func:`prepare_runs`), the
progress of the rounds read from the runs' ``metrics.jsonl`` and the results read back
(:func:`finish_runs`).
"""

from __future__ import annotations

import functools
import json
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Optional

from fedcxr.atomic import atomic_write_json
from fedcxr.errors import UserError
from fedcxr.logs import bar_disabled
from fedcxr.pipeline.checkpoints import latest_checkpoint
from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.data import default_cache_dir
from fedcxr.rundir import FINAL_MODEL, FLARE_WORKSPACE, METRICS, RUN_INFO
from fedcxr.runlock import run_lock
from fedcxr.flare.controller import mark_submitted, read_status
from fedcxr.flare.job import check_flare_sites, export_job


def load_flare_config(path: Path, overrides: list[str], *, need_manifests: bool):
    """The experiment config; ``export`` does not need the manifests on this machine."""
    return load_config(path, overrides=overrides, check_sites=need_manifests)


def default_run_dir(cfg) -> Path:
    return Path("runs") / f"{cfg.name}-{cfg.method_name}-seed{cfg.seed}-flare"


def check_run_dir(run_dir: Path, resume: bool) -> None:
    """The refusals of ``fedcxr train``: never overwrite a finished or interrupted run by accident."""
    if resume:
        return
    if (run_dir / FINAL_MODEL).exists():
        raise UserError(f"{run_dir} already holds a finished run; choose another --out or pass --resume")
    if latest_checkpoint(run_dir):
        raise UserError(f"{run_dir} holds checkpoints of an earlier run; pass --resume to continue it")


def holding_run_dirs(command: str):
    """Decorate a runner of ``[(cfg, run_dir)]``: it holds every run directory's lock while the job runs
    (:mod:`fedcxr.runlock`; the server's controller writes them from the job the runner started)."""
    def decorate(func):
        @functools.wraps(func)
        def wrapper(runs: list, **kwargs):
            with ExitStack() as stack:
                for _, run_dir in runs:
                    stack.enter_context(run_lock(Path(run_dir).resolve(), command))
                return func(runs, **kwargs)
        return wrapper
    return decorate


def write_site_configs(cfgs: list, flare_dir: Path, *, device: Optional[str]) -> dict[str, Path]:
    """One ``fedcxr_site.json`` per site (its manifest, cache, device, state folder)."""
    entries: dict[str, dict] = {}
    for cfg in cfgs:
        cache = Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()
        for site in cfg.all_sites():
            name = cfg.site_name(site)
            entry = {"manifest_dir": str(cfg.site_dir(site).resolve()), "cache_dir": str(cache.resolve()),
                     "device": device or cfg.device, "state_dir": str((flare_dir / "state" / name).resolve())}
            if entries.setdefault(name, entry)["manifest_dir"] != entry["manifest_dir"]:
                raise UserError(f"site {name!r} points at two different manifest folders in one FLARE job")
    out = {}
    for name, entry in entries.items():
        out[name] = flare_dir / "sites" / name / "fedcxr_site.json"
        atomic_write_json(out[name], entry)
    return out


def prepare_runs(runs: list, *, resume: bool, task_timeout: int, device: Optional[str],
                 client_script: Optional[Path], flare_dir: Optional[Path],
                 evaluation: Optional[dict] = None) -> tuple[list, Path, Path, list[str]]:
    """Check the run dirs, write site configs and the job; ``(runs, flare_dir, job_dir, sites)``."""
    runs = [(cfg, Path(run_dir).resolve()) for cfg, run_dir in runs]
    if not runs:
        raise UserError("nothing to run")
    sites = list(dict.fromkeys(s for cfg, _ in runs for s in check_flare_sites(cfg)))
    for _, run_dir in runs:
        check_run_dir(run_dir, resume)
    for _, run_dir in runs:
        mark_submitted(run_dir, keep=resume)
    flare_dir = Path(flare_dir).resolve() if flare_dir else runs[0][1] / FLARE_WORKSPACE
    site_configs = write_site_configs([cfg for cfg, _ in runs], flare_dir, device=device)
    job_dir = export_job([(cfg, str(run_dir), resume) for cfg, run_dir in runs], flare_dir / "job",
                         task_timeout=task_timeout, site_configs=site_configs, client_script=client_script,
                         evaluation=evaluation)
    return runs, flare_dir, job_dir, sites


def rounds_done(runs: list) -> int:
    """Rounds finished so far over ``runs``: the lines of their ``metrics.jsonl``."""
    done = 0
    for _, run_dir in runs:
        metrics = run_dir / METRICS
        done += len(metrics.read_text().splitlines()) if metrics.is_file() else 0
    return done


def wait_with_progress(proc: Optional[subprocess.Popen], runs: list, progress: bool, done=lambda: False,
                       timeout: Optional[float] = None, tick=lambda: None) -> None:
    """Wait for ``proc`` (or ``done()``) while showing completed rounds from the runs' ``metrics.jsonl``."""
    from tqdm import tqdm

    start = time.time()
    with tqdm(total=sum(cfg.rounds for cfg, _ in runs), desc="FLARE rounds", unit="round",
              disable=bar_disabled(progress)) as bar:
        while (proc is None or proc.poll() is None) and not done():
            if timeout and time.time() - start > timeout:
                raise TimeoutError(f"the FLARE run did not finish within {timeout:.0f} s")
            _advance(bar, rounds_done(runs))
            tick()
            time.sleep(0.5)
        _advance(bar, rounds_done(runs))


def _advance(bar, done: int) -> None:
    if done > bar.n:
        bar.update(done - bar.n)


def finish_runs(runs: list, what: str, log_hint: Path) -> list[dict]:
    """run.json of every run; RuntimeError naming the runs that failed and why."""
    problems = []
    for _, run_dir in runs:
        status = read_status(run_dir)
        if status.get("status") != "finished":
            error = status.get("error") or "no status written (the server never started it; see the log)"
            problems.append(f"{run_dir}: {error}")
    if problems:
        raise RuntimeError(f"the {what} run failed (FLARE log: {log_hint}):\n  " + "\n  ".join(problems))
    return [json.loads((run_dir / RUN_INFO).read_text()) for _, run_dir in runs]


__all__ = ["check_run_dir", "default_run_dir", "finish_runs", "holding_run_dirs", "load_flare_config",
           "prepare_runs", "rounds_done", "wait_with_progress", "write_site_configs"]
