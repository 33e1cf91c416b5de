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

Only regular files are ever opened as images (:func:`open_regular`, :func:`regular_file_problem`):
a named pipe blocks a reader forever, a device never ends; both are set aside with the reason.

A path that is not valid UTF-8 (a file name in a legacy encoding, which Python holds as
surrogate escapes) is set aside as well: it cannot be written to Parquet or JSON as text.
:func:`printable` gives the form used in messages (``\\udcff`` escapes made visible).
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import stat
from typing import Optional, Sequence

OUTSIDE = "image path outside the export folder"


_CONTROL = re.compile("[\x00-\x1f\x7f]")


def printable(text: str) -> str:
    """``text`` with undecodable bytes (surrogate escapes) and control characters made visible."""
    if text.isascii():
        return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text) if _CONTROL.search(text) else text
    try:
        text.encode("utf-8")
        clean = text
    except UnicodeEncodeError:
        clean = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if _CONTROL.search(clean):
        clean = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", clean)
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


#: what a path that is not a regular file is, in the words of a set-aside reason
_KINDS = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"))
_O_BINARY = getattr(os, "O_BINARY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_O_NOCTTY = getattr(os, "O_NOCTTY", 0)


def not_regular(mode: int) -> Optional[str]:
    """``"not a regular file (a named pipe)"`` for a special file's ``st_mode``; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "a special file")
    return f"not a regular file ({kind})"


def regular_file_problem(path: str | os.PathLike) -> Optional[str]:
    """Why ``path`` must not be opened as an image (missing, or not a regular file), or None.

    One ``stat`` (links followed): reading a named pipe blocks forever, a device never ends,
    and opening some devices has side effects, so they are refused before any open."""
    try:
        return not_regular(os.stat(path).st_mode)
    except FileNotFoundError:
        return "missing file"
    except (OSError, ValueError) as exc:
        return f"unreadable file: {getattr(exc, 'strerror', None) or type(exc).__name__}"


def open_regular(path: str | os.PathLike) -> int:
    """A read-only descriptor of ``path``, only if it is a regular file; else :class:`NotRegularFile`
    (:class:`IsADirectoryError` for a directory).

    Checked before opening (:func:`regular_file_problem`) and again on the open descriptor, which
    is opened non-blocking so that a file swapped for a named pipe in between still never blocks
    (on a regular file ``O_NONBLOCK`` changes nothing: reads return the data as usual)."""
    problem = regular_file_problem(path)
    if problem is not None and problem.startswith("not a regular file"):
        raise _refusal(problem, path)
    fd = os.open(path, os.O_RDONLY | _O_BINARY | _O_NONBLOCK | _O_NOCTTY)
    try:
        problem = not_regular(os.fstat(fd).st_mode)
        if problem is not None:
            raise _refusal(problem, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refusal(problem: str, path) -> OSError:
    if problem.endswith("(a directory)"):
        return IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
    return NotRegularFile(problem)


class NotRegularFile(OSError):
    """A path that is a named pipe, socket, device or directory: never read as an image."""


class Container:
    """Resolves relative paths inside one export root; caches the real path of each folder."""

    def __init__(self, root: str | os.PathLike, *, follow_links: bool = False) -> None:
        self.root = os.path.realpath(os.fspath(root))
        self.follow_links = follow_links
        self._folders: dict[str, str] = {}
        self._listings: dict[str, tuple[frozenset[str], frozenset[str]]] = {}  # real folder → (names, links)

    def inside(self, real: str) -> bool:
        return real == self.root or real.startswith(self.root + os.sep)

    def real(self, norm: str) -> tuple[str, bool]:
        """Real path of ``root/norm`` (every symbolic link resolved) and whether it exists."""
        folder, name = posixpath.split(norm)
        real_folder = self._folders.get(folder)
        if real_folder is None:
            real_folder = os.path.realpath(os.path.join(self.root, folder)) if folder else self.root
            self._folders[folder] = real_folder
        full = os.path.join(real_folder, name)
        names, links = self._listing(real_folder)
        if name in links:
            full = os.path.realpath(full)
            return full, os.path.exists(full)
        return full, name in names

    def _listing(self, real_folder: str) -> tuple[frozenset[str], frozenset[str]]:
        """A folder's entry names and symbolic-link names: one listing per folder, not a stat per row."""
        listing = self._listings.get(real_folder)
        if listing is None:
            try:
                with os.scandir(real_folder) as entries:
                    found = [(e.name, e.is_symlink()) for e in entries]
            except OSError:  # a missing folder: its files are reported missing later
                found = []
            listing = (frozenset(n for n, _ in found), frozenset(n for n, link in found if link))
            self._listings[real_folder] = listing
        return listing

    def contain(self, rel: str) -> tuple[Optional[str], Optional[str], Optional[str]]:
        """``(normalised path, real path, None)`` or ``(None, None, reason)``.

        The real path is ``None`` for a file that does not exist (the image check reports it).
        """
        norm, reason = lexical(rel)
        if reason is not None:
            return None, None, reason
        real, exists = self.real(norm)
        if not self.follow_links and not self.inside(real):
            return None, None, (f"{OUTSIDE}: {printable(rel)!r} is a symbolic link (or in a linked folder) "
                                "that leads out of it; pass --follow-links if that is intended")
        return norm, (real if exists else None), None


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


__all__ = ["OUTSIDE", "Container", "NotRegularFile", "contain_all", "is_utf8", "lexical", "not_regular", "open_regular",
           "printable", "regular_file_problem"]
