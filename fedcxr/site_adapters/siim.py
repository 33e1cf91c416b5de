"""SIIM-ACR Pneumothorax adapter: run-length mask rows → an image-level pneumothorax label.

Layout (the challenge's download; first label file found wins)::

    INPUT/
      train-rle.csv          ImageId, EncodedPixels — one row per mask; " -1" = no pneumothorax
                             (the header's second name starts with a space in the original file)
      (or stage_2_train.csv, the second stage's file with the same columns, or TorchXRayVision's
      siim-pneumothorax-train-rle.csv.gz)
      dicom-images-train/<StudyInstanceUID>/<SeriesInstanceUID>/<ImageId>.dcm
      dicom-images-test/...  no labels: not read

Each image is found by its file name ``<ImageId>.dcm`` anywhere under INPUT (the nested
study/series folders differ between mirrors); one with no file keeps
``dicom-images-train/<ImageId>.dcm`` and is set aside as a missing file.

Rows: one per image (a distinct ``ImageId``), ``source_row`` its first mask row. An image is
``pneumothorax`` positive when any of its rows holds a mask, negative when its only rows say
``-1`` (the challenge's encoding; several mask rows are several pneumothorax regions). A cell
that is neither ``-1`` nor a run-length list (pairs of non-negative integers) sets the image
aside naming the row. TorchXRayVision's ``SIIM_Pneumothorax_Dataset`` keeps one sample per
*row*, so an image with three masks counts three times there (12,954 rows for 12,047 images);
here each image counts once.

Demographics and patient: the challenge's DICOMs (drawn from NIH ChestX-ray14) keep
``PatientID``, ``PatientSex``, ``PatientAge`` and ``ViewPosition``; the patient is the
``PatientID`` tag (the ``ImageId`` when the tag is blank). No official split (the stage-2
test masks were not released with this file): ingest splits by patient hash.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from fedcxr.site_adapters.base import AdapterOptions, IngestError, SetAside, SourceTable
from fedcxr.site_adapters.export_images import attach_dicom_tags, group_rows, index_files, locate_rows
from fedcxr.site_adapters.tables import find_file, read_table, relative_name
from fedcxr.vocab import raw_column

ADAPTER_VERSION = "1"

#: The classes this source labels.
SOURCE_CLASSES: tuple[str, ...] = ("pneumothorax",)

LABEL_FILES = ["train-rle.csv", "stage_2_train.csv", "siim-pneumothorax-train-rle.csv.gz",
               "siim-pneumothorax-train-rle.csv"]
IMAGE_DIR = "dicom-images-train"
IMAGE, PIXELS = "ImageId", "EncodedPixels"
_RLE = re.compile(r"^\d+(\s+\d+)*$")


def read_siim(input_dir: Path, options: AdapterOptions) -> SourceTable:
    """Read a SIIM-ACR Pneumothorax export (see module doc) into a :class:`SourceTable`."""
    input_dir = Path(input_dir)
    frame, set_aside, notes, rows_read = read_siim_labels(input_dir)
    index = index_files(input_dir, (".dcm",))
    frame, ambiguous = locate_rows(frame, index)
    set_aside += ambiguous
    frame, aside, checked = attach_dicom_tags(frame, input_dir, options, notes, patient_from_tag=True)
    return SourceTable(
        source="siim", adapter_version=ADAPTER_VERSION, root=input_dir, frame=frame, classes=list(SOURCE_CLASSES),
        set_aside=set_aside + aside, rows_read=rows_read, headers_checked=checked, notes=notes,
    )


def mask_row_value(text: object) -> float:
    """1.0 for a run-length mask, 0.0 for ``-1``; ``ValueError`` for anything else."""
    cell = str(text).strip() if isinstance(text, str) else ""
    if cell == "-1":
        return 0.0
    if _RLE.match(cell) and len(cell.split()) % 2 == 0:
        return 1.0
    raise ValueError(f"not a run-length mask or -1: {cell[:40]!r}" if cell else "empty mask cell")


def read_siim_labels(input_dir: Path) -> tuple[pd.DataFrame, list[SetAside], list[str], int]:
    """Metadata only: ``(frame, set_aside, notes, rows_read)``, one row per image.

    ``patient_id`` is the ``ImageId`` here; :func:`read_siim` replaces it by the DICOM
    ``PatientID`` when the file has one.
    """
    csv = find_file(input_dir, LABEL_FILES, max_depth=2)
    if csv is None:
        raise IngestError(f"{input_dir}: no SIIM-ACR label file (looked for {', '.join(LABEL_FILES)})")
    name = relative_name(csv, input_dir)
    table = read_table(csv, base=input_dir, dtype=str)
    table.columns = [str(c).strip() for c in table.columns]  # " EncodedPixels" in the original file
    missing = [c for c in (IMAGE, PIXELS) if c not in table]
    if missing:
        raise IngestError(f"{name}: missing required column(s) {', '.join(repr(c) for c in missing)}; "
                          f"found {', '.join(repr(c) for c in table.columns)}")
    ids = table[IMAGE].str.strip().replace("", np.nan)
    keys, first, groups = group_rows(ids)
    cells = table[PIXELS].to_numpy(dtype=object)
    labels = np.zeros(len(keys))
    reasons: list = [None] * len(keys)
    for k, rows in enumerate(groups):
        for r in rows:
            try:
                labels[k] = max(labels[k], mask_row_value(cells[r - 1]))
            except ValueError as exc:
                reasons[k] = reasons[k] or f"unknown label value: {exc} in column {PIXELS!r} (row {r})"
    frame = pd.DataFrame({
        "image_path": [f"{IMAGE_DIR}/{k}.dcm" for k in keys],
        "patient_id": keys, "study_id": keys,
        raw_column("pneumothorax"): labels,
        "source_file": name, "source_row": first,
    })
    bad = np.array([r is not None for r in reasons], dtype=bool)
    blank = np.flatnonzero(ids.isna().to_numpy()) + 1
    set_aside = [SetAside(name, int(r), f"missing value: empty {IMAGE!r}", None) for r in blank]
    set_aside += [SetAside(name, int(first[k]), reasons[k], frame["image_path"][k]) for k in np.flatnonzero(bad)]
    multi = sum(len(g) > 1 for g in groups)
    notes = [f"metadata: {name} ({len(table)} mask rows, {len(keys)} images; {multi} image(s) with several rows: "
             "positive when any row holds a mask)"]
    return frame.loc[~bad].reset_index(drop=True), set_aside, notes, len(keys) + len(blank)


__all__ = ["ADAPTER_VERSION", "SOURCE_CLASSES", "mask_row_value", "read_siim", "read_siim_labels"]
