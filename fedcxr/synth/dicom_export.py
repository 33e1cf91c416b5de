"""DICOM exports: a plain DICOM folder with a label csv (``dicom_style``) and a MIDRC-style
data-commons export (``midrc_style``).

Why these quirks: real CR/DX exports mix photometric interpretations (MONOCHROME1 stores
bright bone as *low* values), bit depths (8, 10, 12 bits stored), transfer syntaxes
(uncompressed implicit/explicit VR, RLE Lossless, JPEG 2000), file names with and without
``.dcm``, conformant (``062Y``) and non-conformant (``62``) ``PatientAge`` values and, now and
then, a file written without preamble and file meta. Each quirk here is one the decode path
(:mod:`fedcxr.site_adapters.images`) must survive; the pixels always decode to the phantom
(MONOCHROME1 files store ``max - value``, so the decoder's inversion restores it).

UIDs are derived from (seed, hospital, kind, index) with :func:`pydicom.uid.generate_uid`'s
``entropy_srcs``, so exports are reproducible; no dates come from the clock.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pydicom
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import (
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    JPEG2000Lossless,
    RLELossless,
    generate_uid,
)

from fedcxr.synth.cohort import ImageDraw
from fedcxr.synth.export import csv_text, entry, write_text
from fedcxr.synth.hospitals import FORMAT, Hospital, pixels, to_uint
from fedcxr.synth.phantom import truth

CR_STORAGE = "1.2.840.10008.5.1.4.1.1.1"  # Computed Radiography Image Storage
DX_STORAGE = "1.2.840.10008.5.1.4.1.1.1.1"  # Digital X-Ray Image Storage - For Presentation
UID_ROOT = "1.2.826.0.1.3680043.8.498."  # pydicom's example root: fine for synthetic data


@dataclass(frozen=True)
class DicomSpec:
    """How one file is encoded."""

    modality: str = "DX"  # CR | DX
    photometric: str = "MONOCHROME2"
    bits_stored: int = 12
    transfer_syntax: str = ExplicitVRLittleEndian
    rescale: bool = False  # write RescaleSlope/Intercept (a Modality LUT the decoder applies)
    file_meta: bool = True  # False: no preamble, no file meta (old CR exports; read with force)


def uid(seed: int, hospital: str, kind: str, *key: object) -> str:
    """A reproducible UID for (seed, hospital, kind, key...)."""
    return str(generate_uid(UID_ROOT, entropy_srcs=["fedcxr-synth", str(seed), hospital, kind, *map(str, key)]))


def encoder_available(transfer_syntax: str) -> bool:
    """True when pydicom can *encode* ``transfer_syntax`` here (RLE: always; J2K: openjpeg)."""
    from pydicom.pixels import get_encoder

    try:
        return bool(get_encoder(transfer_syntax).is_available)
    except (NotImplementedError, ValueError):
        return False


def dicom_dataset(image: np.ndarray, spec: DicomSpec, tags: dict[str, object]) -> Dataset:
    """A complete single-frame dataset for ``image`` (float [0, 1], bright = dense).

    ``tags`` must hold ``SOPInstanceUID``, ``StudyInstanceUID`` and ``SeriesInstanceUID``; any
    other keyword is copied as given (``PatientAge`` stays a string, conformant or not).
    """
    stored = to_uint(image, spec.bits_stored)
    if spec.bits_stored > 8:
        stored = stored.astype(np.uint16)
    if spec.photometric == "MONOCHROME1":
        stored = ((1 << spec.bits_stored) - 1 - stored.astype(np.int64)).astype(stored.dtype)
    ds = Dataset()
    ds.SOPClassUID = CR_STORAGE if spec.modality == "CR" else DX_STORAGE
    ds.Modality = spec.modality
    ds.BodyPartExamined = "CHEST"
    for key, value in tags.items():
        setattr(ds, key, value)
    ds.Rows, ds.Columns = (int(v) for v in stored.shape)
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = spec.photometric
    ds.BitsAllocated = 8 if spec.bits_stored <= 8 else 16
    ds.BitsStored = spec.bits_stored
    ds.HighBit = spec.bits_stored - 1
    ds.PixelRepresentation = 0
    top = (1 << spec.bits_stored) - 1
    intercept = -1024 if spec.rescale else 0
    # the window is in output units of the Modality LUT (PS3.3 C.11.2.1.2): the full stored range
    ds.WindowCenter, ds.WindowWidth = str(top // 2 + 1 + intercept), str(top + 1)
    if spec.rescale:
        ds.RescaleIntercept, ds.RescaleSlope, ds.RescaleType = str(intercept), "1", "US"
    ds.LossyImageCompression = "00"
    ds.PixelData = stored.tobytes()
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = ds.SOPClassUID
    meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    meta.TransferSyntaxUID = ImplicitVRLittleEndian if spec.transfer_syntax == ImplicitVRLittleEndian \
        else ExplicitVRLittleEndian
    meta.ImplementationClassUID = UID_ROOT + "1"
    ds.file_meta = meta
    if spec.transfer_syntax in (RLELossless, JPEG2000Lossless):
        ds.compress(spec.transfer_syntax, stored, generate_instance_uid=False)
    return ds


@contextlib.contextmanager
def lenient_values():
    """Let pydicom store non-conformant values (``PatientAge = "62"``) silently: they are the point."""
    settings = pydicom.config.settings
    previous = settings.reading_validation_mode, settings.writing_validation_mode
    settings.reading_validation_mode = settings.writing_validation_mode = pydicom.config.IGNORE
    try:
        yield
    finally:
        settings.reading_validation_mode, settings.writing_validation_mode = previous


def write_dicom(path: Path, image: np.ndarray, spec: DicomSpec, tags: dict[str, object]) -> None:
    """Write ``image`` as one DICOM file (see :func:`dicom_dataset`)."""
    with lenient_values():
        _write_dicom(path, image, spec, tags)


def _write_dicom(path: Path, image: np.ndarray, spec: DicomSpec, tags: dict[str, object]) -> None:
    ds = dicom_dataset(image, spec, tags)
    path.parent.mkdir(parents=True, exist_ok=True)
    if spec.file_meta:
        ds.save_as(path, enforce_file_format=True)
    else:
        del ds.file_meta
        ds.preamble = None
        ds.save_as(path, implicit_vr=True, little_endian=True)


def dicom_age(age: float, rng: np.random.Generator, *, nonconformant: float = 0.15, missing: float = 0.03) -> str:
    """``PatientAge`` as exports write it: mostly ``062Y``, sometimes ``62``, sometimes blank."""
    u = rng.random()
    years = int(age)
    if u < missing:
        return ""
    if u < missing + nonconformant:
        return str(years)
    return f"{years:03d}Y"


def dicom_sex(sex: str, rng: np.random.Generator, *, other: float = 0.02) -> str:
    u = rng.random()
    if u < other:
        return "O"
    if u < 2 * other:
        return ""
    return sex


def _date(rng: np.random.Generator, year: int) -> str:
    return f"{year}{int(rng.integers(1, 13)):02d}{int(rng.integers(1, 29)):02d}"


# --------------------------------------------------------------------------- dicom_style

DICOM_LABELS = {
    "atelectasis": "Atelectasis", "cardiomegaly": "Cardiomegaly", "consolidation": "Consolidation",
    "edema": "Edema", "pleural_effusion": "Pleural Effusion", "pneumonia": "Pneumonia",
    "pneumothorax": "Pneumothorax", "no_finding": "No Finding", "covid19": "COVID-19",
}
LABELS_FILE = "labels.csv"


def _dicom_style_spec(view: str, rng: np.random.Generator, j2k: bool) -> DicomSpec:
    """Portable DX for AP films, a CR room for PA films, each with a mix of encodings."""
    u = rng.random()
    if view == "AP":
        if u < 0.3 and j2k:
            return DicomSpec("DX", "MONOCHROME2", 12, JPEG2000Lossless, rescale=True)
        if u < 0.6:
            return DicomSpec("DX", "MONOCHROME2", 8, ExplicitVRLittleEndian)
        return DicomSpec("DX", "MONOCHROME2", 12, ImplicitVRLittleEndian, rescale=True)
    if u < 0.45:
        return DicomSpec("CR", "MONOCHROME1", 12, ExplicitVRLittleEndian)
    if u < 0.75:
        return DicomSpec("CR", "MONOCHROME1", 10, RLELossless)
    return DicomSpec("CR", "MONOCHROME2", 10, ExplicitVRLittleEndian)


def write_dicom_folder(hospital: Hospital, root: Path, draws: Sequence[ImageDraw], image_size: int, seed: int) -> dict:
    """``dicom_style``: nested DICOM folder + ``labels.csv`` keyed by SOPInstanceUID.

    Layout: ``<scanner>/<PatientID>/<study>/IM<index>[.dcm]`` where scanner is
    ``DX_PORTABLE`` (AP films) or ``CR_ROOM2`` (PA); 30 % of files have no extension and the
    first PA file from the sixth on has no preamble and no file meta. ``labels.csv``: ``SOPInstanceUID,
    PatientID`` and one column per finding (``Pleural Effusion``...; ``1``/``0``; 2 % of cells
    blank = not labeled); 2 % of images have no label row (kept unlabeled by the adapter).
    """
    rng = hospital.rng(seed, FORMAT)
    j2k = encoder_available(JPEG2000Lossless)
    rows, positives, encodings = [], Counter(), Counter()
    bare = next((d.index for d in draws[5:] if d.subject.view == "PA"), None)  # an old CR export file
    for draw in draws:
        patient_id = f"DS{draw.patient.index + 1:07d}"
        folder = "DX_PORTABLE" if draw.subject.view == "AP" else "CR_ROOM2"
        name = f"IM{draw.index + 1:06d}" + (".dcm" if rng.random() < 0.7 else "")
        spec = _dicom_style_spec(draw.subject.view, rng, j2k)
        if draw.index == bare:
            spec = DicomSpec("CR", "MONOCHROME1", 10, ImplicitVRLittleEndian, file_meta=False)
        study_uid = uid(seed, hospital.name, "study", draw.patient.index, draw.study)
        sop_uid = uid(seed, hospital.name, "sop", draw.index)
        tags = {
            "PatientID": patient_id, "PatientSex": dicom_sex(draw.patient.sex, rng),
            "PatientAge": dicom_age(draw.age, rng),
            "ViewPosition": "" if rng.random() < 0.03 else draw.subject.view,
            "StudyInstanceUID": study_uid, "SOPInstanceUID": sop_uid,
            "SeriesInstanceUID": uid(seed, hospital.name, "series", draw.index),
            "StudyDescription": "XR CHEST 1 VIEW" if draw.subject.view == "AP" else "CHEST PA",
            "StudyDate": _date(rng, 2019), "SeriesNumber": 1, "InstanceNumber": draw.view_number,
            "Manufacturer": "SYNTH-PORTABLE" if folder == "DX_PORTABLE" else "SYNTH-CR",
        }
        image = pixels(hospital, draw, image_size, seed)
        write_dicom(root / folder / patient_id / f"study{draw.study}" / name, image, spec, tags)
        encodings[f"{spec.modality} {spec.photometric} {spec.bits_stored}-bit {_ts_name(spec)}"] += 1
        if rng.random() < 0.02:
            continue  # no label row for this image
        labels = truth(draw.subject.findings)
        cells = ["" if rng.random() < 0.02 else str(labels[c]) for c in DICOM_LABELS]
        positives.update(c for c, v in zip(DICOM_LABELS, cells) if v == "1")
        rows.append([sop_uid, patient_id, *cells])
    write_text(root / LABELS_FILE, csv_text(["SOPInstanceUID", "PatientID", *DICOM_LABELS.values()], rows))
    return entry(
        hospital, root.name, draws, positives,
        extra_args=["--labels", f"<OUT>/{root.name}/{LABELS_FILE}"],
        extra_kwargs={"labels_csv": f"{root.name}/{LABELS_FILE}"},
        files={"labels": LABELS_FILE, "labeled_images": len(rows), "encodings": dict(sorted(encodings.items()))},
    )


def _ts_name(spec: DicomSpec) -> str:
    if not spec.file_meta:
        return "no file meta"
    return {ExplicitVRLittleEndian: "explicit LE", ImplicitVRLittleEndian: "implicit LE",
            RLELossless: "RLE lossless", JPEG2000Lossless: "JPEG 2000 lossless"}[spec.transfer_syntax]
