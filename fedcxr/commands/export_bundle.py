"""``fedcxr export-bundle RUN_DIR --out BUNDLE [--sign-key KEY.pem [--new-key]]`` and
``fedcxr verify-bundle BUNDLE --key PUB.pem``: a finished run's model as a MONAI bundle, signed
and checked.

The work is :func:`fedcxr.bundle.export.export_bundle` and :mod:`fedcxr.bundle.signing`; this
prints how MONAI's runner runs the bundle.
"""

from __future__ import annotations

import argparse

from fedcxr.bundle.export import export_bundle


def cli_export_bundle(args: argparse.Namespace) -> int:
    sign_key = getattr(args, "sign_key", None)
    out = export_bundle(args.run_dir, args.out, site=args.site, sign_key=sign_key,
                        new_key=bool(getattr(args, "new_key", False)))
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


def cli_verify_bundle(args: argparse.Namespace) -> int:
    """Signature (with the user's public key), then every file against the signed checksums."""
    from fedcxr.bundle.runtime import verify_bundle
    from fedcxr.bundle.signing import SignatureError, verify_signature
    from fedcxr.errors import UserError

    signer = verify_signature(args.bundle, args.key)
    try:
        verify_bundle(args.bundle)
    except RuntimeError as exc:
        raise SignatureError(f"{exc}; refused") from None
    except OSError as exc:
        raise UserError(f"bundle {args.bundle}: cannot read ({exc})") from None
    print(f"bundle {args.bundle}: signature verified (Ed25519, key id {signer}) and every file matches its "
          "signed checksum")
    return 0
