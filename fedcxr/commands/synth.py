"""``fedcxr synth``: write the synthetic hospitals' exports and print how to ingest each.

The work is :func:`fedcxr.synth.write_synthetic_export`; this prints each hospital's images,
patients, positives and the ``fedcxr ingest`` command that reads it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedcxr.wording import count

HELP = "write a synthetic multi-hospital export in native formats"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, type=Path, help="folder to write the exports into")
    p.add_argument("--sites", nargs="*", default=None,
                   help="which synthetic hospitals: nih_style chexpert_style midrc_style dicom_style; unset: all")
    p.add_argument("--images-per-site", type=int, default=120, help="images per hospital")
    p.add_argument("--image-size", type=int, default=64, help="base image size in pixels")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same export)")


def run(args: argparse.Namespace) -> int:
    """``fedcxr synth --out DIR [--sites ...] [--images-per-site N] [--image-size PX] [--seed S]``."""
    from fedcxr.synth import SYNTH_JSON, write_synthetic_export

    payload = write_synthetic_export(
        args.out, sites=args.sites, images_per_site=args.images_per_site,
        image_size=args.image_size, seed=args.seed,
    )
    for name, info in payload["hospitals"].items():
        positives = ", ".join(f"{c} {n}" for c, n in info["positives"].items())
        print(f"{name}: {count(info['images'], 'image')}, {count(info['patients'], 'patient')} "
              f"({info['source']} format); positives: {positives}")
        print(f"  ingest: {info['command'].replace('<OUT>', str(args.out))}")
    print(f"wrote {Path(args.out) / SYNTH_JSON}")
    return 0
