"""MIMIC-CXR-JPG adapter: metadata + study labels + official split + MIMIC-IV demographics.

Files (``.csv`` or ``.csv.gz``; at the input folder, in ``mimic-cxr-jpg/<version>/``, or up to
three levels down; MIMIC-IV tables in a ``hosp/`` folder up to five levels down):

==========================================  =========================================================
``mimic-cxr-2.0.0-metadata.csv``            required: one row per image (``dicom_id, subject_id,
                                            study_id, ViewPosition, StudyDate``...)
``mimic-cxr-2.0.0-chexpert.csv``            study labels (CheXpert labeler) — or ``-negbio.csv``
                                            when the chexpert file is absent or
                                            ``options.extra["labeler"] == "negbio"``; one is required
``mimic-cxr-2.0.0-split.csv``               optional: ``train``/``validate``/``test`` per image
``hosp/patients.csv``                       optional: ``gender``, ``anchor_age``, ``anchor_year``
``hosp/admissions.csv``                     optional: ``race`` (MIMIC-IV v2+) or ``ethnicity`` (v1)
==========================================  =========================================================

Semantics (``../shared/data/SCHEMAS.md`` §2–3):

* Image path ``files/p{first 2 digits}/p{subject}/s{study}/{dicom_id}.jpg`` relative to the
  folder of the metadata file (the MIMIC-CXR-JPG release root).
* Labels are per study, joined on ``(subject_id, study_id)``; every image of the study
  inherits them (laterals included). Raw 1/0/-1/blank are kept; another value sets aside
  every image of that study, naming column, value and label row. A study with two label rows
  that disagree is set aside the same way. Images of a study with no label row are kept
  unlabeled (all classes missing) and counted in the notes.
* ``official_split``: ``validate`` → ``val``; an image absent from the split file has none
  (hash split); an unknown split value sets the image aside.
* Age at the study = ``anchor_age + (study year − anchor_year)`` (``StudyDate`` is
  ``YYYYMMDD``); ages over 89 are reported as 91, as MIMIC-IV groups them. A computed age
  outside 0–120 is unknown (noted).
* Race per subject (admissions record it per admission): each value is collapsed with
  :func:`vocab.race_code`; the subject's race is the **most frequent known family** over
  their admissions, ties broken by the **most recent admission** (``admittime``), then by
  the lower code. Unknown/declined values do not count; unmappable strings count as unknown
  (noted). Subjects with no admission have no race.
* ``group__race`` holds the family name (white/black/asian/hispanic/other) so
  ``--site-by race`` reproduces the AuxInfo+GP paper's race domains (the paper uses the
  first four; the ``other`` site can be dropped from the experiment config).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from fedcxr.site_adapters.base import AdapterOptions, IngestError, SetAside, SourceTable, require_columns
from fedcxr.site_adapters.chexpert import CLASS_OF, CHEXPERT_CLASSES, LABEL_COLUMNS
from fedcxr.site_adapters.tables import (
    code_names,
    failed_note,
    find_file,
    label_columns,
    map_distinct,
    read_table,
    relative_name,
    rows_set_aside,
    to_codes,
)
from fedcxr.vocab import age_bin_code, aux_column, parse_age, race_code, raw_column, sex_code, view_code

ADAPTER_VERSION = "1"

PREFIX = "mimic-cxr-2.0.0-"
RELEASE_DIRS = [
    f"{base}mimic-cxr-jpg/{v}" for base in ("", "physionet.org/files/") for v in ("2.0.0", "2.1.0", "2.0", "2.1")
]
HOSP_DIRS = ["hosp"] + [f"{base}/{v}/hosp" for base in ("mimiciv", "mimic-iv", "physionet.org/files/mimiciv")
                        for v in ("3.1", "3.0", "2.2", "2.1", "2.0", "1.0")]
SPLITS = {"train": "train", "validate": "val", "val": "val", "test": "test"}
MAX_GROUPED_AGE, GROUPED_AGE = 89, 91.0
KEYS = ["subject_id", "study_id"]


def _find(input_dir: Path, stem: str, subdirs: list[str], depth: int = 3) -> Optional[Path]:
    return find_file(input_dir, [f"{stem}.csv.gz", f"{stem}.csv"], subdirs=subdirs, max_depth=depth)


def read_mimic(input_dir: Path, options: AdapterOptions) -> SourceTable:
    """Read a MIMIC-CXR-JPG export (+ MIMIC-IV hosp tables) into a :class:`SourceTable`."""
    input_dir = Path(input_dir)
    meta_path = _find(input_dir, PREFIX + "metadata", RELEASE_DIRS)
    if meta_path is None:
        raise IngestError(f"{input_dir}: no {PREFIX}metadata.csv(.gz) (MIMIC-CXR-JPG release folder)")
    root, name = meta_path.parent, relative_name(meta_path, input_dir)
    meta = read_table(meta_path, base=input_dir, dtype=str)
    require_columns(meta, ["dicom_id", "subject_id", "study_id"], name)
    n = len(meta)
    for col in ("dicom_id", "subject_id", "study_id"):
        meta[col] = meta[col].str.strip()
    rows = np.arange(1, n + 1)
    reasons: list[Optional[str]] = [None] * n
    notes = [f"metadata: {name} ({n} images)"]

    image_path = ("files/p" + meta["subject_id"].str[:2] + "/p" + meta["subject_id"] + "/s"
                  + meta["study_id"] + "/" + meta["dicom_id"] + ".jpg")
    frame = pd.DataFrame({
        "image_path": image_path,
        "patient_id": meta["subject_id"],
        "study_id": meta["study_id"],
        "source_file": name,
        "source_row": rows,
    })
    for col in ("dicom_id", "subject_id", "study_id"):
        _mark(reasons, meta[col].isna().to_numpy(), f"missing value: empty {col!r}")

    labels, label_reasons, label_notes = _study_labels(input_dir, options, meta)
    frame = pd.concat([frame, labels], axis=1)
    _merge_reasons(reasons, label_reasons)
    notes += label_notes
    frame["official_split"], split_reasons, split_notes = _official_split(input_dir, meta)
    _merge_reasons(reasons, split_reasons)
    notes += split_notes

    view = map_distinct(meta["ViewPosition"], view_code)[0] if "ViewPosition" in meta else np.full(n, np.nan)
    frame[aux_column("view")] = to_codes(view)
    frame, demo_notes = _add_demographics(frame, meta, input_dir)
    notes += demo_notes

    bad = np.array([r is not None for r in reasons], dtype=bool)
    set_aside = rows_set_aside(name, rows[bad], [reasons[i] for i in np.flatnonzero(bad)], image_path[bad])
    return SourceTable(
        source="mimic", adapter_version=ADAPTER_VERSION, root=root,
        frame=frame.loc[~bad].reset_index(drop=True), classes=list(CHEXPERT_CLASSES),
        set_aside=set_aside, rows_read=n, notes=notes,
    )


def _mark(reasons: list, mask: np.ndarray, reason: str) -> None:
    for i in np.flatnonzero(mask):
        reasons[i] = reasons[i] or reason


def _merge_reasons(reasons: list, other: pd.Series) -> None:
    for i in np.flatnonzero(other.notna().to_numpy()):
        reasons[i] = reasons[i] or other.iloc[i]


# --------------------------------------------------------------------------- labels


def _study_labels(
    input_dir: Path, options: AdapterOptions, meta: pd.DataFrame
) -> tuple[pd.DataFrame, pd.Series, list[str]]:
    """``raw__`` columns per image (row-aligned with ``meta``) and a reason per bad image."""
    labeler = str(options.extra.get("labeler", "chexpert")).lower()
    if labeler not in {"chexpert", "negbio"}:
        raise IngestError(f"mimic: labeler must be 'chexpert' or 'negbio', got {labeler!r}")
    order = ["chexpert", "negbio"] if labeler == "chexpert" else ["negbio", "chexpert"]
    path = None
    for which in order:
        path = _find(input_dir, PREFIX + which, RELEASE_DIRS)
        if path is not None:
            break
    if path is None:
        raise IngestError(f"{input_dir}: no {PREFIX}chexpert.csv(.gz) or {PREFIX}negbio.csv(.gz) label file")
    name = relative_name(path, input_dir)
    table = read_table(path, base=input_dir, dtype={"subject_id": str, "study_id": str})
    require_columns(table, KEYS + LABEL_COLUMNS, name)
    for key in KEYS:
        table[key] = table[key].str.strip()
    raw, bad, bad_reasons = label_columns(table, CLASS_OF)
    labels = pd.DataFrame(raw)
    labels["_row"] = np.arange(1, len(table) + 1)
    labels["_reason"] = [f"{r} ({name} row {i})" if r else None for r, i in zip(bad_reasons, labels["_row"])]
    labels[KEYS] = table[KEYS]
    labels = _resolve_duplicate_studies(labels, name)
    joined = meta[KEYS].merge(labels, on=KEYS, how="left", sort=False, validate="many_to_one")
    unlabeled = int(joined["_row"].isna().sum())
    notes = [f"labels: {name} ({len(table)} studies)"]
    if unlabeled:
        notes.append(f"{unlabeled} image(s) whose study has no row in {name}: kept with no labels")
    raw_cols = [raw_column(c) for c in CHEXPERT_CLASSES]
    return joined[raw_cols].reset_index(drop=True), joined["_reason"].reset_index(drop=True), notes


def _resolve_duplicate_studies(labels: pd.DataFrame, name: str) -> pd.DataFrame:
    """One label row per study: identical repeats collapse; disagreeing repeats → a reason."""
    raw_cols = [raw_column(c) for c in CHEXPERT_CLASSES]
    labels = labels.drop_duplicates(subset=KEYS + raw_cols, keep="first")
    dup = labels.duplicated(subset=KEYS, keep=False)
    if dup.any():
        counts = labels.loc[dup].groupby(KEYS)["_row"].transform("size")
        labels.loc[dup, "_reason"] = [f"conflicting label rows: study has {int(c)} different rows in {name}"
                                      for c in counts]
        labels = labels.drop_duplicates(subset=KEYS, keep="first")
    return labels


# --------------------------------------------------------------------------- split


def _official_split(input_dir: Path, meta: pd.DataFrame) -> tuple[pd.Series, pd.Series, list[str]]:
    """official split per image (``validate`` → ``val``), reasons for unknown values, notes."""
    n = len(meta)
    none = pd.Series([None] * n, dtype=object)
    path = _find(input_dir, PREFIX + "split", RELEASE_DIRS)
    if path is None:
        return none, none.copy(), [f"no {PREFIX}split.csv: splits by patient hash"]
    name = relative_name(path, input_dir)
    table = read_table(path, base=input_dir, dtype=str)
    require_columns(table, ["dicom_id", "split"], name)
    table = table.assign(dicom_id=table["dicom_id"].str.strip(), split=table["split"].str.strip())
    table = table.drop_duplicates(subset=["dicom_id", "split"])
    conflicted = set(table.loc[table["dicom_id"].duplicated(), "dicom_id"])
    table = table.drop_duplicates(subset=["dicom_id"])
    raw = meta["dicom_id"].map(table.set_index("dicom_id")["split"]).reset_index(drop=True)
    split = raw.map(SPLITS)
    unknown = raw.notna() & split.isna()
    reasons = none.copy()
    reasons[unknown] = [f"unknown split value: {v!r} in column 'split' of {name}" for v in raw[unknown]]
    both = meta["dicom_id"].isin(list(conflicted)).to_numpy() if conflicted else np.zeros(n, dtype=bool)
    reasons[both] = f"image in two official splits: dicom_id listed twice in {name}"
    notes = [f"official split: {name}"]
    absent = int(raw.isna().sum())
    if absent:
        notes.append(f"{absent} image(s) not in {name}: split by patient hash")
    return split.astype(object).where(split.notna(), None), reasons, notes


# --------------------------------------------------------------------------- demographics


def _add_demographics(frame: pd.DataFrame, meta: pd.DataFrame, input_dir: Path) -> tuple[pd.DataFrame, list[str]]:
    """sex / age (at the study) / race from MIMIC-IV; unknown → null, counted in notes."""
    n = len(frame)
    notes: list[Optional[str]] = []
    age = np.full(n, np.nan)
    sex = np.full(n, np.nan)
    patients_path = _find(input_dir, "patients", HOSP_DIRS, depth=5)
    if patients_path is None:
        notes.append("no hosp/patients.csv: sex and age unknown")
    else:
        sex, age, patient_notes = _sex_and_age(patients_path, input_dir, meta)
        notes += patient_notes
    bins, _ = map_distinct(pd.Series(age), age_bin_code)
    frame["age"] = age
    frame[aux_column("age_bin")] = to_codes(bins)
    frame[aux_column("sex")] = to_codes(sex)

    race = np.full(n, np.nan)
    admissions_path = _find(input_dir, "admissions", HOSP_DIRS, depth=5)
    if admissions_path is None:
        notes.append("no hosp/admissions.csv: race unknown")
    else:
        per_subject, race_notes = subject_race(admissions_path, input_dir)
        notes += race_notes
        race = meta["subject_id"].map(per_subject).to_numpy(dtype=float)
    frame[aux_column("race")] = to_codes(race)
    frame["group__race"] = code_names("race", race)
    return frame, [x for x in notes if x]


def _sex_and_age(path: Path, input_dir: Path, meta: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, list]:
    name = relative_name(path, input_dir)
    patients = read_table(path, base=input_dir, dtype=str)
    require_columns(patients, ["subject_id", "gender", "anchor_age", "anchor_year"], name)
    patients["subject_id"] = patients["subject_id"].str.strip()
    patients = patients.drop_duplicates(subset=["subject_id"]).set_index("subject_id")
    subject = meta["subject_id"]
    known = subject.isin(patients.index).to_numpy()
    gender = subject.map(patients["gender"])
    sex, sex_failed = map_distinct(gender, sex_code)
    anchor_age = pd.to_numeric(subject.map(patients["anchor_age"]), errors="coerce").to_numpy(dtype=float)
    anchor_year = pd.to_numeric(subject.map(patients["anchor_year"]), errors="coerce").to_numpy(dtype=float)
    if "StudyDate" in meta:
        study_year = pd.to_numeric(meta["StudyDate"].str.strip().str[:4], errors="coerce").to_numpy(dtype=float)
    else:
        study_year = np.full(len(meta), np.nan)
    computed = anchor_age + (study_year - anchor_year)
    computed = np.where(computed > MAX_GROUPED_AGE, GROUPED_AGE, computed)
    age, age_failed = map_distinct(pd.Series(computed), parse_age)
    notes = [
        f"demographics: {name}; {int((~known).sum())} image(s) of subjects not in it: sex and age unknown",
        failed_note(f"gender in {name}", gender, sex_failed, "sex unknown, rows kept"),
        failed_note("age at study (anchor_age + study year - anchor_year)", pd.Series(computed), age_failed,
                    "age unknown, rows kept"),
    ]
    if "StudyDate" not in meta:
        notes.append("metadata has no 'StudyDate': age unknown")
    return sex, age, notes


def subject_race(path: Path, input_dir: Path) -> tuple[pd.Series, list]:
    """Race code per ``subject_id`` from MIMIC-IV admissions (rule in the module doc)."""
    name = relative_name(path, input_dir)
    adm = read_table(path, base=input_dir, dtype=str)
    column = "race" if "race" in adm else "ethnicity"
    require_columns(adm, ["subject_id", column], name)
    codes, failed = map_distinct(adm[column], race_code)
    when = pd.to_datetime(adm["admittime"], errors="coerce") if "admittime" in adm \
        else pd.Series(pd.NaT, index=adm.index)
    known = pd.DataFrame({"subject": adm["subject_id"].str.strip(), "code": codes, "when": when}).dropna(
        subset=["code"])
    votes = known.groupby(["subject", "code"]).agg(n=("code", "size"), last=("when", "max")).reset_index()
    votes = votes.sort_values(["subject", "n", "last", "code"], ascending=[True, False, False, True],
                              na_position="last", kind="mergesort")
    per_subject = votes.drop_duplicates("subject").set_index("subject")["code"]
    notes = [
        f"race: {name} column {column!r}; known for {len(per_subject)} subject(s)",
        failed_note(f"{column} in {name}", adm[column], failed, "treated as unknown"),
    ]
    return per_subject, notes
