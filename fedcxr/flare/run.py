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
copied: :mod:`fedcxr.flare.processes`). With ``privacy.secure_aggregation`` the rehearsal's own HE
keys are kept in ``flare/he/`` (:func:`rehearsal_he_keys`) and the server's sealed
``final_model.pt`` is opened with them once the job has finished (:func:`finish_runs`).

This module holds what both runners share: the refusals of ``fedcxr train`` for a run directory
(:meth:`fedcxr.rundir.RunDir.check_start`, the one policy), its lock while the job runs, the
sites' configurations and the job (:func:`prepare_runs`), the progress of the rounds
(:meth:`~fedcxr.rundir.RunDir.rounds_done`) and the results read back (:func:`finish_runs`).
"""

from __future__ import annotations

import functools
import json
import logging
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Optional

from fedcxr.atomic import atomic_write_json
from fedcxr.errors import RunFailed, UserError
from fedcxr.logs import bar_disabled
from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.data import default_cache_dir
from fedcxr.pipeline.run_log import round_line, rounds_log
from fedcxr.rundir import FLARE_WORKSPACE, METRICS, RunDir, read_run_info
from fedcxr.runlock import run_lock
from fedcxr.flare.controller import mark_submitted, read_status
from fedcxr.flare.job import check_flare_sites, export_job

log = logging.getLogger(__name__)


def load_flare_config(path: Path, overrides: list[str], *, need_manifests: bool):
    """The experiment config; ``export`` does not need the manifests on this machine."""
    return load_config(path, overrides=overrides, check_sites=need_manifests)


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
    for _, run_dir in runs:  # the refusals of `fedcxr train`: never overwrite a finished or interrupted run
        RunDir(run_dir).check_start(resume=resume)
    for _, run_dir in runs:
        mark_submitted(run_dir, keep=resume)
    flare_dir = Path(flare_dir).resolve() if flare_dir else runs[0][1] / FLARE_WORKSPACE
    site_configs = write_site_configs([cfg for cfg, _ in runs], flare_dir, device=device)
    job_dir = export_job([(cfg, str(run_dir), resume) for cfg, run_dir in runs], flare_dir / "job",
                         task_timeout=task_timeout, site_configs=site_configs, client_script=client_script,
                         evaluation=evaluation)
    return runs, flare_dir, job_dir, sites


def rehearsal_he_keys(runs: list, flare_dir: Path) -> Optional[Path]:
    """The HE keys of a rehearsal on this machine when a run asks for ``privacy.secure_aggregation``
    (made once by FLARE's ``HEBuilder`` and kept in ``flare/he/``: a resume opens what was sealed
    before), else None."""
    if not any(cfg.privacy.secure_aggregation for cfg, _ in runs):
        return None
    from fedcxr.flare.he_keys import REHEARSAL_DIR, TENSEAL_HINT, have_tenseal, rehearsal_keys

    if not have_tenseal():
        raise UserError(TENSEAL_HINT)
    return rehearsal_keys(Path(flare_dir) / REHEARSAL_DIR)


def open_sealed_finals(runs: list, keys: Optional[Path]) -> None:
    """Open the sealed ``final_model.pt`` of every secure-aggregation run with the rehearsal's client key:
    on this machine fedcxr holds every site's key, as a site (or the researcher it trusts) does in
    production with ``fedcxr flare decrypt``."""
    if keys is None:
        return
    from fedcxr.flare.he_keys import CLIENT_CONTEXT, read_context_file
    from fedcxr.flare.secure_aggregation import decrypt_run

    context = None
    for cfg, run_dir in runs:
        if cfg.privacy.secure_aggregation:
            context = context or read_context_file(Path(keys) / CLIENT_CONTEXT, private=True)
            if decrypt_run(run_dir, context):
                log.info("%s: final_model.pt decrypted with the rehearsal's site key (%s); the FLARE server only "
                         "ever held it encrypted", run_dir, keys)


def wait_with_progress(proc: Optional[subprocess.Popen], runs: list, progress: bool, done=lambda: False,
                       timeout: Optional[float] = None, tick=lambda: None, resume: bool = False) -> None:
    """Wait for ``proc`` (or ``done()``) while showing completed rounds from the runs' ``metrics.jsonl``:
    the bar on a terminal, else one line per round as it ends (:class:`RoundLines`, ``fedcxr train``'s)."""
    from tqdm import tqdm

    start = time.time()
    with tqdm(total=sum(cfg.rounds for cfg, _ in runs), desc="FLARE rounds", unit="round",
              disable=bar_disabled(progress)) as bar:
        lines = RoundLines(runs, resume=resume, console=bool(bar.disable))
        while (proc is None or proc.poll() is None) and not done():
            if timeout and time.time() - start > timeout:
                raise TimeoutError(f"the FLARE run did not finish within {timeout:.0f} s")
            lines.emit()
            _advance(bar, sum(RunDir(run_dir).rounds_done() for _, run_dir in runs))
            tick()
            time.sleep(0.5)
        lines.emit()
        _advance(bar, sum(RunDir(run_dir).rounds_done() for _, run_dir in runs))


class RoundLines:
    """The round lines of ``fedcxr train`` for a run the FLARE server trains in another process.

    The server's controller writes each round to the run's ``metrics.jsonl`` (and its own
    ``train.log``); this follows that file and logs every new round through the same logger and
    line as ``train`` (:func:`fedcxr.pipeline.run_log.round_line`): shown on the console when no
    bar is (off a terminal: ``nohup``, CI), hidden by ``--quiet``. A file not written yet, or
    unreadable for a moment, is simply read again at the next tick. Rounds already in the file
    when a resumed run starts are not repeated; with several runs in one job each line names
    its run directory.
    """

    def __init__(self, runs: list, *, resume: bool, console: bool) -> None:
        self.runs = [(cfg, Path(run_dir)) for cfg, run_dir in runs]
        self.console = console
        self.seen = {run_dir: ({_round(row) for row in _rows(run_dir)} if resume else set())
                     for _, run_dir in self.runs}

    def emit(self) -> None:
        """Log the line of every round finished since the last call."""
        for cfg, run_dir in self.runs:
            for row in _rows(run_dir):
                if _round(row) in self.seen[run_dir]:
                    continue
                self.seen[run_dir].add(_round(row))
                name = f"{run_dir.name}: " if len(self.runs) > 1 else ""
                rounds_log.info("%s%s", name, round_line(row, cfg.rounds), extra={"console": self.console})


def _round(row: dict):
    return row.get("round")


def _rows(run_dir: Path) -> list[dict]:
    """The JSON objects of ``metrics.jsonl`` now ([] when absent or unreadable: read again next tick;
    a line that is not one is skipped quietly — the run's own reader names it)."""
    try:
        text = (run_dir / METRICS).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _advance(bar, done: int) -> None:
    if done > bar.n:
        bar.update(done - bar.n)


def finish_runs(runs: list, what: str, log_hint: Path, he_keys: Optional[Path] = None) -> list[dict]:
    """run.json of every run; :class:`RunFailed` naming the runs that failed and why. ``he_keys``: the
    rehearsal's HE keys, which open the secure-aggregation runs' sealed final models."""
    problems = []
    for _, run_dir in runs:
        status = read_status(run_dir)
        if status.get("status") != "finished":
            error = status.get("error") or "no status written (the server never started it; see the log)"
            problems.append(f"{run_dir}: {error}")
    if problems:  # a run that stopped (exit 1, with the resume command), not a traceback
        raise RunFailed(f"the {what} run failed (FLARE log: {log_hint}):\n  " + "\n  ".join(problems))
    open_sealed_finals(runs, he_keys)
    return [read_run_info(run_dir) for _, run_dir in runs]


__all__ = ["RoundLines", "finish_runs", "holding_run_dirs", "load_flare_config", "open_sealed_finals", "prepare_runs",
           "rehearsal_he_keys", "wait_with_progress",
           "write_site_configs"]
