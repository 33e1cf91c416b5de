"""Keep every image path inside its export root (and say why one is not).

An export's metadata names image files; a hostile or careless export can name files outside
the export (``/etc/passwd``, ``../../other_site/x.dcm``, a symbolic link into another
patient store). Ingest must never read those, and must never silently drop them either: each
such row is set aside with a reason, counted in ``ingest_report.json`` and listed in
``set_aside.csv``.

Rules (:func:`contain`):

* the path is taken as POSIX (adapters already turn ``\\`` into ``/``); a NUL byte, an absolute
  path (``/x``, ``C:x``, ``//server/share``) → set aside;
* ``.`` and ``..`` parts are resolved lexically: ``images/../images/x.png`` is ``images/x.png``
  and inside; ``../x.png`` or ``images/../../x.png`` leave the root → set aside;
* symbolic links are then resolved (every folder on the way and the file itself): a path whose
  real location is outside the real export root is set aside, unless ``follow_links=True``
  (``fedcxr ingest --follow-links``) says links out of the export are intended (a PACS mount
  linked into the export folder);
* the manifest keeps the lexically normalised relative path; the real path is returned too,
  so duplicates can be found by the file they resolve to (:mod:`fedcxr.site_adapters.ingest`).

A path that is not valid UTF-8 (a file name in a legacy encoding, which Python holds as
surrogate escapes) is set aside as well: it cannot be written to Parquet or JSON as text.
:func:`printable` gives the form used in messages (``\\udcff`` escapes made visible).
"""

from __future__ import annotations

import os
import posixpath
from typing import Optional, Sequence

OUTSIDE = "image path outside the export folder"


def printable(text: str) -> str:
    """``text`` with undecodable bytes (surrogate escapes) and control characters made visible."""
    try:
        text.encode("utf-8")
        clean = text
    except UnicodeEncodeError:
        clean = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if any(ord(c) < 32 or ord(c) == 127 for c in clean):
        clean = "".join(c if 32 <= ord(c) != 127 else f"\\x{ord(c):02x}" for c in clean)
    return clean


def is_utf8(text: str) -> bool:
    """True when ``text`` holds no surrogate escapes (it round-trips through UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def lexical(rel: str) -> tuple[Optional[str], Optional[str]]:
    """``(normalised relative path, None)`` or ``(None, reason)`` without touching the disk."""
    if not isinstance(rel, str) or not rel.strip():
        return None, "no image path"
    if "\x00" in rel:
        return None, f"{OUTSIDE}: path contains a NUL byte"
    if not is_utf8(rel):
        return None, f"image path is not valid UTF-8: {printable(rel)!r}"
    text = rel.replace("\\", "/")
    if text.startswith("/") or (len(text) >= 2 and text[1] == ":" and text[0].isalpha()):
        return None, f"{OUTSIDE}: absolute path {printable(rel)!r}"
    norm = posixpath.normpath(text)
    if norm == ".." or norm.startswith("../"):
        return None, f"{OUTSIDE}: {printable(rel)!r} leaves it through '..'"
    if norm in (".", ""):
        return None, "no image path"
    return norm, None


class Container:
    """Resolves relative paths inside one export root; caches the real path of each folder."""

    def __init__(self, root: str | os.PathLike, *, follow_links: bool = False) -> None:
        self.root = os.path.realpath(os.fspath(root))
        self.follow_links = follow_links
        self._folders: dict[str, str] = {}

    def inside(self, real: str) -> bool:
        return real == self.root or real.startswith(self.root + os.sep)

    def real(self, norm: str) -> str:
        """Real path of ``root/norm`` (every symbolic link resolved; the file may not exist)."""
        folder, name = posixpath.split(norm)
        real_folder = self._folders.get(folder)
        if real_folder is None:
            real_folder = os.path.realpath(os.path.join(self.root, folder)) if folder else self.root
            self._folders[folder] = real_folder
        full = os.path.join(real_folder, name)
        return os.path.realpath(full) if os.path.islink(full) else full

    def contain(self, rel: str) -> tuple[Optional[str], Optional[str], Optional[str]]:
        """``(normalised path, real path, None)`` or ``(None, None, reason)``."""
        norm, reason = lexical(rel)
        if reason is not None:
            return None, None, reason
        real = self.real(norm)
        if not self.follow_links and not self.inside(real):
            return None, None, (f"{OUTSIDE}: {printable(rel)!r} is a symbolic link (or in a linked folder) "
                                "that leads out of it; pass --follow-links if that is intended")
        return norm, real, None


def contain_all(
    root: str | os.PathLike, paths: Sequence[str], *, follow_links: bool = False
) -> tuple[list[Optional[str]], list[Optional[str]], list[Optional[str]]]:
    """:meth:`Container.contain` over many paths: normalised paths, real paths, reasons."""
    box = Container(root, follow_links=follow_links)
    norms, reals, reasons = [], [], []
    for rel in paths:
        norm, real, reason = box.contain(rel)
        norms.append(norm)
        reals.append(real)
        reasons.append(reason)
    return norms, reals, reasons


__all__ = ["OUTSIDE", "Container", "contain_all", "is_utf8", "lexical", "printable"]
