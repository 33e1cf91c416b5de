"""Ed25519 signatures over a bundle's checksum manifest: who made the bundle, not only that it is whole.

``checksums.sha256`` catches damage: a changed, missing or added file. It cannot catch a
deliberate change, because whoever changes ``models/model.ts`` can rewrite its line too. A
signature can: :func:`sign_bundle` signs the exact bytes of ``checksums.sha256`` with the
exporter's Ed25519 private key (``fedcxr export-bundle RUN --out B --sign-key KEY.pem``) and
writes :data:`SIGNATURE` beside it; :func:`verify_signature` checks it with a public key the
*user* names (never one the bundle carries), then the checksums check every file against the
signed manifest. A bundle changed after signing, signed by another key, or not signed at all is
refused when a key is given.

Keys are PEM files (PKCS#8 private, SubjectPublicKeyInfo public), as the ``cryptography``
package and ``openssl genpkey -algorithm ed25519`` write them; :func:`new_key_pair` makes a pair
(the private key readable by its owner only). A private key readable by group or others is
refused, as the site key is.

What a signature cannot do: it proves the bundle is the one the key holder signed, not that the
model is good; whoever holds the private key can sign anything; and the check only means
something when it runs in code the bundle cannot change — the installed fedcxr
(``fedcxr verify-bundle``), not the runtime script shipped inside the bundle (SECURITY.md B4).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from pathlib import Path

from fedcxr.errors import UserError

#: the signature file, beside ``checksums.sha256`` at the bundle's root
SIGNATURE = "checksums.sha256.sig"
CHECKSUMS = "checksums.sha256"
ALGORITHM = "Ed25519"
#: a PEM key file is a few hundred bytes; anything far larger is not one
MAX_KEY_BYTES = 64 * 1024
#: the longest checksum manifest read (the runtime refuses a longer one too)
MAX_MANIFEST_BYTES = 4 << 20


class SignatureError(UserError):
    """The bundle's signature is missing, malformed, from another key, or does not verify (exit 2)."""


def public_key_path(private_key: Path | str) -> Path:
    """``KEY.pem`` → ``KEY.pub.pem`` (where :func:`new_key_pair` puts the public half)."""
    path = Path(private_key)
    return path.with_name(path.name[:-4] + ".pub.pem" if path.name.endswith(".pem") else path.name + ".pub.pem")


def new_key_pair(private_key: Path | str) -> tuple[Path, Path]:
    """Write a new Ed25519 private key (mode 0600, never over an existing file) and its public key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private_path, public_path = Path(private_key), public_key_path(private_key)
    for path in (private_path, public_path):
        if os.path.lexists(path):
            raise UserError(f"{path}: exists; --new-key never overwrites a key (drop --new-key to sign with it)")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    try:
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise UserError(f"{private_path}: cannot create the key file ({exc.strerror})") from None
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    public_path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                          serialization.PublicFormat.SubjectPublicKeyInfo))
    return private_path, public_path


def _read_key_file(path: Path, what: str) -> bytes:
    from fedcxr.site_adapters.paths import regular_file_problem

    problem = regular_file_problem(path)
    if problem is not None:
        raise UserError(f"{path}: {what}: {problem}")
    if os.stat(path).st_size > MAX_KEY_BYTES:
        raise UserError(f"{path}: {what}: {os.stat(path).st_size} bytes, not a PEM key file")
    return path.read_bytes()


def load_private_key(path: Path | str):
    """The Ed25519 private key in ``path``; :class:`UserError` naming the file for anything else."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = Path(path)
    data = _read_key_file(path, "signing key")
    mode = os.stat(path).st_mode
    if os.name == "posix" and mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UserError(f"{path}: signing key readable by others (mode {stat.S_IMODE(mode):o}); "
                        f"`chmod 600 {path}` first")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise UserError(f"{path}: the signing key is encrypted; fedcxr reads an unencrypted key kept readable "
                        "by its owner only") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not a PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise UserError(f"{path}: a {type(key).__name__.removeprefix('_')} key; bundles are signed with Ed25519 "
                        "(`openssl genpkey -algorithm ed25519 -out KEY.pem`, or `--new-key`)")
    return key


def load_public_key(path: Path | str):
    """The Ed25519 public key in ``path`` (a PEM public key; a private key is refused: name its .pub)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    path = Path(path)
    data = _read_key_file(path, "verification key")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not a PEM public key ({exc}); give the public half "
                        "(`openssl pkey -in KEY.pem -pubout -out KEY.pub.pem`)") from None
    if not isinstance(key, Ed25519PublicKey):
        raise UserError(f"{path}: a {type(key).__name__.removeprefix('_')} key, not an Ed25519 public key")
    return key


def key_id(public_key) -> str:
    """The first 16 hex digits of SHA-256 over the raw public key: names a key in messages."""
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def sign_bundle(bundle: Path | str, private_key: Path | str) -> Path:
    """Sign ``checksums.sha256``'s bytes; write :data:`SIGNATURE` (JSON: algorithm, key id, signature)."""
    from fedcxr.atomic import atomic_write_bytes, json_bytes

    bundle = Path(bundle)
    key = load_private_key(private_key)
    manifest = (bundle / CHECKSUMS).read_bytes()
    record = {"algorithm": ALGORITHM, "signed_file": CHECKSUMS, "key_id": key_id(key.public_key()),
              "signature": base64.b64encode(key.sign(manifest)).decode("ascii")}
    atomic_write_bytes(bundle / SIGNATURE, json_bytes(record, sort_keys=False))
    return bundle / SIGNATURE


def verify_signature(bundle: Path | str, public_key: Path | str) -> str:
    """Check :data:`SIGNATURE` over ``checksums.sha256`` with the user's public key; returns the key id.

    Raises :class:`SignatureError` saying what is wrong (unsigned, malformed, another key, changed
    after signing). The caller then checks every file against the (now trusted) checksums."""
    from cryptography.exceptions import InvalidSignature

    bundle = Path(bundle)
    key = load_public_key(public_key)
    expected = key_id(key)
    sig_path, manifest_path = bundle / SIGNATURE, bundle / CHECKSUMS
    if not sig_path.is_file():
        raise SignatureError(f"bundle {bundle} is not signed (no {SIGNATURE}); a key was given ({public_key}), so "
                             "it is refused: its checksums only catch damage, not a deliberate change")
    if not manifest_path.is_file():
        raise SignatureError(f"bundle {bundle}: {CHECKSUMS} missing; nothing to verify the signature over")
    try:
        with open(sig_path, "rb") as handle:  # a regular file (is_file above), read within a bound
            record = json.loads(handle.read(MAX_KEY_BYTES))
        signature = base64.b64decode(record["signature"], validate=True)
        algorithm, signer = record["algorithm"], str(record.get("key_id", ""))[:64]
    except (ValueError, KeyError, TypeError) as exc:
        raise SignatureError(f"{sig_path}: not a fedcxr signature ({type(exc).__name__}); refused") from None
    if algorithm != ALGORITHM:
        raise SignatureError(f"{sig_path}: algorithm {str(algorithm)[:40]!r}, expected {ALGORITHM}; refused")
    with open(manifest_path, "rb") as handle:
        manifest = handle.read(MAX_MANIFEST_BYTES + 1)
    try:
        key.verify(signature, manifest)
    except InvalidSignature:
        if signer != expected:
            raise SignatureError(f"bundle {bundle} is signed by another key (key id {signer!r}), not by "
                                 f"{public_key} (key id {expected}); refused") from None
        raise SignatureError(f"bundle {bundle}: the signature does not match {CHECKSUMS}: the bundle was changed "
                             f"after it was signed; refused") from None
    return expected


__all__ = ["ALGORITHM", "SIGNATURE", "SignatureError", "key_id", "load_private_key", "load_public_key",
           "new_key_pair", "public_key_path", "sign_bundle", "verify_signature"]
