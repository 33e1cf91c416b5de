"""``fedcxr synth``: write the synthetic hospitals' exports and print how to ingest each.

The work is :func:`fedcxr.synth.write_synthetic_export`; this prints each hospital's images,
patients, positives and the ``fedcxr ingest`` command that reads it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedcxr.synth import SYNTH_JSON, write_synthetic_export


def cli_synth(args: argparse.Namespace) -> int:
    """``fedcxr synth --out DIR [--sites ...] [--images-per-site N] [--image-size PX] [--seed S]``."""
    payload = write_synthetic_export(
        args.out, sites=args.sites, images_per_site=args.images_per_site,
        image_size=args.image_size, seed=args.seed,
    )
    for name, info in payload["hospitals"].items():
        positives = ", ".join(f"{c} {n}" for c, n in info["positives"].items())
        print(f"{name}: {info['images']} images, {info['patients']} patients ({info['source']} format); "
              f"positives: {positives}")
        print(f"  ingest: {info['command'].replace('<OUT>', str(args.out))}")
    print(f"wrote {Path(args.out) / SYNTH_JSON}")
    return 0
