"""What an ingested synthetic image truly shows, for every class — not only those its hospital labels.

Why: each synthetic hospital labels only its own class subset, as real sources do, but the
generator knows every image's findings. With this, a benchmark can score a model on the classes
a site does *not* label (the surgical aggregation paper's question: does one global model
predict a class at a site that never annotated it?), which no real export allows.

The image is found again from the path the adapter recorded (``image_path`` of the manifest):
the exports name files by the image's draw (:mod:`fedcxr.synth.export`,
:mod:`fedcxr.synth.dicom_export`, :mod:`fedcxr.synth.midrc_export`), and the cohort is a pure
function of (seed, hospital, number of images). Only the export's ``synth.json`` is read.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Callable

import pandas as pd

from fedcxr.errors import UserError
from fedcxr.synth.cohort import ImageDraw
from fedcxr.synth.hospitals import FORMAT, HOSPITALS, Hospital, cohort
from fedcxr.synth.phantom import truth


def _nih_keys(hospital: Hospital, draws: list[ImageDraw], seed: int) -> dict[str, ImageDraw]:
    return {f"{d.patient.index + 1:08d}_{d.study - 1:03d}.png": d for d in draws}


def _chexpert_keys(hospital: Hospital, draws: list[ImageDraw], seed: int) -> dict[str, ImageDraw]:
    from fedcxr.synth.export import chexpert_path, chexpert_patients

    valid, number = chexpert_patients(draws, hospital.rng(seed, FORMAT))
    return {chexpert_path(d, "valid" if d.patient.index in valid else "train", number[d.patient.index]): d
            for d in draws}


def _dicom_keys(hospital: Hospital, draws: list[ImageDraw], seed: int) -> dict[str, ImageDraw]:
    return {f"IM{d.index + 1:06d}": d for d in draws}


def _midrc_keys(hospital: Hospital, draws: list[ImageDraw], seed: int) -> dict[str, ImageDraw]:
    from fedcxr.synth.dicom_export import uid

    return {uid(seed, hospital.name, "sop", d.index): d for d in draws}


def _path_key(source: str, path: str) -> str:
    """The part of a recorded image path that names the draw, per export format."""
    parts = PurePosixPath(str(path).replace("\\", "/")).parts
    if source == "nih":
        return parts[-1]
    if source == "chexpert":
        return "/".join(parts[-4:])
    name = parts[-1]
    return name[:-4] if name.lower().endswith(".dcm") else name


KEYS: dict[str, Callable[[Hospital, list[ImageDraw], int], dict[str, ImageDraw]]] = {
    "nih": _nih_keys, "chexpert": _chexpert_keys, "dicom": _dicom_keys, "midrc": _midrc_keys,
}


def true_labels(spec: dict, hospital: str, image_paths: pd.Series) -> pd.DataFrame:
    """``truth__<class>`` (0/1) for every class a phantom can show, one row per recorded path.

    ``spec``: the export's ``synth.json`` (:func:`fedcxr.synth.read_synth_json`);
    ``image_paths``: the manifest's ``image_path`` column (the result keeps its index). A path
    that names no image of the export is an exit-2 error naming it (wrong export or hospital).
    """
    if hospital not in spec.get("hospitals", {}) or hospital not in HOSPITALS:
        raise UserError(f"synthetic hospital {hospital!r} is not in this export "
                        f"(it has {', '.join(spec.get('hospitals', {}))})")
    h = HOSPITALS[hospital]
    seed, n_images = int(spec["seed"]), int(spec["images_per_site"])
    by_key = KEYS[h.source](h, cohort(h, n_images, seed), seed)
    rows = []
    for position, path in enumerate(image_paths.astype(str)):
        draw = by_key.get(_path_key(h.source, path))
        if draw is None:
            raise UserError(f"{hospital}: image_path {path!r} (row {position}) is no image of this synthetic export "
                            f"(seed {seed}, {n_images} images)")
        rows.append({f"truth__{c}": v for c, v in truth(draw.subject.findings).items()})
    return pd.DataFrame(rows, index=image_paths.index)
