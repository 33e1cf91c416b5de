"""The ``fedcxr`` command line (DESIGN §10): the parser assembled, the handlers called, errors as exit codes.

Each subcommand is one module of :mod:`fedcxr.commands` that declares its options beside its
handler — ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int`` — and this
module assembles them (:data:`COMMANDS`), adds ``-h`` and ``-v``/``-q`` to every one of them in
the same order, and turns what a handler raises into the exit code. The command modules import
their libraries inside ``run``, so ``fedcxr ingest`` never pays for importing torch. Exit codes:
0 success, 2 bad usage / invalid config or input (:class:`fedcxr.errors.UserError`), 1 a run
that stopped (:class:`~fedcxr.errors.RunFailed`), 130 interrupted, 141 output into a closed
pipe (:data:`EXIT_CLOSED_PIPE`).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from types import ModuleType
from typing import Optional, Sequence

import fedcxr
from fedcxr.commands import (
    demo,
    evaluate,
    export_bundle,
    flare,
    ingest,
    init,
    predict,
    report,
    shift,
    stats,
    sweep,
    synth,
    train,
    verify_bundle,
)
from fedcxr.errors import RunFailed, UserError, disk_full, disk_full_message
from fedcxr.logs import configure as configure_logging
from fedcxr.logs import verbosity

#: subcommand → its module (``HELP``, ``add_arguments(parser)``, ``run(args) -> int``), in ``--help`` order
COMMANDS: dict[str, ModuleType] = {
    "init": init,
    "ingest": ingest,
    "synth": synth,
    "train": train,
    "evaluate": evaluate,
    "predict": predict,
    "export-bundle": export_bundle,
    "verify-bundle": verify_bundle,
    "report": report,
    "demo": demo,
    "sweep": sweep,
    "shift": shift,
    "flare": flare,
    "stats": stats,
}


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default where it says something; keeps option lists readable.

    No ``(default: …)`` on a required option, a flag (``--resume``: default False; ``--no-cross-site``:
    its stored True read as "skipped by default"), an unset (None) or empty-list default, or an
    option whose help already says what happens when it is not given (``unset: …``)."""

    def __init__(self, prog: str):
        super().__init__(prog, max_help_position=32, width=100)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (action.required or default is None or default is argparse.SUPPRESS or isinstance(default, bool)
                or default == [] or "unset:" in text or "%(default)" in text):
            return text
        return super()._get_help_string(action)


def _add_verbosity(p: argparse.ArgumentParser) -> None:
    """``-v``/``--quiet`` on every command (they may come before or after the subcommand)."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                       help="also print debug messages")
    group.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                       help="print warnings and results only: no progress bars, no info messages")


def _add_command(sub, name: str, module: ModuleType) -> argparse.ArgumentParser:
    """One subcommand: ``-h`` (the module's own help action where it has one), ``-v | -q``, its options."""
    p = sub.add_parser(name, help=module.HELP, description=module.HELP, epilog=getattr(module, "EPILOG", None),
                       formatter_class=_HelpFormatter, add_help=False)
    action = getattr(module, "HELP_ACTION", None)
    if action is None:
        p.add_argument("-h", "--help", action="help", help="show this help message and exit")
    else:
        p.add_argument("-h", "--help", action=action, help=action.HELP)
    _add_verbosity(p)
    module.add_arguments(p)
    p.set_defaults(handler=module.run)
    return p


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: every command of :data:`COMMANDS` with the options its module declares."""
    parser = argparse.ArgumentParser(
        prog="fedcxr", formatter_class=_HelpFormatter,
        description="Federated chest X-ray classification: ingest hospital exports, train, evaluate.",
        epilog="Run `fedcxr COMMAND --help` for a command's options. Exit codes: 0 success, 2 bad input "
               "or usage (the message names the file/row/key), 1 a run that stopped (resume it with --resume).",
    )
    _add_verbosity(parser)
    parser.add_argument("--version", action="version", version=f"fedcxr {fedcxr.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, module in COMMANDS.items():
        _add_command(sub, name, module)
    return parser


#: what a command that stopped on a full disk leaves behind (train-like commands: RunFailed's own advice)
DISK_FULL_ADVICE = {
    "evaluate": "report files written before are kept whole (atomic writes); run `fedcxr evaluate` again",
    "ingest": "no half-written manifest is kept (atomic writes); run the ingest again",
    "predict": "no half-written CSV is kept (atomic writes); run `fedcxr predict` again",
    "export-bundle": "remove the half-made bundle folder and export again",
    "report": "files written before are kept whole (atomic writes); run `fedcxr report` again",
    "sweep": "checkpoints of the completed rounds are kept; free disk space and run the same `fedcxr sweep` "
             "again (it resumes the interrupted run)",
    "stats": "nothing was replaced: the previous stats.json, stats.md and figures are kept as they were "
             "(all or nothing); free disk space and run `fedcxr stats` again",
}


def disk_full_advice(args: argparse.Namespace) -> str:
    """What to do after a full disk, for this command: its own advice, ``--resume`` only where the
    command has it, else run it again."""
    if args.command in DISK_FULL_ADVICE:
        return DISK_FULL_ADVICE[args.command]
    if hasattr(args, "resume"):
        return RunFailed.ADVICE
    return f"files written before are kept whole (atomic writes); free disk space and run `fedcxr {args.command}` again"


def _run_command(args: argparse.Namespace) -> int:
    """The subcommand's handler; a full disk anywhere becomes :class:`RunFailed` (exit 1), not a traceback."""
    try:
        return int(args.handler(args) or 0)
    except (UserError, RunFailed, KeyboardInterrupt):
        raise
    except Exception as exc:
        full = disk_full(exc)
        if full is None:
            raise
        raise RunFailed(disk_full_message(full), advice=disk_full_advice(args)) from exc


#: exit status when the reader of fedcxr's output went away (``fedcxr ... | head -1``): 128 + SIGPIPE,
#: what a shell reports for a C tool (``cat``) killed by SIGPIPE, as 130 is 128 + SIGINT
EXIT_CLOSED_PIPE = 141


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one command; its exit status (0 done, 1 run stopped, 2 bad input, 130 Ctrl-C, 141 closed pipe)."""
    try:
        try:
            return _main(argv)
        finally:  # buffered output meets a closed pipe here (or at exit, where it would be a traceback)
            sys.stdout.flush()
    except BrokenPipeError:
        return _closed_pipe()


def _closed_pipe() -> int:
    """The reader closed the pipe (``| head``): stop quietly, as the Python docs advise ("Note on
    SIGPIPE"): output still buffered goes to /dev/null instead of raising again at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(devnull, stream.fileno())
        except (AttributeError, OSError, ValueError):  # not a real file (a test's capture)
            pass
    os.close(devnull)
    return EXIT_CLOSED_PIPE


_INVALID_CHOICE = re.compile(r"invalid choice: '(.*?)' \(choose from (.*)\)$")


def _tune_parsers(parser: argparse.ArgumentParser) -> None:
    """Two things argparse (Python < 3.14) does not do, on this parser and its subcommands':

    * it swallows an error writing its help or usage (``_print_message``), so ``fedcxr --help |
      head -1`` would end unlike every other output into a closed pipe: let it raise, for
      :func:`main` to end as :func:`_closed_pipe` says;
    * "invalid choice: 'trian'" gets the nearest choice (:mod:`fedcxr.suggest`).
    """
    from fedcxr.suggest import did_you_mean

    def print_message(message: str, file=None) -> None:
        if message:
            (file or sys.stderr).write(message)

    def error(message: str, _error=parser.error) -> None:
        found = _INVALID_CHOICE.search(message)
        if found:
            message += did_you_mean(found.group(1), re.findall(r"'([^']*)'", found.group(2)))
        _error(message)

    parser._print_message = print_message  # type: ignore[method-assign]
    parser.error = error  # type: ignore[method-assign]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in {id(p): p for p in action.choices.values()}.values():
                _tune_parsers(sub)


def _main(argv: Optional[Sequence[str]]) -> int:
    parser = build_parser()
    _tune_parsers(parser)
    args = parser.parse_args(argv)
    configure_logging(verbosity(args))
    try:
        return _run_command(args)
    except UserError as exc:
        print(f"fedcxr {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except RunFailed as exc:
        advice = getattr(exc, "advice", None) or RunFailed.ADVICE
        print(f"fedcxr {args.command}: run stopped: {exc}\n  {advice}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
