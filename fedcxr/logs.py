"""The console: fedcxr's own messages at INFO, other libraries at WARNING, bars left intact.

One call (:func:`configure`) from the command line sets it up:

* ``fedcxr`` loggers print INFO and above (``-v``: DEBUG, ``--quiet``: WARNING); every other
  library (pydicom's decoders, openjpeg, nvflare, MONAI, ...) only WARNING and above — a
  newcomer's console shows what fedcxr is doing, not its dependencies' chatter;
* fedcxr's own INFO records (a round's line, a run's header) print as plain lines, the same
  format as what the commands print (``fedcxr demo`` interleaves both); warnings and debug
  records keep their ``LEVEL name:`` prefix;
* records are written through ``tqdm.write`` so a log line never tears a progress bar;
* another library's record is **one line** (:class:`OneLineFormatter`): its first message line
  and, when it carries an exception, ``(ExceptionType: first line)`` — never a traceback.
  pydicom logs each failed decoder attempt at ERROR with its traceback; fedcxr already turns
  the failure into the row's set-aside reason, so the console needs one line, not thirty;
* ``--quiet`` silences the image decoders' records (pydicom, pylibjpeg, openjpeg, libjpeg,
  PIL) altogether: their failures reach the user as set-aside reasons. A handler a library
  attached itself (``pydicom.config.debug()`` adds a StreamHandler) is removed, so every
  record goes through this one console;
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


#: Image decoder libraries: their records are silent under ``--quiet`` (failures become reasons).
DECODERS = ("pydicom", "pylibjpeg", "openjpeg", "libjpeg", "PIL")


class OneLineFormatter(logging.Formatter):
    """fedcxr's own INFO lines as plain text, like the lines a command prints (``round 3/10 ...``);
    everything else ``LEVEL name: message``; records from outside fedcxr lose their traceback (one line)."""

    def __init__(self) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        if record.name == "fedcxr" or record.name.startswith("fedcxr."):
            if record.levelno == logging.INFO and not record.exc_info:
                return record.getMessage()
            return super().format(record)
        lines = record.getMessage().strip().splitlines() or [""]
        text = lines[0]
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            detail = (str(exc).strip().splitlines() or [""])[0]
            summary = type(exc).__name__ if not detail or detail in text else f"{type(exc).__name__}: {detail}"
            text = f"{text} ({summary})" if text else summary
        return f"{record.levelname} {record.name}: {text}"


class SilenceDecoders(logging.Filter):
    """Drops the image decoders' records (``--quiet``). A handler filter, not a logger level:
    pydicom resets its logger's level when it is imported, after :func:`configure` ran."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(record.name == n or record.name.startswith(n + ".") for n in DECODERS)


def configure(verbosity: str = "normal") -> None:
    """Route fedcxr's records (at ``verbosity``) and other libraries' warnings to the console."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, TqdmHandler):
            root.removeHandler(handler)
    level = LEVELS[verbosity]
    handler = TqdmHandler()
    handler.setFormatter(OneLineFormatter())
    if verbosity == "quiet":
        handler.addFilter(SilenceDecoders())
    handler.setLevel(level)  # loggers that always log INFO (fedcxr.rounds, for train.log) obey --quiet here
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("fedcxr").setLevel(level)
    # third-party libraries stay at WARNING even with -v, except when they are asked for by name
    for noisy in ("openjpeg", "pylibjpeg", "pydicom", "PIL", "matplotlib", "nvflare", "monai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    for name in DECODERS:
        logger = logging.getLogger(name)
        for own in [h for h in logger.handlers if not isinstance(h, logging.NullHandler)]:
            logger.removeHandler(own)  # pydicom.config.debug() attaches a bare StreamHandler
        logger.propagate = True


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
