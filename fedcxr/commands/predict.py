"""``fedcxr predict RUN_DIR --input DIR --out FILE.csv``: a trained model on new images.

The work — and what the two files hold — is :mod:`fedcxr.workflows.predict`; this prints how
many images were scored by which model, whose thresholds decided (or why there are no
decisions), and where the private key map is.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedcxr.commands.options import add_device
from fedcxr.wording import count

HELP = "score new images with a trained model (CSV of keys, probabilities, decisions)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR",
                   help="a finished run directory (operating points: run `fedcxr evaluate` first)")
    p.add_argument("--input", required=True, type=Path, metavar="DIR",
                   help="a site's manifest folder, or a folder of DICOM/PNG/JPEG files (never written to)")
    p.add_argument("--out", required=True, type=Path, metavar="FILE.csv",
                   help="FILE.csv (no ids, no paths); FILE.private-key-map.csv beside it maps keys to images")
    p.add_argument("--site", default=None, metavar="NAME",
                   help="use this site's own model and thresholds (PFL, FedBN, Individual); unset: the global "
                        "model, and the target's thresholds (or the only evaluated site's)")
    add_device(p, default="auto")
    p.add_argument("--cam", type=int, default=0, metavar="N",
                   help="Grad-CAM overlays of the N top-scoring images per class into FILE.cam/ (patient pixels); "
                        "unset: none")
    p.add_argument("--batch-size", type=int, default=32, metavar="N", help="images per forward pass")
    p.add_argument("--site-key", type=Path, default=None, metavar="FILE",
                   help="site key file for a plain folder's pseudonyms (stable keys across runs); "
                        "unset: $FEDCXR_SITE_KEY, else a fresh key per run")


def run(args: argparse.Namespace) -> int:
    from fedcxr.logs import progress_wanted
    from fedcxr.workflows.predict import NOT_CHEST_COLUMN, cam_dir, predict

    result = predict(args.run_dir, args.input, args.out, site=args.site, device=args.device,
                     cam=int(args.cam or 0), batch_size=int(args.batch_size),
                     progress=progress_wanted(args), site_key=getattr(args, "site_key", None))
    print(f"scored {result.scored} image(s) with the {result.model} model "
          f"({count(len(result.classes), 'class')}): {result.csv}")
    if result.thresholds_from:
        print(f"  decisions at the operating points chosen on {result.thresholds_from}'s validation split")
    else:
        print(f"  no decisions, probabilities only: {result.no_decisions}")
    if result.not_chest:
        print(f"  {result.not_chest} image(s) are not chest radiographs by their DICOM tags (Modality / "
              f"BodyPartExamined): their scores mean nothing; flagged 1 in column {NOT_CHEST_COLUMN}, the reason "
              "in the key map's not_chest column")
    if result.not_scored:
        print(f"  {result.not_scored} file(s) not scored (unreadable, or a duplicate of a scored image): "
              "see the status column of the key map")
    print(f"  key → image path (identifies images: keep it local): {result.private_key_map}")
    if result.cam:
        print(f"  {len(result.cam)} Grad-CAM overlay(s) in {cam_dir(result.csv)}")
    return 0
