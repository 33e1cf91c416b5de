"""Crash-safe file writes: every output goes to a temporary name in the same folder, then a rename.

A crash or a kill mid-write therefore never leaves a half manifest, cache, checkpoint or
report behind; the previous complete file (if any) stays in place. One mechanism serves
manifests, site.json, image caches, checkpoints, predictions and reports.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd

from fedcxr.errors import disk_full


@contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path``, on error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        full = disk_full(exc)
        if full is not None and not full.filename:  # name the file a full disk stopped (torch.save does not)
            raise OSError(full.errno, os.strerror(full.errno), str(path)) from exc
        raise


def atomic_write_bytes(path: Path | str, data: bytes, *, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (flushed to disk before the rename).

    ``fsync=False`` skips the flush to disk: still never half a file after a crash of the
    process, but after a power loss the file may be empty or damaged. Only for files that are
    cheap to check and write again (thousands of small PNGs, where an fsync each made a run ~10x
    slower: :mod:`fedcxr.site_adapters.medmnist`).
    """
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as handle:
            handle.write(data)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())


def atomic_write_json(path: Path | str, payload: Any) -> None:
    """JSON with sorted keys and NaN written as null (strict JSON readers accept it)."""
    atomic_write_bytes(path, json_bytes(payload))


def json_bytes(payload: Any, *, sort_keys: bool = True) -> bytes:
    """The bytes :func:`atomic_write_json` writes (serialise once, write to several places).

    ``sort_keys=False`` keeps the payload's own key order (a report reads top to bottom)."""
    text = json.dumps(json_safe(payload), indent=2, sort_keys=sort_keys, allow_nan=False)
    return (text + "\n").encode()


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON values: the one conversion every JSON fedcxr writes goes through.

    Dicts (keys as ``str``, order kept), lists and tuples are walked; numpy and Python bools,
    integers and floats become ``bool``/``int``/``float``; a float that is NaN or infinite, ``None``
    and ``pd.NA`` become ``None`` (``null``: strict JSON readers accept it, and an undefined number
    is never written as a number); paths and strings become ``str``. Anything else is returned as
    it is, so ``json.dumps`` names it (or the caller's ``default=`` converts it).
    """
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if np.isfinite(value) else None
    if value is None or value is pd.NA:
        return None
    if isinstance(value, (str, Path)):
        return str(value)
    return value


def atomic_torch_save(obj: Any, path: Path | str) -> None:
    """``torch.save`` to ``path`` atomically (checkpoints, final models, site state).

    torch is imported here, not at module level: ingest uses this module and never needs torch.
    """
    import torch

    with atomic_path(path) as tmp:
        with open(tmp, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
