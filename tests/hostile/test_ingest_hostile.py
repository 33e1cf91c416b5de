"""Hostile hospital exports (SECURITY.md: "Ingest").

Each case builds an export a careless or hostile site could send through ``fedcxr ingest`` and
asserts what the user relies on: the row is set aside with a reason naming it (or the ingest
stops with exit 2 and a message naming the file/row), nothing outside the export is read, no
raw patient or study id reaches any output file, and every row read is accounted for
(``rows_read == rows_kept + rows_set_aside``, and ``set_aside.csv`` lists each set-aside row).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pydicom
import pytest
import yaml
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage, generate_uid

from fedcxr.site_adapters.ingest import run_ingest
from fedcxr.site_adapters.manifest import read_manifest
from fedcxr.site_adapters.sitekey import KEY_FILE_NAME, load_site_key

from ..conftest import write_csv_export

pytestmark = pytest.mark.filterwarnings("ignore:Invalid value for VR")

MAPPING = {
    "image": {"column": "image", "prefix": "images", "extension": ".png"},
    "patient": "pid",
    "study": "study",
    "classes": ["edema"],
    "labels": {"edema": "edema"},
}


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def key(tmp_path) -> Path:
    """A fixed site key (fixed pseudonyms: a scan for raw ids cannot pass or fail by chance)."""
    path = tmp_path / "site.key"
    path.write_text("5a" * 32 + "\n")
    path.chmod(0o600)
    return path


def write_dicom(path: Path, *, rows: int = 16, cols: int = 16, seed: int = 0, pixels=None, **tags) -> dict:
    """A small uncompressed 16-bit DICOM; returns its UIDs. ``pixels`` overrides the noise."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID = SecondaryCaptureImageStorage
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = tags.pop("SOPInstanceUID", None) or generate_uid()
    ds.StudyInstanceUID = tags.pop("StudyInstanceUID", None) or generate_uid()
    ds.SeriesInstanceUID, ds.Modality = generate_uid(), "CR"
    ds.Rows, ds.Columns = rows, cols
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    if pixels is None:
        pixels = np.random.default_rng(seed).integers(0, 4096, (rows, cols))
    ds.PixelData = np.asarray(pixels).astype("<u2").tobytes()
    for name, value in tags.items():
        setattr(ds, name, value)
    ds.save_as(path, enforce_file_format=True)
    return {"sop": str(ds.SOPInstanceUID), "study": str(ds.StudyInstanceUID)}


def png(path: Path, size: int = 16, seed: int = 0, value=None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (np.full((size, size), value, np.uint8) if value is not None
            else np.random.default_rng(seed).integers(0, 256, (size, size), dtype=np.uint8))
    Image.fromarray(data, "L").save(path)
    return path


def csv_rows(n: int, prefix: str = "MRN-SECRET-") -> list[dict]:
    return [{"image": f"im{i}", "pid": f"{prefix}{i // 2:04d}", "study": f"ACC-SECRET-{i:05d}",
             "edema": str(i % 2)} for i in range(n)]


def output_text(out: Path) -> str:
    """Everything ingest wrote under ``out`` as text (Parquet cells included), except the key."""
    parts = []
    for path in sorted(out.rglob("*")):
        if not path.is_file() or path.name == KEY_FILE_NAME:
            continue
        if path.suffix == ".parquet":
            frame = pd.read_parquet(path)
            parts.append(" ".join(frame.columns) + "\n" + frame.astype(str).to_csv(index=False))
        elif path.suffix in {".json", ".csv", ".txt", ".md"}:
            parts.append(path.read_text())
    return "\n".join(parts)


def assert_no_raw_ids(out: Path, ids) -> None:
    text = output_text(out)
    assert (out / "ingest_report.json").is_file() and (out / "set_aside.csv").is_file()
    leaked = sorted({i for i in ids if i and i in text})
    assert not leaked, f"raw ids in ingest outputs: {leaked[:5]}"


def accounted(report: dict, out: Path) -> None:
    """rows read = kept + set aside, in the report, in the manifests and in set_aside.csv."""
    assert report["rows_read"] == report["rows_kept"] + report["rows_set_aside"]
    kept = sum(len(read_manifest(out / s)) for s in report["sites"])
    assert kept == report["rows_kept"]
    listed = pd.read_csv(out / "set_aside.csv", dtype=str, keep_default_na=False)
    assert len(listed) == report["rows_set_aside"] and (listed["reason"] != "").all()


def reasons_by_path(report: dict) -> dict:
    return {r["image_path"]: r["reason"] for r in report["set_aside"]}


# --------------------------------------------------------------------------- 1. keyed pseudonyms


def test_csv_ids_never_reach_any_output_and_pseudonyms_are_keyed(tmp_path, key):
    export, mapping = write_csv_export(tmp_path, csv_rows(24), MAPPING)
    out = tmp_path / "out"
    report = run_ingest("csv", export, out, mapping=mapping, site_key=key, progress=False)
    accounted(report, out)
    assert_no_raw_ids(out, [r["pid"] for r in csv_rows(24)] + [r["study"] for r in csv_rows(24)] + ["SECRET"])
    frame = read_manifest(out / "csv")
    secret = load_site_key(key, out)
    assert set(frame["patient_id"]) == {secret.pseudonym("patient", r["pid"]) for r in csv_rows(24)}
    assert frame["image_key"].is_unique and frame["image_key"].str.fullmatch("[0-9a-f]{20}").all()
    site = json.loads((out / "csv" / "site.json").read_text())
    assert site["manifest_version"] == 2 and site["pseudonyms"]["key_id"] == secret.key_id
    assert "5a5a5a" not in output_text(out) and not (out / KEY_FILE_NAME).exists()


def test_same_key_same_pseudonyms_and_splits_other_key_other_pseudonyms(tmp_path, key):
    export, mapping = write_csv_export(tmp_path, csv_rows(40), MAPPING)
    runs = {}
    for name, key_file in (("a", key), ("b", key), ("c", None)):
        run_ingest("csv", export, tmp_path / name, mapping=mapping, site_key=key_file, progress=False)
        runs[name] = read_manifest(tmp_path / name / "csv").sort_values("image_path").reset_index(drop=True)
    assert runs["a"][["patient_id", "study_id", "image_key", "split"]].equals(
        runs["b"][["patient_id", "study_id", "image_key", "split"]])
    assert not set(runs["a"]["patient_id"]) & set(runs["c"]["patient_id"])
    assert (tmp_path / "c" / KEY_FILE_NAME).is_file()  # no key given: one was created in OUT, 0600
    assert (tmp_path / "c" / KEY_FILE_NAME).stat().st_mode & 0o077 == 0
    again = run_ingest("csv", export, tmp_path / "c", mapping=mapping, progress=False)
    assert again["rows_kept"] == 40
    rerun = read_manifest(tmp_path / "c" / "csv").sort_values("image_path").reset_index(drop=True)
    assert rerun["patient_id"].equals(runs["c"]["patient_id"]) and rerun["split"].equals(runs["c"]["split"])


def test_dicom_patient_and_study_uids_never_reach_any_output(tmp_path, key):
    export = tmp_path / "export"
    ids = []
    for i in range(8):
        uids = write_dicom(export / f"f{i}.dcm", seed=i, PatientID=f"MRN-DCM-{i // 2:03d}", PatientSex="F")
        ids += [f"MRN-DCM-{i // 2:03d}", uids["study"], uids["sop"]]
    pd.DataFrame({"file": [f"f{i}.dcm" for i in range(8)], "edema": [i % 2 for i in range(8)]}).to_csv(
        tmp_path / "labels.csv", index=False)
    out = tmp_path / "out"
    report = run_ingest("dicom", export, out, labels_csv=tmp_path / "labels.csv", site_key=key, progress=False)
    accounted(report, out)
    assert report["rows_kept"] == 8
    assert_no_raw_ids(out, ids + ["MRN-DCM"])


def test_real_dicom_tags_never_reach_any_output(shared_data, tmp_path, key):
    export = shared_data / "dicom"
    ids = []
    for path in export.rglob("*.dcm"):
        ds = pydicom.dcmread(path, force=True, stop_before_pixels=True)
        ids += [str(ds.get(k, "")).strip() for k in ("PatientID", "StudyInstanceUID", "SOPInstanceUID",
                                                     "AccessionNumber")]
    ids = [i for i in ids if len(i) >= 4]
    assert len(ids) >= 12
    out = tmp_path / "out"
    labels = pd.DataFrame({"file": [p.relative_to(export).as_posix() for p in sorted(export.rglob("*.dcm"))]})
    labels["pneumonia"] = [i % 2 for i in range(len(labels))]
    labels.to_csv(tmp_path / "labels.csv", index=False)
    report = run_ingest("dicom", export, out, labels_csv=tmp_path / "labels.csv", site_key=key, progress=False)
    accounted(report, out)
    assert report["rows_kept"] >= 6
    assert_no_raw_ids(out, ids)


def test_real_hannover_patient_ids_never_reach_any_output(shared_data, tmp_path, key):
    export = shared_data / "hannover-covid-19-image-repository"
    mapping = Path(__file__).parents[2] / "examples" / "hannover.yaml"
    out = tmp_path / "out"
    report = run_ingest("csv", export, out, mapping=mapping, site_key=key, progress=False)
    accounted(report, out)
    assert report["rows_kept"] == 243
    patients = pd.read_csv(export / "data.csv", dtype=str)["patient_id"].unique().tolist()
    assert len(patients) == 71
    assert_no_raw_ids(out, patients)
    frame = read_manifest(out / "csv")
    assert frame["patient_id"].nunique() == 71 and frame.groupby("patient_id")["split"].nunique().max() == 1
