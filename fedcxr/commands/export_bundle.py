"""``fedcxr export-bundle RUN_DIR --out BUNDLE``: a finished run's model as a MONAI bundle.

The work is :func:`fedcxr.bundle.export.export_bundle`; this prints how MONAI's runner runs it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "a trained model as a MONAI bundle (TorchScript + configs for MONAI's runner)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a finished run directory")
    p.add_argument("--out", required=True, type=Path, help="bundle folder to create (new or empty)")
    p.add_argument("--site", default=None, help="export this site's own model (PFL, FedBN, Individual); unset: global")


def run(args: argparse.Namespace) -> int:
    from fedcxr.bundle.export import export_bundle

    out = export_bundle(args.run_dir, args.out, site=args.site)
    print(f"MONAI bundle in {out}; run it with:\n  python -m monai.bundle run --bundle_root {out} "
          f"--config_file {out / 'configs' / 'inference.json'} --dataset_dir DIR --output_dir OUT")
    return 0
