"""Errors that are the user's to fix: bad input, bad config, bad usage (CLI exit code 2).

The message must say which file, row, column, key or option is wrong and why. Anything
else that escapes is a bug (exit code 1).
"""


class UserError(Exception):
    """Bad usage, an invalid config or invalid input; the CLI prints it and exits with 2."""


class RunFailed(RuntimeError):
    """A run could not go on (e.g. too few sites answered a round); the CLI exits with 1.

    Checkpoints up to the last complete round are kept: fix the cause, then ``--resume``.
    """
