"""RSNA Pneumonia Detection Challenge adapter: box table + DICOMs → image-level labels.

Layout (the Kaggle download ``rsna-pneumonia-detection-challenge``, unpacked)::

    INPUT/
      stage_2_train_labels.csv          patientId,x,y,width,height,Target — one row per box;
                                        an image without a box has one row, blank box, Target 0
      stage_2_detailed_class_info.csv   patientId,class — optional, one row per labels row
      stage_2_train_images/<patientId>.dcm
      stage_2_test_images/              no public labels: not read

(``stage_1_train_labels.csv`` / ``stage_1_detailed_class_info.csv`` of the first stage are
accepted when the stage-2 files are absent.) Each DICOM is found by its file name anywhere
under INPUT; a ``patientId`` with no file keeps ``stage_2_train_images/<patientId>.dcm`` and
is set aside as a missing file.

Rows: one per image (a distinct ``patientId``; RSNA's ``patientId`` names an image, and the
challenge gives each of its 26,684 images its own id, so each image is its own patient here —
the NIH patient linkage was not released). ``source_row`` is the image's first labels row.

Labels (Shih et al., *Radiology: AI* 2019, and the challenge's data page):

* ``Target`` 1 = the image has a "lung opacity suggestive of pneumonia" (boxed); 0 = none.
  It is the same on every row of an image; rows that disagree, or a value other than 0/1, set
  the image aside naming the rows. ``pneumonia`` = ``lung_opacity`` = ``Target`` — the
  challenge's one finding, read as TorchXRayVision reads it. Note ``lung_opacity`` here is the
  challenge's class ("opacity suggestive of pneumonia"), narrower than CheXpert's Lung Opacity.
* ``stage_2_detailed_class_info.csv`` adds ``no_finding``: ``Normal`` → 1, ``No Lung Opacity /
  Not Normal`` and ``Lung Opacity`` → 0 (TorchXRayVision does not read this file). Its class
  must agree with ``Target`` (``Lung Opacity`` ⇔ 1); an image whose rows disagree, or with an
  unknown class, is set aside. Without the file ``no_finding`` is not a class of the site.

Demographics from the DICOM tags (the challenge's DICOMs keep ``PatientSex``, ``PatientAge``
and ``ViewPosition`` AP/PA): see :func:`fedcxr.site_adapters.export_images.attach_dicom_tags`.
No official split (stage-2 test labels are not public): ingest splits by patient hash.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from fedcxr.site_adapters.base import AdapterOptions, IngestError, SetAside, SourceTable, require_columns
from fedcxr.site_adapters.export_images import attach_dicom_tags, group_rows, index_files, locate_rows, row_list
from fedcxr.site_adapters.tables import find_file, read_table, relative_name
from fedcxr.vocab import raw_column

ADAPTER_VERSION = "1"

#: The classes this source labels; ``no_finding`` only with the detailed class file.
SOURCE_CLASSES: tuple[str, ...] = ("pneumonia", "lung_opacity", "no_finding")

LABEL_FILES = ["stage_2_train_labels.csv", "stage_1_train_labels.csv"]
DETAIL_FILES = ["stage_2_detailed_class_info.csv", "stage_1_detailed_class_info.csv"]
IMAGE_DIR = "stage_2_train_images"
PATIENT, TARGET, CLASS = "patientId", "Target", "class"

#: ``stage_2_detailed_class_info.csv`` class → (Target it implies, no_finding).
DETAILED_CLASSES: dict[str, tuple[float, float]] = {
    "Lung Opacity": (1.0, 0.0),
    "No Lung Opacity / Not Normal": (0.0, 0.0),
    "Normal": (0.0, 1.0),
}


def read_rsna(input_dir: Path, options: AdapterOptions) -> SourceTable:
    """Read an RSNA Pneumonia export (see module doc) into a :class:`SourceTable`."""
    input_dir = Path(input_dir)
    frame, set_aside, notes, rows_read, classes = read_rsna_labels(input_dir)
    index = index_files(input_dir, (".dcm",))
    frame, ambiguous = locate_rows(frame, index)
    set_aside += ambiguous
    frame, aside, checked = attach_dicom_tags(frame, input_dir, options, notes)
    return SourceTable(
        source="rsna", adapter_version=ADAPTER_VERSION, root=input_dir, frame=frame, classes=classes,
        set_aside=set_aside + aside, rows_read=rows_read, headers_checked=checked, notes=notes,
    )


def read_rsna_labels(input_dir: Path) -> tuple[pd.DataFrame, list[SetAside], list[str], int, list[str]]:
    """Metadata only: ``(frame, set_aside, notes, rows_read, classes)``; one row per image.

    ``frame`` has ``image_path`` = the documented ``stage_2_train_images/<patientId>.dcm``;
    no file is opened (the plan mode and the real-metadata tests call this directly).
    """
    csv = find_file(input_dir, LABEL_FILES, max_depth=2)
    if csv is None:
        raise IngestError(f"{input_dir}: no RSNA label file (looked for {', '.join(LABEL_FILES)})")
    name = relative_name(csv, input_dir)
    table = read_table(csv, base=input_dir, dtype=str)
    table.columns = [str(c).strip() for c in table.columns]
    require_columns(table, [PATIENT, TARGET], name)
    ids = table[PATIENT].str.strip().replace("", np.nan)
    notes = [f"metadata: {name} ({len(table)} box rows)"]
    set_aside = [SetAside(name, int(r), f"missing value: empty {PATIENT!r}", None)
                 for r in np.flatnonzero(ids.isna().to_numpy()) + 1]
    keys, first, groups = group_rows(ids)
    target = table[TARGET].str.strip().to_numpy(dtype=object)
    labels = np.full(len(keys), np.nan)
    reasons: list = [None] * len(keys)
    for k, rows in enumerate(groups):
        values = {target[r - 1] for r in rows}
        if len(values) > 1:
            reasons[k] = f"conflicting {TARGET!r} values {sorted(map(str, values))} in {row_list(rows)}"
        elif (value := values.pop()) not in {"0", "1"}:
            reasons[k] = f"unknown label value: {value!r} in column {TARGET!r} ({row_list(rows)})"
        else:
            labels[k] = float(value)
    classes = ["pneumonia", "lung_opacity"]
    frame = pd.DataFrame({
        "image_path": [f"{IMAGE_DIR}/{k}.dcm" for k in keys],
        "patient_id": keys, "study_id": keys,
        raw_column("pneumonia"): labels, raw_column("lung_opacity"): labels,
        "source_file": name, "source_row": first,
    })
    detail = find_file(input_dir, DETAIL_FILES, max_depth=2)
    if detail is not None:
        no_finding, detail_reasons, detail_notes = _detailed_classes(detail, input_dir, keys, labels)
        frame[raw_column("no_finding")] = no_finding
        reasons = [r or d for r, d in zip(reasons, detail_reasons)]
        classes.append("no_finding")
        notes += detail_notes
    else:
        notes.append(f"no {DETAIL_FILES[0]}: no_finding is not labeled")
    bad = np.array([r is not None for r in reasons], dtype=bool)
    set_aside += [SetAside(name, int(first[k]), reasons[k], frame["image_path"][k]) for k in np.flatnonzero(bad)]
    notes.append(f"{len(keys)} images; RSNA gives each image its own patientId (no patient linkage), so each "
                 "image is its own patient")
    return frame.loc[~bad].reset_index(drop=True), set_aside, notes, len(keys) + int(ids.isna().sum()), classes


def _detailed_classes(path: Path, base: Path, keys: np.ndarray, target: np.ndarray):
    """``no_finding`` per image from the detailed class file, a reason per image, and notes."""
    name = relative_name(path, base)
    table = read_table(path, base=base, dtype=str)
    table.columns = [str(c).strip() for c in table.columns]
    require_columns(table, [PATIENT, CLASS], name)
    ids = table[PATIENT].str.strip()
    values = table[CLASS].str.strip().fillna("")
    by_image: dict[str, set] = {}
    rows_of: dict[str, list] = {}
    for i, (pid, value) in enumerate(zip(ids.to_numpy(dtype=object), values.to_numpy(dtype=object))):
        if isinstance(pid, str) and pid:
            by_image.setdefault(pid, set()).add(value)
            rows_of.setdefault(pid, []).append(i + 1)
    no_finding = np.full(len(keys), np.nan)
    reasons: list = [None] * len(keys)
    for k, pid in enumerate(keys):
        found = by_image.get(pid)
        if found is None:
            continue
        where = f"{name} {row_list(rows_of[pid])}"
        unknown = sorted(v for v in found if v not in DETAILED_CLASSES)
        if unknown:
            reasons[k] = f"unknown label value: {unknown[0]!r} in column {CLASS!r} ({where})"
        elif len(found) > 1:
            reasons[k] = f"conflicting {CLASS!r} values {sorted(found)} ({where})"
        else:
            implied, normal = DETAILED_CLASSES[found.pop()]
            if not np.isnan(target[k]) and implied != target[k]:
                reasons[k] = f"{CLASS!r} disagrees with Target {int(target[k])} ({where})"
            no_finding[k] = normal
    notes = [f"{name}: no_finding = class 'Normal'"]
    missing = sum(pid not in by_image for pid in keys)
    if missing:
        notes.append(f"{missing} image(s) have no row in {name}: no_finding not labeled there")
    extra = len(set(by_image) - set(keys))
    if extra:
        notes.append(f"{extra} patientId(s) of {name} are not in the label file: ignored")
    return no_finding, reasons, notes


__all__ = ["ADAPTER_VERSION", "DETAILED_CLASSES", "SOURCE_CLASSES", "read_rsna", "read_rsna_labels"]
