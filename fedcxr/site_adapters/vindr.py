"""VinDr-CXR adapter: several radiologists per image → one image-level label per finding.

Layouts (first found wins):

* PhysioNet release ``vindr-cxr/1.0.0``::

      INPUT/annotations/image_labels_train.csv   image_id, rad_id, 28 label columns (0/1) — one
                                                 row per (image, radiologist): 3 per train image
      INPUT/annotations/image_labels_test.csv    image_id, 28 label columns — the consensus of
                                                 five radiologists, one row per image
      INPUT/annotations/annotations_{train,test}.csv   boxes (read only without image_labels_*)
      INPUT/train/<image_id>.dicom, INPUT/test/<image_id>.dicom

* Kaggle VinBigData challenge (and TorchXRayVision's ``vinbigdata-train.csv.gz``)::

      INPUT/train.csv     image_id, class_name, class_id, rad_id, x_min, y_min, x_max, y_max —
                          one row per box, or one ``No finding`` row per radiologist with none
      INPUT/train/<image_id>.dicom

  Box tables hold the 14 local findings and ``No finding`` only.

Rows: one per image; ``source_row`` is the image's first row in its table. Images are found
by file name (``<image_id>.dicom`` or ``.dcm``) anywhere under INPUT.

Readers (Nguyen et al., *Sci Data* 2022: each training image read independently by three
radiologists, each test image by a consensus of five). Per finding and image, count the
readers who name it (``k``) among those who read the image (``n``):

* ``any`` (default, ``--readers any``): positive when ``k ≥ 1`` — the reading TorchXRayVision's
  ``VinBrain_Dataset`` uses (it joins every reader's class names per image);
* ``majority`` (``--readers majority``): positive when ``k > n/2``, negative when ``k < n/2``,
  uncertain (-1, then ``--uncertain`` decides) on a tie.

``no_finding`` follows the dual rule: under ``any`` it is positive only when *every* reader
says "No finding" (one reader naming a finding makes the image abnormal, so no image is both
"no finding" and positive for a finding); under ``majority`` when most readers say so. A
label table cell outside {0, 1, blank} or an unknown ``class_name`` sets the image aside; an
unknown label *column* stops the ingest (a misspelt finding must not vanish).

Classes: see :data:`COLUMN_CLASSES` (README "VinDr-CXR" table). ``Clavicle fracture`` and
``Rib fracture`` both map to ``fracture`` (a reader names a fracture when they name either).
TorchXRayVision calls ``Other lesion`` "Lesion"; here it is ``other_lesion``, not CheXpert's
``lung_lesion`` (VinDr's class is any other lesion, in or outside the lung).

Demographics: the VinDr DICOMs keep only ``PatientSex`` and ``PatientAge`` of the patient tags
(the release's ``de-identification/tags.csv``); view is PA, as the dataset documents every scan,
unless a ``ViewPosition`` tag says otherwise. There is no patient id: each image is its own
patient. Official split: ``train`` → train/val by hash, ``test`` → test, when both label files
are present (else a hash split, noted).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from fedcxr.site_adapters.base import AdapterOptions, IngestError, SetAside, SourceTable, require_columns
from fedcxr.site_adapters.export_images import attach_dicom_tags, group_rows, index_files, locate_rows, row_list
from fedcxr.site_adapters.tables import find_file, read_table, relative_name
from fedcxr.vocab import CLASSES, raw_column

ADAPTER_VERSION = "1"

#: VinDr label (column of ``image_labels_*.csv`` or ``class_name`` of a box table) → class.
COLUMN_CLASSES: dict[str, str] = {
    "Aortic enlargement": "aortic_enlargement", "Atelectasis": "atelectasis",
    "Calcification": "calcification", "Cardiomegaly": "cardiomegaly",
    "Clavicle fracture": "fracture", "Consolidation": "consolidation", "Edema": "edema",
    "Emphysema": "emphysema", "Enlarged PA": "enlarged_pa", "ILD": "ild",
    "Infiltration": "infiltration", "Lung Opacity": "lung_opacity", "Lung cavity": "lung_cavity",
    "Lung cyst": "lung_cyst", "Mediastinal shift": "mediastinal_shift", "Nodule/Mass": "nodule_mass",
    "Pleural effusion": "pleural_effusion", "Pleural thickening": "pleural_thickening",
    "Pneumothorax": "pneumothorax", "Pulmonary fibrosis": "pulmonary_fibrosis",
    "Rib fracture": "fracture", "Other lesion": "other_lesion", "COPD": "copd",
    "Lung tumor": "lung_tumor", "Pneumonia": "pneumonia", "Tuberculosis": "tuberculosis",
    "Other diseases": "other_disease", "Other disease": "other_disease", "No finding": "no_finding",
}
#: The classes this source can label, in canonical order (a box table labels 15 of them).
SOURCE_CLASSES: tuple[str, ...] = tuple(c for c in CLASSES if c in set(COLUMN_CLASSES.values()))
RULES = ("any", "majority")

LABEL_TABLES = {"train": ["image_labels_train.csv"], "test": ["image_labels_test.csv"]}
BOX_TABLES = {"train": ["annotations_train.csv", "train.csv", "vinbigdata-train.csv.gz", "vinbigdata-train.csv"],
              "test": ["annotations_test.csv"]}
IMAGE, READER, CLASS_NAME = "image_id", "rad_id", "class_name"
_NORM = {re.sub(r"[^a-z0-9]", "", k.lower()): k for k in COLUMN_CLASSES}


def _vendor(name: str) -> Optional[str]:
    """The VinDr label a column or class name spells (case and punctuation ignored)."""
    return _NORM.get(re.sub(r"[^a-z0-9]", "", str(name).lower()))


@dataclass
class Readings:
    """One label file read: per image its first row, reader count and per-class reader votes."""

    file: str
    keys: np.ndarray  # image ids, first-appearance order
    first: np.ndarray  # 1-based first row of each image
    rows: list  # all rows of each image
    classes: list[str]
    positive: dict[str, np.ndarray]  # class → readers naming it, per image
    read: dict[str, np.ndarray]  # class → readers giving a value (0 or 1), per image
    problems: list  # reason or None, per image
    blank: list[int]  # rows with no image_id


def read_vindr(input_dir: Path, options: AdapterOptions) -> SourceTable:
    """Read a VinDr-CXR export (see module doc) into a :class:`SourceTable`."""
    input_dir = Path(input_dir)
    rule = str(options.extra.get("readers") or "any")
    frame, set_aside, notes, rows_read, classes = read_vindr_labels(input_dir, rule)
    index = index_files(input_dir, (".dicom", ".dcm"))
    frame, ambiguous = locate_rows(frame, index)
    set_aside += ambiguous
    frame, aside, checked = attach_dicom_tags(frame, input_dir, options, notes, view_default=0)
    return SourceTable(
        source="vindr", adapter_version=ADAPTER_VERSION, root=input_dir, frame=frame, classes=classes,
        set_aside=set_aside + aside, rows_read=rows_read, headers_checked=checked, notes=notes,
    )


def read_vindr_labels(input_dir: Path, rule: str = "any") -> tuple[pd.DataFrame, list[SetAside], list[str], int, list[str]]:
    """Metadata only: ``(frame, set_aside, notes, rows_read, classes)``, one row per image."""
    if rule not in RULES:
        raise IngestError(f"--readers must be one of {', '.join(RULES)}, got {rule!r}")
    readings: dict[str, Readings] = {}
    notes: list[str] = []
    for split in ("train", "test"):
        path = find_file(input_dir, LABEL_TABLES[split], subdirs=("annotations",), max_depth=3)
        kind = "labels"
        if path is None:
            path, kind = find_file(input_dir, BOX_TABLES[split], subdirs=("annotations",), max_depth=3), "boxes"
        if path is not None:
            readings[split] = read_label_table(path, input_dir) if kind == "labels" else read_box_table(path, input_dir)
            notes.append(f"{split}: {readings[split].file} ({kind}, {len(readings[split].keys)} images)")
    if not readings:
        raise IngestError(f"{input_dir}: no VinDr-CXR label file (looked for "
                          f"{', '.join(LABEL_TABLES['train'] + BOX_TABLES['train'])}, in annotations/ too)")
    official = len(readings) == 2
    if not official:
        notes.append(f"only the {next(iter(readings))} labels: no official split, ingest splits by patient hash")
    classes = [c for c in CLASSES if any(c in r.classes for r in readings.values())]
    parts, set_aside = [], []
    for split, r in readings.items():
        part = _image_rows(r, rule, classes, split, official)
        set_aside += [SetAside(r.file, row, "missing value: empty 'image_id'", None) for row in r.blank]
        parts.append(part)
    frame = pd.concat(parts, ignore_index=True)
    twice = frame["patient_id"].duplicated(keep=False).to_numpy()
    reasons = frame["_problem"].where(frame["_problem"].notna(), None).to_numpy(dtype=object)
    for i in np.flatnonzero(twice):
        reasons[i] = reasons[i] or "image in both the train and the test labels"
    bad = np.array([r is not None for r in reasons], dtype=bool)
    set_aside += [SetAside(f, int(row), reasons[i], p) for i, f, row, p in
                  zip(np.flatnonzero(bad), frame.loc[bad, "source_file"], frame.loc[bad, "source_row"],
                      frame.loc[bad, "image_path"])]
    notes.append(f"readers: {rule!r} rule ({'a finding is positive when any radiologist names it' if rule == 'any' else 'positive when most radiologists name it, -1 on a tie'}); "
                 "no patient id in VinDr: each image is its own patient")
    rows_read = len(frame) + sum(len(r.blank) for r in readings.values())
    frame = frame.loc[~bad].drop(columns="_problem").reset_index(drop=True)
    return frame, set_aside, notes, rows_read, classes


def read_label_table(path: Path, base: Path) -> Readings:
    """``image_labels_*.csv``: one row per (image, reader), one 0/1 column per VinDr label."""
    name = relative_name(path, base)
    table = read_table(path, base=base, dtype=str)
    table.columns = [str(c).strip() for c in table.columns]
    require_columns(table, [IMAGE], name)
    reader = next((c for c in table.columns if c.lower() == READER.lower()), None)
    columns = [c for c in table.columns if c not in {IMAGE, reader}]
    unknown = [c for c in columns if _vendor(c) is None]
    if unknown:
        raise IngestError(f"{name}: column(s) {', '.join(repr(c) for c in unknown)} are not VinDr-CXR labels "
                          f"(known: {', '.join(k for k in COLUMN_CLASSES if k != 'Other disease')})")
    ids = table[IMAGE].str.strip().replace("", np.nan)
    keys, first, groups = group_rows(ids)
    classes = [c for c in CLASSES if any(COLUMN_CLASSES[_vendor(col)] == c for col in columns)]
    reader_values = {cls: np.full(len(table), np.nan) for cls in classes}  # per row: any of its columns
    bad_cell: list = [None] * len(table)
    for col in columns:
        cls = COLUMN_CLASSES[_vendor(col)]
        text = table[col].str.strip().replace("", np.nan)
        values = pd.to_numeric(text, errors="coerce").to_numpy(dtype=float, copy=True)
        invalid = text.notna().to_numpy() & ~np.isin(values, (0.0, 1.0))
        for i in np.flatnonzero(invalid):
            bad_cell[i] = bad_cell[i] or f"unknown label value: {table[col].iloc[i]!r} in column {col!r}"
        values[invalid] = np.nan
        current = reader_values[cls]
        reader_values[cls] = np.where(np.isnan(current), values, np.fmax(current, values))
    codes = pd.factorize(ids, use_na_sentinel=True)[0]
    values = pd.DataFrame(reader_values).loc[codes >= 0]
    image = codes[codes >= 0]
    positive_counts = (values == 1.0).groupby(image).sum()
    read_counts = values.notna().groupby(image).sum()
    positive = {c: positive_counts[c].to_numpy(dtype=float) for c in classes}
    read = {c: read_counts[c].to_numpy(dtype=float) for c in classes}
    problems: list = [None] * len(keys)
    for i in np.flatnonzero([b is not None for b in bad_cell]):
        if codes[i] >= 0 and problems[codes[i]] is None:
            problems[codes[i]] = f"{bad_cell[i]} ({name} row {i + 1})"
    if reader is not None:
        pairs = pd.DataFrame({"k": codes, "r": table[reader].str.strip()}).loc[codes >= 0]
        for k in pairs.loc[pairs.duplicated(keep=False), "k"].unique():
            problems[k] = problems[k] or f"the same radiologist twice for one image ({name} {row_list(groups[k])})"
    blank = (np.flatnonzero(ids.isna().to_numpy()) + 1).tolist()
    return Readings(name, keys, first, groups, classes, positive, read, problems, blank)


def read_box_table(path: Path, base: Path) -> Readings:
    """A box table (``train.csv``, ``annotations_*.csv``): one row per box or per "No finding".

    A radiologist who read an image names every class they drew a box for; the readers of an
    image are its distinct ``rad_id`` values (a table without ``rad_id`` is one consensus reader).
    """
    name = relative_name(path, base)
    table = read_table(path, base=base, dtype=str)
    table.columns = [str(c).strip() for c in table.columns]
    require_columns(table, [IMAGE, CLASS_NAME], name)
    ids = table[IMAGE].str.strip().replace("", np.nan)
    readers = table[READER].str.strip().fillna("") if READER in table else pd.Series([""] * len(table))
    names = table[CLASS_NAME].str.strip().fillna("").to_numpy(dtype=object)
    keys, first, groups = group_rows(ids)
    vocab = sorted({COLUMN_CLASSES[_vendor(n)] for n in names if _vendor(n)}, key=CLASSES.index)
    # a box table's readers give a value for all 15 of its classes: absent from a reader = 0
    classes = [c for c in CLASSES if c in {COLUMN_CLASSES[k] for k in (
        "Aortic enlargement", "Atelectasis", "Calcification", "Cardiomegaly", "Consolidation", "ILD",
        "Infiltration", "Lung Opacity", "Nodule/Mass", "Other lesion", "Pleural effusion", "Pleural thickening",
        "Pneumothorax", "Pulmonary fibrosis", "No finding")} | set(vocab)]
    codes = pd.factorize(ids, use_na_sentinel=True)[0]
    label = pd.Series([COLUMN_CLASSES.get(_vendor(n) or "", None) for n in names], dtype=object)
    problems: list = [None] * len(keys)
    for i in np.flatnonzero((label.isna() & (codes >= 0)).to_numpy()):
        problems[codes[i]] = problems[codes[i]] or (f"unknown label value: {names[i]!r} in column {CLASS_NAME!r} "
                                                    f"({name} row {i + 1})")
    boxes = pd.DataFrame({"k": codes, "reader": readers.to_numpy(dtype=object), "cls": label}).loc[codes >= 0]
    n_readers = boxes.groupby("k")["reader"].nunique().reindex(range(len(keys)), fill_value=0).to_numpy(dtype=float)
    named = boxes.dropna(subset=["cls"]).drop_duplicates()  # a reader's several boxes of one class: one vote
    counts = pd.crosstab(named["k"], named["cls"]).reindex(index=range(len(keys)), columns=classes, fill_value=0)
    positive = {c: counts[c].to_numpy(dtype=float) for c in classes}
    read = {c: n_readers.copy() for c in classes}
    blank = (np.flatnonzero(ids.isna().to_numpy()) + 1).tolist()
    return Readings(name, keys, first, groups, classes, positive, read, problems, blank)


def vote(positive: np.ndarray, read: np.ndarray, rule: str, *, dual: bool = False) -> np.ndarray:
    """Image-level raw label from reader counts (see module doc): 1, 0, -1 (tie) or NaN (no reader).

    ``dual`` (``no_finding``): under ``any`` positive only when every reader says so.
    """
    positive, read = np.asarray(positive, float), np.asarray(read, float)
    if rule == "any":
        out = np.where(positive == read, 1.0, 0.0) if dual else np.where(positive >= 1, 1.0, 0.0)
    else:
        out = np.where(2 * positive > read, 1.0, np.where(2 * positive < read, 0.0, -1.0))
    return np.where(read > 0, out, np.nan)


def _image_rows(r: Readings, rule: str, classes: list[str], split: str, official: bool) -> pd.DataFrame:
    """One canonical row per image of ``r``; ``image_path`` is the documented ``<split>/<image_id>.dicom``."""
    frame = pd.DataFrame({
        "image_path": [f"{split}/{k}.dicom" for k in r.keys],
        "patient_id": r.keys, "study_id": r.keys,
        "official_split": pd.Series([{"train": "train_val", "test": "test"}[split] if official else None] * len(r.keys),
                                    dtype=object),
        "source_file": r.file, "source_row": r.first,
        "_problem": pd.Series(r.problems, dtype=object),
    })
    for cls in classes:
        if cls in r.classes:
            frame[raw_column(cls)] = vote(r.positive[cls], r.read[cls], rule, dual=cls == "no_finding")
        else:
            frame[raw_column(cls)] = np.nan
    return frame


__all__ = ["ADAPTER_VERSION", "COLUMN_CLASSES", "RULES", "SOURCE_CLASSES", "read_box_table", "read_label_table",
           "read_vindr", "read_vindr_labels", "vote"]
