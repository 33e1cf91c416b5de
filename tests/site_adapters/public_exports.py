"""Tiny exports laid out as the public datasets' own downloads (RSNA, VinDr-CXR, SIIM-ACR, Open-i,
PadChest), written at test time from each source's documented layout: a few rows, 16×16 images.

No real file is copied: the DICOMs are pydicom-written noise with the tags each dataset keeps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage, generate_uid


def tiny_dicom(path: Path, *, seed: int = 0, uids: bool = True, **tags) -> Path:
    """A 16×16 12-bit MONOCHROME2 DICOM with ``tags`` set.

    ``uids=False`` leaves the study/series/instance UIDs out of the data set (VinDr-CXR's
    de-identification keeps only sex, age and the pixel-describing tags); the file meta still
    names an instance, as a conformant file must.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    if uids:
        ds.SOPClassUID = SecondaryCaptureImageStorage
        ds.SOPInstanceUID = tags.pop("SOPInstanceUID", None) or ds.file_meta.MediaStorageSOPInstanceUID
        ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
        ds.StudyInstanceUID, ds.SeriesInstanceUID = generate_uid(), generate_uid()
    ds.Rows = ds.Columns = 16
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    ds.PixelData = np.random.default_rng(seed).integers(0, 4096, (16, 16)).astype("<u2").tobytes()
    for key, value in tags.items():
        setattr(ds, key, value)
    ds.save_as(path, enforce_file_format=uids)
    return path


def tiny_png(path: Path, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (16, 16)).astype(np.uint8)).save(path)
    return path


def write_csv(path: Path, rows: list[dict], columns: Optional[list[str]] = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=columns).to_csv(path, index=False)
    return path


# --------------------------------------------------------------------------- RSNA Pneumonia

RSNA_IMAGES = [  # patientId, boxes, detailed class, (sex, age, view)
    ("p-pos-2box", 2, "Lung Opacity", ("F", "51", "AP")),
    ("p-pos", 1, "Lung Opacity", ("M", "034Y", "PA")),
    ("p-normal", 0, "Normal", ("M", "62", "PA")),
    ("p-notnormal", 0, "No Lung Opacity / Not Normal", ("F", "150", "AP")),  # an impossible age: unknown
    ("p-normal-2", 0, "Normal", ("F", "8", "PA")),
    ("p-no-file", 0, "Normal", None),  # no DICOM: set aside as a missing file
]


def write_rsna(root: Path, images=RSNA_IMAGES, *, detailed: bool = True) -> Path:
    """``stage_2_train_labels.csv`` (one row per box), the detailed class file and the DICOMs."""
    labels, classes = [], []
    for i, (pid, boxes, cls, tags) in enumerate(images):
        for b in range(max(1, boxes)):
            box = dict(x=100.0 + b, y=200.0, width=50.0, height=80.0) if boxes else dict(x="", y="", width="", height="")
            labels.append({"patientId": pid, **box, "Target": 1 if boxes else 0})
            classes.append({"patientId": pid, "class": cls})
        if tags is not None:
            sex, age, view = tags
            tiny_dicom(root / "stage_2_train_images" / f"{pid}.dcm", seed=i, PatientID=pid, PatientSex=sex,
                       PatientAge=age, ViewPosition=view, BodyPartExamined="CHEST", Modality="CR")
    write_csv(root / "stage_2_train_labels.csv", labels, ["patientId", "x", "y", "width", "height", "Target"])
    if detailed:
        write_csv(root / "stage_2_detailed_class_info.csv", classes, ["patientId", "class"])
    return root


# --------------------------------------------------------------------------- VinDr-CXR

VINDR_COLUMNS = [
    "Aortic enlargement", "Atelectasis", "Calcification", "Cardiomegaly", "Clavicle fracture", "Consolidation",
    "Edema", "Emphysema", "Enlarged PA", "ILD", "Infiltration", "Lung Opacity", "Lung cavity", "Lung cyst",
    "Mediastinal shift", "Nodule/Mass", "Pleural effusion", "Pleural thickening", "Pneumothorax",
    "Pulmonary fibrosis", "Rib fracture", "Other lesion", "COPD", "Lung tumor", "Pneumonia", "Tuberculosis",
    "Other diseases", "No finding",
]


def vindr_reader(image: str, rad: Optional[str], *findings: str, test: bool = False) -> dict:
    """One row of ``image_labels_*.csv``: 1 for ``findings``, 0 elsewhere; "No finding" when none."""
    row = {"image_id": image} | ({"rad_id": rad} if rad is not None else {})
    for col in VINDR_COLUMNS:
        name = "Other disease" if (test and col == "Other diseases") else col
        row[name] = int(col in findings or (col == "No finding" and not findings))
    return row


def write_vindr(root: Path, train: list[dict], test: Optional[list[dict]] = None,
                images: dict[str, dict] | None = None) -> Path:
    """The PhysioNet layout: ``annotations/image_labels_{train,test}.csv`` and ``{train,test}/<id>.dicom``."""
    write_csv(root / "annotations" / "image_labels_train.csv", train)
    if test is not None:
        write_csv(root / "annotations" / "image_labels_test.csv", test)
    for i, (image, tags) in enumerate((images or {}).items()):
        split = tags.pop("_split", "train")
        tiny_dicom(root / split / f"{image}.dicom", seed=i, uids=False, **tags)
    return root


# --------------------------------------------------------------------------- SIIM-ACR

def write_siim(root: Path, rows: list[tuple[str, str]], files: dict[str, dict], *,
               name: str = "train-rle.csv", pixel_header: str = " EncodedPixels") -> Path:
    """``train-rle.csv`` rows (ImageId, EncodedPixels) and DICOMs in nested study/series folders."""
    write_csv(root / name, [{"ImageId": i, pixel_header: p} for i, p in rows], ["ImageId", pixel_header])
    for k, (image, tags) in enumerate(files.items()):
        tiny_dicom(root / "dicom-images-train" / f"1.2.{k}" / f"1.2.{k}.1" / f"{image}.dcm", seed=k,
                   SOPInstanceUID=image, **tags)
    return root


# --------------------------------------------------------------------------- Open-i

def openi_report(uid: int, images: list[str], automatic: list[str], major: list[str]) -> str:
    """One ``ecgen-radiology/<uid>.xml`` report with the tags the collection uses."""
    mesh = "".join(f"<major>{t}</major>" for t in major) + "".join(f"<automatic>{t}</automatic>" for t in automatic)
    parents = "".join(f'<parentImage id="{i}"><figureId>F1</figureId><caption>Xray Chest</caption></parentImage>'
                      for i in images)
    return (f'<?xml version="1.0" encoding="utf-8"?><eCitation><meta type="rr"/><uId id="CXR{uid}"/>'
            f'<MedlineCitation><Article><Abstract><AbstractText Label="FINDINGS">text</AbstractText></Abstract>'
            f'</Article></MedlineCitation><MeSH>{mesh}</MeSH>{parents}</eCitation>')


# --------------------------------------------------------------------------- PadChest

PADCHEST_COLUMNS = [
    "ImageID", "ImageDir", "StudyDate_DICOM", "StudyID", "PatientID", "PatientBirth", "PatientSex_DICOM",
    "ViewPosition_DICOM", "Projection", "MethodProjection", "Pediatric", "Modality_DICOM", "Manufacturer_DICOM",
    "PhotometricInterpretation_DICOM", "PixelRepresentation_DICOM", "PixelAspectRatio_DICOM",
    "SpatialResolution_DICOM", "BitsStored_DICOM", "WindowCenter_DICOM", "WindowWidth_DICOM", "Rows_DICOM",
    "Columns_DICOM", "XRayTubeCurrent_DICOM", "Exposure_DICOM", "ExposureInuAs_DICOM", "ExposureTime",
    "RelativeXRayExposure_DICOM", "ReportID", "Report", "MethodLabel", "Labels", "Localizations",
    "LabelsLocalizationsBySentence", "labelCUIS", "LocalizationsCUIS",
]


def padchest_row(image: str, patient: str, labels: object, *, folder: int = 0, projection: str = "PA",
                 sex: str = "M", birth: object = 1950.0, date: str = "20140301", method: str = "Physician",
                 study: Optional[str] = None) -> dict:
    """One row of the PadChest csv, every published column present (most blank, as many are)."""
    row = {c: "" for c in PADCHEST_COLUMNS}
    row.update({
        "ImageID": image, "ImageDir": folder, "StudyDate_DICOM": date, "StudyID": study or f"s-{image}",
        "PatientID": patient, "PatientBirth": birth, "PatientSex_DICOM": sex, "Projection": projection,
        "ViewPosition_DICOM": "POSTEROANTERIOR" if projection == "PA" else "", "Pediatric": "No",
        "Modality_DICOM": "CR", "MethodProjection": "Manual review of DICOM fields", "MethodLabel": method,
        "Labels": labels if isinstance(labels, str) or labels is None else repr(list(labels)),
        "Report": "informe", "ReportID": f"r-{image}",
    })
    return row


__all__ = ["RSNA_IMAGES", "VINDR_COLUMNS", "openi_report", "padchest_row", "tiny_dicom", "tiny_png", "vindr_reader",
           "write_csv", "write_rsna", "write_siim", "write_vindr"]
