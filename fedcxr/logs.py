"""The console: fedcxr's own messages at INFO, other libraries at WARNING, bars left intact.

One call (:func:`configure`) from the command line sets it up:

* ``fedcxr`` loggers print INFO and above (``-v``: DEBUG, ``--quiet``: WARNING); every other
  library (pydicom's decoders, openjpeg, nvflare, MONAI, ...) only WARNING and above — a
  newcomer's console shows what fedcxr is doing, not its dependencies' chatter;
* records are written through ``tqdm.write`` so a log line never tears a progress bar;
* progress bars show only on a terminal (:func:`bar_disabled`), never in a log file or CI; a
  record logged with ``extra={"console": False}`` (a training round's line while its bar is on
  screen) is left to the run's own log file.
"""

from __future__ import annotations

import argparse
import logging
import sys

from tqdm import tqdm

LEVELS = {"quiet": logging.WARNING, "normal": logging.INFO, "verbose": logging.DEBUG}


class TqdmHandler(logging.Handler):
    """A stderr handler that writes around any active tqdm bar instead of through it."""

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "console", True) is False:  # the bar on screen already says it
            return
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # pragma: no cover - logging must never raise
            self.handleError(record)


def configure(verbosity: str = "normal") -> None:
    """Route fedcxr's records (at ``verbosity``) and other libraries' warnings to the console."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, TqdmHandler):
            root.removeHandler(handler)
    level = LEVELS[verbosity]
    handler = TqdmHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.setLevel(level)  # loggers that always log INFO (fedcxr.rounds, for train.log) obey --quiet here
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("fedcxr").setLevel(level)
    # third-party libraries stay at WARNING even with -v, except when they are asked for by name
    for noisy in ("openjpeg", "pylibjpeg", "pydicom", "PIL", "matplotlib", "nvflare", "monai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def bar_disabled(progress: bool = True) -> bool | None:
    """``disable=`` for tqdm: off when asked, else tqdm's own rule (None: off when not a terminal)."""
    return None if progress else True


def verbosity(args: argparse.Namespace) -> str:
    """``quiet`` | ``normal`` | ``verbose`` from the command line's -q/-v flags."""
    if getattr(args, "quiet", False):
        return "quiet"
    return "verbose" if getattr(args, "verbose", False) else "normal"


def progress_wanted(args: argparse.Namespace) -> bool:
    """Progress bars unless --quiet (and only on a terminal: see :func:`bar_disabled`)."""
    return not getattr(args, "quiet", False)
