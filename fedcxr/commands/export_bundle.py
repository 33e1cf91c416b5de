"""``fedcxr export-bundle RUN_DIR --out BUNDLE``: a finished run's model as a MONAI bundle.

The work is :func:`fedcxr.bundle.export.export_bundle`; this prints how MONAI's runner runs it.
"""

from __future__ import annotations

import argparse

from fedcxr.bundle.export import export_bundle


def cli_export_bundle(args: argparse.Namespace) -> int:
    out = export_bundle(args.run_dir, args.out, site=args.site)
    print(f"MONAI bundle in {out}; run it with:\n  python -m monai.bundle run --bundle_root {out} "
          f"--config_file {out / 'configs' / 'inference.json'} --dataset_dir DIR --output_dir OUT")
    return 0
