"""``fedcxr init DIR``: start a study — a commented config, a csv mapping template, an example export.

The work is :func:`fedcxr.workflows.init.init_study`; this prints what was written and the next
steps (README: Your own data in three steps).
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "start a study: a commented experiment config, a csv mapping template and an example export"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path, metavar="DIR",
                   help="folder to write into (new or empty): experiment.yaml, mapping.yaml, export/ "
                        "(README: Your own data in three steps)")


def run(args: argparse.Namespace) -> int:
    from fedcxr.workflows.init import EXPORT, init_study

    done = init_study(args.dir)
    folder = done["folder"]
    print(f"wrote {folder}/:")
    print("  mapping.yaml     how `fedcxr ingest csv` reads a spreadsheet export (commented; edit the column names)")
    print("  experiment.yaml  a starter experiment config (commented)")
    print(f"  export/          an example export to try them on: {sum(done['images'].values())} images of "
          f"{len(done['images'])} hospitals, findings.csv + images/")
    print("next (README: Your own data in three steps):")
    print(f"  fedcxr ingest csv --input {folder / EXPORT} --mapping {folder / 'mapping.yaml'} --site-by hospital "
          f"--out {folder / 'manifests'}")
    print(f"  fedcxr train {folder / 'experiment.yaml'} --out {folder / 'run'} && fedcxr evaluate {folder / 'run'}")
    return 0
