"""Options several commands share, declared once: ``--device`` and ``--set``.

Each ``commands/<verb>.py`` declares its own options in ``add_arguments(parser)``; what more than
one of them takes lives here so its help reads the same everywhere. Nothing here imports torch
(``--device`` is checked by its pattern at parse time; a GPU number that does not exist is
refused when the run starts, :func:`fedcxr.pipeline.devices.resolve_device`).
"""

from __future__ import annotations

import argparse
import re
from typing import Optional

#: ``--device`` values: auto, cpu, cuda (the current GPU) or cuda:N (GPU number N)
DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def device_name(text: str) -> str:
    """``--device`` checked at parse time (parsing never imports torch)."""
    value = text.strip().lower()
    if not DEVICE_PATTERN.match(value):
        raise argparse.ArgumentTypeError(f"{text!r}: use auto, cpu, cuda or cuda:N (N: the GPU's number, "
                                         "e.g. cuda:1)")
    return value


def add_device(p: argparse.ArgumentParser, default: Optional[str] = None, what: str = "the config's `device`") -> None:
    """``--device``; ``default`` None means "unset: ``what``" (the config decides)."""
    choices = "auto (CUDA when present), cpu, cuda or cuda:N (GPU number N)"
    p.add_argument("--device", default=default, type=device_name, metavar="auto|cpu|cuda|cuda:N",
                   help=f"where the network runs: {choices}" + (f"; unset: {what}" if default is None else ""))


def add_set(p: argparse.ArgumentParser, help_text: str = "override a config key; repeatable") -> None:
    """``--set KEY=VALUE`` (repeatable), collected in ``args.overrides``."""
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help_text)


def add_bootstrap(p: argparse.ArgumentParser, help_text: str) -> None:
    """``--bootstrap N`` (patient-bootstrap resamples; 0: DeLong CIs)."""
    p.add_argument("--bootstrap", type=int, default=1000, metavar="N", help=help_text)
