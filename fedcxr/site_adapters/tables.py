"""Helpers for adapters that read vendor metadata tables (NIH, CheXpert, MIMIC).

Why a module of its own: each adapter reads CSVs, maps vendor strings through the scalar
functions of :mod:`fedcxr.vocab` and sets rows aside with reasons. Doing that per row in
Python costs seconds on 100k-row exports, so the helpers here apply a vocabulary function
once per *distinct* value and broadcast the result with integer indexing (NIH's 112,120
rows have 836 distinct label strings and ~100 distinct ages).

Conventions shared by the adapters:

* a label value outside {1, 0, -1, blank} sets the row aside (the reason names column and
  value);
* an auxiliary value (sex, age, race, view) that cannot be mapped becomes *unknown* (null),
  the row is kept, and the adapter adds a note with the count and a few example values.
"""

from __future__ import annotations

import csv
import io
import lzma
import os
import zipfile
import zlib
from collections import deque
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

import numpy as np
import pandas as pd

from fedcxr.site_adapters.base import IngestError, SetAside
from fedcxr.site_adapters.inputs import MAX_COLUMNS, check_zip, open_input, text_stream
from fedcxr.vocab import AUX_VOCAB, raw_column

#: Label values a vendor may use: positive, negative, uncertain (blank = not mentioned).
LABEL_VALUES = (1.0, 0.0, -1.0)

#: Folder names never searched for metadata files (image trees with 10^4-10^5 entries).
_IMAGE_TREES = {"files", "train", "valid", "test", "images"}
_MAX_ENTRIES = 2000


def find_file(
    input_dir: Path,
    names: Sequence[str],
    *,
    subdirs: Sequence[str] = (),
    max_depth: int = 3,
) -> Optional[Path]:
    """The first existing file among ``names`` (in priority order) under ``input_dir``.

    Looks in ``input_dir``, then the given ``subdirs`` (the vendor's usual layout), then any
    folder up to ``max_depth`` levels down, never descending into image trees (``files/``,
    ``train/``, ``images*/``...) or folders with more than 2,000 entries, so the search costs
    milliseconds even beside 10^5 images. A higher-priority name wins over a shallower folder.
    """
    folders = [input_dir] + [input_dir / s for s in subdirs if (input_dir / s).is_dir()]
    folders += [d for d in _walk_folders(input_dir, max_depth) if d not in folders]
    for name in names:
        for folder in folders:
            candidate = folder / name
            if candidate.is_file():
                return candidate
    return None


def _walk_folders(root: Path, max_depth: int) -> list[Path]:
    """Breadth-first folders below ``root`` (excluding it), pruned as :func:`find_file` says."""
    found: list[Path] = []
    queue = deque([(root, 0)])
    while queue:
        folder, depth = queue.popleft()
        if depth >= max_depth:
            continue
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError:
            continue
        if len(entries) > _MAX_ENTRIES:
            continue
        for entry in sorted(entries, key=lambda e: e.name):
            name = entry.name.lower()
            if entry.is_dir() and not name.startswith(".") and name not in _IMAGE_TREES \
                    and not name.startswith("images"):
                found.append(Path(entry.path))
                queue.append((Path(entry.path), depth + 1))
    return found


def deeper_hint(path: Path) -> str:
    """`` (but it exists one folder deeper: X)`` for a missing file or folder, else ``""``.

    The commonest cause of a "no such file" is a download unpacked into its own folder; a
    message that names where the file really is saves the user a search. A name that differs
    only in case is reported too. At most 200 sibling folders are looked into.
    """
    parent = Path(path).parent
    try:
        entries = sorted(os.scandir(parent), key=lambda e: e.name) if parent.is_dir() else []
    except OSError:
        return ""
    name = Path(path).name
    for entry in entries:
        if entry.name != name and entry.name.lower() == name.lower():
            return f" (but {Path(entry.path)} exists: names are case-sensitive)"
    for entry in [e for e in entries if e.is_dir()][:200]:
        if (Path(entry.path) / name).exists():
            return f" (but it exists one folder deeper: {Path(entry.path) / name})"
    return ""


def relative_name(path: Path, base: Path) -> str:
    """``path`` relative to ``base`` with POSIX separators (for ``source_file``)."""
    try:
        return path.relative_to(base).as_posix()
    except ValueError:
        return path.as_posix()


def check_csv_header(path: Path, name: str, *, sep: str = ",", encoding: str = "utf-8",
                     root: Optional[Path] = None) -> list[str]:
    """The header row's column names; :class:`IngestError` for an empty file or repeated names.

    pandas would silently rename a repeated column (``Edema`` → ``Edema.1``), so a second
    label column with the same name would be read as something else; an empty file would
    surface as a parser traceback. Both are the export's problem and are named here. The file
    is read through :func:`fedcxr.site_adapters.inputs.open_input` (a regular file inside
    ``root``, decompressed within bounds, no line over 1 MiB), and a header of more than
    :data:`~fedcxr.site_adapters.inputs.MAX_COLUMNS` columns is refused before pandas sees it.
    """
    try:
        with open_input(path, root=root, name=name) as raw, text_stream(raw, encoding) as handle:
            first = next(csv.reader(handle, delimiter=sep), None)
    except IngestError:
        raise
    except (OSError, UnicodeDecodeError, csv.Error, LookupError, EOFError, zlib.error, lzma.LZMAError) as exc:
        raise IngestError(f"{name}: cannot read ({type(exc).__name__}: {exc})") from None
    if first is None or not any(cell.strip() for cell in first):
        raise IngestError(f"{name}: empty file: no header row")
    if len(first) > MAX_COLUMNS:
        raise IngestError(f"{name}: {len(first)} columns in the header row, more than the {MAX_COLUMNS} a metadata "
                          "table may have")
    names = [cell.strip().lstrip("\ufeff") for cell in first]
    repeated = sorted({c for c in names if c and names.count(c) > 1})
    if repeated:
        raise IngestError(f"{name}: column name(s) {', '.join(repr(c) for c in repeated)} appear more than once "
                          "in the header row; every column needs its own name")
    return names


#: what reading a compressed or malformed table can raise besides pandas' own errors
READ_ERRORS = (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError, OSError, EOFError,
               zlib.error, lzma.LZMAError, zipfile.BadZipFile, KeyError)
_INHERIT = object()


def read_table(path: Path, *, base: Path, usecols=None, dtype=None, root=_INHERIT) -> pd.DataFrame:
    """Read a CSV (plain or compressed) or an Excel sheet; errors name the file.

    Only an empty cell is missing (``keep_default_na=False``): vendor strings such as
    ``NA`` or ``None`` stay strings, so an odd label value is reported instead of silently
    becoming "not labeled". ``index_col=False`` keeps pandas from turning the first column
    into the index when rows have a trailing comma (NIH's 2017 Data_Entry).

    Every table goes through :mod:`fedcxr.site_adapters.inputs`: a regular file, inside ``root``
    (default ``base``, the export; ``None`` for a file the user named), decompressed as a bounded
    stream with bounded lines; an ``.xlsx`` (a zip) is refused when its parts declare more than
    the bound.
    """
    name = relative_name(path, base)
    root = base if root is _INHERIT else root
    try:
        if path.suffix.lower() in {".xlsx", ".xls"}:
            if path.suffix.lower() == ".xlsx":
                check_zip(path, name)
            with open_input(path, root=root, name=name, lines=False) as handle:
                frame = pd.read_excel(io.BytesIO(handle.read()), dtype=dtype)
            return frame if usecols is None else frame[[c for c in frame.columns if usecols(c)]]
        check_csv_header(path, name, root=root)
        with open_input(path, root=root, name=name) as handle:
            return pd.read_csv(
                handle, usecols=usecols, dtype=dtype, keep_default_na=False, na_values=[""],
                index_col=False, low_memory=False, encoding="utf-8",
            )
    except READ_ERRORS as exc:
        raise IngestError(f"{name}: cannot read ({type(exc).__name__}: {exc})") from None


def map_distinct(values: pd.Series, func: Callable[[object], object]) -> tuple[np.ndarray, np.ndarray]:
    """Apply a scalar vocabulary function once per distinct value of ``values``.

    Returns ``(mapped, failed)``: ``mapped`` is a float array (NaN where ``func`` returned
    ``None`` or raised ``ValueError``), ``failed`` a bool array marking rows whose value made
    ``func`` raise. Missing cells are passed to ``func`` as ``None``.
    """
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    lookup = np.full(len(uniques) + 1, np.nan)
    bad = np.zeros(len(uniques) + 1, dtype=bool)
    for i, value in enumerate(list(uniques) + [None]):
        try:
            result = func(value)
        except ValueError:
            bad[i] = True
            continue
        if result is not None:
            lookup[i] = float(result)
    return lookup[codes], bad[codes]


def to_codes(mapped: np.ndarray, index: Optional[pd.Index] = None) -> pd.Series:
    """Float codes with NaN → nullable Int64 series (the ``aux__`` column type)."""
    return pd.Series(pd.array(mapped, dtype="Int64"), index=index)


def code_names(task: str, codes: np.ndarray) -> pd.Series:
    """Float aux codes → vocabulary names (``None`` where unknown), for ``group__`` columns."""
    vocab = np.array(AUX_VOCAB[task] + [None], dtype=object)
    index = np.where(np.isnan(codes), len(AUX_VOCAB[task]), codes).astype(int)
    return pd.Series(vocab[index], dtype=object)


def failed_note(what: str, values: pd.Series, failed: np.ndarray, consequence: str) -> Optional[str]:
    """A note such as ``3 row(s) with unmappable age (e.g. '411Y'): age unknown, rows kept``."""
    count = int(failed.sum())
    if not count:
        return None
    examples = ", ".join(repr(v) for v in pd.unique(values[failed])[:5])
    return f"{count} row(s) with unmappable {what} (e.g. {examples}): {consequence}"


def label_columns(
    frame: pd.DataFrame, columns: dict[str, str]
) -> tuple[dict[str, np.ndarray], np.ndarray, list[Optional[str]]]:
    """Vendor label columns (1/0/-1/blank) → ``raw__<class>`` float arrays.

    ``columns`` maps vendor column → canonical class. Returns ``(raw, bad, reasons)``: the
    arrays keyed by ``raw__`` column, a bool mask of rows holding any other value, and for
    each bad row a reason naming the first offending column and its value (else ``None``).
    """
    raw: dict[str, np.ndarray] = {}
    bad = np.zeros(len(frame), dtype=bool)
    reasons: list[Optional[str]] = [None] * len(frame)
    for vendor, cls in columns.items():
        col = frame[vendor]
        if pd.api.types.is_numeric_dtype(col):
            numeric = col.to_numpy(dtype=float, na_value=np.nan)
        else:  # text: a blank or whitespace-only cell is "not mentioned", like an empty one
            col = col.astype(object).where(col.notna(), None).map(
                lambda v: v.strip() or None if isinstance(v, str) else v)
            numeric = pd.to_numeric(col, errors="coerce").to_numpy(dtype=float)
        present = col.notna().to_numpy()
        invalid = present & ~np.isin(numeric, LABEL_VALUES)
        for i in np.flatnonzero(invalid & ~bad):
            reasons[i] = f"unknown label value: {col.iloc[i]!r} in column {vendor!r}"
        bad |= invalid
        raw[raw_column(cls)] = np.where(invalid, np.nan, numeric)
    return raw, bad, reasons


def member_of(values: pd.Series, members: set) -> np.ndarray:
    """Bool mask of ``values`` found in ``members``.

    A plain set lookup: ``Series.isin`` on pandas' Arrow-backed strings converts the whole
    set and took ~0.2 s for NIH's 86,524 names, this takes ~0.01 s.
    """
    return np.fromiter((v in members for v in values.to_numpy(dtype=object)), dtype=bool, count=len(values))


def rows_set_aside(
    file: str, rows: Iterable[int], reasons: Iterable[str], image_paths: Optional[Iterable[str]] = None
) -> list[SetAside]:
    """SetAside records for the given 1-based rows of ``file``."""
    rows, reasons = list(rows), list(reasons)
    paths = list(image_paths) if image_paths is not None else [None] * len(rows)
    return [SetAside(file, int(r), reason, p) for r, reason, p in zip(rows, reasons, paths)]


__all__ = [
    "LABEL_VALUES", "deeper_hint", "find_file", "relative_name", "read_table", "map_distinct", "to_codes", "code_names",
    "failed_note", "label_columns", "member_of", "rows_set_aside",
]
