"""Checkpoints and model files of a run directory: safe to load, verified, never half-written.

A run directory is treated as hostile input (SECURITY.md): a tampered ``.pt`` file must not run
code, and a damaged one must not end a run that an earlier intact checkpoint can continue.

* Every file is loaded with ``torch.load(weights_only=True)`` (:func:`load_tensors`): only
  tensors and plain containers/numbers/strings come back; anything else is refused with the
  file's name (exit 2), never unpickled.
* Every checkpoint is written atomically (temporary name, fsync, rename) and its SHA-256 is
  recorded beside it (``round_NNNN.pt.sha256``). :func:`load_latest_intact` walks the
  checkpoints newest first and takes the first whose checksum matches and which loads;
  a corrupt newest one is skipped with a warning naming it.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Any, Optional

import torch

from fedcxr.atomic import atomic_torch_save, atomic_write_bytes
from fedcxr.errors import UserError
from fedcxr.rundir import RunDir

log = logging.getLogger(__name__)

#: Checkpoints kept per run: the newest and the one before it (the fallback).
KEEP_CHECKPOINTS = 2
CHECKSUM_SUFFIX = ".sha256"


class UnsafeFile(UserError):
    """A file that cannot be loaded safely (not a plain tensor file, truncated, or corrupt)."""


def load_tensors(path: Path | str, what: str = "file") -> Any:
    """``torch.load(path, weights_only=True)`` on CPU; a refusal names the file and why.

    ``weights_only`` only rebuilds tensors, dicts, lists, tuples, strings, numbers, booleans
    and None, so a crafted pickle cannot execute code. Truncated or non-torch files raise
    :class:`UnsafeFile` (a :class:`~fedcxr.errors.UserError`, exit 2) instead of a traceback.
    """
    path = Path(path)
    if not path.is_file():
        raise UnsafeFile(f"{path}: no such {what}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnsafeFile(f"{path}: refused to load this {what}: it holds more than tensors and plain values "
                         f"({first[:200]}); fedcxr never runs code from a file") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError, KeyError, AttributeError,
            struct.error) as exc:
        raise UnsafeFile(f"{path}: cannot read this {what} (truncated or not a torch file: "
                         f"{type(exc).__name__}: {str(exc)[:200]})") from None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def save_verified(obj: Any, path: Path) -> None:
    """Write ``obj`` atomically, then its checksum beside it (``<name>.sha256``)."""
    atomic_torch_save(obj, path)
    atomic_write_bytes(Path(str(path) + CHECKSUM_SUFFIX), (_sha256(path) + "\n").encode())


def verify(path: Path) -> Optional[str]:
    """Why ``path`` fails its recorded checksum, or None when it matches (or none was recorded)."""
    record = Path(str(path) + CHECKSUM_SUFFIX)
    if not record.is_file():
        return None
    expected = record.read_text().strip()
    actual = _sha256(path)
    return None if actual == expected else f"checksum mismatch (recorded {expected[:12]}…, file {actual[:12]}…)"


def checkpoint_paths(run_dir: Path) -> list[Path]:
    """The run's round checkpoints, oldest first."""
    return RunDir(run_dir).checkpoint_files()


def latest_checkpoint(run_dir: Path) -> Optional[Path]:
    found = checkpoint_paths(run_dir)
    return found[-1] if found else None


def save_checkpoint(run_dir: Path, r: int, payload: dict) -> None:
    """``checkpoints/round_NNNN.pt`` (+ checksum); only the newest :data:`KEEP_CHECKPOINTS` stay."""
    save_verified(payload, RunDir(run_dir).checkpoint(r))
    for old in checkpoint_paths(run_dir)[:-KEEP_CHECKPOINTS]:
        old.unlink(missing_ok=True)
        Path(str(old) + CHECKSUM_SUFFIX).unlink(missing_ok=True)


def load_checkpoint(path: Path) -> dict:
    """One checkpoint, checked against its checksum and for the keys a resume needs."""
    problem = verify(path)
    if problem:
        raise UnsafeFile(f"{path}: {problem}")
    ckpt = load_tensors(path, "checkpoint")
    if not isinstance(ckpt, dict) or not {"round", "fingerprint", "state"} <= set(ckpt):
        raise UnsafeFile(f"{path}: not a fedcxr checkpoint (expected round, fingerprint and state)")
    return ckpt


def load_latest_intact(run_dir: Path) -> Optional[tuple[Path, dict]]:
    """The newest checkpoint that verifies and loads; corrupt newer ones are skipped with a warning.

    Returns None when the run has no checkpoint; raises :class:`UnsafeFile` naming every file
    when checkpoints exist but none is intact.
    """
    paths = checkpoint_paths(run_dir)
    problems = []
    for path in reversed(paths):
        try:
            ckpt = load_checkpoint(path)
        except UnsafeFile as exc:
            problems.append(str(exc))
            log.warning("skipping a damaged checkpoint: %s", exc)
            continue
        if problems:
            log.warning("resuming from %s, the newest intact checkpoint", path.name)
        return path, ckpt
    if problems:
        raise UnsafeFile("no intact checkpoint to resume from:\n  " + "\n  ".join(problems))
    return None


def save_final(run_dir: Path, payload: dict) -> Path:
    """``final_model.pt`` (+ checksum): the global model and whatever evaluation needs."""
    path = RunDir(run_dir).final_model
    save_verified(payload, path)
    return path


def load_final_model(run_dir: Path) -> dict:
    """``final_model.pt``, verified and loaded safely (evaluation, prediction, FLARE's collector)."""
    path = RunDir(run_dir).final_model
    problem = verify(path) if path.is_file() else None
    if problem:
        raise UnsafeFile(f"{path}: {problem}")
    final = load_tensors(path, "model file")
    if not isinstance(final, dict) or "global" not in final:
        raise UnsafeFile(f"{path}: not a fedcxr model file (no 'global' weights)")
    return final
