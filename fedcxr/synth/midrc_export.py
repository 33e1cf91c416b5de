"""``midrc_style``: a MIDRC data-commons export — Gen3 node TSVs plus the DICOM files.

Layout (the one :mod:`fedcxr.site_adapters.midrc` documents and reads)::

    midrc_style/
      case.tsv              one row per patient: covid19_positive, sex, race, ethnicity,
                            age_at_index (+ age_at_index_gt89), zip (3 digits), site_id
      imaging_study.tsv     one row per study: link to the case, study_uid, age_at_imaging
      cr_series_file.tsv    one row per CR file: link to the study, file_name, md5sum, ...
      dx_series_file.tsv    one row per DX file
      measurement.tsv       one COVID-19 RT-PCR result per case (realism; the adapter ignores it)
      images/<case>/<study_uid>/<sop_uid>.dcm

Headers are the Gen3 submission templates' (``../shared/data/schemas/midrc/``, required
columns marked ``*``) and values come from the MIDRC enums (``Yes``/``No``/``Not Reported``,
``Hispanic or Latino``, ``Black or African American``...). Quirks a real export has and this
one reproduces: ages over 89 withheld (blank number, ``*_gt89 = Yes``), ``zip = 000`` for
small areas (no state), ``view_position`` sometimes a JSON-style array (``["AP"]``),
``study_modality`` always an array, race and ethnicity separate (a Hispanic patient's race
may be ``White`` or ``Not Reported``), and one DICOM file that no series TSV names (the
adapter links it through its PatientID/StudyInstanceUID tags).

Patients live in two states (zip prefixes in Illinois and Texas, :data:`STATES`), so
``fedcxr ingest midrc --site-by state`` splits the hospital into two sites.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from pydicom.uid import ExplicitVRLittleEndian, JPEG2000Lossless, RLELossless

from fedcxr.synth.cohort import ImageDraw, Patient
from fedcxr.synth.dicom_export import DicomSpec, dicom_age, encoder_available, uid, write_dicom
from fedcxr.synth.export import entry, write_text
from fedcxr.synth.hospitals import FORMAT, Hospital, pixels

PROJECT = "SYNTH-MIDRC"
DATASET = "synth-dataset-1"
#: state → (3-digit zip prefixes, site_id of the submitting site there, share of patients)
STATES = {"IL": (("606", "604", "617"), "101", 0.55), "TX": (("770", "752", "787"), "204", 0.40)}
SMALL_AREA_SHARE = 0.05  # zip "000": population under 20,000, no state

CASE_HEADER = [
    "*type", "project_id", "*submitter_id", "*datasets.submitter_id", "age_at_index", "age_at_index_gt89",
    "case_ids", "country_of_residence", "covid19_positive", "ethnicity", "gen3_linked_subjects_available",
    "icu_indicator", "index_event", "linked_external_data", "race", "sex", "site_id", "token_record_id",
    "treatment_info", "ventilator_indicator", "zip",
]
STUDY_HEADER = [
    "*type", "project_id", "*submitter_id", "*cases.submitter_id", "age_at_imaging", "age_at_imaging_gt89",
    "body_part_examined", "case_ids", "days_from_study_to_neg_covid_test", "days_from_study_to_pos_covid_test",
    "days_to_study", "loinc_code", "loinc_contrast", "loinc_long_common_name", "loinc_method", "loinc_system",
    "study_description", "study_modality", "study_uid", "study_year", "study_year_shifted",
]
SERIES_HEADER = [
    "*type", "project_id", "*submitter_id", "core_metadata_collections.submitter_id",
    "imaging_studies.submitter_id", "*data_category", "*data_format", "*data_type", "*file_name", "*file_size",
    "*md5sum", "associated_ids", "case_ids", "contrast_bolus_agent", "detector_type", "file_description",
    "image_type", "imager_pixel_spacing", "lossy_image_compression", "manufacturer", "manufacturer_model_name",
    "modality", "object_id", "pixel_spacing", "series_description", "series_uid", "spatial_resolution",
    "storage_urls", "view_position",
]
MEASUREMENT_HEADER = [
    "*type", "project_id", "*submitter_id", "cases.submitter_id", "conditions.submitter_id",
    "procedures.submitter_id", "case_ids", "test_days_from_index", "test_method", "test_name", "test_result_text",
]
#: canonical race → MIDRC ``race`` values (one picked); Hispanic goes in ``ethnicity``
MIDRC_RACE = {
    "white": ["White"], "black": ["Black or African American"], "asian": ["Asian"],
    "hispanic": ["White", "Other", "Not Reported"],
    "other": ["American Indian or Alaska Native", "Native Hawaiian or other Pacific Islander", "Other"],
    None: ["Not Reported"],
}


def tsv(header: Sequence[str], records: Sequence[dict]) -> str:
    """Rows as Gen3 TSV under ``header`` (keys: header names without ``*``; missing → blank).

    No quoting, as Gen3 writes them: an array cell stays ``["DX"]``. Values never hold tabs
    or line breaks (checked).
    """
    keys = [h.lstrip("*") for h in header]
    lines = ["\t".join(header)]
    for record in records:
        cells = [str(record.get(k, "")) for k in keys]
        if any(("\t" in c) or ("\n" in c) for c in cells):
            raise ValueError(f"TSV cell with a tab or line break in {record}")
        lines.append("\t".join(cells))
    return "\n".join(lines) + "\n"


def _age_fields(age: float, prefix: str) -> dict:
    """MIDRC withholds ages over 89: blank number and ``<prefix>_gt89 = Yes``."""
    years = int(age)
    if years > 89:
        return {prefix: "", f"{prefix}_gt89": "Yes"}
    return {prefix: str(years), f"{prefix}_gt89": "No"}


def _case_record(patient: Patient, case_id: str, first_age: float, covid: bool, rng: np.random.Generator) -> dict:
    u = rng.random()
    if u < SMALL_AREA_SHARE:
        zip3, site_id = "000", str(rng.choice([s for _, s, _ in STATES.values()]))
    else:
        states = list(STATES)
        shares = np.array([STATES[s][2] for s in states])
        prefixes, site_id, _ = STATES[states[int(rng.choice(len(states), p=shares / shares.sum()))]]
        zip3 = str(rng.choice(prefixes))
    choices = MIDRC_RACE[patient.race]
    race = choices[int(rng.integers(len(choices)))]
    if patient.race == "hispanic":
        ethnicity = "Hispanic or Latino"
    elif patient.race is None:
        ethnicity = "Not Reported"
    else:
        ethnicity = "Not Reported" if rng.random() < 0.1 else "Not Hispanic or Latino"
    sex = "Not Reported" if rng.random() < 0.02 else {"M": "Male", "F": "Female"}[patient.sex]
    covid_text = "Not Reported" if rng.random() < 0.03 else ("Yes" if covid else "No")
    return {
        "type": "case", "project_id": PROJECT, "submitter_id": case_id, "datasets.submitter_id": DATASET,
        **_age_fields(first_age, "age_at_index"), "country_of_residence": "United States",
        "covid19_positive": covid_text, "ethnicity": ethnicity, "index_event": "COVID-19 test",
        "race": race, "sex": sex, "site_id": site_id, "zip": zip3,
    }


def _spec(modality: str, rng: np.random.Generator, j2k: bool) -> DicomSpec:
    """CR plates store MONOCHROME1 (some RLE); DX detectors MONOCHROME2 (some JPEG 2000)."""
    compressed = rng.random() < 0.35
    if modality == "CR":
        return DicomSpec("CR", "MONOCHROME1", 12, RLELossless if compressed else ExplicitVRLittleEndian)
    return DicomSpec("DX", "MONOCHROME2", 12, JPEG2000Lossless if compressed and j2k else ExplicitVRLittleEndian,
                     rescale=True)


def write_midrc(hospital: Hospital, root: Path, draws: Sequence[ImageDraw], image_size: int, seed: int) -> dict:
    """MIDRC layout (see module doc) under ``root``."""
    rng = hospital.rng(seed, FORMAT)
    j2k = encoder_available(JPEG2000Lossless)
    cases: dict[int, dict] = {}
    studies: dict[tuple[int, int], dict] = {}
    series = {"CR": [], "DX": []}
    positives: Counter = Counter()
    loose = len(draws) - 1 if len(draws) >= 10 else None  # one file no series TSV names
    for draw in draws:
        p = draw.patient
        case_id = f"{PROJECT}-{p.index + 1:06d}"
        covid = "covid19" in draw.subject.findings
        if p.index not in cases:
            cases[p.index] = _case_record(p, case_id, draw.age, covid, rng)
        if cases[p.index]["covid19_positive"] == "Yes":
            positives["covid19"] += 1
        key = (p.index, draw.study)
        modality = "DX" if draw.subject.view == "AP" or rng.random() < 0.3 else "CR"
        study_uid = uid(seed, hospital.name, "study", p.index, draw.study)
        if key not in studies:
            studies[key] = _study_record(case_id, draw, study_uid, modality)
        sop_uid = uid(seed, hospital.name, "sop", draw.index)
        series_uid = uid(seed, hospital.name, "series", draw.index)
        rel = f"images/{case_id}/{study_uid}/{sop_uid}.dcm"
        spec = _spec(modality, rng, j2k)
        tags = {
            "PatientID": case_id, "PatientSex": {"M": "M", "F": "F"}[p.sex],
            "PatientAge": dicom_age(min(draw.age, 90.0), rng, nonconformant=0.0, missing=0.0),
            "ViewPosition": draw.subject.view, "StudyInstanceUID": study_uid, "SeriesInstanceUID": series_uid,
            "SOPInstanceUID": sop_uid, "StudyDescription": "XR CHEST 1V", "SeriesDescription": draw.subject.view,
            "StudyDate": f"2020{int(rng.integers(3, 13)):02d}{int(rng.integers(1, 29)):02d}",
            "Manufacturer": "SYNTH-DR" if modality == "DX" else "SYNTH-CR",
            "ImagerPixelSpacing": ["0.2", "0.2"] if modality == "DX" else ["0.1", "0.1"],
        }
        write_dicom(root / rel, pixels(hospital, draw, image_size, seed), spec, tags)
        if draw.index == loose:
            continue
        data = (root / rel).read_bytes()
        view = f'["{draw.subject.view}"]' if rng.random() < 0.3 else draw.subject.view
        series[modality].append({
            "type": f"{modality.lower()}_series_file", "project_id": PROJECT,
            "submitter_id": f"{case_id}_{draw.study}_{draw.view_number}_{modality.lower()}",
            "imaging_studies.submitter_id": studies[key]["submitter_id"], "data_category": modality,
            "data_format": "DCM", "data_type": "DICOM", "file_name": rel, "file_size": str(len(data)),
            "md5sum": hashlib.md5(data).hexdigest(), "case_ids": case_id,
            "detector_type": "DIRECT" if modality == "DX" else "STORAGE", "image_type": "ORIGINAL\\PRIMARY",
            "lossy_image_compression": "00", "manufacturer": tags["Manufacturer"], "modality": modality,
            "series_uid": series_uid, "view_position": view,
        })
    write_text(root / "case.tsv", tsv(CASE_HEADER, list(cases.values())))
    write_text(root / "imaging_study.tsv", tsv(STUDY_HEADER, list(studies.values())))
    for modality, rows in series.items():
        header_type = f"{modality.lower()}_series_file"
        write_text(root / f"{header_type}.tsv", tsv(SERIES_HEADER, rows))
    write_text(root / "measurement.tsv", tsv(MEASUREMENT_HEADER, _measurements(cases, rng)))
    states = Counter(_state_of(c["zip"]) for c in cases.values())
    return entry(hospital, root.name, draws, positives, files={
        "tsvs": ["case.tsv", "imaging_study.tsv", "cr_series_file.tsv", "dx_series_file.tsv", "measurement.tsv"],
        "images": "images/", "unlisted_file": loose is not None,
        "patients_per_state": {k or "none (zip 000)": v for k, v in sorted(states.items(), key=lambda kv: str(kv[0]))},
        "site_by": ["state", "site_id", "race"],
    })


def _state_of(zip3: str) -> Optional[str]:
    return next((s for s, (prefixes, _, _) in STATES.items() if zip3 in prefixes), None)


def _study_record(case_id: str, draw: ImageDraw, study_uid: str, modality: str) -> dict:
    return {
        "type": "imaging_study", "project_id": PROJECT, "submitter_id": f"{case_id}_study{draw.study}",
        "cases.submitter_id": case_id, **_age_fields(draw.age, "age_at_imaging"), "body_part_examined": "CHEST",
        "days_to_study": str(int(round((draw.age - draw.patient.age) * 365.25))),
        "loinc_code": "36554-4", "loinc_long_common_name": "XR Chest Single view",
        "study_description": "XR CHEST 1V", "study_modality": f'["{modality}"]', "study_uid": study_uid,
        "study_year": "2020",
    }


def _measurements(cases: dict[int, dict], rng: np.random.Generator) -> list[dict]:
    out = []
    for case in cases.values():
        result = {"Yes": "Positive", "No": "Negative"}.get(case["covid19_positive"], "Not Reported")
        out.append({
            "type": "measurement", "project_id": PROJECT, "submitter_id": f"{case['submitter_id']}_covid_test",
            "cases.submitter_id": case["submitter_id"], "test_days_from_index": str(int(rng.integers(-3, 1))),
            "test_method": "RT-PCR" if rng.random() < 0.9 else "Rapid antigen test", "test_name": "COVID-19",
            "test_result_text": result,
        })
    return out
