"""``fedcxr export-bundle RUN_DIR --out BUNDLE [--sign-key KEY.pem [--new-key]]``: a finished run's
model as a MONAI bundle, optionally signed (``fedcxr verify-bundle`` checks it).

The work is :func:`fedcxr.bundle.export.export_bundle` and :mod:`fedcxr.bundle.signing`; this
prints how MONAI's runner runs the bundle.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "a trained model as a MONAI bundle (TorchScript + configs for MONAI's runner)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a finished run directory")
    p.add_argument("--out", required=True, type=Path, help="bundle folder to create (new or empty)")
    p.add_argument("--site", default=None, help="export this site's own model (PFL, FedBN, Individual); unset: global")
    p.add_argument("--sign-key", type=Path, default=None, metavar="KEY.pem",
                   help="sign the bundle's checksums with this Ed25519 private key (PEM, readable by you only)")
    p.add_argument("--new-key", action="store_true",
                   help="create the --sign-key file first (never over an existing one), its public key as KEY.pub.pem")


def run(args: argparse.Namespace) -> int:
    from fedcxr.bundle.export import export_bundle

    sign_key = args.sign_key
    out = export_bundle(args.run_dir, args.out, site=args.site, sign_key=sign_key, new_key=bool(args.new_key))
    print(f"MONAI bundle in {out}; run it with:\n  python -m monai.bundle run --bundle_root {out} "
          f"--config_file {out / 'configs' / 'inference.json'} --dataset_dir DIR --output_dir OUT")
    if sign_key is not None:
        from fedcxr.bundle.signing import public_key_path

        public = public_key_path(sign_key)
        print(f"signed with {sign_key}; whoever runs it checks it with the public key ({public} if "
              f"--new-key made it):\n  fedcxr verify-bundle {out} --key PUB.pem   "
              "(and add --verify_key PUB.pem to the runner's command)")
    else:
        print("not signed: its checksums catch damage, not a deliberate change (--sign-key KEY.pem signs it)")
    return 0
