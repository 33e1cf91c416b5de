"""A fedcxr run on a POC FLARE system on this machine (``fedcxr flare poc``): provisioned, started, stopped here.

``nvflare poc prepare`` provisions a server, an admin and one client per site with mTLS startup
kits (:func:`write_project`: the server on a free loopback port); the server is allowed to build
fedcxr's controller, persistor and model locator (:func:`allow_controller`, as a production
operator must) and drops a client silent for :data:`POC_HEARTBEAT_TIMEOUT_S` (:func:`set_heartbeat_timeout`);
``nvflare poc start`` starts them; the job is submitted through the FLARE API and waited for
(:func:`submit_and_wait`, watched by :class:`fedcxr.flare.poc_watch.JobWatch`: a server that
stops ends the command with a fedcxr message, a site whose client restarted is brought back by
submitting the job again with ``resume``, a job FLARE keeps open after its runs ended is
aborted); then the system is always stopped, every process left in its group ended, the logs
kept and the workspace removed (:func:`stop_poc`) — also on error or Ctrl-C. The user's
``~/.nvflare/config.conf``, which ``poc prepare`` rewrites, is put back.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

import yaml

from fedcxr.errors import RunFailed
from fedcxr.flare.he_keys import KEPT_BUILDER_PATH
from fedcxr.flare.job import CONTROLLER_PATH
from fedcxr.flare.persistor import LOCATOR_PATH, PERSISTOR_PATH
from fedcxr.flare.processes import (
    ProcessTree,
    copy_global_model,
    copy_logs,
    copy_tensorboard,
    next_log_dir,
    nvflare_command,
    nvflare_env,
    run_nvflare,
    terminate_as_interrupt,
)
from fedcxr.flare.poc_watch import MAX_REJOINS, JobWatch, ServerLost, abort_and_wait, mark_server_lost
from fedcxr.flare.run import finish_runs, holding_run_dirs, prepare_runs, rehearsal_he_keys, wait_with_progress

log = logging.getLogger(__name__)
#: seconds ``nvflare poc start`` may take to start the server's and clients' processes
POC_START_TIMEOUT_S = 180

ADMIN = "admin@fedcxr.local"
PROJECT = "fedcxr"
#: seconds without a heartbeat after which the POC server drops a client (FLARE's provisioned kits: 600;
#: a client sends one every 10 s). Only then does FLARE report the client dead to the job, which stops
#: asking it (fedcxr.flare.liveness): a killed site costs the rounds of about this long, not the run's.
POC_HEARTBEAT_TIMEOUT_S = 30


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_project(path: Path, sites: list[str], port: int, he_keys: Optional[Path] = None) -> Path:
    """A POC project: one server on ``port``, one admin, one client per site (FLARE provisions mTLS).

    ``he_keys`` (``privacy.secure_aggregation``): FLARE's HE builder writes these kept contexts into the
    kits before the signature builder signs them — the server's kit the public one, each client's
    the secret one (``nvflare poc prepare -he`` does the same with new keys)."""
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
            *([{"path": KEPT_BUILDER_PATH, "args": {"keys_dir": str(Path(he_keys).resolve())}}] if he_keys else []),
            {"path": "nvflare.lighter.impl.signature.SignatureBuilder"},
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(project, sort_keys=False))
    return path


#: What a training job's server builds: fedcxr's controller, persistor and model locator.
SERVER_CLASSES = (CONTROLLER_PATH, PERSISTOR_PATH, LOCATOR_PATH)


def allow_controller(server_kit: Path, paths: tuple[str, ...] = SERVER_CLASSES) -> None:
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


def set_heartbeat_timeout(server_kit: Path, seconds: float = POC_HEARTBEAT_TIMEOUT_S) -> None:
    """The server drops a client silent for ``seconds`` (``heart_beat_timeout`` of its ``local/resources.json``;
    a production operator chooses it there too)."""
    path = server_kit / "local" / "resources.json"
    if not path.is_file():
        path = server_kit / "local" / "resources.json.default"
    resources = json.loads(path.read_text())
    servers = resources.get("servers") or [{}]
    for server in servers:
        server["heart_beat_timeout"] = seconds
    resources["servers"] = servers
    (server_kit / "local" / "resources.json").write_text(json.dumps(resources, indent=2))


def server_alive(workspace: Path) -> bool:
    """Whether the POC server of ``workspace`` still runs (its parent process, ``server_train``)."""
    import psutil  # a FLARE dependency

    kit = str(Path(workspace) / PROJECT / "prod_00" / "server")
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmd = proc.info["cmdline"] or []
            if "nvflare.private.fed.app.server.server_train" in cmd and kit in cmd \
                    and proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            continue
    return False


@contextmanager
def keep_user_nvflare_config() -> Iterator[None]:
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


def poc(cfg, run_dir: Path, **kwargs) -> dict:
    """Run one experiment on a POC FLARE system; returns its run.json payload (see :func:`poc_many`)."""
    return poc_many([(cfg, run_dir)], **kwargs)[0]


@holding_run_dirs("fedcxr flare poc")
def poc_many(runs: list, *, resume: bool = False, task_timeout: int = 0, device: Optional[str] = None,
             client_script: Optional[Path] = None, progress: bool = True, timeout: Optional[float] = None,
             flare_dir: Optional[Path] = None, env: Optional[dict] = None,
             evaluation: Optional[dict] = None, heartbeat_timeout: Optional[float] = None) -> list[dict]:
    """Run ``[(ExperimentConfig, run_dir)]`` as one job on a POC system on this machine.

    Provisions the server, an admin and one client per site (mTLS startup kits), starts them,
    submits through the FLARE API, waits, downloads the server's result, and always stops the
    system, ends any process left in its group and removes the POC workspace (logs are kept
    in ``flare/logs``). ``evaluation``: as in :func:`simulate_many`. ``heartbeat_timeout``: seconds
    without a heartbeat after which the server drops a client (:func:`set_heartbeat_timeout`; default
    :data:`POC_HEARTBEAT_TIMEOUT_S`).
    """
    runs, flare_dir, job_dir, sites = prepare_runs(runs, resume=resume, task_timeout=task_timeout, device=device,
                                                   client_script=client_script, flare_dir=flare_dir,
                                                   evaluation=evaluation)
    workspace = flare_dir / "poc"
    shutil.rmtree(workspace, ignore_errors=True)
    env = {**nvflare_env(), **(env or {}), "NVFLARE_POC_WORKSPACE": str(workspace)}
    he_keys = rehearsal_he_keys(runs, flare_dir)
    project = write_project(flare_dir / "project.yml", sites, free_port(), he_keys=he_keys)
    logs = next_log_dir(flare_dir)
    log_path = logs / "poc.log"
    def resubmission() -> Path:  # the same job, resuming every run (a site restarted: it joins the new job)
        return prepare_runs(runs, resume=True, task_timeout=task_timeout, device=device, client_script=client_script,
                            flare_dir=flare_dir, evaluation=evaluation)[2]

    with open(log_path, "w") as out, keep_user_nvflare_config(), terminate_as_interrupt():
        try:
            with poc_system(project, workspace, env, out, log_path, {"server": SERVER_CLASSES},
                            heartbeat_timeout=heartbeat_timeout or POC_HEARTBEAT_TIMEOUT_S) as tree:
                submit_and_wait(job_dir, workspace, flare_dir, runs, progress, timeout, tick=tree.snapshot,
                                resume=resume, resubmission=resubmission)
        except ServerLost as exc:
            mark_server_lost(runs, str(exc))
            raise
        finally:
            copy_tensorboard(flare_dir / "result", flare_dir / "tensorboard")
    return finish_runs(runs, "FLARE POC", log_path, he_keys=he_keys)


@contextmanager
def poc_system(project: Path, workspace: Path, env: dict, out, log_path: Path,
               allow: dict[str, tuple[str, ...]],
               heartbeat_timeout: float = POC_HEARTBEAT_TIMEOUT_S) -> Iterator[ProcessTree]:
    """A POC system provisioned from ``project`` into ``workspace`` and started; yields its process tree.

    ``allow``: participant (``server`` or a site) → the classes its startup kit may build
    (:func:`allow_controller`). ``out`` is the log file ``log_path`` of the ``nvflare`` commands.
    On exit — also on error or Ctrl-C — the system is stopped, every process left in its group
    ended, the logs kept beside ``log_path`` and the workspace removed (:func:`stop_poc`).
    """
    tree: Optional[ProcessTree] = None
    try:
        if run_nvflare(["poc", "prepare", "-i", str(project), "--force"], env, out, 120).returncode:
            raise RuntimeError(f"`nvflare poc prepare` failed (see {log_path})")
        kits = workspace / PROJECT / "prod_00"
        for participant, paths in allow.items():
            allow_controller(kits / participant, paths=paths)
        set_heartbeat_timeout(kits / "server", heartbeat_timeout)
        out.write("$ nvflare poc start\n")
        out.flush()
        started = subprocess.Popen(nvflare_command("poc", "start", "--timeout", "120"), env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        tree = ProcessTree(started.pid)
        try:
            failed = started.wait(timeout=POC_START_TIMEOUT_S)
        except subprocess.TimeoutExpired:  # a machine too busy to start FLARE's processes: say so, no traceback
            raise RunFailed(f"the FLARE POC system did not start within {POC_START_TIMEOUT_S:g} s (`nvflare poc "
                            f"start`; see {log_path}): is the machine busy? Nothing was trained") from None
        if failed:
            raise RunFailed(f"`nvflare poc start` failed (exit {failed}; see {log_path}); nothing was trained")
        tree.snapshot()
        yield tree
    finally:
        stop_poc(env, out, tree, workspace, log_path.parent)


def submit_and_wait(job_dir: Path, workspace: Path, flare_dir: Path, runs: list, progress: bool,
                    timeout: Optional[float], tick=lambda: None, resume: bool = False,
                    resubmission: Optional[Callable[[], Path]] = None) -> None:
    """Submit ``job_dir`` through the FLARE API as the POC admin, wait for it (showing the runs'
    rounds; aborted on any error or Ctrl-C) and download the server's result into ``flare/result``.

    The wait is a :class:`~fedcxr.flare.poc_watch.JobWatch`: :class:`ServerLost` when the server
    stops; when a site's client restarted mid-job, the job is aborted and ``resubmission()`` (the
    job written again with ``resume``) submitted, at most :data:`MAX_REJOINS` times."""
    from nvflare.fuel.flare_api.flare_api import new_secure_session

    kit = workspace / PROJECT / "prod_00" / ADMIN
    sites = sorted({cfg.site_name(s) for cfg, _ in runs for s in cfg.all_sites()})
    session = new_secure_session(ADMIN, str(kit), timeout=60)
    try:
        for attempt in range(MAX_REJOINS + 1):
            job_id = _server_call(workspace, lambda: session.submit_job(str(job_dir.resolve())), "a job submission")
            log.info("submitted FLARE job %s", job_id)
            watch = JobWatch(session, job_id, runs, sites, lambda: server_alive(workspace),
                             can_rejoin=resubmission is not None)
            try:
                wait_with_progress(None, runs, progress, done=watch.done, timeout=timeout, tick=tick,
                                   resume=resume or attempt > 0)
            except ServerLost:
                raise
            except BaseException:  # Ctrl-C, SIGTERM, an error here: the system is stopped right after
                abort_and_wait(session, job_id, wait=False)
                raise
            if not watch.rejoin or resubmission is None or attempt == MAX_REJOINS:
                break
            abort_and_wait(session, job_id)
            job_dir = resubmission()
        log.info("FLARE job %s: %s", job_id, watch.aborted or watch.status)
        try:  # FLARE's copy of the server's job folder; the run directory already holds the run
            session.download_job_result(job_id, str(flare_dir / "result"))
        except Exception as exc:
            log.warning("FLARE job %s: its result could not be downloaded (%s: %s); the run directory is complete, "
                        "the server's logs are in %s", job_id, type(exc).__name__, exc, flare_dir / "logs")
    finally:
        try:
            session.close()
        except Exception:  # a server that stopped: nothing to close
            pass


def _server_call(workspace: Path, call, what: str):
    """``call()`` to the POC server; :class:`ServerLost` when it fails because the server stopped."""
    try:
        return call()
    except Exception as exc:
        if server_alive(workspace):
            raise
        raise ServerLost(f"the FLARE server stopped before {what} ({type(exc).__name__})") from None


def _request_stop(env: dict, out, attempts: int = 2) -> bool:
    """``nvflare poc stop``, once more when it fails: on a busy machine its wait for the shutdown
    can time out (exit 2, "did not complete before the timeout") while the system is still going
    down. Whatever it answers, :func:`stop_poc` then ends every process the system left."""
    for attempt in range(1, attempts + 1):
        try:
            done = run_nvflare(["poc", "stop"], env, out, 120)
            if done.returncode == 0:
                return True
            out.write(f"poc stop attempt {attempt}: exit code {done.returncode}\n")
        except Exception as exc:  # keep cleaning up
            out.write(f"poc stop attempt {attempt} failed: {exc}\n")
        out.flush()
    return False


def stop_poc(env: dict, out, tree: Optional[ProcessTree], workspace: Path, logs: Path) -> None:
    """Stop the POC system, end any process it left, keep the logs, remove the workspace."""
    try:
        if tree is not None:
            alive = server_alive(workspace)
            if alive:
                _request_stop(env, out)
            tree.adopt(str(workspace))  # a client restarted by hand belongs to this system too
            # a stopped server cannot stop its clients: they are ended here without waiting for them
            tree.stop(grace=30) if alive else tree.stop(grace=5, wait_first=False)
    finally:
        copy_logs(workspace, logs)
        copy_tensorboard(workspace, logs.parent.parent / "tensorboard")
        copy_global_model(workspace, logs.parent.parent)
        try:
            run_nvflare(["poc", "clean"], env, out, 120)
        except Exception as exc:
            out.write(f"poc clean failed: {exc}\n")
        shutil.rmtree(workspace, ignore_errors=True)


__all__ = ["ADMIN", "POC_HEARTBEAT_TIMEOUT_S", "PROJECT", "SERVER_CLASSES", "allow_controller", "free_port",
           "keep_user_nvflare_config", "poc", "poc_many", "poc_system", "server_alive", "set_heartbeat_timeout",
           "stop_poc", "submit_and_wait", "write_project"]
