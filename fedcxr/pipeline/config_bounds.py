"""Leaf: the config's bounds on every size and count, and the strict base of its sections.

Why a module of its own: the experiment config (:mod:`fedcxr.pipeline.config`), its privacy and
defence sections (:mod:`fedcxr.pipeline.config_defences`) and the methods' options blocks
(:mod:`fedcxr.pipeline.protocols.spec`; the config imports the method modules, never the other way
round) check against the same bounds; here they sit below all of them (pydantic only).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

#: Bounds on every size and count (SECURITY.md R7): past them a run would only die allocating memory
#: (``image_size: 100000``, ``model.hidden: 1e9``) or never end. Generous for real studies.
MAX_IMAGE_SIZE = 2048
MAX_HIDDEN = 16384
MAX_BATCH = 4096
MAX_ROUNDS = 100_000
MAX_EPOCHS = 10_000
MAX_STEPS = 10_000_000
MAX_ROWS = 10**9
#: The most training rows one site may report or be declared with (``fedcxr.pipeline.screening``):
#: the largest public chest X-ray collections hold well under a million rows.
MAX_SITE_ROWS = 10**8
MAX_SITES = 1000
MAX_WORKERS = 256
MAX_NAME = 100
MAX_PATH = 4096
MAX_FILTERS = 16


def refuse(message: str):
    """Raise the ValueError pydantic reports under the key being validated."""
    raise ValueError(message)


class Strict(BaseModel):
    """A config section: every key checked (a misspelt one is an error, never ignored), every float
    finite (``lr: .inf`` or ``alpha: .nan`` is refused naming the key)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


__all__ = ["MAX_BATCH", "MAX_EPOCHS", "MAX_FILTERS", "MAX_HIDDEN", "MAX_IMAGE_SIZE", "MAX_NAME", "MAX_PATH",
           "MAX_ROUNDS", "MAX_ROWS", "MAX_SITES", "MAX_SITE_ROWS", "MAX_STEPS", "MAX_WORKERS", "Strict", "refuse"]
