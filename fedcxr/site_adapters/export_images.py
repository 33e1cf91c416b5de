"""What the public-dataset adapters (rsna, vindr, siim, openi, padchest) share: find each image
by its file name, read its DICOM tags, and count a per-image row over per-box metadata rows.

Why a module of its own: these datasets ship a label table keyed by an image id (a Kaggle
``patientId``, a VinDr ``image_id``, a SIIM ``ImageId``...) and an image tree whose layout
varies between the official download, Kaggle mirrors and re-packed copies (flat, one folder
per split, nested study/series folders). Each adapter names the id and the layout it
expects; the file is then found by one directory walk, wherever it sits under the export.

Rows. Several of these tables hold one row per *box* or per *reader*, not per image: the
adapters emit one canonical row per image, whose ``source_row`` is the image's first row in
the table (:func:`group_rows`); a set-aside reason names the rows at fault.

Demographics from DICOM tags (:func:`attach_dicom_tags`): ``PatientSex``, ``PatientAge``,
``ViewPosition`` through :func:`fedcxr.site_adapters.dicom_folder.demographics`; a file that
is missing or fails the header check (:func:`fedcxr.site_adapters.image_checks.header_or_reason`)
is set aside with that reason, so the shared image check need not open it again.
With ``options.plan`` (``fedcxr ingest --plan``, metadata only) no image is opened: tags stay unknown.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np
import pandas as pd

from fedcxr.site_adapters.base import AdapterOptions, SetAside
from fedcxr.site_adapters.body_part import not_chest_reason
from fedcxr.site_adapters.dicom_folder import demographics, read_dicom_headers
from fedcxr.site_adapters.image_headers import KIND_DICOM
from fedcxr.site_adapters.paths import is_utf8
from fedcxr.vocab import aux_column


#: Reason for an image whose file name is found more than once under the export.
AMBIGUOUS = "ambiguous image: several files under the export have this image's file name (keep one copy)"


def metadata_only(options: AdapterOptions) -> bool:
    """True when the ingest must not open any image (``fedcxr ingest --plan``)."""
    return bool(options.plan)


def index_files(root: Path, suffixes: Iterable[str], *, strip_suffix: bool = True) -> dict[str, Optional[str]]:
    """File key → path relative to ``root`` (POSIX) for every file with one of ``suffixes``.

    One recursive walk; hidden files and folders are skipped, and so are names that are not
    UTF-8 (no metadata row can name them). The key is the file name, without its suffix when
    ``strip_suffix``. A key found twice maps to ``None``: the row that names it is ambiguous
    (:func:`locate` says so) rather than silently bound to one of the copies.
    """
    wanted = tuple(s.lower() for s in suffixes)
    index: dict[str, Optional[str]] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel = os.path.relpath(folder, root)
        prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        for name in files:
            lower = name.lower()
            if name.startswith(".") or not lower.endswith(wanted) or not is_utf8(name):
                continue
            key = name[: len(name) - len(next(s for s in wanted if lower.endswith(s)))] if strip_suffix else name
            index[key] = None if key in index else prefix + name
    return index


def locate(keys: Sequence[str], index: dict[str, Optional[str]], default: Sequence[str]) -> tuple[list[str], list[Optional[str]]]:
    """Path of each key's image and a reason for keys found twice.

    A key not in the index keeps its ``default`` path (the layout the dataset documents), so
    the header check sets it aside as a missing file naming that path.
    """
    paths: list[str] = []
    reasons: list[Optional[str]] = []
    for key, fallback in zip(keys, default):
        if key in index and index[key] is None:
            paths.append(fallback)
            reasons.append(AMBIGUOUS)  # the name is an id in several datasets: reasons never quote one
        else:
            paths.append(index.get(key) or fallback)
            reasons.append(None)
    return paths, reasons


def set_aside_rows(frame: pd.DataFrame, reasons: Sequence[Optional[str]]) -> tuple[pd.DataFrame, list[SetAside]]:
    """``(the rows without a reason, index reset; one SetAside per row with one)``: each set-aside
    row keeps its file, 1-based row and image path. ``reasons`` is aligned with ``frame``'s rows."""
    bad = np.array([r is not None for r in reasons], dtype=bool)
    aside = [SetAside(f, int(r), reasons[i], p) for i, f, r, p in
             zip(np.flatnonzero(bad), frame.loc[bad, "source_file"], frame.loc[bad, "source_row"],
                 frame.loc[bad, "image_path"])]
    return frame.loc[~bad].reset_index(drop=True), aside


def locate_rows(frame: pd.DataFrame, index: dict[str, Optional[str]]) -> tuple[pd.DataFrame, list[SetAside]]:
    """Each row's ``image_path`` found by its ``patient_id`` key in ``index`` (:func:`locate`, which
    keeps the documented path where the key is not indexed); a key naming several files sets its
    row aside (:data:`AMBIGUOUS`). ``frame``'s ``image_path`` is updated in place."""
    frame["image_path"], ambiguous = locate(frame["patient_id"].tolist(), index, frame["image_path"].tolist())
    return set_aside_rows(frame, ambiguous)


def group_rows(keys: pd.Series) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Distinct keys in first-appearance order, each one's first 1-based row, and all its rows.

    ``keys`` is one metadata column (an image id per table row); rows with a blank key are
    left out (the caller sets them aside).
    """
    codes, uniques = pd.factorize(keys, use_na_sentinel=True)
    rows = np.arange(1, len(keys) + 1)
    present = codes >= 0
    order = np.argsort(codes[present], kind="stable")
    sorted_codes, sorted_rows = codes[present][order], rows[present][order]
    bounds = np.flatnonzero(np.diff(sorted_codes)) + 1
    groups = np.split(sorted_rows, bounds) if len(sorted_rows) else []
    first = np.array([g[0] for g in groups], dtype=np.int64)
    return np.asarray(uniques, dtype=object), first, groups


def row_list(rows: Sequence[int], limit: int = 4) -> str:
    """``rows 3, 7 and 9`` / ``rows 3, 7, 9, 12 ... (6 rows)`` for reasons that name table rows."""
    rows = [int(r) for r in rows]
    if len(rows) == 1:
        return f"row {rows[0]}"
    if len(rows) <= limit:
        return "rows " + ", ".join(map(str, rows[:-1])) + f" and {rows[-1]}"
    return "rows " + ", ".join(map(str, rows[:limit])) + f" ... ({len(rows)} rows)"


def attach_dicom_tags(
    frame: pd.DataFrame,
    root: Path,
    options: AdapterOptions,
    notes: list[str],
    *,
    patient_from_tag: bool = False,
    view_default: Optional[int] = None,
) -> tuple[pd.DataFrame, list[SetAside], bool]:
    """Read each row's DICOM header; set aside the unusable ones; demographics from the tags.

    ``frame``: canonical rows whose ``image_path`` is relative to ``root``. Returns the kept
    rows with ``aux__sex``/``aux__age_bin``/``aux__view``/``age`` (and ``instance_uid``, and
    ``patient_id`` from ``PatientID`` when ``patient_from_tag`` and the tag is set), the rows
    set aside, and whether the headers were read (False under ``--plan``). A tag wins where it
    is set; a demographic column ``frame`` already holds (a metadata table) fills the rest.
    ``options.extra["raster"]``: PNG/JPEG files are accepted too (they have no tags).
    The header also gives each DICOM's chest check (``not_chest``, :mod:`fedcxr.site_adapters.body_part`).
    ``view_default``: the view code of a file without a ViewPosition tag, for a dataset whose
    documentation fixes the projection (VinDr-CXR: every scan is PA).
    """
    if metadata_only(options):
        notes.append("plan: no image opened; sex, age and view from DICOM tags are unknown")
        return frame, [], False
    files = frame["image_path"].astype(str).tolist()
    headers, reasons = read_dicom_headers(root, files, options)
    kept, aside = set_aside_rows(frame, reasons)
    good = [i for i, reason in enumerate(reasons) if reason is None]
    tags = pd.DataFrame([headers[i] for i in good],
                        columns=["PatientID", "PatientSex", "PatientAge", "ViewPosition", "SOPInstanceUID"],
                        dtype=object)
    for column, values in demographics(tags, notes).items():
        tagged = values.to_numpy(dtype=float, na_value=np.nan) if column == "age" else \
            values.astype("Float64").to_numpy(dtype=float, na_value=np.nan)
        if column in kept:  # a value the metadata already gave fills a file without the tag
            known = kept[column].astype("Float64").to_numpy(dtype=float, na_value=np.nan)
            tagged = np.where(np.isnan(tagged), known, tagged)
        kept[column] = tagged if column == "age" else pd.array(
            [None if np.isnan(v) else int(v) for v in tagged], dtype="Int64")
    if view_default is not None:
        missing = kept[aux_column("view")].isna()
        kept.loc[missing, aux_column("view")] = view_default
    kept["instance_uid"] = tags["SOPInstanceUID"].to_numpy()
    kept["not_chest"] = pd.Series([not_chest_reason(headers[i]) if headers[i].get("kind") == KIND_DICOM else None
                                   for i in good], dtype=object)
    if patient_from_tag:
        pid = tags["PatientID"].map(lambda v: v.strip() if isinstance(v, str) else "")
        has = (pid != "").to_numpy()
        kept.loc[has, "patient_id"] = pid[has].to_numpy()
        if (~has).any():
            notes.append(f"{int((~has).sum())} DICOM file(s) without PatientID: each such image is its own patient")
    return kept, aside, True


__all__ = ["AMBIGUOUS", "attach_dicom_tags", "group_rows", "index_files", "locate", "locate_rows", "metadata_only",
           "row_list", "set_aside_rows"]
