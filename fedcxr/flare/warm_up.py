"""MONAI imported while a FLARE process waits on FLARE, not while the others wait on it.

Every process of a FLARE job imports MONAI the first time it builds a network (some 3-5 s of CPU on
a busy 2-core machine: MONAI loads all its submodules): the server right after the sites answered
the metadata query, each site at its first training task. Those imports ran one after the other —
the sites idle while the server imported, then a round's target idle while its sources imported —
so every job's first round started seconds late. Measured on the suite's simulator job (one source,
the target, 2 cores): the first training task was sent 3 s after the last metadata reply and each
site's first training task took 3.5 s against 0.5 s for its second.

:func:`start` begins the import in a background thread at a moment the process only waits on FLARE
(the server while its first task is out, a site after each reply while it waits for its next task);
:func:`finish` joins it before the process does anything else. So the main thread never imports while
the background thread does (two threads importing modules that import each other can raise Python's
import deadlock error), and the import itself is the very one the process would have done later.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from typing import Optional

log = logging.getLogger(__name__)

#: what building a network imports (fedcxr.models.network: MONAI's ResNet and DenseNet), and a site's
#: evaluation (fedcxr.flare.site_evaluation: SciPy, scikit-learn), which its first task does not need
MODULES = ("monai.networks.nets", "fedcxr.evaluation.report", "fedcxr.evaluation.calibration")

_thread: Optional[threading.Thread] = None
_lock = threading.Lock()


def _import(modules: tuple[str, ...]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # the process's own import says what is wrong, where it needs the module
            log.debug("warm-up import of %s failed (%s: %s)", name, type(exc).__name__, exc)


def start(modules: tuple[str, ...] = MODULES) -> bool:
    """Import ``modules`` in a background thread (once per process; nothing when they are already
    imported). Call it only where the calling thread will do nothing but wait until :func:`finish`.
    True when a thread was started."""
    global _thread
    with _lock:
        if _thread is not None or all(name in sys.modules for name in modules):
            return False
        _thread = threading.Thread(target=_import, args=(tuple(modules),), name="fedcxr-warm-up", daemon=True)
        _thread.start()
        return True


def finish() -> None:
    """Wait for the background import started by :func:`start`, if any."""
    thread = _thread
    if thread is not None and thread.is_alive():
        thread.join()


__all__ = ["MODULES", "finish", "start"]
