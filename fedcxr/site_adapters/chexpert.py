"""CheXpert adapter: ``train.csv`` / ``valid.csv`` (+ optional demographics sheet) → canonical rows.

Files (at the input folder, in ``CheXpert-v1.0-small/`` or ``CheXpert-v1.0/``, or up to three
levels down): ``train.csv`` (or the 2021 relabel ``train_cheXbert.csv`` when ``train.csv`` is
absent, or when ``options.extra["labeler"] == "chexbert"``) and ``valid.csv``. At least one
must exist. Optional: ``CHEXPERT DEMO.xlsx`` (or ``CHEXPERT DEMO.csv``) with ``PATIENT,
GENDER, AGE_AT_CXR, PRIMARY_RACE, ETHNICITY``, joined on the patient for race.

Columns read (the release's header): ``Path, Sex, Age, Frontal/Lateral, AP/PA`` and the 14
observations ``No Finding, Enlarged Cardiomediastinum, Cardiomegaly, Lung Opacity, Lung
Lesion, Edema, Consolidation, Pneumonia, Atelectasis, Pneumothorax, Pleural Effusion, Pleural
Other, Fracture, Support Devices`` (1.0 / 0.0 / -1.0 / blank).

Semantics (``../shared/data/SCHEMAS.md`` §1):

* ``Path`` starts with the release folder (``CheXpert-v1.0-small/`` or ``CheXpert-v1.0/``),
  which is stripped: ``image_path`` is ``train/patientNNNNN/studyN/viewK_frontal.jpg``
  relative to the release folder (the export root). Patient = ``patientNNNNN``, study =
  ``patientNNNNN/studyN``; a path without them sets the row aside.
* The 14 observation columns keep their raw values 1 / 0 / -1 (uncertain) / blank (not
  mentioned) in ``raw__<class>``; the uncertain policy is applied centrally at ingest.
  ``No Finding`` is only ever 1 or blank in the release and is kept as is (blank = not
  labeled). Any other value sets the row aside naming column and value.
* **Implied negatives** (on by default; ``--no-implied-negatives`` turns them off): a blank
  pathology on a ``No Finding = 1`` row is a negative (``label__<class> = 0``, ``raw__``
  stays blank), for every observation except ``Support Devices``. Source: the CheXpert
  labeler assigns No Finding only when no pathology is positive or uncertain (Irvin et al.
  2019, "CheXpert: A Large Chest Radiograph Dataset with Uncertainty Labels and Expert
  Comparison", AAAI, §Labeler: aggregation), and its code excepts Support Devices
  (``stanfordmlgroup/chexpert-labeler``, ``stages/aggregate.py``: "If at least one
  non-support category has a -1 (u) or 1 label, there was a finding"). So on such a row
  every other observation is known to be absent even where the report never named it.
  On the real ``train.csv`` (223,414 rows, 22,381 with No Finding = 1) no such row holds a
  positive or uncertain pathology, and the rule adds 21,898 atelectasis, 22,361 pleural
  other and 21,223 pneumonia negatives (1,328 / 316 / 2,799 explicit). TorchXRayVision's
  ``CheX_Dataset`` reads the file the same way (it also excepts Support Devices). The count
  of implied negatives per class is in ``site.json`` (``class_counts.<c>.implied_negative``)
  and the ingest summary. The rule is the CheXpert labeler's: it is applied to ``train.csv``
  and ``valid.csv`` (whose consensus labels have no blanks), not to the CheXbert relabel
  ``train_cheXbert.csv``, whose No Finding is the model's own output.
* ``official_split``: rows of ``train.csv`` → ``train_val`` (ingest cuts ``val`` by patient
  hash), rows of ``valid.csv`` → ``test`` (radiologist consensus labels).
* ``Sex`` Male/Female/Unknown → sex code; ``Age`` in years (0 is a real value: 3 rows);
  view = ``AP/PA`` for frontal images (``LL``/``RL`` there → LATERAL) and LATERAL for
  ``Frontal/Lateral == Lateral`` (their ``AP/PA`` is blank).
* Race from the sheet's ``PRIMARY_RACE`` through :data:`PRIMARY_RACE` (all 24 strings of the
  release mapped explicitly; ``"<race>, Hispanic"`` → hispanic, as the combined MIMIC-style
  category) with ``ETHNICITY == Hispanic/Latino`` taking precedence (:func:`vocab.race_code`).
  A string not in the table falls back to :func:`vocab.race_code`; if that fails too the
  race is unknown (null), the row is kept, and the count is noted.
* Group columns for ``--site-by``: ``race`` (with the sheet), ``sex``, ``view``
  (frontal/lateral). Condition sites (``--site-by chexpert-conditions``) use label columns.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from fedcxr.site_adapters.base import AdapterOptions, IngestError, SetAside, SourceTable, require_columns
from fedcxr.site_adapters.inputs import open_input
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
from fedcxr.vocab import (
    CLASSES,
    age_bin_code,
    aux_column,
    canonical_class,
    parse_age,
    race_code,
    sex_code,
    view_code,
)

ADAPTER_VERSION = "1"

#: The 14 CheXpert observation columns, in the release's order.
LABEL_COLUMNS: list[str] = [
    "No Finding", "Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Opacity", "Lung Lesion",
    "Edema", "Consolidation", "Pneumonia", "Atelectasis", "Pneumothorax", "Pleural Effusion",
    "Pleural Other", "Fracture", "Support Devices",
]
CLASS_OF: dict[str, str] = {c: canonical_class(c) for c in LABEL_COLUMNS}
#: The classes this source labels (every adapter declares them; ``None``: read from the export).
SOURCE_CLASSES: tuple[str, ...] = tuple(c for c in CLASSES if c in set(CLASS_OF.values()))
#: The classes a ``No Finding = 1`` row implies negative where blank (the CheXpert labeler's
#: rule: every observation but No Finding itself and Support Devices; see the module doc).
IMPLIED_NEGATIVE_CLASSES: tuple[str, ...] = tuple(
    c for c in SOURCE_CLASSES if c not in ("no_finding", "support_devices"))

PATH, SEX, AGE, FRONTAL_LATERAL, AP_PA = "Path", "Sex", "Age", "Frontal/Lateral", "AP/PA"
RELEASE_DIRS = ["CheXpert-v1.0-small", "CheXpert-v1.0"]
DEMOGRAPHICS_FILES = ["CHEXPERT DEMO.xlsx", "CHEXPERT DEMO.csv"]

#: ``PRIMARY_RACE`` strings of the CheXpert demographics sheet → race family (None = unknown).
#: "<race>, Hispanic" is Hispanic (the combined race/ethnicity category, as MIMIC records it).
PRIMARY_RACE: dict[str, Optional[str]] = {
    "White": "white", "White, non-Hispanic": "white", "White or Caucasian": "white",
    "Black or African American": "black", "Black, non-Hispanic": "black",
    "Asian": "asian", "Asian, non-Hispanic": "asian", "Asian - Historical Conv": "asian",
    "White, Hispanic": "hispanic", "Black, Hispanic": "hispanic", "Asian, Hispanic": "hispanic",
    "Other, Hispanic": "hispanic", "Native American, Hispanic": "hispanic",
    "Pacific Islander, Hispanic": "hispanic",
    "Native Hawaiian or Other Pacific Islander": "other", "Pacific Islander, non-Hispanic": "other",
    "American Indian or Alaska Native": "other", "Native American, non-Hispanic": "other",
    "Other": "other", "Other, non-Hispanic": "other",
    "Unknown": None, "Race and Ethnicity Unknown": None, "Patient Refused": None,
}


def read_chexpert(input_dir: Path, options: AdapterOptions) -> SourceTable:
    """Read a CheXpert export (see module doc) into a :class:`SourceTable`."""
    input_dir = Path(input_dir)
    files = _label_files(input_dir, options)
    parts, set_aside, notes, rows_read = [], [], [], 0
    roots = {csv: _export_root(csv) for csv, _ in files}
    root = Path(os.path.commonpath([str(r) for r in roots.values()]))
    for csv, split in files:
        frame, aside, file_notes = _read_label_file(csv, split, input_dir, roots[csv], root)
        parts.append(frame)
        set_aside += aside
        notes += file_notes
        rows_read += len(frame) + len(aside)
    frame = pd.concat(parts, ignore_index=True)
    frame, demo_notes = _add_race(frame, input_dir, root)
    notes += demo_notes
    labeler_rule = not any(csv.name == "train_cheXbert.csv" for csv, _ in files)
    implied = IMPLIED_NEGATIVE_CLASSES if options.implied_negatives and labeler_rule else ()
    notes.append(implied_negatives_note(implied, options.implied_negatives, "CheXpert labeler"))
    return SourceTable(
        source="chexpert", adapter_version=ADAPTER_VERSION, root=root, frame=frame,
        classes=list(SOURCE_CLASSES), set_aside=set_aside, rows_read=rows_read, notes=notes,
        implied_negative_classes=implied,
    )


def implied_negatives_note(implied: tuple[str, ...], wanted: bool, labeler: str) -> str:
    """One note saying whether blanks on ``No Finding = 1`` rows became negatives, and why."""
    if implied:
        return (f"implied negatives ({labeler} rule): a blank pathology on a 'No Finding = 1' row is a negative "
                "(Support Devices excepted); --no-implied-negatives keeps such blanks unlabeled")
    if not wanted:
        return "implied negatives off (--no-implied-negatives): blanks on 'No Finding = 1' rows stay unlabeled"
    return f"no implied negatives: the labels are not the {labeler}'s (its No Finding rule does not apply)"


def _label_files(input_dir: Path, options: AdapterOptions) -> list[tuple[Path, str]]:
    """[(csv, official split)] for the train and valid label files that exist."""
    labeler = str(options.extra.get("labeler", "chexpert")).lower()
    if labeler not in {"chexpert", "chexbert"}:
        raise IngestError(f"chexpert: labeler must be 'chexpert' or 'chexbert', got {labeler!r}")
    train_names = ["train.csv", "train_cheXbert.csv"]
    if labeler == "chexbert":
        train_names.reverse()
    files = []
    for names, split in ((train_names, "train_val"), (["valid.csv"], "test")):
        found = find_file(input_dir, names, subdirs=RELEASE_DIRS)
        if found is not None:
            files.append((found, split))
    if not files:
        raise IngestError(f"{input_dir}: no CheXpert label file (looked for train.csv, train_cheXbert.csv, valid.csv)")
    return files


def _export_root(csv: Path) -> Path:
    """The folder the csv's paths are relative to once their first component is stripped.

    The csv normally sits in the release folder; ``train_cheXbert.csv`` kept beside it
    (one level up) points into it, so the release folder is taken when it is there.
    """
    try:
        with open_input(csv) as raw, io.TextIOWrapper(raw, encoding="utf-8", errors="replace") as handle:
            handle.readline()
            first = handle.readline().split(",", 1)[0].strip().strip('"').replace("\\", "/")
    except (OSError, IngestError):  # read_table names the problem when the rows are read
        return csv.parent
    head = first.split("/", 1)[0]
    if head.lower().startswith("chexpert") and (csv.parent / head).is_dir():
        return csv.parent / head
    return csv.parent


def _read_label_file(
    csv: Path, split: str, input_dir: Path, file_root: Path, root: Path
) -> tuple[pd.DataFrame, list[SetAside], list[str]]:
    name = relative_name(csv, input_dir)
    text_cols = {c: str for c in (PATH, SEX, AGE, FRONTAL_LATERAL, AP_PA)}
    df = read_table(csv, base=input_dir, dtype=text_cols)
    df.columns = [str(c).strip() for c in df.columns]
    require_columns(df, [PATH] + LABEL_COLUMNS, name)
    n = len(df)
    rows = np.arange(1, n + 1)
    raw, bad, reasons = label_columns(df, CLASS_OF)

    rel = df[PATH].str.strip().str.replace("\\", "/", regex=False).str.replace(
        r"(?i)^chexpert[^/]*/", "", regex=True)
    prefix = relative_name(file_root, root)
    image_path = rel if prefix in {"", "."} else prefix + "/" + rel
    patient, study = _patient_study(rel)
    no_ids = patient.isna().to_numpy()
    for i in np.flatnonzero(no_ids & ~bad):
        reasons[i] = f"unrecognised path: {PATH!r} has no patientNNNNN/studyN component"
    bad |= no_ids

    frame = pd.DataFrame({
        "image_path": image_path,
        "patient_id": patient,
        "study_id": study,
        **raw,
        "official_split": split,
        "source_file": name,
        "source_row": rows,
    })
    frame, notes = _add_demographics(frame, df, name)
    aside = rows_set_aside(name, rows[bad], [reasons[i] for i in np.flatnonzero(bad)], image_path[bad])
    notes.insert(0, f"labels: {name} ({n} rows) → official split {split!r}")
    return frame.loc[~bad].reset_index(drop=True), aside, notes


_PATIENT_STUDY = re.compile(r"(?:^|/)((patient\d+)/study\d+)/")
_DIGITS = re.compile(r"\d+")


def _patient_study(rel: pd.Series) -> tuple[pd.Series, pd.Series]:
    """``patientNNNNN`` and ``patientNNNNN/studyN`` from each path (``None`` when absent).

    A compiled regex over a plain list: pandas' ``str.extract`` runs ~3× slower on the
    223k-row train.csv.
    """
    found = [_PATIENT_STUDY.search(p) if isinstance(p, str) else None for p in rel.tolist()]
    patient = [m[2] if m else None for m in found]
    study = [m[1] if m else None for m in found]
    return pd.Series(patient, dtype=object, index=rel.index), pd.Series(study, dtype=object, index=rel.index)


def _patient_number(value: Optional[str]) -> Optional[int]:
    """``patient00042`` / ``00042`` / ``42`` → 42 (the demographics sheet's join key)."""
    match = _DIGITS.search(value) if isinstance(value, str) else None
    return int(match.group()) if match else None


def _add_demographics(frame: pd.DataFrame, df: pd.DataFrame, name: str) -> tuple[pd.DataFrame, list[str]]:
    """age / sex / view codes (unmappable values → unknown, noted) and the sex/view groups."""
    notes: list[Optional[str]] = []
    n = len(df)
    age, failed = map_distinct(df[AGE], parse_age) if AGE in df else (np.full(n, np.nan), None)
    if failed is not None:
        notes.append(failed_note(f"age in {name}", df[AGE], failed, "age unknown, rows kept"))
    bins, _ = map_distinct(pd.Series(age), age_bin_code)
    sex, failed = map_distinct(df[SEX], sex_code) if SEX in df else (np.full(n, np.nan), None)
    if failed is not None:
        notes.append(failed_note(f"sex in {name}", df[SEX], failed, "sex unknown, rows kept"))
    view = _view_codes(df)
    frame["age"] = age
    frame[aux_column("age_bin")] = to_codes(bins)
    frame[aux_column("sex")] = to_codes(sex)
    frame[aux_column("view")] = to_codes(view)
    frame["group__sex"] = code_names("sex", sex)
    if FRONTAL_LATERAL in df:
        frame["group__view"] = df[FRONTAL_LATERAL].str.strip().str.lower()
    missing = [c for c in (SEX, AGE, FRONTAL_LATERAL, AP_PA) if c not in df]
    if missing:
        notes.append(f"{name}: no column(s) {', '.join(map(repr, missing))}: those values unknown")
    return frame, [x for x in notes if x]


def _view_codes(df: pd.DataFrame) -> np.ndarray:
    """LATERAL for ``Frontal/Lateral == Lateral``; otherwise the ``AP/PA`` column's view."""
    n = len(df)
    codes = map_distinct(df[AP_PA], view_code)[0] if AP_PA in df else np.full(n, np.nan)
    if FRONTAL_LATERAL in df:
        lateral = (df[FRONTAL_LATERAL].str.strip().str.lower() == "lateral").fillna(False).to_numpy(dtype=bool)
        codes = np.where(lateral, float(view_code("LATERAL")), codes)
    return codes


def chexpert_race_code(primary_race: object, ethnicity: object = None) -> Optional[int]:
    """Race code of one demographics-sheet row (see :data:`PRIMARY_RACE`); ValueError if unmappable."""
    text = None if primary_race is None or pd.isna(primary_race) else str(primary_race).strip()
    family = PRIMARY_RACE[text] if text in PRIMARY_RACE else text
    return race_code(family, ethnicity)


def _add_race(frame: pd.DataFrame, input_dir: Path, root: Path) -> tuple[pd.DataFrame, list[str]]:
    """Join the demographics sheet on the patient number: ``aux__race`` and ``group__race``."""
    sheet = find_file(input_dir, DEMOGRAPHICS_FILES, subdirs=RELEASE_DIRS) or find_file(root, DEMOGRAPHICS_FILES)
    frame[aux_column("race")] = pd.array([pd.NA] * len(frame), dtype="Int64")
    if sheet is None:
        return frame, ["no demographics sheet (CHEXPERT DEMO.xlsx/.csv): race unknown"]
    name = relative_name(sheet, input_dir)
    demo = read_table(sheet, base=input_dir, dtype=str)
    demo.columns = [str(c).strip() for c in demo.columns]
    require_columns(demo, ["PATIENT", "PRIMARY_RACE"], name)
    ethnicity = demo["ETHNICITY"] if "ETHNICITY" in demo else pd.Series([None] * len(demo), dtype=object)
    pairs = demo["PRIMARY_RACE"].fillna("").astype(str) + "\x1f" + ethnicity.fillna("").astype(str)
    codes, failed = map_distinct(pairs, _pair_code)
    key = map_distinct(demo["PATIENT"], _patient_number)[0]
    per_patient = pd.DataFrame({"key": key, "code": codes}).dropna(subset=["key"])
    conflicts = int((per_patient.groupby("key")["code"].nunique() > 1).sum())
    lookup = per_patient.drop_duplicates("key").set_index("key")["code"].to_dict()
    race = map_distinct(frame["patient_id"], lambda p: lookup.get(_patient_number(p)))[0]
    frame[aux_column("race")] = to_codes(race)
    frame["group__race"] = code_names("race", race)
    notes = [f"demographics: {name} ({len(demo)} rows); race known for {int(np.isfinite(race).sum())} of "
             f"{len(frame)} images"]
    notes.append(failed_note(f"PRIMARY_RACE in {name}", demo["PRIMARY_RACE"], failed, "race unknown, rows kept"))
    if conflicts:
        notes.append(f"{conflicts} patient(s) with conflicting rows in {name}: first row used")
    return frame, [x for x in notes if x]


def _pair_code(pair: Optional[str]) -> Optional[int]:
    race, _, ethnicity = (pair or "").partition("\x1f")
    return chexpert_race_code(race or None, ethnicity or None)
