"""One fedcxr process per run directory: an exclusive lock file, ``RUN_DIR/.fedcxr.lock``.

Two ``fedcxr train`` into one ``--out`` used to both run and leave a mixed run (rounds 0, 0, 1, 1
in ``metrics.jsonl``, whichever checkpoint was written last). Now ``train`` (and ``sweep`` and
``demo``, which train through it), ``evaluate`` and the FLARE runners (``fedcxr flare simulate``
and ``poc``) hold the run directory's lock while they write into it; a second process stops with
exit code 2 naming the holder (pid, host, command, start time).

* The lock is the operating system's (``fcntl.flock`` on the lock file): the kernel releases it
  when the process ends, however it ends, so a dead process never holds a run directory.
* The file records the holder for that message. A ``kill -9`` leaves the file behind but not
  the lock: the next process finds the file unlocked, names it as a **stale lock** of a process
  that is no longer running (a warning), and takes it over.
* The lock is released and the file removed when the command ends. A process may re-enter a
  run directory it already holds (``sweep`` evaluating the run it trained).
* Where ``fcntl`` does not exist (Windows) the file is created exclusively (``O_EXCL``); a file
  whose pid is not running on this host is stale and taken over, as above.

The FLARE server's controller writes the run directory from inside the simulator or POC job the
runner started; the runner holds the lock for it. A job submitted to a provisioned FLARE system
(``fedcxr flare export``) is one job per run directory, scheduled by FLARE.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from fedcxr.errors import UserError
from fedcxr.rundir import LOCK, RunDir

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

LOCK_NAME = LOCK  # fedcxr.rundir
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # a link planted at the lock's name is not followed
_held: dict[str, list] = {}  # real path of a lock file → [fd, depth] (this process)


def lock_path(run_dir: Path | str) -> Path:
    return RunDir(run_dir).lock


@contextmanager
def run_lock(run_dir: Path | str, command: str) -> Iterator[Path]:
    """Hold ``run_dir``'s lock for ``command`` (e.g. ``"fedcxr train"``); creates ``run_dir``.

    Raises :class:`~fedcxr.errors.UserError` (exit code 2) when another running process holds it.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = lock_path(run_dir)
    key = os.path.realpath(path)
    if key in _held:  # re-entered by the process that holds it
        _held[key][1] += 1
        try:
            yield path
        finally:
            _held[key][1] -= 1
        return
    fd = _acquire(path, run_dir, command)
    _held[key] = [fd, 1]
    try:
        yield path
    finally:
        del _held[key]
        _release(path, fd)


def holder(run_dir: Path | str) -> Optional[dict]:
    """What the lock file of ``run_dir`` says about its holder (None when there is none)."""
    try:
        return _parse(lock_path(run_dir).read_bytes())
    except OSError:
        return None


def describe(info: Optional[dict]) -> str:
    """``pid 123 on host h, `fedcxr train`, since 2024-05-01 10:00:00`` (bounded, from a hostile file)."""
    if not info:
        return "a process that left no details"
    since = info.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else "?"
    return (f"pid {str(info.get('pid', '?'))[:12]} on host {str(info.get('host', '?'))[:64]}, "
            f"`{str(info.get('command', '?'))[:40]}`, since {when}")


# --------------------------------------------------------------------------- internals


def _record(command: str) -> bytes:
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                       "started": round(time.time(), 3)}).encode() + b"\n"


def _parse(data: bytes) -> Optional[dict]:
    if not data.strip():
        return None
    try:
        info = json.loads(data[:4096].decode("utf-8", "replace"))
    except ValueError:
        return {"pid": "?", "host": "?", "command": "unreadable lock file"}
    return info if isinstance(info, dict) else {"pid": "?", "host": "?", "command": "unreadable lock file"}


def _read_fd(fd: int) -> Optional[dict]:
    os.lseek(fd, 0, os.SEEK_SET)
    return _parse(os.read(fd, 4096))


def _in_use(run_dir: Path, info: Optional[dict]) -> UserError:
    return UserError(f"{run_dir} is in use by another fedcxr process ({describe(info)}); wait until it ends, "
                     "or choose another --out (two processes writing one run directory would mix their rounds)")


def _stale(path: Path, info: dict) -> None:
    log.warning("%s: stale lock of %s, which is no longer running (killed?); taking it over", path, describe(info))


def _acquire(path: Path, run_dir: Path, command: str) -> int:
    if fcntl is None:  # pragma: no cover - Windows
        return _acquire_exclusive(path, run_dir, command)
    for _ in range(5):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            info = _read_fd(fd)
            os.close(fd)
            raise _in_use(run_dir, info) from None
        except OSError as exc:  # a file system without locks (some network mounts): say so, go on
            log.warning("%s: this file system cannot lock files (%s): nothing stops a second process from "
                        "writing this run directory at the same time", path, exc.strerror or exc)
            _write(fd, command)
            return fd
        # the previous holder removes the file when it ends: our lock must be on the file at ``path`` now
        try:
            same = os.stat(path, follow_symlinks=False)
            current = os.fstat(fd)
            fresh = (same.st_dev, same.st_ino) == (current.st_dev, current.st_ino)
        except FileNotFoundError:
            fresh = False
        if not fresh:
            os.close(fd)
            continue
        previous = _read_fd(fd)
        if previous is not None:
            _stale(path, previous)
        _write(fd, command)
        return fd
    raise _in_use(run_dir, holder(run_dir))


def _write(fd: int, command: str) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, _record(command))


def _acquire_exclusive(path: Path, run_dir: Path, command: str) -> int:  # pragma: no cover - Windows
    for _ in range(5):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            info = holder(run_dir)
            if info and info.get("host") == socket.gethostname() and not _alive(info.get("pid")):
                _stale(path, info)
                path.unlink(missing_ok=True)
                continue
            raise _in_use(run_dir, info) from None
        _write(fd, command)
        return fd
    raise _in_use(run_dir, holder(run_dir))


def _alive(pid) -> bool:  # pragma: no cover - Windows path only
    try:
        os.kill(int(pid), 0)
    except (ValueError, TypeError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _release(path: Path, fd: int) -> None:
    try:
        path.unlink(missing_ok=True)  # unlink before unlocking: a waiting process re-checks the path
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ = ["LOCK_NAME", "describe", "holder", "lock_path", "run_lock"]
