"""Errors that are the user's to fix: bad input, bad config, bad usage (CLI exit code 2).

The message must say which file, row, column, key or option is wrong and why. Anything
else that escapes is a bug (exit code 1).
"""

from __future__ import annotations

import errno
import os
from typing import Optional


class UserError(Exception):
    """Bad usage, an invalid config or invalid input; the CLI prints it and exits with 2."""


class RunFailed(RuntimeError):
    """A run could not go on (e.g. too few sites answered a round); the CLI exits with 1.

    Checkpoints up to the last complete round are kept: fix the cause, then ``--resume``.
    ``advice`` replaces that hint where another one is true (``fedcxr evaluate`` has no rounds).
    """

    ADVICE = "checkpoints of the completed rounds are kept; fix the cause and continue with --resume"

    def __init__(self, message: str, advice: Optional[str] = None) -> None:
        super().__init__(message)
        self.advice = advice or self.ADVICE


#: errno values that mean "the disk (or a quota, or a file-size limit) is full"
DISK_FULL = frozenset(e for e in (errno.ENOSPC, getattr(errno, "EDQUOT", None), errno.EFBIG) if e is not None)


def disk_full(exc: BaseException) -> Optional[OSError]:
    """The disk-full :class:`OSError` behind ``exc`` (itself, or its cause/context chain), else None.

    ``torch.save`` reports a failed write as a ``RuntimeError`` whose context is the OSError."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_FULL:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def disk_full_message(exc: OSError) -> str:
    """``no space left writing FILE (File too large)`` for the console."""
    where = f" writing {exc.filename}" if exc.filename else ""
    return f"no space left{where} ({os.strerror(exc.errno)}); free disk space (or raise the quota or file-size limit)"
