"""``fedcxr init DIR`` as a library function: start a study — a commented config, a csv mapping
template, an example export.

Writes into ``DIR`` (new, or empty):

``mapping.yaml``     a csv mapping (:mod:`fedcxr.site_adapters.csv_mapping`) with every key
                     explained in comments (``delimiter``, ``values``, ``unmentioned``, ...)
``experiment.yaml``  a starter experiment config (:mod:`fedcxr.pipeline.config`), commented
``export/``          an example export those two describe (:mod:`fedcxr.synth.csv_example`)

The two files are ``templates/`` beside this module. Both validate as they are, and the
README's "Your own data in three steps" runs on them unchanged (init → ingest → train and
evaluate); a user then swaps in their own export and edits the column names. Nothing is
overwritten: a ``DIR`` that holds files is refused, naming them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from fedcxr.errors import UserError

TEMPLATES = Path(__file__).with_name("templates")
FILES = ("mapping.yaml", "experiment.yaml")
EXPORT = "export"


def init_study(folder: "str | os.PathLike") -> dict:
    """Write the templates and the example export into ``folder``; returns what was written
    (``folder``, ``files``, ``export`` and ``images``: images per example hospital)."""
    from fedcxr.synth.csv_example import write_csv_example

    folder = Path(folder)
    if folder.is_symlink() and not folder.exists():
        raise UserError(f"{folder}: a symbolic link to {os.readlink(folder)}, which does not exist; "
                        "remove the link or choose a new folder")
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{folder}: exists and is not a folder")
    present = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    if present:
        shown = ", ".join(present[:5]) + (" ..." if len(present) > 5 else "")
        raise UserError(f"{folder}: not empty ({shown}); fedcxr init never overwrites: choose a new folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError, PermissionError) as exc:  # a file or a dangling link on the way
        raise UserError(f"{folder}: cannot create it ({exc.strerror or type(exc).__name__}"
                        f"{': ' + str(exc.filename) if exc.filename else ''}); choose another folder") from None
    for name in FILES:
        shutil.copyfile(TEMPLATES / name, folder / name)
    counts = write_csv_example(folder / EXPORT)
    return {"folder": folder, "files": [folder / n for n in FILES], "export": folder / EXPORT, "images": counts}


__all__ = ["EXPORT", "FILES", "TEMPLATES", "init_study"]
