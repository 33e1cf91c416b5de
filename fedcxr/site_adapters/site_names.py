"""Site names: one rule turns export values and ``--site-name`` into names that never merge two hospitals.

A site's name is its folder under the ingest output, its key in experiment configs and its
FLARE client name, so it may hold only ASCII letters, digits, ``-`` and ``_``, and at most
:data:`MAX_SITE_NAME` characters. Names come from a value of the export (``--site-by hospital``,
``state``, ``race``) or from ``--site-name``. The rule, the same for every partition and for
``fedcxr shift``:

1. a value is trimmed of surrounding white space and put in Unicode NFC form (``"A "`` and
   ``"A"`` are one value, as are the composed and decomposed spellings of ``é``);
2. a value that already is a valid name keeps it (``CA``, ``site_group_1``, ``white``);
3. any other value gets its **slug**: every run of other characters becomes ``-``, and ``-`` at
   either end is dropped (``United Kingdom`` → ``United-Kingdom``);
4. a value whose slug is empty (``病院``: no Latin letter or digit), longer than
   :data:`MAX_SITE_NAME`, or shared with another value of the same ingest (``Hôpital A`` and
   ``Hôpital-A`` → both ``H-pital-A``) gets the **suffix** ``-`` + the first 8 hex digits of the
   SHA-256 of the value (UTF-8): ``site-9f86d081``, ``H-pital-A-5c4f2a1e`` (a long slug is cut to
   make room). A value that is exactly its name (rule 2) keeps it even then;
5. two names still equal after that (an 8-digit hash collision, about 1 in 4 billion) stop the
   ingest with exit code 2 naming both values.

So two different values never become one site, a value gets the same name in every ingest
that holds it, and non-Latin values keep distinct names. Every suffixed name is logged and
listed in ``ingest_report.json`` (``notes``), value and name side by side.
"""

from __future__ import annotations

import hashlib
import logging
import re
import unicodedata
from typing import Iterable

from fedcxr.errors import UserError
from fedcxr.escape import short

log = logging.getLogger(__name__)

#: longest site name (folder names, FLARE client names and report file names stay well inside 255 bytes)
MAX_SITE_NAME = 64
VALID = re.compile(r"[A-Za-z0-9_-]+")
_OTHER = re.compile(r"[^A-Za-z0-9_-]+")
_SUFFIX = 8


def canonical(value: object) -> str:
    """The value a name is made from: ``str(value)`` trimmed, in Unicode NFC form."""
    return unicodedata.normalize("NFC", str(value).strip())


def slug(value: object) -> str:
    """Rule 3: runs of characters other than ``A-Za-z0-9_-`` → ``-``, ``-`` stripped at both ends."""
    return _OTHER.sub("-", canonical(value)).strip("-")


def is_valid(name: str) -> bool:
    return bool(VALID.fullmatch(name)) and len(name) <= MAX_SITE_NAME


def suffix(value: object) -> str:
    """The first 8 hex digits of SHA-256 of the canonical value (UTF-8; undecodable bytes kept as they were)."""
    return hashlib.sha256(canonical(value).encode("utf-8", "surrogateescape")).hexdigest()[:_SUFFIX]


def site_names(values: Iterable[object]) -> tuple[dict[str, str], list[str]]:
    """``({canonical value: site name}, notes)`` for the values of one partition (see the module doc).

    Raises :class:`~fedcxr.errors.UserError` on rule 5 (two values, one name)."""
    raw = list(dict.fromkeys(canonical(v) for v in values))
    slugs = {v: slug(v) for v in raw}
    shared: dict[str, int] = {}
    for s in slugs.values():
        shared[s] = shared.get(s, 0) + 1
    names, notes = {}, []
    for value in raw:
        base = slugs[value]
        if is_valid(value):
            names[value] = value
            continue
        if base and len(base) <= MAX_SITE_NAME and shared[base] == 1 and base not in names.values():
            names[value] = base
            continue
        stem = (base or "site")[: MAX_SITE_NAME - _SUFFIX - 1].rstrip("-") or "site"
        names[value] = f"{stem}-{suffix(value)}"
        why = ("has no Latin letter or digit" if not base else
               f"is longer than {MAX_SITE_NAME} characters" if len(base) > MAX_SITE_NAME else
               f"shares the name {base!r} with another value")
        notes.append(f"site value {short(value, 60)} {why}: named {names[value]!r}")
    _check_unique(names)
    for note in notes:
        log.warning("%s", note)
    return names, notes


def site_name(value: object) -> str:
    """The site name of one value on its own (``--site-name``, ``fedcxr shift``)."""
    names, _ = site_names([value])
    return names[canonical(value)]


def _check_unique(names: dict[str, str]) -> None:
    seen: dict[str, str] = {}
    for value, name in names.items():
        if name in seen:
            raise UserError(f"site values {short(seen[name], 60)} and {short(value, 60)} would both be site "
                            f"{name!r}; rename one of them in the export")
        seen[name] = value


__all__ = ["MAX_SITE_NAME", "canonical", "is_valid", "site_name", "site_names", "slug", "suffix"]
