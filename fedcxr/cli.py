"""The ``fedcxr`` command line (DESIGN §10): the parser assembled, the handlers called, errors as exit codes.

Each subcommand is one module of :mod:`fedcxr.commands` that declares its options beside its
handler — ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int`` — and this
module assembles them (:data:`COMMANDS`), adds ``-h`` and ``-v``/``-q`` to every one of them in
the same order, and turns what a handler raises into the exit code. The command modules import
their libraries inside ``run``, so ``fedcxr ingest`` never pays for importing torch. Exit codes:
0 success, 2 bad usage / invalid config or input (:class:`fedcxr.errors.UserError`), 1 a run
that stopped (:class:`~fedcxr.errors.RunFailed`), 130 interrupted.
"""

from __future__ import annotations

import argparse
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
}


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
        raise RunFailed(disk_full_message(full), advice=DISK_FULL_ADVICE.get(args.command)) from exc


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
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
