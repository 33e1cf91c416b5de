"""``fedcxr verify-bundle BUNDLE --key PUB.pem``: a bundle's signature checked with the signer's
public key, then every file against the signed checksums (:mod:`fedcxr.bundle.signing`)."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "check a bundle's signature with the signer's public key, then every file"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", type=Path, metavar="BUNDLE", help="an exported bundle folder")
    p.add_argument("--key", required=True, type=Path, metavar="PUB.pem", help="the signer's Ed25519 public key (PEM)")


def run(args: argparse.Namespace) -> int:
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
