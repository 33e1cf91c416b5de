"""DICOM writing: every encoding decodes back to the phantom; the dicom_style folder's quirks."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.uid import ExplicitVRLittleEndian, ImplicitVRLittleEndian, JPEG2000Lossless, RLELossless

from fedcxr.synth.dicom_export import DICOM_LABELS, DicomSpec, encoder_available, uid, write_dicom
from fedcxr.synth.export import write_hospital
from fedcxr.synth.hospitals import HOSPITALS
from fedcxr.synth.phantom import Subject, render

SPECS = [
    DicomSpec("DX", "MONOCHROME2", 8, ExplicitVRLittleEndian),
    DicomSpec("CR", "MONOCHROME1", 12, ExplicitVRLittleEndian),
    DicomSpec("CR", "MONOCHROME1", 10, RLELossless),
    DicomSpec("DX", "MONOCHROME2", 12, ImplicitVRLittleEndian, rescale=True),
    DicomSpec("CR", "MONOCHROME1", 10, ImplicitVRLittleEndian, file_meta=False),
    pytest.param(DicomSpec("DX", "MONOCHROME2", 12, JPEG2000Lossless, rescale=True),
                 marks=pytest.mark.skipif(not encoder_available(JPEG2000Lossless), reason="no J2K encoder")),
]


def tags(i: int) -> dict:
    return {"PatientID": "P1", "PatientAge": "62", "PatientSex": "F", "ViewPosition": "PA",
            "StudyInstanceUID": uid(0, "t", "study", i), "SeriesInstanceUID": uid(0, "t", "series", i),
            "SOPInstanceUID": uid(0, "t", "sop", i)}


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.modality}-{s.photometric}-{s.bits_stored}-"
                         f"{pydicom.uid.UID(s.transfer_syntax).name}-{'meta' if s.file_meta else 'bare'}")
def test_every_encoding_decodes_to_the_phantom(tmp_path, spec):
    from fedcxr.site_adapters.images import read_image

    image = render(Subject(findings=frozenset({"cardiomegaly"})), (40, 48), rng=np.random.default_rng(0))
    path = tmp_path / "img"
    write_dicom(path, image, spec, tags(1))
    ds = pydicom.dcmread(path, force=True)
    assert (ds.Rows, ds.Columns) == (40, 48) and ds.BitsStored == spec.bits_stored
    assert ds.PhotometricInterpretation == spec.photometric and ds.PatientAge == "62"
    if spec.file_meta:
        assert ds.file_meta.TransferSyntaxUID == spec.transfer_syntax and ds.preamble is not None
    else:
        assert path.read_bytes()[128:132] != b"DICM"
    expected = (image - image.min()) / (image.max() - image.min())
    decoded = read_image(path)  # the project's decode path: Modality LUT, min/max, MONOCHROME1 inversion
    assert np.abs(decoded - expected).max() < 2.5 / (1 << spec.bits_stored) + 1e-6


def test_uids_are_reproducible_and_distinct():
    assert uid(0, "h", "sop", 1) == uid(0, "h", "sop", 1)
    assert len({uid(0, "h", "sop", 1), uid(1, "h", "sop", 1), uid(0, "h", "sop", 2), uid(0, "g", "sop", 1)}) == 4
    assert all(len(uid(s, "dicom_style", "study", 123, 4)) <= 64 for s in range(5))


@pytest.fixture(scope="module")
def dicom_style(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("dicom_style")
    info = write_hospital(HOSPITALS["dicom_style"], out, n_images=60, image_size=32, seed=1)
    return out / "dicom_style", info


def test_dicom_style_folder_has_real_export_quirks(dicom_style):
    root, info = dicom_style
    files = [p for p in root.rglob("*") if p.is_file() and p.name != "labels.csv"]
    assert len(files) == 60
    assert {len(p.relative_to(root).parts) for p in files} == {4}  # scanner/patient/study/file
    assert {p.relative_to(root).parts[0] for p in files} == {"DX_PORTABLE", "CR_ROOM2"}
    assert 0 < sum(p.suffix != ".dcm" for p in files) < 60
    datasets = [pydicom.dcmread(p, force=True) for p in files]
    ages = [str(ds.get("PatientAge", "")) for ds in datasets]
    assert any(a.endswith("Y") and len(a) == 4 for a in ages) and any(a.isdigit() for a in ages)
    assert {str(ds.PhotometricInterpretation) for ds in datasets} == {"MONOCHROME1", "MONOCHROME2"}
    assert {int(ds.BitsStored) for ds in datasets} >= {8, 10, 12}
    syntaxes = Counter(str(ds.file_meta.get("TransferSyntaxUID", "none")) for ds in datasets)
    assert RLELossless in syntaxes and ImplicitVRLittleEndian in syntaxes and "none" in syntaxes
    for ds in datasets:  # portable DX films are AP, the CR room takes PA
        assert ds.ViewPosition in ("", "AP" if ds.Modality == "DX" else "PA")
    assert sum(info["files"]["encodings"].values()) == 60


def test_dicom_style_labels_are_keyed_by_sop_uid(dicom_style):
    root, info = dicom_style
    with open(root / "labels.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["SOPInstanceUID", "PatientID", *DICOM_LABELS.values()]
    uids = {str(pydicom.dcmread(p, force=True, stop_before_pixels=True).SOPInstanceUID)
            for p in root.rglob("IM*")}
    assert {r["SOPInstanceUID"] for r in rows} <= uids and len(rows) == info["files"]["labeled_images"]
    values = Counter(v for r in rows for k, v in r.items() if k in DICOM_LABELS.values())
    assert set(values) <= {"0", "1", ""} and values["1"] > 0 and values["0"] > 0
    assert info["positives"]["cardiomegaly"] == sum(r["Cardiomegaly"] == "1" for r in rows)
