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
* **Implied negatives** (on by default; ``--no-implied-negatives`` turns them off): a blank
  pathology on a ``No Finding = 1`` study is a negative (``label__<class> = 0``, ``raw__``
  stays blank), Support Devices excepted — the rule of the labelers that made both label
  files. MIMIC-CXR-JPG's labels come from the CheXpert labeler and from NegBio (Johnson et
  al. 2019, "MIMIC-CXR-JPG, a large publicly available database of labeled chest
  radiographs", arXiv:1901.07042, and the PhysioNet MIMIC-CXR-JPG page: the same 14
  observations and 1 / 0 / -1 / blank encoding as CheXpert); the CheXpert labeler sets No
  Finding only when no observation but Support Devices is positive or uncertain
  (``stanfordmlgroup/chexpert-labeler`` ``stages/aggregate.py``), and NegBio aggregates
  with the same code (``ncbi-nlp/NegBio`` ``negbio/chexpert/stages/aggregate.py``).
  TorchXRayVision's ``MIMIC_Dataset`` zeroes Support Devices too on such studies; fedcxr
  follows the labelers (a device is often present on a normal film). Counts per class:
  ``site.json`` ``class_counts.<c>.implied_negative`` and the ingest summary.
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

from fedcxr.site_adapters.base import AdapterOptions, IngestError, SourceTable, require_columns
from fedcxr.site_adapters.chexpert import CLASS_OF, IMPLIED_NEGATIVE_CLASSES, LABEL_COLUMNS, implied_negatives_note
from fedcxr.site_adapters.chexpert import SOURCE_CLASSES as SOURCE_CLASSES  # MIMIC-CXR-JPG uses CheXpert's labeler
from fedcxr.site_adapters.tables import (
    code_names,
    failed_note,
    find_file,
    label_columns,
    map_distinct,
    member_of,
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
META_COLUMNS = {"dicom_id", "subject_id", "study_id", "ViewPosition", "StudyDate"}
PATIENT_COLUMNS = {"subject_id", "gender", "anchor_age", "anchor_year"}
ADMISSION_COLUMNS = {"subject_id", "admittime", "race", "ethnicity"}


def _find(input_dir: Path, stem: str, subdirs: list[str], depth: int = 3) -> Optional[Path]:
    return find_file(input_dir, [f"{stem}.csv.gz", f"{stem}.csv"], subdirs=subdirs, max_depth=depth)


def read_mimic(input_dir: Path, options: AdapterOptions) -> SourceTable:
    """Read a MIMIC-CXR-JPG export (+ MIMIC-IV hosp tables) into a :class:`SourceTable`."""
    input_dir = Path(input_dir)
    meta_path = _find(input_dir, PREFIX + "metadata", RELEASE_DIRS)
    if meta_path is None:
        raise IngestError(f"{input_dir}: no {PREFIX}metadata.csv(.gz) (MIMIC-CXR-JPG release folder)")
    root, name = meta_path.parent, relative_name(meta_path, input_dir)
    meta = read_table(meta_path, base=input_dir, usecols=lambda c: c in META_COLUMNS,
                      dtype={"dicom_id": str, "ViewPosition": str, "StudyDate": str})
    require_columns(meta, ["dicom_id", "subject_id", "study_id"], name)
    n = len(meta)
    rows = np.arange(1, n + 1)
    reasons: list[Optional[str]] = [None] * n
    notes = [f"metadata: {name} ({n} images)"]
    dicom = meta["dicom_id"].str.strip()
    subject, study = id_keys(meta["subject_id"]), id_keys(meta["study_id"])
    _mark(reasons, dicom.isna().to_numpy(), "missing value: empty 'dicom_id'")
    for col, keys in (("subject_id", subject), ("study_id", study)):
        _mark(reasons, np.isnan(keys), f"missing value: empty or non-integer {col!r}")

    subject_text, study_text = id_text(subject), id_text(study)
    image_path = ("files/p" + subject_text.str[:2] + "/p" + subject_text + "/s" + study_text + "/"
                  + dicom.fillna("") + ".jpg")
    frame = pd.DataFrame({
        "image_path": image_path,
        "patient_id": subject_text,
        "study_id": study_text,
        "source_file": name,
        "source_row": rows,
    })
    labels, label_reasons, label_notes = _study_labels(input_dir, options, subject, study)
    frame = pd.concat([frame, labels], axis=1)
    _merge_reasons(reasons, label_reasons)
    notes += label_notes
    frame["official_split"], split_reasons, split_notes = _official_split(input_dir, dicom)
    _merge_reasons(reasons, split_reasons)
    notes += split_notes

    view = map_distinct(meta["ViewPosition"], view_code)[0] if "ViewPosition" in meta else np.full(n, np.nan)
    frame[aux_column("view")] = to_codes(view)
    study_year = (pd.to_numeric(meta["StudyDate"].str.strip().str[:4], errors="coerce").to_numpy(dtype=float)
                  if "StudyDate" in meta else None)
    frame, demo_notes = _add_demographics(frame, subject, study_year, input_dir)
    notes += demo_notes

    bad = np.array([r is not None for r in reasons], dtype=bool)
    set_aside = rows_set_aside(name, rows[bad], [reasons[i] for i in np.flatnonzero(bad)], image_path[bad])
    implied = IMPLIED_NEGATIVE_CLASSES if options.implied_negatives else ()
    notes.append(implied_negatives_note(implied, options.implied_negatives, "CheXpert/NegBio labeler"))
    return SourceTable(
        source="mimic", adapter_version=ADAPTER_VERSION, root=root,
        frame=frame.loc[~bad].reset_index(drop=True), classes=list(SOURCE_CLASSES),
        set_aside=set_aside, rows_read=n, notes=notes, implied_negative_classes=implied,
    )


def id_keys(values: pd.Series) -> np.ndarray:
    """MIMIC integer ids as float64 join keys; NaN where blank or not an integer.

    Joins on numbers: merging 377k rows on pandas' Arrow strings took seconds.
    """
    keys = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    keys[keys != np.floor(keys)] = np.nan
    return keys


def id_text(keys: np.ndarray) -> pd.Series:
    """Float id keys → ``"10000032"`` strings (``""`` where missing)."""
    return pd.Series(pd.array(keys, dtype="Int64")).astype(str).where(~np.isnan(keys), "")


def _lookup(keys: np.ndarray, table_keys: np.ndarray) -> np.ndarray:
    """Position of each key in ``table_keys`` (unique), -1 when absent or NaN."""
    return pd.Index(table_keys).get_indexer(keys)


def _mark(reasons: list, mask: np.ndarray, reason: str) -> None:
    for i in np.flatnonzero(mask):
        reasons[i] = reasons[i] or reason


def _merge_reasons(reasons: list, other: pd.Series) -> None:
    for i in np.flatnonzero(other.notna().to_numpy()):
        reasons[i] = reasons[i] or other.iloc[i]


# --------------------------------------------------------------------------- labels


def _study_labels(
    input_dir: Path, options: AdapterOptions, subject: np.ndarray, study: np.ndarray
) -> tuple[pd.DataFrame, pd.Series, list[str]]:
    """``raw__`` columns per image (row-aligned with the metadata) and a reason per bad image."""
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
    table = read_table(path, base=input_dir)
    require_columns(table, KEYS + LABEL_COLUMNS, name)
    raw, bad, bad_reasons = label_columns(table, CLASS_OF)
    labels = pd.DataFrame(raw)
    labels["_row"] = np.arange(1, len(table) + 1)
    labels["_reason"] = [f"{r} ({name} row {i})" if r else None for r, i in zip(bad_reasons, labels["_row"])]
    labels["subject_id"], labels["study_id"] = id_keys(table["subject_id"]), id_keys(table["study_id"])
    notes = [f"labels: {name} ({len(table)} studies)"]
    keyless = labels[KEYS].isna().any(axis=1)
    if keyless.any():
        notes.append(f"{int(keyless.sum())} row(s) of {name} without integer subject_id/study_id: ignored")
        labels = labels.loc[~keyless]
    labels = _resolve_duplicate_studies(labels, name)
    images = pd.DataFrame({"subject_id": subject, "study_id": study})
    joined = images.merge(labels, on=KEYS, how="left", sort=False, validate="many_to_one")
    unlabeled = int((joined["_row"].isna() & images[KEYS].notna().all(axis=1)).sum())
    if unlabeled:
        notes.append(f"{unlabeled} image(s) whose study has no row in {name}: kept with no labels")
    raw_cols = [raw_column(c) for c in SOURCE_CLASSES]
    return joined[raw_cols].reset_index(drop=True), joined["_reason"].reset_index(drop=True), notes


def _resolve_duplicate_studies(labels: pd.DataFrame, name: str) -> pd.DataFrame:
    """One label row per study: identical repeats collapse; disagreeing repeats → a reason."""
    raw_cols = [raw_column(c) for c in SOURCE_CLASSES]
    labels = labels.drop_duplicates(subset=KEYS + raw_cols, keep="first")
    dup = labels.duplicated(subset=KEYS, keep=False)
    if dup.any():
        counts = labels.loc[dup].groupby(KEYS)["_row"].transform("size")
        labels.loc[dup, "_reason"] = [f"conflicting label rows: study has {int(c)} different rows in {name}"
                                      for c in counts]
        labels = labels.drop_duplicates(subset=KEYS, keep="first")
    return labels


# --------------------------------------------------------------------------- split


def _official_split(input_dir: Path, dicom: pd.Series) -> tuple[pd.Series, pd.Series, list[str]]:
    """official split per image (``validate`` → ``val``), reasons for unknown values, notes."""
    n = len(dicom)
    none = pd.Series([None] * n, dtype=object)
    path = _find(input_dir, PREFIX + "split", RELEASE_DIRS)
    if path is None:
        return none, none.copy(), [f"no {PREFIX}split.csv: splits by patient hash"]
    name = relative_name(path, input_dir)
    table = read_table(path, base=input_dir, usecols=lambda c: c in {"dicom_id", "split"}, dtype=str)
    require_columns(table, ["dicom_id", "split"], name)
    split_of: dict[str, str] = {}
    conflicted: set[str] = set()
    for d, sp in zip(table["dicom_id"].str.strip().tolist(), table["split"].str.strip().tolist()):
        if split_of.setdefault(d, sp) != sp:
            conflicted.add(d)
    raw = pd.Series([split_of.get(d) for d in dicom.tolist()], dtype=object)
    split = raw.map(SPLITS)
    unknown = raw.notna() & split.isna()
    reasons = none.copy()
    reasons[unknown] = [f"unknown split value: {v!r} in column 'split' of {name}" for v in raw[unknown]]
    if conflicted:
        reasons[member_of(dicom, conflicted)] = f"image in two official splits: dicom_id listed twice in {name}"
    notes = [f"official split: {name}"]
    absent = int(raw.isna().sum())
    if absent:
        notes.append(f"{absent} image(s) not in {name}: split by patient hash")
    return split.astype(object).where(split.notna(), None), reasons, notes


# --------------------------------------------------------------------------- demographics


def _add_demographics(
    frame: pd.DataFrame, subject: np.ndarray, study_year: Optional[np.ndarray], input_dir: Path
) -> tuple[pd.DataFrame, list[str]]:
    """sex / age (at the study) / race from MIMIC-IV; unknown → null, counted in notes."""
    n = len(frame)
    notes: list[Optional[str]] = []
    age = np.full(n, np.nan)
    sex = np.full(n, np.nan)
    patients_path = _find(input_dir, "patients", HOSP_DIRS, depth=5)
    if patients_path is None:
        notes.append("no hosp/patients.csv: sex and age unknown")
    else:
        sex, age, patient_notes = _sex_and_age(patients_path, input_dir, subject, study_year)
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
        at = _lookup(subject, per_subject.index.to_numpy(dtype=float))
        race = np.where(at >= 0, per_subject.to_numpy(dtype=float)[at], np.nan)
    frame[aux_column("race")] = to_codes(race)
    frame["group__race"] = code_names("race", race)
    return frame, [x for x in notes if x]


def _sex_and_age(
    path: Path, input_dir: Path, subject: np.ndarray, study_year: Optional[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, list]:
    name = relative_name(path, input_dir)
    patients = read_table(path, base=input_dir, usecols=lambda c: c in PATIENT_COLUMNS, dtype={"gender": str})
    require_columns(patients, sorted(PATIENT_COLUMNS), name)
    patients["key"] = id_keys(patients["subject_id"])
    patients = patients.dropna(subset=["key"]).drop_duplicates(subset=["key"])
    at = _lookup(subject, patients["key"].to_numpy())
    known = at >= 0

    def column(col: str) -> pd.Series:  # the patients' value for each image (-1 → missing)
        return patients[col].reset_index(drop=True).reindex(at).reset_index(drop=True)

    gender = column("gender")
    sex, sex_failed = map_distinct(gender, sex_code)
    anchor_age = pd.to_numeric(column("anchor_age"), errors="coerce").to_numpy(dtype=float)
    anchor_year = pd.to_numeric(column("anchor_year"), errors="coerce").to_numpy(dtype=float)
    year = study_year if study_year is not None else np.full(len(subject), np.nan)
    computed = anchor_age + (year - anchor_year)
    computed = np.where(computed > MAX_GROUPED_AGE, GROUPED_AGE, computed)
    age, age_failed = map_distinct(pd.Series(computed), parse_age)
    notes = [
        f"demographics: {name}; {int((~known).sum())} image(s) of subjects not in it: sex and age unknown",
        failed_note(f"gender in {name}", gender, sex_failed, "sex unknown, rows kept"),
        failed_note("age at study (anchor_age + study year - anchor_year)", pd.Series(computed), age_failed,
                    "age unknown, rows kept"),
    ]
    if study_year is None:
        notes.append("metadata has no 'StudyDate': age unknown")
    return sex, age, notes


def subject_race(path: Path, input_dir: Path) -> tuple[pd.Series, list]:
    """Race code per ``subject_id`` (int index) from MIMIC-IV admissions (rule in the module doc)."""
    name = relative_name(path, input_dir)
    adm = read_table(path, base=input_dir, usecols=lambda c: c in ADMISSION_COLUMNS,
                     dtype={"race": str, "ethnicity": str, "admittime": str})
    column = "race" if "race" in adm else "ethnicity"
    require_columns(adm, ["subject_id", column], name)
    codes, failed = map_distinct(adm[column], race_code)
    when = pd.to_datetime(adm["admittime"], errors="coerce") if "admittime" in adm \
        else pd.Series(pd.NaT, index=adm.index)
    known = pd.DataFrame({"subject": id_keys(adm["subject_id"]), "code": codes, "when": when}).dropna(
        subset=["subject", "code"])
    votes = known.groupby(["subject", "code"]).agg(n=("code", "size"), last=("when", "max")).reset_index()
    votes = votes.sort_values(["subject", "n", "last", "code"], ascending=[True, False, False, True],
                              na_position="last", kind="mergesort")
    per_subject = votes.drop_duplicates("subject").set_index("subject")["code"].astype(int)
    per_subject.index = per_subject.index.astype("int64").rename("subject_id")
    notes = [
        f"race: {name} column {column!r}; known for {len(per_subject)} subject(s)",
        failed_note(f"{column} in {name}", adm[column], failed, "treated as unknown"),
    ]
    return per_subject, notes
