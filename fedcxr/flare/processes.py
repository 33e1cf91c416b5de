"""The processes a FLARE run starts, and what is kept of them: the one place that starts, watches and ends them.

Why a module of its own: the simulator and POC runs of training (:mod:`fedcxr.flare.simulator`,
:mod:`fedcxr.flare.poc`) and of the statistics job (:mod:`fedcxr.flare.stats_run`) all start
``nvflare`` processes that open their own sessions; each must end every process it started —
also on error, Ctrl-C or SIGTERM — and keep FLARE's logs, never its keys.

* :func:`nvflare_command`, :func:`nvflare_env`, :func:`run_nvflare`: ``nvflare`` of this
  Python (its venv first on PATH), its output into a log file;
* :class:`ProcessTree`: every process of a run's process group and its descendants, ended
  exactly (wait, SIGTERM, SIGKILL; never a process that merely reused a pid);
* :func:`terminate_as_interrupt`: SIGTERM behaves as Ctrl-C while FLARE runs, so cleanup happens;
* :func:`next_log_dir`, :func:`copy_logs`, :func:`copy_tensorboard`, :func:`copy_global_model`:
  what is kept of a FLARE workspace before it is removed (``flare/logs/attempt-N``, the sites'
  scalars, the persistor's global model; startup kits, keys and uploaded jobs never).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from fedcxr.flare.job import TB_FOLDER
from fedcxr.flare.persistor import GLOBAL_MODEL_FILE

log = logging.getLogger(__name__)

LOG_SUFFIXES = (".txt", ".log", ".json")
NEVER_COPY = ("startup", "transfer", "local")  # keys, certificates, uploaded jobs


def nvflare_env() -> dict:
    """FLARE's processes run the Python of this fedcxr (its venv first on PATH)."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def nvflare_command(*args: str) -> list[str]:
    """``nvflare ARGS`` run by this Python (the console script may belong to another environment)."""
    return [sys.executable, "-m", "nvflare.cli", *args]


def run_nvflare(args: list[str], env: dict, log_file, timeout: float) -> subprocess.CompletedProcess:
    """Run ``nvflare ARGS`` to completion, the command line and its output written to ``log_file``."""
    log_file.write(f"$ nvflare {' '.join(args)}\n")
    log_file.flush()
    return subprocess.run(nvflare_command(*args), env=env, stdout=log_file, stderr=subprocess.STDOUT,
                          timeout=timeout)


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

    def adopt(self, text: str) -> None:
        """Also end the processes whose command line names ``text`` (a POC workspace): a client restarted
        by hand (``nvflare poc start -p SITE``) runs in a group of its own, but still belongs to this run."""
        import psutil

        for proc in psutil.process_iter(["cmdline", "create_time"]):
            try:
                if text in " ".join(proc.info["cmdline"] or []):
                    self.seen[proc.pid] = proc.info["create_time"]
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

    def stop(self, grace: float = 10.0, *, wait_first: bool = True) -> None:
        """End the processes still running: wait ``grace`` s for FLARE's own processes to end by themselves,
        then SIGTERM and ``grace`` s, then SIGKILL. The first wait is not for the shells of FLARE's start
        scripts: a POC participant's ``sub_start.sh`` loop only notices its process ended at its next
        5 s tick (it has nothing left to do: the workspace goes next). ``wait_first=False``: no first wait,
        where nothing will end them (a POC system whose server died: its clients keep trying to reach it)."""
        import psutil

        self.snapshot()
        for action in (None, "terminate", "kill") if wait_first else ("terminate", "kill"):
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
            psutil.wait_procs([p for p in procs if action or not _is_shell(p)], timeout=grace)


#: the shells FLARE's start scripts run in (``start.sh``, ``sub_start.sh``)
SHELLS = ("bash", "sh", "dash")


def _is_shell(proc) -> bool:
    import psutil

    try:
        return proc.name() in SHELLS
    except psutil.Error:
        return False


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
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


__all__ = ["LOG_SUFFIXES", "NEVER_COPY", "ProcessTree", "copy_global_model", "copy_logs", "copy_tensorboard",
           "next_log_dir", "nvflare_command", "nvflare_env", "run_nvflare", "terminate_as_interrupt"]
