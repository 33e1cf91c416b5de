"""PadChest adapter: the label strings of ``PADCHEST_chest_x_ray_images_labels_160K_01.02.19.csv``.

Layout (the BIMCV download, unpacked)::

    INPUT/
      PADCHEST_chest_x_ray_images_labels_160K_01.02.19.csv(.gz)   one row per image
      <ImageDir>/<ImageID>         the PNGs, in the numbered folders of the download's zips
                                   (or all in one folder: images are found by name)

Columns read (Bustos et al., *Medical Image Analysis* 2020, and the release's field list):
``ImageID`` (file name, ``.png``), ``ImageDir``, ``PatientID``, ``StudyID``, ``Labels`` (a
Python-list string of lower-case findings, e.g. ``['pleural effusion', 'cardiomegaly']``;
``['normal']`` for a normal report), ``Projection`` (``PA``, ``L``, ``AP``, ``AP_horizontal``,
``COSTAL``...), ``PatientSex_DICOM`` (M/F), ``PatientBirth`` (year), ``StudyDate_DICOM``
(``YYYYMMDD``), ``MethodLabel`` (``Physician``: labeled by hand, 27 % of reports;
``RNN_model``: by the authors' network). Only the first four are required.

Labels. PadChest lists the findings a report names; a finding not listed is absent, so every
class of :data:`LABEL_CLASSES` is 0 unless one of its PadChest labels is listed (the reading of
TorchXRayVision's ``PC_Dataset``). The table follows TorchXRayVision's 28 classes but matches
whole labels, not substrings, so ``subcutaneous emphysema`` is not emphysema and
``pseudonodule`` (a nodule look-alike) not a nodule; ``support_devices`` also takes catheters,
defibrillators and heart valves (CheXpert's definition of the class, which TorchXRayVision's
"Support Devices"/"Tube" pair leaves out). ``normal`` → ``no_finding`` 1. Rows set aside: an
empty ``Labels`` cell (TorchXRayVision drops them too), one that is not a list of strings, and
one labeled ``exclude`` (the dataset's mark for a report that does not describe the image).
Labels with no canonical class (``chronic changes``, ``kyphosis``...) are counted in the notes.

Demographics: sex from ``PatientSex_DICOM``; age = study year − birth year (TorchXRayVision
uses 2017 − birth year for every study, 2009–2017); view from ``Projection`` (``AP_horizontal``
→ AP, ``L`` → LATERAL; ``COSTAL``/others unknown). ``MethodLabel`` becomes the group column
``label_method`` (``physician``/``rnn_model``) for ``--site-by label_method``. No official split.
TorchXRayVision keeps PA views, one image per patient and patients over 10 by default; here
every row is kept and those are choices of the experiment, not of the ingest.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from fedcxr.site_adapters.base import AdapterOptions, IngestError, SetAside, SourceTable, require_columns
from fedcxr.site_adapters.export_images import AMBIGUOUS, index_files
from fedcxr.site_adapters.tables import failed_note, find_file, map_distinct, read_table, relative_name, to_codes
from fedcxr.vocab import CLASSES, age_bin_code, aux_column, parse_age, raw_column, sex_code, view_code

ADAPTER_VERSION = "1"

#: Canonical class → the PadChest labels that name it (README "PadChest" table).
CLASS_LABELS: dict[str, tuple[str, ...]] = {
    "atelectasis": ("atelectasis", "laminar atelectasis", "lobar atelectasis", "segmental atelectasis",
                    "round atelectasis", "total atelectasis", "atelectasis basal"),
    "cardiomegaly": ("cardiomegaly",),
    "consolidation": ("consolidation", "air bronchogram"),
    "edema": ("pulmonary edema",),
    "pleural_effusion": ("pleural effusion", "loculated pleural effusion", "loculated fissural effusion"),
    "pneumonia": ("pneumonia", "atypical pneumonia"),
    "pneumothorax": ("pneumothorax", "hydropneumothorax"),
    "infiltration": ("infiltrates", "interstitial pattern", "ground glass pattern", "reticular interstitial pattern",
                     "reticulonodular interstitial pattern", "alveolar pattern", "consolidation", "air bronchogram"),
    "mass": ("mass", "pulmonary mass", "mediastinal mass", "breast mass", "pleural mass", "soft tissue mass"),
    "nodule": ("nodule", "multiple nodules"),
    "emphysema": ("emphysema",),
    "fibrosis": ("pulmonary fibrosis",),
    "pleural_thickening": ("pleural thickening", "apical pleural thickening", "calcified pleural thickening"),
    "hernia": ("hiatal hernia",),
    "fracture": ("fracture", "rib fracture", "clavicle fracture", "humeral fracture", "vertebral fracture",
                 "callus rib fracture"),
    "support_devices": ("pacemaker", "electrical device", "dual chamber device", "single chamber device", "dai",
                        "nsg tube", "endotracheal tube", "tracheostomy tube", "chest drain tube",
                        "ventriculoperitoneal drain tube", "double j stent", "central venous catheter",
                        "central venous catheter via subclavian vein", "central venous catheter via jugular vein",
                        "central venous catheter via umbilical vein", "reservoir central venous catheter",
                        "catheter", "artificial heart valve", "artificial mitral heart valve",
                        "artificial aortic heart valve"),
    "no_finding": ("normal",),
    "lung_cavity": ("cavitation",),
    "mediastinal_shift": ("mediastinal shift",),
    "copd": ("copd signs",),
    "tuberculosis": ("tuberculosis", "tuberculosis sequelae"),
    "granuloma": ("granuloma", "calcified granuloma"),
    "calcified_granuloma": ("calcified granuloma",),
    "scoliosis": ("scoliosis",),
    "bronchiectasis": ("bronchiectasis",),
    "flattened_diaphragm": ("flattened diaphragm",),
    "aortic_elongation": ("aortic elongation", "descendent aortic elongation", "ascendent aortic elongation",
                          "supra aortic elongation"),
    "hilar_enlargement": ("hilar enlargement", "vascular hilar enlargement", "adenopathy", "calcified adenopathy",
                          "calcified mediastinal adenopathy", "pulmonary artery enlargement"),
    "air_trapping": ("air trapping",),
    "costophrenic_angle_blunting": ("costophrenic angle blunting",),
    "aortic_atheromatosis": ("aortic atheromatosis",),
    "hemidiaphragm_elevation": ("hemidiaphragm elevation",),
}
#: The classes this source labels, canonical order.
SOURCE_CLASSES: tuple[str, ...] = tuple(c for c in CLASSES if c in CLASS_LABELS)
LABEL_CLASSES: dict[str, tuple[str, ...]] = {}
for _cls in SOURCE_CLASSES:
    for _label in CLASS_LABELS[_cls]:
        LABEL_CLASSES[_label] = LABEL_CLASSES.get(_label, ()) + (_cls,)
#: Labels that are not findings: excluded rows, and notes about the study rather than the patient.
EXCLUDE = "exclude"
NOT_FINDINGS = frozenset({"suboptimal study", "unchanged"})

METADATA_FILES = ["PADCHEST_chest_x_ray_images_labels_160K_01.02.19.csv.gz",
                  "PADCHEST_chest_x_ray_images_labels_160K_01.02.19.csv",
                  "PADCHEST_chest_x_ray_images_labels_160K.csv"]
IMAGE, IMAGE_DIR, PATIENT, STUDY, LABELS = "ImageID", "ImageDir", "PatientID", "StudyID", "Labels"
SEX, BIRTH, STUDY_DATE, PROJECTION, METHOD = ("PatientSex_DICOM", "PatientBirth", "StudyDate_DICOM", "Projection",
                                              "MethodLabel")
MAX_LABELS_CHARS = 10_000  # the longest real list is a few hundred characters


def parse_labels(text: object) -> list[str]:
    """``"['pleural effusion', ' cardiomegaly']"`` → ``['pleural effusion', 'cardiomegaly']``.

    Raises ``ValueError`` (with the reason) for a cell that is not a list of strings; blank
    items are dropped. ``ast.literal_eval`` evaluates literals only, never code.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("missing value: empty 'Labels'")
    if len(text) > MAX_LABELS_CHARS:
        raise ValueError(f"unknown label value: a {len(text)}-character 'Labels' cell")
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise ValueError(f"unknown label value: {text[:60]!r} in column 'Labels' (not a list)") from None
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"unknown label value: {text[:60]!r} in column 'Labels' (not a list of strings)")
    return [v.strip().lower() for v in value if v.strip()]


def labels_row(labels: list[str]) -> dict[str, float]:
    """Raw value per source class for one row's PadChest labels."""
    found = {c for label in labels for c in LABEL_CLASSES.get(label, ())}
    return {c: 1.0 if c in found else 0.0 for c in SOURCE_CLASSES}


def read_padchest_labels(input_dir: Path) -> tuple[pd.DataFrame, list[SetAside], list[str], int]:
    """Metadata only: ``(frame, set_aside, notes, rows_read)``; ``image_path`` = ``<ImageDir>/<ImageID>``."""
    csv = find_file(input_dir, METADATA_FILES, max_depth=2)
    if csv is None:
        raise IngestError(f"{input_dir}: no PadChest label file (looked for {', '.join(METADATA_FILES)})")
    name = relative_name(csv, input_dir)
    wanted = {IMAGE, IMAGE_DIR, PATIENT, STUDY, LABELS, SEX, BIRTH, STUDY_DATE, PROJECTION, METHOD}
    # the free-text columns (Report, LabelsLocalizationsBySentence) are most of the file's size: not read
    table = read_table(csv, base=input_dir, usecols=lambda c: str(c).strip() in wanted, dtype=str)
    table.columns = [str(c).strip() for c in table.columns]
    require_columns(table, [IMAGE, PATIENT, LABELS], name)
    n = len(table)
    rows = np.arange(1, n + 1)
    image = table[IMAGE].str.strip().fillna("")
    folder = table[IMAGE_DIR].str.strip().fillna("") if IMAGE_DIR in table else pd.Series([""] * n)
    patient = table[PATIENT].str.strip().fillna("")
    study = table[STUDY].str.strip().fillna("") if STUDY in table else image
    study = study.where(study != "", image)  # a blank StudyID: the image is its own study
    codes, uniques = pd.factorize(table[LABELS], use_na_sentinel=True)
    parsed: list = []
    for text in list(uniques) + [None]:  # once per distinct string (PadChest: ~27,000 for 160,000 rows)
        try:
            labels = parse_labels(text)
            parsed.append((labels, EXCLUDE in labels and "labeled 'exclude' by PadChest (the report does not describe "
                                                         "the image)" or None))
        except ValueError as exc:
            parsed.append(([], str(exc)))
    per_row = [parsed[c] for c in codes]
    reasons = [r for _, r in per_row]
    for i in np.flatnonzero((image == "").to_numpy() | (patient == "").to_numpy()):
        reasons[i] = reasons[i] or f"missing value: empty {(IMAGE if image.iloc[i] == '' else PATIENT)!r}"
    matrix = np.array([[row[c] for c in SOURCE_CLASSES] for row in (labels_row(p) for p, _ in parsed)])[codes]
    values = {c: matrix[:, j] for j, c in enumerate(SOURCE_CLASSES)}
    image_path = [f"{d}/{f}" if d else f for d, f in zip(folder, image)]
    frame = pd.DataFrame({
        "image_path": image_path, "patient_id": patient, "study_id": study, "_image": image,
        **{raw_column(c): values[c] for c in SOURCE_CLASSES},
        "source_file": name, "source_row": rows,
    })
    notes = [f"metadata: {name} ({n} rows)"]
    frame, demo_notes = _demographics(frame, table)
    notes += demo_notes
    unmapped = Counter(label for labels, r in parsed for label in labels if label not in LABEL_CLASSES
                       and label not in NOT_FINDINGS and label != EXCLUDE)
    if unmapped:
        weighted = Counter()
        for c, count in zip(*np.unique(codes[codes >= 0], return_counts=True)):
            weighted.update({label: int(count) for label in parsed[c][0] if label in unmapped})
        top = ", ".join(f"{t!r} {k}" for t, k in weighted.most_common(8))
        notes.append(f"{len(weighted)} PadChest label(s) name no canonical class ({sum(weighted.values())} mentions), "
                     f"e.g. {top}")
    bad = np.array([r is not None for r in reasons], dtype=bool)
    set_aside = [SetAside(name, int(rows[i]), reasons[i], image_path[i] or None) for i in np.flatnonzero(bad)]
    return frame.loc[~bad].reset_index(drop=True), set_aside, notes, n


def _demographics(frame: pd.DataFrame, table: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """sex, age (study year − birth year), view (Projection) and the label_method group."""
    notes: list[str] = []
    n = len(table)
    blank = pd.Series([None] * n, dtype=object)
    sex, bad_sex = map_distinct(table[SEX] if SEX in table else blank, sex_code)
    birth = pd.to_numeric(table[BIRTH], errors="coerce") if BIRTH in table else pd.Series(np.nan, index=range(n))
    year = pd.to_numeric((table[STUDY_DATE] if STUDY_DATE in table else blank).astype(str).str[:4], errors="coerce")
    ages = (year - birth).to_numpy(dtype=float)
    age, bad_age = map_distinct(pd.Series(ages), lambda v: None if v is None or np.isnan(v) else parse_age(float(v)))
    projection = (table[PROJECTION] if PROJECTION in table else blank).str.strip()
    view, _ = map_distinct(projection.replace({"L": "LATERAL"}), view_code)
    frame["age"] = age
    bins, _ = map_distinct(pd.Series(age), age_bin_code)  # once per distinct age, not per row
    frame[aux_column("age_bin")] = to_codes(bins).to_numpy()
    frame[aux_column("sex")] = to_codes(sex).to_numpy()
    frame[aux_column("view")] = to_codes(view).to_numpy()
    method = (table[METHOD] if METHOD in table else blank).astype(str).str.strip().str.lower()
    frame["group__label_method"] = method.where(method.isin(["physician", "rnn_model"]), None).to_numpy()
    for note in (failed_note("sex", table[SEX] if SEX in table else blank, bad_sex, "sex unknown, rows kept"),
                 failed_note("age", pd.Series(ages), bad_age, "age unknown, rows kept")):
        if note:
            notes.append(note)
    unknown_view = projection[np.isnan(view) & projection.notna().to_numpy()].value_counts()
    if len(unknown_view):
        notes.append("view unknown for projection(s) " + ", ".join(f"{k!r} {v}" for k, v in unknown_view.items()))
    counts = pd.Series(frame["group__label_method"]).value_counts()
    notes.append("MethodLabel: " + ", ".join(f"{k} {v}" for k, v in counts.items()) + " (group column label_method)")
    return frame, notes


def read_padchest(input_dir: Path, options: AdapterOptions) -> SourceTable:
    """Read a PadChest export (see module doc) into a :class:`SourceTable`."""
    input_dir = Path(input_dir)
    frame, set_aside, notes, rows_read = read_padchest_labels(input_dir)
    index = index_files(input_dir, (".png",), strip_suffix=False)
    located: list[str] = []
    ambiguous = np.zeros(len(frame), dtype=bool)
    for i, (image, default) in enumerate(zip(frame["_image"], frame["image_path"])):
        found: Optional[str] = index.get(image)
        ambiguous[i] = image in index and found is None and not (input_dir / default).is_file()
        located.append(found or default)
    frame["image_path"] = located
    set_aside += [SetAside(f, int(r), AMBIGUOUS, p)
                  for f, r, p in zip(frame.loc[ambiguous, "source_file"], frame.loc[ambiguous, "source_row"],
                                     frame.loc[ambiguous, "image_path"])]
    frame = frame.loc[~ambiguous].drop(columns="_image").reset_index(drop=True)
    return SourceTable(
        source="padchest", adapter_version=ADAPTER_VERSION, root=input_dir, frame=frame,
        classes=list(SOURCE_CLASSES), set_aside=set_aside, rows_read=rows_read, notes=notes,
    )


__all__ = ["ADAPTER_VERSION", "CLASS_LABELS", "LABEL_CLASSES", "SOURCE_CLASSES", "labels_row", "parse_labels",
           "read_padchest", "read_padchest_labels"]
