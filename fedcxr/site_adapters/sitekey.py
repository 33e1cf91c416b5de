"""The site's secret pseudonym key: keyed (HMAC-SHA256) ids that only the site can recompute.

Why a secret: a patient id such as a medical record number has few possible values, so a
hash with a public salt is reversed by hashing every candidate. With HMAC under a key that
never leaves the site, nobody without the key can test a guess, and two sites (or two keys)
give unrelated pseudonyms for the same patient.

Where the key comes from, first match wins:

1. ``--site-key FILE`` (``run_ingest(site_key=...)``);
2. ``$FEDCXR_SITE_KEY``, the path of a key file;
3. ``OUT/.fedcxr_site_key``, created on the first ingest into ``OUT`` (32 random bytes as 64
   hex digits, mode 0600) and reused by every later ingest into the same ``OUT``, so a
   re-ingest gives the same pseudonyms and therefore the same patient-level splits.

A key file holds 64 hex digits (what fedcxr writes, or ``openssl rand -hex 32``) or at least 16
raw bytes. A key file that the group or others may read is refused (``chmod 600 FILE``), like
ssh refuses such private keys. The key is never written into a manifest, ``site.json``, an
ingest report or a run directory; ``site.json`` records only :attr:`SiteKey.key_id`, a keyed
fingerprint that tells whether two ingests used the same key without revealing it.

Keep the key with the site's backups: losing it means a re-ingest gives new pseudonyms (new
splits), and a key copied to another site lets that site link pseudonyms back to ids it knows.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

import numpy as np
import pandas as pd

from fedcxr.errors import UserError

log = logging.getLogger(__name__)

KEY_FILE_NAME = ".fedcxr_site_key"
ENV_VAR = "FEDCXR_SITE_KEY"
MIN_KEY_BYTES = 16
MAX_KEY_FILE_BYTES = 4096
#: Hex digits kept of each pseudonym: 80 bits, so a collision among 10^7 patients has
#: probability ~4e-11.
PSEUDONYM_HEX = 20


@dataclass(frozen=True)
class SiteKey:
    """A loaded key and where it came from (the path is for messages; it stays at the site)."""

    secret: bytes
    origin: str  # "option" | "env" | "out" | "created" | "synthetic"
    path: Optional[Path] = None

    def __repr__(self) -> str:  # never show the secret in a traceback or log line
        return f"SiteKey(origin={self.origin!r}, key_id={self.key_id!r})"

    @property
    def key_id(self) -> str:
        """A keyed fingerprint (12 hex digits): same key ⇔ same id, the key itself not derivable."""
        return hmac.new(self.secret, b"fedcxr-key-id", "sha256").hexdigest()[:12]

    def pseudonym(self, kind: str, value: str) -> str:
        """HMAC-SHA256(key, kind NUL value), first :data:`PSEUDONYM_HEX` hex digits.

        ``kind`` separates domains (``patient``, ``study``, ``image``), so equal raw values of
        different kinds never get the same pseudonym.
        """
        message = kind.encode() + b"\x00" + value.encode("utf-8", "surrogateescape")
        return hmac.digest(self.secret, message, "sha256").hex()[:PSEUDONYM_HEX]

    def pseudonyms(self, kind: str, values: pd.Series | Iterable[str]) -> np.ndarray:
        """:meth:`pseudonym` of every value (one HMAC per distinct value), as an object array."""
        items = values.tolist() if isinstance(values, pd.Series) else list(values)
        # an object array, not pandas strings: a non-UTF-8 file name (surrogate escapes) must hash too
        codes, uniques = pd.factorize(np.array([str(v) for v in items], dtype=object), use_na_sentinel=False)
        mapped = np.array([self.pseudonym(kind, str(u)) for u in uniques.tolist()] or [""], dtype=object)
        return mapped[codes] if len(codes) else np.array([], dtype=object)


def load_site_key(key_file: Optional[Path | str], out_dir: Path | str, *, create: bool = True) -> SiteKey:
    """The site key (see module doc for the order); creates ``OUT/.fedcxr_site_key`` if needed."""
    if key_file is not None:
        return SiteKey(_read_key(Path(key_file), "--site-key"), "option", Path(key_file))
    env = os.environ.get(ENV_VAR)
    if env:
        return SiteKey(_read_key(Path(env), f"${ENV_VAR}"), "env", Path(env))
    path = Path(out_dir) / KEY_FILE_NAME
    if path.exists():
        return SiteKey(_read_key(path, "the site key"), "out", path)
    if not create:
        raise UserError(f"no site key: pass --site-key FILE, set ${ENV_VAR}, or ingest into {out_dir} first")
    return SiteKey(_create_key(path), "created", path)


def _read_key(path: Path, what: str) -> bytes:
    try:
        info = path.stat()
    except FileNotFoundError:
        raise UserError(f"{what} {path}: no such file") from None
    if not stat.S_ISREG(info.st_mode):
        raise UserError(f"{what} {path}: not a regular file")
    if info.st_size > MAX_KEY_FILE_BYTES:
        raise UserError(f"{what} {path}: {info.st_size} bytes; a site key file holds 32 bytes (or their hex)")
    if os.name == "posix" and info.st_mode & 0o077:
        raise UserError(
            f"{what} {path}: readable by group or others (mode {stat.S_IMODE(info.st_mode):04o}); "
            f"the key must stay private to the site: run `chmod 600 {path}`"
        )
    data = path.read_bytes()
    text = data.strip()
    try:
        if len(text) >= 2 * MIN_KEY_BYTES and len(text) % 2 == 0:
            return bytes.fromhex(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        pass
    if len(data) < MIN_KEY_BYTES:
        raise UserError(
            f"{what} {path}: too short ({len(data)} bytes); use at least {MIN_KEY_BYTES} random bytes, "
            "e.g. `openssl rand -hex 32 > FILE`"
        )
    return data


def _create_key(path: Path) -> bytes:
    """32 random bytes written as hex, created exclusively with mode 0600 (never world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_bytes(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another ingest created it a moment ago: use that one
        return _read_key(path, "the site key")
    with os.fdopen(fd, "w") as handle:
        handle.write(secret.hex() + "\n")
    log.warning("created a new site key %s: keep it (and back it up) at the site; the same key gives "
                "the same pseudonyms on a re-ingest", path)
    return secret


__all__ = ["ENV_VAR", "KEY_FILE_NAME", "PSEUDONYM_HEX", "SiteKey", "load_site_key"]
