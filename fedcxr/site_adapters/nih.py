"""NIH ChestX-ray14 adapter: ``Data_Entry`` csv + official split lists → canonical rows.

Accepted metadata files (first found wins, at the input folder or up to two levels down):
``Data_Entry_2017_v2020.csv(.gz)`` (2020 revision), ``Data_Entry_2017.csv(.gz)`` (2017 file:
trailing header comma → an extra empty column) and the Kaggle 5 % sample ``sample_labels.csv``
(ages as ``060Y``/``013M``/``001D`` strings, renamed size columns). Columns are picked by
name, so the bracketed header names that split into 11 columns
(``OriginalImage[Width``, ``Height]``, ...) never matter.

Semantics (``../shared/data/nih-chestxray14/README.md`` lists the quirks):

* ``Finding Labels`` is a ``|``-separated list. NIH labels all 14 findings plus
  ``No Finding`` on every image, so a class absent from the list is a negative (0), never
  missing. A name that is not one of those 15 sets the row aside, naming the value.
* ``train_val_list.txt`` / ``test_list.txt`` (beside the csv) give ``official_split``
  ``train_val`` / ``test``; ingest cuts ``val`` out of ``train_val`` by patient hash. An image
  in neither list gets no official split (hash split; counted in the notes); an image in
  both is set aside.
* Images are found by one directory listing of ``images/``, ``images_*/`` (and their
  ``images/`` subfolder, as NIH ships ``images_001/images/``) and the csv folder itself;
  no per-row ``stat``. An image found nowhere keeps ``images/<name>`` and the shared
  image check sets it aside as missing.
* An age that cannot be parsed or is out of range (the sample's ``411Y``) becomes unknown
  (null); the row is kept and the count is noted. Same for an unknown sex value.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from fedcxr.site_adapters.base import AdapterOptions, IngestError, SourceTable, require_columns
from fedcxr.site_adapters.inputs import max_decompressed, read_input_bytes
from fedcxr.site_adapters.paths import is_utf8
from fedcxr.site_adapters.tables import (
    failed_note,
    find_file,
    map_distinct,
    member_of,
    read_table,
    relative_name,
    rows_set_aside,
    to_codes,
)
from fedcxr.vocab import CLASSES, age_bin_code, aux_column, canonical_class, parse_age, raw_column, sex_code, view_code

ADAPTER_VERSION = "1"

#: The classes this source labels (every adapter declares them; ``None``: read from the export):
#: the 14 NIH findings + no_finding, in canonical order.
SOURCE_CLASSES: tuple[str, ...] = tuple(
    c for c in CLASSES
    if c in {
        "atelectasis", "cardiomegaly", "consolidation", "edema", "pleural_effusion", "pneumonia",
        "pneumothorax", "infiltration", "mass", "nodule", "emphysema", "fibrosis",
        "pleural_thickening", "hernia", "no_finding",
    }
)

METADATA_FILES = [
    "Data_Entry_2017_v2020.csv.gz", "Data_Entry_2017_v2020.csv",
    "Data_Entry_2017.csv.gz", "Data_Entry_2017.csv",
    "sample_labels.csv",
]
SPLIT_LISTS = {"train_val": "train_val_list.txt", "test": "test_list.txt"}

IMAGE, LABELS, FOLLOW_UP, PATIENT = "Image Index", "Finding Labels", "Follow-up #", "Patient ID"
AGE, SEX, VIEW = "Patient Age", "Patient Gender", "View Position"
REQUIRED = [IMAGE, LABELS, PATIENT]
WANTED = {IMAGE, LABELS, FOLLOW_UP, PATIENT, AGE, SEX, VIEW}


def read_nih(input_dir: Path, options: AdapterOptions) -> SourceTable:
    """Read an NIH ChestX-ray14 export (see module doc) into a :class:`SourceTable`."""
    input_dir = Path(input_dir)
    csv = find_file(input_dir, METADATA_FILES, max_depth=2)
    if csv is None:
        raise IngestError(f"{input_dir}: no NIH metadata file (looked for {', '.join(METADATA_FILES)})")
    root, name = csv.parent, relative_name(csv, input_dir)
    df = read_table(csv, base=input_dir, usecols=lambda c: str(c).strip() in WANTED, dtype=str)
    df.columns = [str(c).strip() for c in df.columns]
    require_columns(df, REQUIRED, name)
    n = len(df)
    rows = np.arange(1, n + 1)
    notes = [f"metadata: {name} ({n} rows)"]

    image = df[IMAGE].str.strip()
    patient = df[PATIENT].str.strip()
    labels, reasons = _parse_findings(df[LABELS])
    for col, series in ((IMAGE, image), (PATIENT, patient)):
        empty = (series.isna() | (series == "")).to_numpy()
        for i in np.flatnonzero(empty):
            reasons[i] = reasons[i] or f"missing value: empty {col!r}"
    official, split_reasons, split_notes = _official_splits(image, root, input_dir)
    notes += split_notes
    for i in np.flatnonzero(split_reasons.notna().to_numpy()):
        reasons[i] = reasons[i] or split_reasons.iloc[i]
    bad = np.array([r is not None for r in reasons], dtype=bool)

    if options.plan:  # a plan never looks at the images: every name is placed under images/
        image_path = "images/" + image.fillna("")
        notes.append("plan: image folders not listed; every image path is images/<Image Index>")
    else:
        index = _image_index(root)
        image_path = image.map(index)
        found = image_path.notna().to_numpy()
        image_path = image_path.fillna("images/" + image.fillna(""))
        notes.append(f"images found for {int(found.sum())} of {n} rows (by listing images/, images_*/ and the csv "
                     "folder)")

    frame = pd.DataFrame({
        "image_path": image_path,
        "patient_id": patient,
        "study_id": _study_ids(df, patient, image),
        **{raw_column(c): labels[:, j] for j, c in enumerate(SOURCE_CLASSES)},
        "official_split": official,
        "source_file": name,
        "source_row": rows,
    })
    frame, aux_notes = _add_demographics(frame, df)
    notes += aux_notes

    set_aside = rows_set_aside(name, rows[bad], [reasons[i] for i in np.flatnonzero(bad)], image_path[bad])
    return SourceTable(
        source="nih", adapter_version=ADAPTER_VERSION, root=root,
        frame=frame.loc[~bad].reset_index(drop=True), classes=list(SOURCE_CLASSES),
        set_aside=set_aside, rows_read=n, notes=notes,
    )


def _parse_findings(values: pd.Series) -> tuple[np.ndarray, list]:
    """Pipe lists → (rows × 15) 0/1 matrix and a reason (or None) per row.

    Parsed once per distinct string (NIH has ~800) and broadcast by integer codes.
    """
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    table = np.zeros((len(uniques) + 1, len(SOURCE_CLASSES)))
    errors: list = []
    position = {c: j for j, c in enumerate(SOURCE_CLASSES)}
    for u, text in enumerate(list(uniques) + [None]):
        tokens = [t.strip() for t in str(text).split("|") if t.strip()] if text is not None else []
        error = None if tokens else f"missing value: empty {LABELS!r}"
        for token in tokens:
            cls = canonical_class(token)
            if cls not in position:
                error = f"unknown label value: {token!r} in column {LABELS!r}"
                break
            table[u, position[cls]] = 1.0
        errors.append(error)
    error_of = np.array(errors, dtype=object)
    return table[codes], list(error_of[codes])


def _official_splits(image: pd.Series, root: Path, input_dir: Path) -> tuple[pd.Series, pd.Series, list[str]]:
    """``official_split`` per row from the NIH lists, reasons for rows in both, and notes."""
    official = pd.Series([None] * len(image), dtype=object, index=image.index)
    reasons = pd.Series([None] * len(image), dtype=object, index=image.index)
    members = {}
    for split, filename in SPLIT_LISTS.items():
        path = root / filename if (root / filename).is_file() else find_file(input_dir, [filename], max_depth=2)
        if path is not None:
            data = read_input_bytes(path, root=input_dir, base=input_dir, limit=max_decompressed(), lines=True)
            names = set(data.decode("utf-8", errors="replace").split())  # no trailing newline in the official files
            members[split] = member_of(image, names)
    if not members:
        return official, reasons, ["no train_val_list.txt/test_list.txt: splits by patient hash"]
    for split, mask in members.items():
        official[mask] = split
    if len(members) == 2:
        both = members["train_val"] & members["test"]
        reasons[both] = "image in both official splits: listed in train_val_list.txt and test_list.txt"
    listed = np.logical_or.reduce(list(members.values()))
    notes = [f"official split lists: {', '.join(SPLIT_LISTS[s] for s in members)}"]
    unlisted = int((~listed).sum())
    if unlisted:
        notes.append(f"{unlisted} row(s) in no official split list: split by patient hash")
    return official, reasons, notes


def _image_index(root: Path) -> dict[str, str]:
    """Image file name → path relative to ``root``, from one listing per image folder.

    File names that are not valid UTF-8 are left out: no csv row can name them.
    """
    folders: list[tuple[str, Path]] = []
    with os.scandir(root) as it:
        subdirs = sorted(e.name for e in it if e.is_dir() and e.name.lower().startswith("images"))
    for sub in subdirs:
        folders.append((sub + "/", root / sub))
        if (root / sub / "images").is_dir():
            folders.append((sub + "/images/", root / sub / "images"))
    folders.append(("", root))
    index: dict[str, str] = {}
    for prefix, folder in folders:
        with os.scandir(folder) as it:
            for entry in it:
                # a name that is not UTF-8 can match no csv row (and would break Arrow strings)
                if entry.name not in index and is_utf8(entry.name) and not entry.is_dir():
                    index[entry.name] = prefix + entry.name
    return index


def _study_ids(df: pd.DataFrame, patient: pd.Series, image: pd.Series) -> pd.Series:
    """``<patient>_<follow-up>`` (one NIH image is one study); the image stem without follow-up."""
    if FOLLOW_UP in df:
        return patient + "_" + df[FOLLOW_UP].str.strip().fillna("")
    return image.str.rsplit(".", n=1).str[0]


def _add_demographics(frame: pd.DataFrame, df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """age, aux__age_bin, aux__sex, aux__view from the NIH columns (unmappable → unknown)."""
    notes = []
    if AGE in df:
        age, failed = map_distinct(df[AGE], parse_age)
        notes.append(failed_note("age", df[AGE], failed, "age unknown, rows kept"))
    else:
        age = np.full(len(df), np.nan)
        notes.append(f"no {AGE!r} column: age unknown")
    bins, _ = map_distinct(pd.Series(age), age_bin_code)
    frame["age"] = age
    frame[aux_column("age_bin")] = to_codes(bins)
    for task, col, func in (("sex", SEX, sex_code), ("view", VIEW, view_code)):
        if col in df:
            codes, failed = map_distinct(df[col], func)
            notes.append(failed_note(task, df[col], failed, f"{task} unknown, rows kept"))
        else:
            codes = np.full(len(df), np.nan)
            notes.append(f"no {col!r} column: {task} unknown")
        frame[aux_column(task)] = to_codes(codes)
    return frame, [n for n in notes if n]
