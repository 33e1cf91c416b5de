"""Write each synthetic hospital in its vendor's native export format.

Why native formats rather than a ready-made manifest: the demo and the tests should walk
the same road as a real hospital — vendor files → ``fedcxr ingest`` adapter → manifest — so
every adapter quirk the synthetic exports exercise is one a user meets.

Formats (``../shared/data/SCHEMAS.md`` and the NIH README list the real facts copied here):

* ``nih_style`` (:func:`write_nih`): ``Data_Entry_2017_v2020.csv`` with the real bracketed
  header, ``|``-separated ``Finding Labels`` in NIH spelling (``Effusion``,
  ``Pleural_Thickening``, ``No Finding`` = none of the 14), integer ``Patient Age``, ``M``/``F``,
  ``PA``/``AP``, rows not sorted by image (a patient's ``_000`` image comes last, as in
  v2020), pixel spacing with float noise; ``images/<patient:08d>_<follow-up:03d>.png``
  (8-bit grey; one RGBA like the real release); ``train_val_list.txt`` / ``test_list.txt``
  (patient-disjoint, no trailing newline).
* ``chexpert_style`` (:func:`write_chexpert`): ``CheXpert-v1.0-small/train.csv`` and
  ``valid.csv`` with the exact 19-column header, ``Path`` with the release prefix,
  ``Male``/``Female``/``Unknown``, age capped at 90, ``Frontal``/``Lateral``, ``AP/PA`` blank
  for laterals; train labels ``1.0``/``0.0``/``-1.0``/blank (uncertain and not-mentioned
  values), valid labels only ``1.0``/``0.0``; JPGs under
  ``train/patientNNNNN/studyN/viewK_frontal.jpg``; ``CHEXPERT DEMO.csv`` beside the release
  folder (``PATIENT, GENDER, AGE_AT_CXR, PRIMARY_RACE, ETHNICITY``).
* ``midrc_style``: :mod:`fedcxr.synth.midrc_export`; ``dicom_style``: :mod:`fedcxr.synth.dicom_export`.

Every writer returns its ``synth.json`` entry (:func:`entry`). Text files are written with
``\\n`` line ends and no timestamps, so the same seed gives byte-identical files.
"""

from __future__ import annotations

import csv
import importlib
import io
from collections import Counter, defaultdict
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from PIL import Image

from fedcxr.synth.cohort import ImageDraw
from fedcxr.synth.hospitals import FORMAT, Hospital, cohort, pixels, to_uint
from fedcxr.synth.phantom import truth

NIH_HEADER = (
    "Image Index,Finding Labels,Follow-up #,Patient ID,Patient Age,Patient Gender,View Position,"
    "OriginalImage[Width,Height],OriginalImagePixelSpacing[x,y]"
)
#: canonical class → NIH ``Finding Labels`` spelling
NIH_NAMES = {
    "atelectasis": "Atelectasis", "cardiomegaly": "Cardiomegaly", "consolidation": "Consolidation",
    "edema": "Edema", "pleural_effusion": "Effusion", "emphysema": "Emphysema", "fibrosis": "Fibrosis",
    "hernia": "Hernia", "infiltration": "Infiltration", "mass": "Mass", "nodule": "Nodule",
    "pleural_thickening": "Pleural_Thickening", "pneumonia": "Pneumonia", "pneumothorax": "Pneumothorax",
}
NIH_NO_FINDING = "No Finding"

CHEXPERT_RELEASE = "CheXpert-v1.0-small"
#: CheXpert label column → canonical class, in the release's column order
CHEXPERT_LABELS = {
    "No Finding": "no_finding", "Enlarged Cardiomediastinum": "enlarged_cardiomediastinum",
    "Cardiomegaly": "cardiomegaly", "Lung Opacity": "lung_opacity", "Lung Lesion": "lung_lesion",
    "Edema": "edema", "Consolidation": "consolidation", "Pneumonia": "pneumonia",
    "Atelectasis": "atelectasis", "Pneumothorax": "pneumothorax", "Pleural Effusion": "pleural_effusion",
    "Pleural Other": "pleural_other", "Fracture": "fracture", "Support Devices": "support_devices",
}
CHEXPERT_HEADER = ["Path", "Sex", "Age", "Frontal/Lateral", "AP/PA", *CHEXPERT_LABELS]
CHEXPERT_DEMO = "CHEXPERT DEMO.csv"
CHEXPERT_DEMO_HEADER = ["PATIENT", "GENDER", "AGE_AT_CXR", "PRIMARY_RACE", "ETHNICITY"]
#: canonical race → PRIMARY_RACE strings of the demographics sheet (one picked per patient)
CHEXPERT_RACE = {
    "white": ["White", "White, non-Hispanic"],
    "black": ["Black or African American", "Black, non-Hispanic"],
    "asian": ["Asian", "Asian, non-Hispanic"],
    "hispanic": ["White, Hispanic", "Other, Hispanic"],
    "other": ["Other", "Native Hawaiian or Other Pacific Islander", "Pacific Islander, non-Hispanic"],
    None: ["Unknown", "Patient Refused"],
}


# --------------------------------------------------------------------------- shared


def entry(hospital: Hospital, input_dir: str, draws: Sequence[ImageDraw], positives: Counter,
          *, extra_args: Sequence[str] = (), extra_kwargs: dict | None = None, files: dict | None = None) -> dict:
    """The ``synth.json`` record of one hospital: how to ingest it and what it contains."""
    args = ["--site-name", hospital.name, *extra_args]
    kwargs = {"site_name": hospital.name, **(extra_kwargs or {})}
    return {
        "source": hospital.source,
        "input": input_dir,
        "ingest_args": list(args),
        "ingest_kwargs": kwargs,
        "command": " ".join(["fedcxr", "ingest", hospital.source, "--input", f"<OUT>/{input_dir}",
                             "--out", "<MANIFESTS>", *args]),
        "classes": list(hospital.classes),
        "images": len(draws),
        "patients": len({d.patient.index for d in draws}),
        "positives": {c: int(positives.get(c, 0)) for c in hospital.classes},
        "files": files or {},
    }


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8"))


def csv_text(header: Sequence[str] | str, rows: Sequence[Sequence[object]], delimiter: str = ",") -> str:
    """CSV with ``\\n`` line ends; ``header`` as a string is written verbatim (NIH's brackets)."""
    buf = io.StringIO()
    writer = csv.writer(buf, delimiter=delimiter, lineterminator="\n")
    if isinstance(header, str):
        buf.write(header + "\n")
    else:
        writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


def split_patients(patients: Sequence[int], fraction: float, rng: np.random.Generator) -> set[int]:
    """About ``fraction`` of the patients (at least one, never all when there are two or more)."""
    patients = sorted(set(patients))
    chosen = {p for p in patients if rng.random() < fraction}
    if len(patients) >= 2:
        if not chosen:
            chosen = {patients[-1]}
        if len(chosen) == len(patients):
            chosen.discard(patients[0])
    return chosen


# --------------------------------------------------------------------------- NIH


def write_nih(hospital: Hospital, root: Path, draws: Sequence[ImageDraw], image_size: int, seed: int) -> dict:
    """NIH ChestX-ray14 layout (see module doc) under ``root``."""
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    rng = hospital.rng(seed, FORMAT)
    rgba_index = min(3, len(draws) - 1)
    rows_by_patient: dict[int, list[list[object]]] = defaultdict(list)
    positives: Counter = Counter()
    names_by_patient: dict[int, list[str]] = defaultdict(list)
    for draw in draws:
        pid = draw.patient.index + 1
        name = f"{pid:08d}_{draw.study - 1:03d}.png"
        img = to_uint(pixels(hospital, draw, image_size, seed), 8)
        _save_png(images / name, img, rgba=draw.index == rgba_index)
        labels = truth(draw.subject.findings)
        found = sorted(NIH_NAMES[c] for c in NIH_NAMES if labels[c])
        positives.update(c for c in NIH_NAMES if labels[c])
        if not found:
            positives["no_finding"] += 1
        spacing = "0.14300000000000002" if img.shape[0] <= image_size else "0.168"
        rows_by_patient[pid].append([
            name, "|".join(found) or NIH_NO_FINDING, draw.study - 1, pid, int(round(draw.age)),
            draw.patient.sex, draw.subject.view, img.shape[1], img.shape[0], spacing, spacing,
        ])
        names_by_patient[pid].append(name)
    rows: list[list[object]] = []
    for pid in sorted(rows_by_patient):
        group = rows_by_patient[pid]
        rows += group[1:] + group[:1] if len(group) > 1 else group  # v2020: _000 after the others
    write_text(root / "Data_Entry_2017_v2020.csv", csv_text(NIH_HEADER, rows))
    test = split_patients(list(names_by_patient), 0.2, rng)
    for filename, members in (("train_val_list.txt", [p for p in names_by_patient if p not in test]),
                              ("test_list.txt", sorted(test))):
        names = sorted(n for p in members for n in names_by_patient[p])
        write_text(root / filename, "\n".join(names))  # no trailing newline, as released
    rgba = draws[rgba_index]
    return entry(hospital, root.name, draws, positives, files={
        "metadata": "Data_Entry_2017_v2020.csv", "images": "images/",
        "rgba_image": f"images/{rgba.patient.index + 1:08d}_{rgba.study - 1:03d}.png",
        "splits": ["train_val_list.txt", "test_list.txt"], "test_patients": len(test),
    })


def _save_png(path: Path, img: np.ndarray, *, rgba: bool = False) -> None:
    if rgba:
        alpha = np.full_like(img, 255)
        Image.fromarray(np.stack([img, img, img, alpha], axis=-1), mode="RGBA").save(path)
    else:
        Image.fromarray(img, mode="L").save(path)


# --------------------------------------------------------------------------- CheXpert


def write_chexpert(hospital: Hospital, root: Path, draws: Sequence[ImageDraw], image_size: int, seed: int) -> dict:
    """CheXpert-v1.0-small layout (see module doc) under ``root``."""
    rng = hospital.rng(seed, FORMAT)
    release = root / CHEXPERT_RELEASE
    valid, number = chexpert_patients(draws, rng)
    ordered = sorted(number, key=number.get)
    unknown_sex = ordered[int(rng.integers(len(ordered)))] if len(ordered) >= 20 else None
    rows = {"train": [], "valid": []}
    positives: Counter = Counter()
    for draw in draws:
        part = "valid" if draw.patient.index in valid else "train"
        lateral = draw.subject.view == "LATERAL"
        rel = chexpert_path(draw, part, number[draw.patient.index])
        img = to_uint(pixels(hospital, draw, image_size, seed), 8)
        (release / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img, mode="L").save(release / rel, quality=90)
        labels = _chexpert_labels(truth(draw.subject.findings), rng, consensus=part == "valid")
        positives.update(CHEXPERT_LABELS[c] for c, v in labels.items() if v == "1.0")
        sex = "Unknown" if draw.patient.index == unknown_sex else {"M": "Male", "F": "Female"}[draw.patient.sex]
        rows[part].append([
            f"{CHEXPERT_RELEASE}/{rel}", sex, min(int(draw.age), 90),
            "Lateral" if lateral else "Frontal", "" if lateral else draw.subject.view, *labels.values(),
        ])
    for part, part_rows in rows.items():
        write_text(release / f"{part}.csv", csv_text(CHEXPERT_HEADER, part_rows))
    firsts = sorted(_first_per_patient(draws), key=lambda d: number[d.patient.index])
    demo = [_chexpert_demo_row(d.patient, number[d.patient.index], rng) for d in firsts]
    write_text(root / CHEXPERT_DEMO, csv_text(CHEXPERT_DEMO_HEADER, demo))
    return entry(hospital, root.name, draws, positives, files={
        "train": f"{CHEXPERT_RELEASE}/train.csv", "valid": f"{CHEXPERT_RELEASE}/valid.csv",
        "demographics": CHEXPERT_DEMO, "valid_patients": len(valid),
    })


def chexpert_patients(draws: Sequence[ImageDraw], rng: np.random.Generator) -> tuple[set[int], dict[int, int]]:
    """``(valid patients, patient index → patient number)``; valid patients numbered after train.

    The first draws of the hospital's FORMAT stream: :mod:`fedcxr.synth.truth` replays them
    to find an ingested image's draw again."""
    patients = sorted({d.patient.index for d in draws})
    valid = split_patients(patients, 0.2, rng)
    ordered = [p for p in patients if p not in valid] + [p for p in patients if p in valid]
    return valid, {p: i + 1 for i, p in enumerate(ordered)}


def chexpert_path(draw: ImageDraw, part: str, number: int) -> str:
    """The image's path inside the release folder (``train/patient00001/study1/view1_frontal.jpg``)."""
    lateral = draw.subject.view == "LATERAL"
    view = "lateral" if lateral else "frontal"
    return f"{part}/patient{number:05d}/study{draw.study}/view{draw.view_number}_{view}.jpg"


def _chexpert_labels(labels: dict[str, int], rng: np.random.Generator, *, consensus: bool) -> dict[str, str]:
    """Report-style values per column: positives sometimes uncertain, negatives often blank.

    ``consensus`` (valid.csv) gives radiologist labels: only ``1.0`` and ``0.0``.
    """
    out = {}
    normal = bool(labels["no_finding"])
    for column, cls in CHEXPERT_LABELS.items():
        value = labels[cls]
        if consensus:
            out[column] = "1.0" if value else "0.0"
        elif cls == "no_finding":
            out[column] = "1.0" if value else ""  # never 0 or -1 in the release
        elif value:
            out[column] = "-1.0" if rng.random() < 0.15 else "1.0"
        else:
            u = rng.random()
            blank = 0.9 if normal else 0.6
            out[column] = "" if u < blank else ("0.0" if u < 0.93 or normal else "-1.0")
    return out


def _first_per_patient(draws: Sequence[ImageDraw]) -> list[ImageDraw]:
    seen: dict[int, ImageDraw] = {}
    for d in draws:
        seen.setdefault(d.patient.index, d)
    return sorted(seen.values(), key=lambda d: d.index)


def _chexpert_demo_row(patient, number: int, rng: np.random.Generator) -> list[object]:
    choices = CHEXPERT_RACE[patient.race]
    race = choices[int(rng.integers(len(choices)))]
    ethnicity = {"hispanic": "Hispanic/Latino", None: "Unknown"}.get(patient.race, "Non-Hispanic/Non-Latino")
    gender = {"M": "Male", "F": "Female"}[patient.sex]
    return [f"patient{number:05d}", gender, min(int(patient.age), 90), race, ethnicity]


# --------------------------------------------------------------------------- dispatch


#: SOURCE → "module:function" of its writer(hospital, root, draws, image_size, seed) -> entry
WRITERS: dict[str, str] = {
    "nih": "fedcxr.synth.export:write_nih",
    "chexpert": "fedcxr.synth.export:write_chexpert",
    "midrc": "fedcxr.synth.midrc_export:write_midrc",
    "dicom": "fedcxr.synth.dicom_export:write_dicom_folder",
}


def writer(source: str) -> Callable:
    module, func = WRITERS[source].split(":")
    return getattr(importlib.import_module(module), func)


def write_hospital(hospital: Hospital, out: Path, *, n_images: int, image_size: int, seed: int) -> dict:
    """Write one hospital's export into ``out/<hospital.name>``; return its synth.json entry."""
    root = Path(out) / hospital.name
    root.mkdir(parents=True, exist_ok=True)
    draws = cohort(hospital, n_images, seed)
    return writer(hospital.source)(hospital, root, draws, image_size, seed)
