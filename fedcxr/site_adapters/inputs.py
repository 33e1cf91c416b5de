"""Every metadata file an adapter reads: a regular file, inside the export, bounded once decompressed.

Images have long gone through :func:`fedcxr.site_adapters.paths.open_regular` and the export's
containment (:mod:`fedcxr.site_adapters.paths`); the files that *describe* them — label tables,
report XML, split lists, archives — are read here, under the same three checks:

* **regular file** — a named pipe blocks a reader forever and a device never ends
  (``/dev/zero`` behind a report's name exhausts memory): both are refused before any read, on
  the open descriptor too (:func:`~fedcxr.site_adapters.paths.open_regular`);
* **containment** — a metadata file whose real path (links resolved) leaves the export root is
  refused unless links out of the export are intended (``fedcxr ingest --follow-links``, which
  ingest passes down with :func:`following_links`);
* **bounded size** — every compressed input (``.gz``, ``.bz2``, ``.xz``, a ``.zip`` table, the
  zip inside an ``.xlsx``, an ``.npz``, a ``.tgz`` report archive) is decompressed as a stream
  that stops at :func:`max_decompressed` bytes (2 GiB unless ``$FEDCXR_MAX_DECOMPRESSED_MB``
  says otherwise), and every text table stops at a line longer than :data:`MAX_LINE_BYTES`
  (1 MiB; real rows are a few kB) or a header of more than :data:`MAX_COLUMNS` columns. A 382 KB
  gzip whose header line is 400 MB of commas is refused after 1 MiB, naming the file, instead of
  ending in a ``MemoryError``.

Each refusal is an :class:`~fedcxr.site_adapters.base.IngestError` (exit 2) naming the file
and the bound; per-row files (an Open-i report) get the same reasons via :func:`input_problem`
and are set aside instead.
"""

from __future__ import annotations

import bz2
import contextlib
import contextvars
import gzip
import io
import lzma
import os
import zipfile
from pathlib import Path
from typing import BinaryIO, Iterator, Optional

from fedcxr.site_adapters.base import IngestError
from fedcxr.site_adapters.paths import NotRegularFile, open_regular, printable

#: the longest line a metadata table may have (a PadChest row with its report is a few kB)
MAX_LINE_BYTES = 1 << 20
#: the most columns a table's header may name (vendor exports have tens)
MAX_COLUMNS = 10_000
#: the default bound on what one compressed input may expand to
DEFAULT_MAX_DECOMPRESSED = 2 << 30
#: the default bound on an array archive (MedMNIST's largest, ChestMNIST at 224 px, holds 5.6 GB)
DEFAULT_MAX_ARRAYS = 16 << 30
LIMIT_ENV = "FEDCXR_MAX_DECOMPRESSED_MB"

_FOLLOW_LINKS: contextvars.ContextVar[bool] = contextvars.ContextVar("fedcxr_follow_links", default=False)

#: compression by file name, as pandas infers it (content sniffing would take a CSV whose
#: header starts "BZh" for bzip2)
_SUFFIXES = {".gz": "gzip", ".tgz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zip": "zip"}


class InputTooLarge(IngestError):
    """A metadata file that expands past its bound (or has an overlong line)."""


def max_decompressed(default: int = DEFAULT_MAX_DECOMPRESSED) -> int:
    """The bound on decompressed bytes: ``$FEDCXR_MAX_DECOMPRESSED_MB`` (MiB), else ``default``
    (2 GiB for a table or report archive, :data:`DEFAULT_MAX_ARRAYS` for an ``.npz``)."""
    text = os.environ.get(LIMIT_ENV, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise IngestError(f"${LIMIT_ENV}={text[:40]!r}: not a whole number of MiB") from None
    if value < 1:
        raise IngestError(f"${LIMIT_ENV}={value}: must be at least 1 (MiB)")
    return value << 20


@contextlib.contextmanager
def following_links(follow: bool) -> Iterator[None]:
    """Within this block, metadata files linked out of the export are read (``--follow-links``)."""
    token = _FOLLOW_LINKS.set(bool(follow))
    try:
        yield
    finally:
        _FOLLOW_LINKS.reset(token)


def links_followed() -> bool:
    return _FOLLOW_LINKS.get()


def outside_problem(path: Path | str, root: Optional[Path | str]) -> Optional[str]:
    """Why ``path`` must not be read as part of the export rooted at ``root`` (a link out), or None."""
    if root is None or links_followed():
        return None
    real, real_root = os.path.realpath(path), os.path.realpath(root)
    if real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep):
        return None
    return "a symbolic link (or in a linked folder) that leads out of the export folder; pass --follow-links " \
           "if that is intended"


def input_problem(path: Path | str, root: Optional[Path | str], max_bytes: Optional[int] = None) -> Optional[str]:
    """Why ``path`` cannot be read (outside the export, missing, not a regular file, over
    ``max_bytes`` on disk), or None. For per-row files that are set aside, not fatal."""
    from fedcxr.site_adapters.paths import regular_file_problem

    problem = outside_problem(path, root) or regular_file_problem(path)
    if problem is None and max_bytes is not None:
        size = os.stat(path).st_size
        if size > max_bytes:
            problem = f"{size} bytes, over the {max_bytes}-byte bound"
    return problem


def _name(path: Path | str, base: Optional[Path | str]) -> str:
    if base is not None:
        try:
            return printable(Path(path).relative_to(base).as_posix())
        except ValueError:
            pass
    return printable(str(path))


class _Bounded(io.RawIOBase):
    """A read-only stream that stops at ``limit`` bytes and at a line longer than ``line_limit``."""

    def __init__(self, source: BinaryIO, name: str, limit: int, line_limit: Optional[int], closers: list) -> None:
        super().__init__()
        self.source, self.name_, self.limit, self.line_limit = source, name, limit, line_limit
        self.total = 0
        self.line = 0  # bytes since the last newline
        self._closers = closers

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.source.read(len(buffer))
        n = len(data)
        self.total += n
        if self.total > self.limit:
            raise InputTooLarge(f"{self.name_}: expands to more than {self.limit} bytes (the bound on a metadata "
                                f"file once decompressed; raise it with ${LIMIT_ENV}=<MiB> if the file is genuine)")
        if self.line_limit is not None and n:
            self._check_lines(data)
        buffer[:n] = data
        return n

    def _check_lines(self, data: bytes) -> None:
        first, last = data.find(b"\n"), data.rfind(b"\n")
        if first < 0:
            self.line += len(data)
            longest = self.line
        else:
            longest = self.line + first
            if len(data) > self.line_limit:  # lines wholly inside a large chunk
                longest = max(longest, max(len(part) for part in data[first + 1:last].split(b"\n")))
            self.line = len(data) - last - 1
            longest = max(longest, self.line)
        if longest > self.line_limit:
            raise InputTooLarge(f"{self.name_}: a line longer than {self.line_limit} bytes (a row of a metadata "
                                "table is a few kB; this is not a table fedcxr reads)")

    def close(self) -> None:
        if not self.closed:
            for closer in reversed(self._closers):
                with contextlib.suppress(Exception):
                    closer.close()
        super().close()


def _open_raw(path: Path | str, name: str) -> BinaryIO:
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        raise IngestError(f"{name}: no such file") from None
    except (NotRegularFile, IsADirectoryError) as exc:
        raise IngestError(f"{name}: cannot read: {exc if isinstance(exc, NotRegularFile) else 'a directory'}") from None
    except OSError as exc:
        raise IngestError(f"{name}: cannot read ({exc.strerror or type(exc).__name__})") from None
    return os.fdopen(fd, "rb")


def open_input(path: Path | str, *, root: Optional[Path | str] = None, base: Optional[Path | str] = None,
               name: Optional[str] = None, lines: bool = True, limit: Optional[int] = None,
               decompress: bool = True) -> io.BufferedReader:
    """``path`` opened for reading, decompressed (``.gz``, ``.bz2``, ``.xz`` or a one-file ``.zip``),
    with every bound of the module doc. ``root``: the export it must stay inside (None: a file
    the user named). ``base``: what names are shown relative to (or ``name`` itself). ``lines``:
    check line lengths (text tables). ``decompress=False``: the bytes as they are (a report XML).
    Raises :class:`IngestError` naming the file."""
    name = name or _name(path, base)
    problem = outside_problem(path, root)
    if problem is not None:
        raise IngestError(f"{name}: {problem}")
    raw = _open_raw(path, name)
    closers: list = [raw]
    try:
        kind = _SUFFIXES.get(Path(path).suffix.lower()) if decompress else None
        source: BinaryIO = raw
        if kind == "gzip":
            source = gzip.GzipFile(fileobj=raw, mode="rb")
        elif kind == "bzip2":
            source = bz2.BZ2File(raw, mode="rb")
        elif kind == "xz":
            source = lzma.LZMAFile(raw, mode="rb")
        elif kind == "zip":
            source = _zip_member(raw, name)
        closers.append(source)
        bound = limit if limit is not None else max_decompressed()
        return io.BufferedReader(_Bounded(source, name, bound, MAX_LINE_BYTES if lines else None, closers))
    except BaseException:
        for closer in reversed(closers):
            with contextlib.suppress(Exception):
                closer.close()
        raise


def _zip_member(raw: BinaryIO, name: str) -> BinaryIO:
    """The one file of a zipped table (pandas reads ``x.csv.zip`` the same way)."""
    try:
        archive = zipfile.ZipFile(raw)
    except (zipfile.BadZipFile, OSError) as exc:
        raise IngestError(f"{name}: not a readable zip ({exc})") from None
    members = [i for i in archive.infolist() if not i.is_dir()]
    if len(members) != 1:
        raise IngestError(f"{name}: a zip holding {len(members)} files; a zipped table holds exactly one")
    return archive.open(members[0])


def check_zip(path: Path | str, name: str, *, limit: Optional[int] = None) -> None:
    """Refuse a zip container (``.xlsx``, ``.npz``) whose members declare more than the bound in all.

    Python's zip reader never returns more than a member's declared size, so the declared sizes
    bound what reading the members can produce."""
    bound = limit if limit is not None else max_decompressed()
    with _open_raw(path, name) as raw:
        try:
            with zipfile.ZipFile(raw) as archive:
                total = sum(info.file_size for info in archive.infolist())
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise IngestError(f"{name}: not a readable zip ({exc})") from None
    if total > bound:
        raise InputTooLarge(f"{name}: its parts expand to {total} bytes, more than the {bound}-byte bound on a "
                            f"metadata file once decompressed (raise it with ${LIMIT_ENV}=<MiB> if it is genuine)")


def check_npz(path: Path | str, name: str) -> None:
    """Refuse an ``.npz`` whose arrays would not fit their own bytes or the bound, before numpy
    allocates anything: each ``.npy`` header's shape × item size must fit in the member's declared
    size (numpy allocates what the header says, then reads), object arrays are refused, and the
    members together stay under :func:`max_decompressed` (:data:`DEFAULT_MAX_ARRAYS` by default)."""
    import numpy as np

    bound = max_decompressed(DEFAULT_MAX_ARRAYS)
    with _open_raw(path, name) as raw:
        try:
            with zipfile.ZipFile(raw) as archive:
                members = archive.infolist()
                total = sum(info.file_size for info in members)
                if total > bound:
                    raise InputTooLarge(f"{name}: its arrays expand to {total} bytes, more than the {bound}-byte "
                                        f"bound (raise it with ${LIMIT_ENV}=<MiB> if the file is genuine)")
                for info in members:
                    if info.filename.endswith(".npy"):
                        _check_npy_member(archive, info, name, np)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
            raise IngestError(f"{name}: not a readable npz ({type(exc).__name__}: {exc})") from None


def _check_npy_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, np) -> None:
    with archive.open(info) as member:
        version = np.lib.format.read_magic(member)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(member)
    if dtype.hasobject:
        raise IngestError(f"{name}: array {info.filename} holds Python objects; fedcxr reads numbers only")
    count = 1
    for dim in shape:
        count *= int(dim)
    if count * dtype.itemsize > info.file_size:
        raise InputTooLarge(f"{name}: array {info.filename} declares shape {tuple(shape)} ({count * dtype.itemsize} "
                            f"bytes) but holds {info.file_size}: refused before anything is allocated")


def read_input_bytes(path: Path | str, *, root: Optional[Path | str] = None, base: Optional[Path | str] = None,
                     name: Optional[str] = None, limit: int, lines: bool = False, decompress: bool = True) -> bytes:
    """All of ``path`` (decompressed unless ``decompress=False``), at most ``limit`` bytes, under
    every check of :func:`open_input`."""
    with open_input(path, root=root, base=base, name=name, lines=lines, limit=limit,
                    decompress=decompress) as handle:
        return handle.read()


def text_stream(handle: io.BufferedReader, encoding: str = "utf-8") -> io.TextIOWrapper:
    """A text view of :func:`open_input`'s stream for the csv module (``newline=""``)."""
    return io.TextIOWrapper(handle, encoding=encoding, newline="")


__all__ = ["DEFAULT_MAX_ARRAYS", "DEFAULT_MAX_DECOMPRESSED", "InputTooLarge", "LIMIT_ENV", "MAX_COLUMNS",
           "MAX_LINE_BYTES", "check_npz", "check_zip",
           "following_links", "input_problem", "links_followed", "max_decompressed", "open_input", "outside_problem",
           "read_input_bytes", "text_stream"]
