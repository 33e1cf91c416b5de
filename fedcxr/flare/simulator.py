"""A fedcxr run in FLARE's simulator on this machine (``fedcxr flare simulate``).

One client process per site (named as the config's sites), the server in the simulator
process, all in their own process group: ended on error, Ctrl-C or SIGTERM
(:mod:`fedcxr.flare.processes`), the logs, the sites' scalars and the global model kept in
``RUN_DIR/flare/`` and the simulator's workspace removed. The run directory is ``fedcxr
train``'s (:mod:`fedcxr.flare.run`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

from fedcxr.errors import RunFailed
from fedcxr.flare.processes import (
    ProcessTree,
    copy_global_model,
    copy_logs,
    copy_tensorboard,
    next_log_dir,
    nvflare_command,
    nvflare_env,
    terminate_as_interrupt,
)
from fedcxr.flare.run import finish_runs, holding_run_dirs, prepare_runs, rehearsal_he_keys, wait_with_progress

log = logging.getLogger(__name__)


def simulate(cfg, run_dir: Path, **kwargs) -> dict:
    """Run one experiment in FLARE's simulator; returns its run.json payload (see :func:`simulate_many`)."""
    return simulate_many([(cfg, run_dir)], **kwargs)[0]


@holding_run_dirs("fedcxr flare simulate")
def simulate_many(runs: list, *, resume: bool = False, retries: int = 1, **kwargs) -> list[dict]:
    """Run ``[(ExperimentConfig, run_dir)]`` one after the other in one FLARE simulator job
    (:func:`simulate_job`, which says what ``kwargs`` are).

    Where NVFLARE's simulator loses a site's worker process (:class:`SimulatorWorkerLost`) the job is
    run again, resuming — up to ``retries`` times — and a warning says so: a resumed run ends on the
    model an undisturbed one ends on, so the retry costs time, never a different result."""
    attempt = 0
    while True:
        try:
            return simulate_job(runs, resume=resume or attempt > 0, **kwargs)
        except SimulatorWorkerLost as exc:
            if attempt >= retries:
                raise
            attempt += 1
            log.warning("%s — running the job again, resuming (attempt %d of %d)", exc, attempt + 1, retries + 1)


def simulate_job(runs: list, *, resume: bool = False, task_timeout: int = 0, device: Optional[str] = None,
                 client_script: Optional[Path] = None, progress: bool = True, timeout: Optional[float] = None,
                 flare_dir: Optional[Path] = None, env: Optional[dict] = None,
                 on_start: Optional[Callable[[subprocess.Popen], None]] = None,
                 evaluation: Optional[dict] = None) -> list[dict]:
    """One FLARE simulator job over ``[(ExperimentConfig, run_dir)]``, one run after the other.

    One client process per site (named as the configs' sites), the server in the simulator
    process. ``flare_dir`` (default ``<first run dir>/flare``) receives the job, the site
    configs, the sites' resume state and the logs (the simulator's workspace is removed after
    the run). ``env`` adds environment variables; ``on_start`` is called with the simulator
    process (its own process group) once it runs. ``evaluation``: the cross-site evaluation after
    the last round (``{"enabled", "n_boot", "split", "seed"}``, :mod:`fedcxr.flare.cross_site`).

    ``privacy.secure_aggregation``: the HE contexts go into the simulator's one ``startup`` folder,
    which it copies to the server and every site — the rehearsal measures the protocol, it does not
    keep the key from the server (POC mode does: :mod:`fedcxr.flare.poc`).
    """
    runs, flare_dir, job_dir, sites = prepare_runs(runs, resume=resume, task_timeout=task_timeout, device=device,
                                                   client_script=client_script, flare_dir=flare_dir,
                                                   evaluation=evaluation)
    workspace = flare_dir / "simulator"
    shutil.rmtree(workspace, ignore_errors=True)
    he_keys = rehearsal_he_keys(runs, flare_dir)
    if he_keys is not None:  # privacy.secure_aggregation: one shared startup folder, so one trust domain
        from fedcxr.flare.he_keys import plant_simulator_contexts

        plant_simulator_contexts(he_keys, workspace)
    logs = next_log_dir(flare_dir)
    log_path = logs / "simulator.log"
    with open(log_path, "w") as out, terminate_as_interrupt():
        try:
            with running_simulator(job_dir, workspace, sites, out, {**nvflare_env(), **(env or {})}) as (proc, tree):
                if on_start is not None:
                    on_start(proc)
                watch = WorkerWatch(log_path)
                wait_with_progress(proc, runs, progress, done=lambda: server_app_ended(workspace) or watch.check(),
                                   timeout=timeout, tick=tree.snapshot, resume=resume)
        finally:
            copy_logs(workspace, logs)
            copy_tensorboard(workspace, flare_dir / "tensorboard")
            copy_global_model(workspace, flare_dir)
            shutil.rmtree(workspace, ignore_errors=True)
    return finish_runs(runs, "FLARE simulator", log_path, he_keys=he_keys)


#: What NVFLARE's simulator logs when a site's worker process dies under it (its pipe to the simulator
#: reset, or the process gone) or never answers its start-up connection (60 s) — at start-up as much as
#: mid-run. It starts no other worker for that site, so the server would wait for the site's replies
#: until the run's timeout, or forever. (Seen in CI: the simulator hands each worker a free port that
#: it has just probed; under load, with another simulator job starting beside it, the connection
#: was reset at start-up.)
LOST_WORKER = re.compile(r"(?:Communication error with client|Subprocess died for client) ([^\s:,]+)"
                         r"|Failed to create connection to the child process")


class SimulatorWorkerLost(RunFailed):
    """NVFLARE's simulator lost a site's worker process (:data:`LOST_WORKER`): the run is stopped at
    once, with the site and the simulator's line, instead of waiting for that site forever."""


class WorkerWatch:
    """Reads the simulator's log as it grows (only the new bytes each time) for :data:`LOST_WORKER`."""

    def __init__(self, log_path: Path):
        self.log_path = Path(log_path)
        self.offset = 0
        self.tail = ""

    def check(self) -> bool:
        """False while no worker is lost; raises :class:`SimulatorWorkerLost` once one is."""
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(self.offset)
                new = handle.read()
        except OSError:
            return False
        self.offset += len(new)
        text, _, self.tail = (self.tail + new.decode("utf-8", errors="replace")).rpartition("\n")
        for line in text.splitlines():
            found = LOST_WORKER.search(line)
            if found:
                site = f"site {found.group(1)}'s" if found.group(1) else "a site's"
                raise SimulatorWorkerLost(
                    f"NVFLARE's simulator lost {site} worker process and starts no other, so the "
                    f"run would wait for that site forever; it was stopped. The simulator said: {line.strip()} "
                    f"(log: {self.log_path})")
        return False


#: What FLARE's simulator writes in its workspace once the server app has ended: every site done,
#: END_RUN handled (TensorBoard files closed, the global model persisted), logs written. After it
#: the simulator only sleeps through NVFLARE's fixed shutdown grace (3 s, then its cleanup).
SERVER_APP_ENDED = Path("server") / "pool_stats" / "simulator_cell_stats.json"


def server_app_ended(workspace: Path) -> bool:
    """True once the simulator's server app in ``workspace`` has ended (:data:`SERVER_APP_ENDED`):
    the run is over and its outputs are on disk, so the simulator is stopped rather than waited for."""
    return (Path(workspace) / SERVER_APP_ENDED).is_file()


@contextmanager
def running_simulator(job_dir: Path, workspace: Path, sites: list[str], out, env: dict
                      ) -> Iterator[tuple[subprocess.Popen, ProcessTree]]:
    """``nvflare simulator`` on ``job_dir`` (one client per site, workspace ``workspace``) in its own
    process group, its output into ``out``; yields ``(process, its tree)``. On exit — also on error
    or Ctrl-C — a simulator still running is interrupted (it ends its workers on SIGINT; once its
    server app has ended, :func:`server_app_ended`, there is nothing left to end well and it gets
    SIGTERM) and every process it started is ended."""
    cmd = nvflare_command("simulator", str(job_dir), "-w", str(workspace), "-c", ",".join(sites),
                          "-t", str(len(sites)))
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    tree = ProcessTree(proc.pid)
    try:
        yield proc, tree
    finally:
        if proc.poll() is None:  # the simulator ends its workers on Ctrl-C
            os.killpg(proc.pid, signal.SIGTERM if server_app_ended(workspace) else signal.SIGINT)
        tree.stop()
        proc.wait()


__all__ = ["LOST_WORKER", "SERVER_APP_ENDED", "SimulatorWorkerLost", "WorkerWatch", "running_simulator",
           "server_app_ended", "simulate", "simulate_job", "simulate_many"]
