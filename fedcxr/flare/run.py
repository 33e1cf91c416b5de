"""``fedcxr flare export|simulate|poc``: write a FLARE job, run it in the simulator or in POC mode.

* ``export`` writes a job folder for a provisioned (production) FLARE system; each hospital
  reads its own manifest path from its own configuration (:mod:`fedcxr.flare.client`).
* ``simulate`` runs the job in FLARE's simulator (one client process per site, named as the
  config's sites) on this machine.
* ``poc`` provisions a POC system for the sites (mTLS startup kits, server on a free loopback
  port), starts it, submits the job through the FLARE API, waits, downloads the server's
  result, then stops and removes everything it started — also on error or Ctrl-C.

Both runs write the run directory of ``fedcxr train`` (so ``fedcxr evaluate RUN_DIR`` works)
plus ``RUN_DIR/flare/``: the job, each site's ``fedcxr_site.json``, the sites' resume state,
the scalars the sites streamed through FLARE's experiment tracking (``flare/tensorboard/<site>``),
the global model as FLARE's persistor wrote it (``flare/FL_global_model.pt``)
and the FLARE logs of every attempt (``flare/logs/attempt-N``; startup kits and keys are never
copied).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

import yaml

from fedcxr.atomic import atomic_write_json
from fedcxr.errors import UserError
from fedcxr.logs import bar_disabled
from fedcxr.pipeline.checkpoints import latest_checkpoint
from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.data import default_cache_dir
from fedcxr.rundir import FINAL_MODEL, FLARE_WORKSPACE, METRICS, RUN_INFO
from fedcxr.runlock import run_lock
from fedcxr.flare.controller import mark_submitted, read_status
from fedcxr.flare.job import CONTROLLER_PATH, TB_FOLDER, check_flare_sites, export_job
from fedcxr.flare.persistor import GLOBAL_MODEL_FILE, LOCATOR_PATH, PERSISTOR_PATH

log = logging.getLogger(__name__)

ADMIN = "admin@fedcxr.local"
PROJECT = "fedcxr"
LOG_SUFFIXES = (".txt", ".log", ".json")
NEVER_COPY = ("startup", "transfer", "local")  # keys, certificates, uploaded jobs


# --------------------------------------------------------------------------- config and run directory


def load_flare_config(path: Path, overrides: list[str], *, need_manifests: bool):
    """The experiment config; ``export`` does not need the manifests on this machine."""
    return load_config(path, overrides=overrides, check_sites=need_manifests)


def default_run_dir(cfg) -> Path:
    return Path("runs") / f"{cfg.name}-{cfg.strategy}-seed{cfg.seed}-flare"


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


def _prepare(runs: list, *, resume: bool, task_timeout: int, device: Optional[str], client_script: Optional[Path],
             flare_dir: Optional[Path], evaluation: Optional[dict] = None) -> tuple[list, Path, Path, list[str]]:
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


# --------------------------------------------------------------------------- processes we start


def _env() -> dict:
    """FLARE's processes run the Python of this fedcxr (its venv first on PATH)."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _nvflare(*args: str) -> list[str]:
    return [sys.executable, "-m", "nvflare.cli", *args]


class ProcessTree:
    """Every process a FLARE run started: its process group and all their descendants.

    FLARE's simulator workers and job processes open their own sessions, so the group alone
    does not reach them; :meth:`snapshot` (called while the run is alive) remembers each
    ``(pid, start time)``, and :meth:`stop` ends exactly those still running — wait, SIGTERM,
    SIGKILL — never a process that merely reused a pid.
    """

    def __init__(self, pgid: int):
        self.pgid = pgid
        self.seen: dict[int, float] = {}

    def snapshot(self) -> None:
        import psutil  # a FLARE dependency

        for proc in psutil.process_iter():
            try:
                if os.getpgid(proc.pid) != self.pgid:
                    continue
                for member in [proc, *proc.children(recursive=True)]:
                    self.seen[member.pid] = member.create_time()
            except (OSError, psutil.Error):
                continue

    def alive(self) -> list:
        import psutil

        out = []
        for pid, created in self.seen.items():
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(proc)
            except psutil.Error:
                continue
        return out

    def stop(self, grace: float = 10.0) -> None:
        import psutil

        self.snapshot()
        for action in (None, "terminate", "kill"):
            procs = self.alive()
            if not procs:
                return
            if action:
                log.info("stopping %d leftover FLARE process(es) with %s", len(procs), action)
                for proc in procs:
                    try:
                        getattr(proc, action)()
                    except psutil.Error:
                        pass
            psutil.wait_procs(procs, timeout=grace)


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C while FLARE processes run, so cleanup still happens."""
    def handler(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _rounds_done(runs: list) -> int:
    done = 0
    for _, run_dir in runs:
        metrics = run_dir / METRICS
        done += len(metrics.read_text().splitlines()) if metrics.is_file() else 0
    return done


def _wait_with_progress(proc: Optional[subprocess.Popen], runs: list, progress: bool, done=lambda: False,
                        timeout: Optional[float] = None, tick=lambda: None) -> None:
    """Wait for ``proc`` (or ``done()``) while showing completed rounds from the runs' ``metrics.jsonl``."""
    from tqdm import tqdm

    start = time.time()
    with tqdm(total=sum(cfg.rounds for cfg, _ in runs), desc="FLARE rounds", unit="round",
              disable=bar_disabled(progress)) as bar:
        while (proc is None or proc.poll() is None) and not done():
            if timeout and time.time() - start > timeout:
                raise TimeoutError(f"the FLARE run did not finish within {timeout:.0f} s")
            _advance(bar, _rounds_done(runs))
            tick()
            time.sleep(0.5)
        _advance(bar, _rounds_done(runs))


def _advance(bar, done: int) -> None:
    if done > bar.n:
        bar.update(done - bar.n)


def _finish(runs: list, what: str, log_hint: Path) -> list[dict]:
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


def next_log_dir(flare_dir: Path) -> Path:
    """``flare/logs/attempt-N``: a resumed run keeps the logs of the attempts before it."""
    root = flare_dir / "logs"
    n = 1
    while (root / f"attempt-{n}").exists():
        n += 1
    (root / f"attempt-{n}").mkdir(parents=True)
    return root / f"attempt-{n}"


def copy_logs(src: Path, dest: Path) -> None:
    """FLARE's logs (server and sites) into ``dest``; never keys, certificates or uploaded jobs."""
    if not src.is_dir():
        return
    for path in src.rglob("*"):
        rel = path.relative_to(src)
        if not path.is_file() or any(part in NEVER_COPY for part in rel.parts):
            continue
        if path.suffix in LOG_SUFFIXES and ("log" in path.name or path.name in ("meta.json",)):
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)


def copy_tensorboard(src: Path, dest: Path) -> None:
    """The sites' streamed scalars (FLARE's ``tb_events/<site>/``) into ``dest/<site>/``."""
    if not src.is_dir():
        return
    for folder in src.rglob(TB_FOLDER):
        if not folder.is_dir() or any(part in NEVER_COPY for part in folder.relative_to(src).parts):
            continue
        for path in folder.rglob("events.out.tfevents.*"):
            target = dest / path.relative_to(folder)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)


def copy_global_model(src: Path, flare_dir: Path) -> None:
    """The persistor's ``FL_global_model.pt`` (FLARE's convention, :mod:`fedcxr.flare.persistor`) into ``flare/``."""
    if not src.is_dir():
        return
    found = [p for p in src.rglob(GLOBAL_MODEL_FILE)
             if p.is_file() and not any(part in NEVER_COPY for part in p.relative_to(src).parts)]
    if found:
        newest = max(found, key=lambda p: p.stat().st_mtime)
        flare_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(newest, flare_dir / GLOBAL_MODEL_FILE)


# --------------------------------------------------------------------------- simulator


def simulate(cfg, run_dir: Path, **kwargs) -> dict:
    """Run one experiment in FLARE's simulator; returns its run.json payload (see :func:`simulate_many`)."""
    return simulate_many([(cfg, run_dir)], **kwargs)[0]


@holding_run_dirs("fedcxr flare simulate")
def simulate_many(runs: list, *, resume: bool = False, task_timeout: int = 0, device: Optional[str] = None,
                  client_script: Optional[Path] = None, progress: bool = True, timeout: Optional[float] = None,
                  flare_dir: Optional[Path] = None, env: Optional[dict] = None,
                  on_start: Optional[Callable[[subprocess.Popen], None]] = None,
                  evaluation: Optional[dict] = None) -> list[dict]:
    """Run ``[(ExperimentConfig, run_dir)]`` one after the other in one FLARE simulator job.

    One client process per site (named as the configs' sites), the server in the simulator
    process. ``flare_dir`` (default ``<first run dir>/flare``) receives the job, the site
    configs, the sites' resume state and the logs (the simulator's workspace is removed after
    the run). ``env`` adds environment variables; ``on_start`` is called with the simulator
    process (its own process group) once it runs. ``evaluation``: the cross-site evaluation after
    the last round (``{"enabled", "n_boot", "split", "seed"}``, :mod:`fedcxr.flare.cross_site`).
    """
    runs, flare_dir, job_dir, sites = _prepare(runs, resume=resume, task_timeout=task_timeout, device=device,
                                               client_script=client_script, flare_dir=flare_dir,
                                               evaluation=evaluation)
    workspace = flare_dir / "simulator"
    shutil.rmtree(workspace, ignore_errors=True)
    logs = next_log_dir(flare_dir)
    log_path = logs / "simulator.log"
    cmd = _nvflare("simulator", str(job_dir), "-w", str(workspace), "-c", ",".join(sites), "-t", str(len(sites)))
    with open(log_path, "w") as out, _terminate_as_interrupt():
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**_env(), **(env or {})},
                                start_new_session=True)
        tree = ProcessTree(proc.pid)
        try:
            if on_start is not None:
                on_start(proc)
            _wait_with_progress(proc, runs, progress, timeout=timeout, tick=tree.snapshot)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)  # the simulator ends its workers on Ctrl-C
            tree.stop()
            proc.wait()
            copy_logs(workspace, logs)
            copy_tensorboard(workspace, flare_dir / "tensorboard")
            copy_global_model(workspace, flare_dir)
            shutil.rmtree(workspace, ignore_errors=True)
    return _finish(runs, "FLARE simulator", log_path)


# --------------------------------------------------------------------------- POC mode


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_project(path: Path, sites: list[str], port: int) -> Path:
    """A POC project: one server on ``port``, one admin, one client per site (FLARE provisions mTLS)."""
    project = {
        "api_version": 3, "name": PROJECT, "description": "fedcxr POC run",
        "participants": [
            {"name": "server", "type": "server", "org": "fedcxr", "fed_learn_port": port},
            {"name": ADMIN, "type": "admin", "org": "fedcxr", "role": "project_admin"},
            *({"name": s, "type": "client", "org": "fedcxr"} for s in sites),
        ],
        "builders": [
            {"path": "nvflare.lighter.impl.workspace.WorkspaceBuilder", "args": {"template_file": ["master_template.yml"]}},
            {"path": "nvflare.lighter.impl.static_file.StaticFileBuilder", "args": {"config_folder": "config"}},
            {"path": "nvflare.lighter.impl.cert.CertBuilder"},
            {"path": "nvflare.lighter.impl.signature.SignatureBuilder"},
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(project, sort_keys=False))
    return path


def allow_controller(server_kit: Path, paths: tuple[str, ...] = (CONTROLLER_PATH, PERSISTOR_PATH, LOCATOR_PATH)
                     ) -> None:
    """Let the server build fedcxr's controller, persistor and model locator (or the classes in
    ``paths``, e.g. a statistics job's): add them to ``local/resources.json``'s ``class_allow_list``.

    A provisioned FLARE server only builds components its operator allowed (jobs without
    custom code are checked against this list); production servers need the same line.
    """
    path = server_kit / "local" / "resources.json"
    if not path.is_file():
        path = server_kit / "local" / "resources.json.default"
    resources = json.loads(path.read_text())
    if "class_allow_list" not in resources:  # an explicit list replaces FLARE's default one: start from it
        from nvflare.app_common.default_component_policy import DEFAULT_CLASS_ALLOW_LIST

        resources["class_allow_list"] = list(DEFAULT_CLASS_ALLOW_LIST)
    allowed = resources["class_allow_list"]
    for name in paths:
        if name not in allowed and "*" not in allowed:
            allowed.append(name)
    (server_kit / "local" / "resources.json").write_text(json.dumps(resources, indent=2))


@contextmanager
def _keep_user_nvflare_config() -> Iterator[None]:
    """``nvflare poc prepare`` records the POC in ``~/.nvflare/config.conf``; put it back afterwards."""
    conf = Path.home() / ".nvflare" / "config.conf"
    existed_dir = conf.parent.exists()
    before = conf.read_bytes() if conf.is_file() else None
    try:
        yield
    finally:
        if before is not None:
            conf.write_bytes(before)
        else:
            conf.unlink(missing_ok=True)
            if not existed_dir and conf.parent.is_dir() and not any(conf.parent.iterdir()):
                conf.parent.rmdir()


def _run_cli(args: list[str], env: dict, log_file, timeout: float) -> subprocess.CompletedProcess:
    log_file.write(f"$ nvflare {' '.join(args)}\n")
    log_file.flush()
    done = subprocess.run(_nvflare(*args), env=env, stdout=log_file, stderr=subprocess.STDOUT, timeout=timeout)
    return done


def poc(cfg, run_dir: Path, **kwargs) -> dict:
    """Run one experiment on a POC FLARE system; returns its run.json payload (see :func:`poc_many`)."""
    return poc_many([(cfg, run_dir)], **kwargs)[0]


@holding_run_dirs("fedcxr flare poc")
def poc_many(runs: list, *, resume: bool = False, task_timeout: int = 0, device: Optional[str] = None,
             client_script: Optional[Path] = None, progress: bool = True, timeout: Optional[float] = None,
             flare_dir: Optional[Path] = None, env: Optional[dict] = None,
             evaluation: Optional[dict] = None) -> list[dict]:
    """Run ``[(ExperimentConfig, run_dir)]`` as one job on a POC system on this machine.

    Provisions the server, an admin and one client per site (mTLS startup kits), starts them,
    submits through the FLARE API, waits, downloads the server's result, and always stops the
    system, ends any process left in its group and removes the POC workspace (logs are kept
    in ``flare/logs``). ``evaluation``: as in :func:`simulate_many`.
    """
    runs, flare_dir, job_dir, sites = _prepare(runs, resume=resume, task_timeout=task_timeout, device=device,
                                               client_script=client_script, flare_dir=flare_dir,
                                               evaluation=evaluation)
    workspace = flare_dir / "poc"
    shutil.rmtree(workspace, ignore_errors=True)
    env = {**_env(), **(env or {}), "NVFLARE_POC_WORKSPACE": str(workspace)}
    project = write_project(flare_dir / "project.yml", sites, free_port())
    logs = next_log_dir(flare_dir)
    log_path = logs / "poc.log"
    tree: Optional[ProcessTree] = None
    with open(log_path, "w") as out, _keep_user_nvflare_config(), _terminate_as_interrupt():
        try:
            if _run_cli(["poc", "prepare", "-i", str(project), "--force"], env, out, 120).returncode:
                raise RuntimeError(f"`nvflare poc prepare` failed (see {log_path})")
            allow_controller(workspace / PROJECT / "prod_00" / "server")
            out.write("$ nvflare poc start\n")
            out.flush()
            started = subprocess.Popen(_nvflare("poc", "start", "--timeout", "120"), env=env, stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True)
            tree = ProcessTree(started.pid)
            if started.wait(timeout=180):
                raise RuntimeError(f"`nvflare poc start` failed (see {log_path})")
            tree.snapshot()
            _submit_and_wait(job_dir, workspace, flare_dir, runs, progress, timeout, tick=tree.snapshot)
        finally:
            _stop_poc(env, out, tree, workspace, logs)
            copy_tensorboard(flare_dir / "result", flare_dir / "tensorboard")
    return _finish(runs, "FLARE POC", log_path)


def _submit_and_wait(job_dir: Path, workspace: Path, flare_dir: Path, runs: list, progress: bool,
                     timeout: Optional[float], tick=lambda: None) -> None:
    from nvflare.fuel.flare_api.flare_api import new_secure_session

    kit = workspace / PROJECT / "prod_00" / ADMIN
    session = new_secure_session(ADMIN, str(kit), timeout=60)
    try:
        job_id = session.submit_job(str(job_dir.resolve()))
        log.info("submitted FLARE job %s", job_id)
        state = {}

        def finished() -> bool:
            state["status"] = str(session.get_job_meta(job_id).get("status", ""))
            return state["status"].startswith("FINISHED")

        try:
            _wait_with_progress(None, runs, progress, done=finished, timeout=timeout, tick=tick)
        except BaseException:
            session.abort_job(job_id)
            raise
        log.info("FLARE job %s: %s", job_id, state.get("status"))
        session.download_job_result(job_id, str(flare_dir / "result"))
    finally:
        session.close()


def _stop_poc(env: dict, out, tree: Optional[ProcessTree], workspace: Path, logs: Path) -> None:
    """Stop the POC system, end any process it left, keep the logs, remove the workspace."""
    try:
        if tree is not None:
            try:
                _run_cli(["poc", "stop"], env, out, 120)
            except Exception as exc:  # keep cleaning up
                out.write(f"poc stop failed: {exc}\n")
            tree.stop(grace=30)
    finally:
        copy_logs(workspace, logs)
        copy_tensorboard(workspace, logs.parent.parent / "tensorboard")
        copy_global_model(workspace, logs.parent.parent)
        try:
            _run_cli(["poc", "clean"], env, out, 120)
        except Exception as exc:
            out.write(f"poc clean failed: {exc}\n")
        shutil.rmtree(workspace, ignore_errors=True)


# --------------------------------------------------------------------------- CLI
