"""``dicom`` source: folders of DICOM files with a label csv, end to end through the ingest."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pydicom
import pytest
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, RLELossless, SecondaryCaptureImageStorage, generate_uid

from fedcxr.site_adapters.base import AdapterOptions, IngestError
from fedcxr.site_adapters.dicom_folder import pseudonym, read_dicom_folder, read_label_csv
from fedcxr.site_adapters.ingest import run_ingest
from fedcxr.site_adapters.manifest import read_manifest
from fedcxr.vocab import AUX_VOCAB

# The fixtures write non-conformant ages ('45', '0XYZ') on purpose; pydicom warns when setting them.
pytestmark = pytest.mark.filterwarnings("ignore:Invalid value for VR AS")


def write_dicom(path: Path, *, seed: int = 0, photometric: str = "MONOCHROME2", compress=None, **tags) -> dict:
    """A small 32×32 12-bit DICOM with the given tags; returns its UIDs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID = SecondaryCaptureImageStorage
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.StudyInstanceUID = tags.pop("StudyInstanceUID", None) or generate_uid()
    ds.SeriesInstanceUID, ds.Modality = generate_uid(), "CR"
    ds.Rows = ds.Columns = 32
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, photometric
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    pixels = np.random.default_rng(seed).integers(0, 4096, (32, 32)).astype("<u2")
    ds.PixelData = pixels.tobytes()
    for key, value in tags.items():
        setattr(ds, key, value)
    if compress:
        ds.compress(compress)
    ds.save_as(path, enforce_file_format=True)
    return {"sop": str(ds.SOPInstanceUID), "study": str(ds.StudyInstanceUID)}


def synthetic_folder(root: Path) -> dict:
    """Six good DICOMs (one without extension, one RLE, one MONOCHROME1), plus bad files."""
    uids = {
        "a": write_dicom(root / "site1" / "a.dcm", seed=1, PatientID="MRN-0001", PatientSex="M",
                         PatientAge="062Y", ViewPosition="PA"),
        "b": write_dicom(root / "site1" / "b.dcm", seed=2, PatientID="MRN-0002", PatientSex="F",
                         PatientAge="45", ViewPosition="AP"),
        "c": write_dicom(root / "site2" / "c", seed=3, PatientID="MRN-0003", PatientSex="O",
                         PatientAge="0XYZ", ViewPosition="LL"),
        "d": write_dicom(root / "site2" / "d.dcm", seed=4, PatientID="MRN-0004", PatientSex="M",
                         PatientAge="081Y", compress=RLELossless),
        "e": write_dicom(root / "site2" / "e.dcm", seed=5, PatientID="MRN-0005", PatientSex="F",
                         PatientAge="030Y", photometric="MONOCHROME1"),
        "f": write_dicom(root / "site1" / "f.dcm", seed=6, PatientID="MRN-0006", PatientAge="070Y"),
    }
    (root / "site1" / "corrupt.dcm").write_bytes(np.random.default_rng(9).bytes(4000))
    full = (root / "site1" / "a.dcm").read_bytes()
    (root / "site2" / "truncated.dcm").write_bytes(full[:-500])
    from PIL import Image

    Image.fromarray(np.zeros((8, 8), np.uint8)).save(root / "site2" / "stray.png")
    (root / "README.txt").write_text("export notes\n")
    return uids


def label_csv(path: Path, rows: list[dict]) -> Path:
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "export"
    uids = synthetic_folder(root)
    labels = label_csv(tmp_path / "labels.csv", [
        {"SOPInstanceUID": uids["a"]["sop"], "Pneumonia": "1", "Pleural Effusion": "0", "Cardiomegaly": ""},
        {"SOPInstanceUID": uids["b"]["sop"], "Pneumonia": "0", "Pleural Effusion": "-1", "Cardiomegaly": "1"},
        {"SOPInstanceUID": uids["c"]["sop"], "Pneumonia": "yes", "Pleural Effusion": "0", "Cardiomegaly": "0"},
        {"SOPInstanceUID": uids["d"]["sop"], "Pneumonia": "0", "Pleural Effusion": "1", "Cardiomegaly": "0"},
        {"SOPInstanceUID": uids["e"]["sop"], "Pneumonia": "1", "Pleural Effusion": "0", "Cardiomegaly": "0"},
        {"SOPInstanceUID": "1.2.3.999", "Pneumonia": "1", "Pleural Effusion": "0", "Cardiomegaly": "0"},
    ])
    return root, labels, uids


def test_adapter_rows_reasons_and_demographics(folder):
    root, labels, uids = folder
    table = read_dicom_folder(root, AdapterOptions(labels_csv=labels))
    assert table.rows_read == 9  # 6 DICOMs (one without extension) + corrupt + truncated + png; not README
    assert len(table.frame) + len(table.set_aside) == table.rows_read
    assert table.headers_checked and table.classes == ["cardiomegaly", "pleural_effusion", "pneumonia"]
    reasons = {s.image_path: s.reason for s in table.set_aside}
    assert reasons["site1/corrupt.dcm"] == "not a DICOM/PNG/JPEG file"
    assert reasons["site2/truncated.dcm"].startswith("truncated DICOM: pixel data has")
    assert reasons["site2/stray.png"].startswith("not a DICOM file (a PNG image")
    assert reasons["site2/c"] == "unknown label value: 'yes' in column 'Pneumonia' (labels.csv row 3)"
    assert set(reasons) == {"site1/corrupt.dcm", "site2/truncated.dcm", "site2/stray.png", "site2/c"}

    frame = table.frame.set_index("image_path")
    assert list(table.frame["source_row"]) == sorted(table.frame["source_row"])
    a, b, d, f = (frame.loc[p] for p in ("site1/a.dcm", "site1/b.dcm", "site2/d.dcm", "site1/f.dcm"))
    assert (a["raw__pneumonia"], a["raw__pleural_effusion"]) == (1.0, 0.0) and np.isnan(a["raw__cardiomegaly"])
    assert b["raw__pleural_effusion"] == -1.0 and b["raw__cardiomegaly"] == 1.0
    assert d["raw__pleural_effusion"] == 1.0
    assert np.isnan(f["raw__pneumonia"])  # no label row → kept unlabeled
    assert (a["age"], b["age"], d["age"]) == (62.0, 45.0, 81.0)
    assert a["aux__sex"] == AUX_VOCAB["sex"].index("M") and b["aux__sex"] == AUX_VOCAB["sex"].index("F")
    assert a["aux__view"] == 0 and b["aux__view"] == 1 and pd.isna(d["aux__view"])
    assert a["aux__age_bin"] == 3 and d["aux__age_bin"] == 4
    assert a["patient_id"] == pseudonym("patient:MRN-0001") and "MRN" not in a["patient_id"]
    assert a["study_id"] == pseudonym(f"study:{uids['a']['study']}")
    assert a["group__folder"] == "site1"
    assert any("match no readable DICOM" in n for n in table.notes)
    assert any("README" not in n and "skipped 1 non-image" in n for n in table.notes)


def test_unusable_window_is_set_aside_with_its_reason(tmp_path):
    root = tmp_path / "export"
    write_dicom(root / "good.dcm", seed=1, PatientID="P1", WindowCenter="2048", WindowWidth="4096")
    write_dicom(root / "bad.dcm", seed=2, PatientID="P2", WindowCenter="2048", WindowWidth="0")
    table = read_dicom_folder(root, AdapterOptions())
    reasons = {s.image_path: s.reason for s in table.set_aside}
    assert list(table.frame["image_path"]) == ["good.dcm"]
    assert reasons["bad.dcm"].startswith("unusable VOI LUT / window (WindowCenter='2048', WindowWidth='0')")


def test_unparseable_age_is_unknown_and_noted(tmp_path):
    write_dicom(tmp_path / "x.dcm", PatientID="P1", PatientAge="0XYZ", PatientSex="X")
    write_dicom(tmp_path / "y.dcm", PatientID="P2", PatientAge="150Y")
    table = read_dicom_folder(tmp_path, AdapterOptions())
    assert len(table.frame) == 2 and not table.set_aside
    assert table.frame["age"].isna().all() and table.frame["aux__age_bin"].isna().all()
    assert table.frame["aux__sex"].isna().all()
    assert any("unmappable age" in n and "'0XYZ'" in n for n in table.notes)
    assert any("unmappable sex" in n for n in table.notes)


def test_ingest_end_to_end_synthetic(folder, tmp_path):
    root, labels, _ = folder
    out = tmp_path / "out"
    report = run_ingest("dicom", root, out, labels_csv=labels, verify_pixels=True, progress=False)
    assert report["rows_kept"] + report["rows_set_aside"] == report["rows_read"] == 9
    assert report["rows_kept"] == 5
    assert report["set_aside_by_reason"]["unknown label value"] == 1
    manifest = read_manifest(out / "dicom")
    assert len(manifest) == 5 and set(manifest["split"]) <= {"train", "val", "test"}
    site = json.loads((out / "dicom" / "site.json").read_text())
    assert site["aux"]["age_bin"]["available"] == 5 and site["aux"]["sex"]["available"] == 4
    everything = (out / "ingest_report.json").read_text() + (out / "dicom" / "site.json").read_text()
    everything += (out / "dicom" / "manifest.parquet").read_bytes().decode("latin-1")
    assert "MRN-000" not in everything  # no raw PatientID anywhere in the outputs


def test_site_by_folder(folder, tmp_path):
    root, labels, _ = folder
    report = run_ingest("dicom", root, tmp_path / "out", labels_csv=labels, site_by="folder", progress=False)
    assert set(report["sites"]) == {"site1", "site2"}
    assert report["rows_kept"] + report["rows_set_aside"] == report["rows_read"]


def test_real_dicom_folder_with_file_name_labels(shared_data, tmp_path):
    files = sorted(p.name for p in (shared_data / "dicom").rglob("*.dcm"))
    rows = [{"filename": name, "No Finding": "1" if i % 2 else "0", "Effusion": "0" if i % 2 else "1"}
            for i, name in enumerate(files)]
    labels = label_csv(tmp_path / "labels.csv", rows)
    out = tmp_path / "out"
    report = run_ingest("dicom", shared_data / "dicom", out, labels_csv=labels, verify_pixels=True,
                        progress=False, keep_non_chest=True)
    # the FAKE file is the mono2 file with one tag changed: the same SOPInstanceUID, so one image
    assert report["rows_read"] == 8 and report["rows_kept"] == 7 and report["rows_set_aside"] == 1
    assert report["set_aside"][0]["image_path"] == "rsna_pneumonia_cr_chest_pa_jpegbaseline_mono2.dcm"
    assert report["set_aside"][0]["reason"] == (
        "duplicate image: same SOPInstanceUID as row 5 (rsna_pneumonia_cr_chest_pa_jpegbaseline_FAKE_mono1_tag.dcm)")
    manifest = read_manifest(out / "dicom").set_index("image_path")
    rsna = manifest.loc["rsna_pneumonia_cr_chest_pa_jpegbaseline_FAKE_mono1_tag.dcm"]
    assert rsna["age"] == 62.0 and rsna["aux__sex"] == 1 and rsna["aux__view"] == 0
    nih = manifest.loc["nih_cxr14_gcp_dx_chest_implicit_le_mono2.dcm"]
    assert nih["age"] == 81.0 and pd.isna(nih["aux__view"])
    assert manifest.loc["nonchest/wg04_RG2_cr_hip_jpeg_lossless_sv1_mono2.dcm", "group__folder"] == "nonchest"
    flagged = manifest["not_chest"].dropna().to_dict()   # kept (--keep-non-chest), flagged with the reason
    assert flagged == {
        "nonchest/cr_dental_jpeg_lossless_mono1_modality_lut_seq.dcm":
            "not a chest radiograph: StudyDescription names TEETH (no BodyPartExamined)",
        "nonchest/wg04_RG2_cr_hip_jpeg_lossless_sv1_mono2.dcm": "not a chest radiograph: BodyPartExamined 'HIP'"}
    assert set(report["sites"]["dicom"]["class_set"]) == {"pleural_effusion", "no_finding"}
    assert "Covid0000" not in (out / "ingest_report.json").read_text()


def test_real_folder_without_labels_is_an_unlabeled_site(shared_data, tmp_path, capsys):
    """No label csv, no findings in StudyDescription: every usable chest image kept, demographics from
    the tags; the FAKE_mono1 twin shares its SOPInstanceUID with the original and is set aside, and so
    are the hip and the dental film (their tags say they are not chest radiographs)."""
    from fedcxr.cli import main

    out = tmp_path / "out"
    assert main(["ingest", "dicom", "--input", str(shared_data / "dicom"), "--out", str(out),
                 "--site-name", "ward7", "-q"]) == 0
    printed = capsys.readouterr().out
    assert "kept 5, set aside 3" in printed and "set aside 1: duplicate image" in printed
    assert "set aside 2: not a chest radiograph" in printed
    assert "site ward7: unlabeled site: 5 images, no finding labels" in printed
    report = json.loads((out / "ingest_report.json").read_text())
    assert report["sites"]["ward7"]["unlabeled"] is True and report["sites"]["ward7"]["class_set"] == []
    assert any("StudyDescription of 7 of 8" in n for n in report["notes"])
    site = json.loads((out / "ward7" / "site.json").read_text())
    assert site["unlabeled"] is True and site["class_set"] == [] and site["rows"] == 5
    aside = {r["image_path"]: r["reason"] for r in report["set_aside"]}
    assert aside["nonchest/wg04_RG2_cr_hip_jpeg_lossless_sv1_mono2.dcm"] == (
        "not a chest radiograph: BodyPartExamined 'HIP'")
    manifest = read_manifest(out / "ward7").set_index("image_path")
    assert "not_chest" not in manifest and not any(p.startswith("nonchest/") for p in manifest.index)
    assert manifest.filter(like="label__").isna().all().all()
    (rsna_path,) = [p for p in manifest.index if p.startswith("rsna_pneumonia")]  # one twin kept
    rsna = manifest.loc[rsna_path]
    assert rsna["age"] == 62.0 and rsna["aux__sex"] == 1 and rsna["aux__view"] == 0


def test_images_source_takes_png_and_jpeg_beside_dicom(tmp_path, capsys):
    from PIL import Image

    from fedcxr.cli import main

    root = tmp_path / "scans"
    write_dicom(root / "a" / "1.dcm", PatientID="P1", PatientSex="F", PatientAge="045Y")
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (40, 30), dtype=np.uint8), "L").save(root / "a" / "2.png")
    Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8), "RGB").save(root / "3.jpg")
    (root / "notes.txt").write_text("not an image")
    out = tmp_path / "out"
    assert main(["ingest", "images", "--input", str(root), "--out", str(out), "--site-name", "clinic", "-q"]) == 0
    assert "site clinic: unlabeled site: 3 images, no finding labels" in capsys.readouterr().out
    manifest = read_manifest(out / "clinic").set_index("image_path")
    assert sorted(manifest.index) == ["3.jpg", "a/1.dcm", "a/2.png"]
    assert manifest.loc["a/1.dcm", "aux__sex"] == AUX_VOCAB["sex"].index("F")
    assert pd.isna(manifest.loc["a/2.png", "aux__sex"]) and manifest["patient_id"].nunique() == 3
    # the dicom source still sets raster images aside, with the reason
    report = run_ingest("dicom", root, tmp_path / "out2", progress=False)
    assert report["rows_kept"] == 1 and report["rows_set_aside"] == 2


def test_study_description_labels_when_every_file_names_findings(tmp_path):
    write_dicom(tmp_path / "1.dcm", PatientID="P1", StudyDescription="No Finding")
    write_dicom(tmp_path / "2.dcm", PatientID="P2", StudyDescription="Effusion|Mass")
    table = read_dicom_folder(tmp_path, AdapterOptions())
    assert table.classes == ["pleural_effusion", "mass", "no_finding"]
    frame = table.frame.set_index("image_path")
    assert frame.loc["1.dcm", ["raw__pleural_effusion", "raw__mass", "raw__no_finding"]].tolist() == [0, 0, 1]
    assert frame.loc["2.dcm", ["raw__pleural_effusion", "raw__mass", "raw__no_finding"]].tolist() == [1, 1, 0]
    write_dicom(tmp_path / "3.dcm", PatientID="P3", StudyDescription="CHEST PA")
    table = read_dicom_folder(tmp_path, AdapterOptions())
    assert table.classes == [] and any("'CHEST PA'" in n for n in table.notes)


def test_study_uid_and_relative_path_keys(tmp_path):
    root = tmp_path / "export"
    study = generate_uid()
    write_dicom(root / "p1" / "x.dcm", PatientID="P1", StudyInstanceUID=study)
    write_dicom(root / "p1" / "y.dcm", PatientID="P1", StudyInstanceUID=study)
    write_dicom(root / "p2" / "x.dcm", PatientID="P2")
    by_study = label_csv(tmp_path / "study.csv", [{"StudyInstanceUID": study, "Edema": "1"}])
    table = read_dicom_folder(root, AdapterOptions(labels_csv=by_study))
    values = table.frame.set_index("image_path")["raw__edema"]
    assert values["p1/x.dcm"] == 1 and values["p1/y.dcm"] == 1 and np.isnan(values["p2/x.dcm"])
    by_path = label_csv(tmp_path / "path.csv", [{"image_path": "p2/x.dcm", "Edema": "0", "split": "test"},
                                                {"image_path": "x.dcm", "Edema": "1"}])  # ambiguous name
    table = read_dicom_folder(root, AdapterOptions(labels_csv=by_path))
    frame = table.frame.set_index("image_path")
    assert frame.loc["p2/x.dcm", "raw__edema"] == 0 and frame.loc["p2/x.dcm", "official_split"] == "test"
    assert np.isnan(frame.loc["p1/x.dcm", "raw__edema"])
    assert any("match several files" in n for n in table.notes)


def test_conflicting_duplicate_label_rows(tmp_path):
    uid = write_dicom(tmp_path / "export" / "a.dcm", PatientID="P1")["sop"]
    labels = label_csv(tmp_path / "l.csv", [{"SOPInstanceUID": uid, "Edema": "1"},
                                            {"SOPInstanceUID": uid, "Edema": "0"}])
    table = read_dicom_folder(tmp_path / "export", AdapterOptions(labels_csv=labels))
    assert table.frame.empty
    assert table.set_aside[0].reason == "conflicting label rows: l.csv rows 1 and 2 differ for the same SOPInstanceUID"


def test_label_csv_without_key_column(tmp_path):
    labels = label_csv(tmp_path / "l.csv", [{"PatientID": "x", "Edema": "1"}])
    with pytest.raises(IngestError, match=r"l\.csv: no key column.*found 'PatientID', 'Edema'"):
        read_label_csv(labels)


def test_label_csv_with_unknown_column(tmp_path):
    labels = label_csv(tmp_path / "l.csv", [{"filename": "a.dcm", "Pneumonai": "1", "Edema": "0"}])
    with pytest.raises(IngestError, match=r"column\(s\) 'Pneumonai' are neither finding names"):
        read_label_csv(labels)


def test_missing_labels_file_and_empty_folder(tmp_path):
    write_dicom(tmp_path / "a.dcm")
    with pytest.raises(IngestError, match="no such file"):
        read_dicom_folder(tmp_path, AdapterOptions(labels_csv=tmp_path / "nope.csv"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(IngestError, match="no candidate DICOM files"):
        read_dicom_folder(tmp_path / "empty", AdapterOptions())


def test_missing_patient_id_falls_back_to_study(tmp_path):
    ids = write_dicom(tmp_path / "a.dcm")
    table = read_dicom_folder(tmp_path, AdapterOptions(workers=2))
    assert table.frame.loc[0, "patient_id"] == pseudonym(f"study:{ids['study']}")
    assert any("without PatientID" in n for n in table.notes)


def test_labels_csv_inside_the_folder_is_used_not_read_as_an_image(tmp_path):
    uid = write_dicom(tmp_path / "a.dcm", PatientID="P")["sop"]
    label_csv(tmp_path / "labels.csv", [{"SOPInstanceUID": uid, "Atelectasis": "1"}])
    table = read_dicom_folder(tmp_path, AdapterOptions())
    assert table.rows_read == 1 and table.frame.loc[0, "raw__atelectasis"] == 1.0
    assert pydicom.dcmread(tmp_path / "a.dcm").SOPInstanceUID == uid


def _corrupt_j2k_copy(good: Path, bad: Path) -> None:
    """The same file (same SOPInstanceUID) with its JPEG 2000 codestream damaged: the header check
    passes (lengths intact), the decode fails."""
    data = bytearray(good.read_bytes())
    start = data.rfind(b"\xff\x4f\xff\x51")  # J2K SOC + SIZ markers
    data[start: start + 40] = b"\x00" * 40
    bad.write_bytes(bytes(data))


def test_first_decodable_copy_of_an_instance_is_kept(tmp_path):
    """Three copies of one instance, the first corrupt: it is set aside with its decode failure, the
    second (the first that decodes) is kept, the third is its duplicate — with or without
    --verify-pixels. Before, the good copies went as duplicates and the corrupt one failed later."""
    from pydicom.uid import JPEG2000Lossless

    root = tmp_path / "export"
    write_dicom(root / "b_copy.dcm", seed=1, PatientID="P1", compress=JPEG2000Lossless)
    _corrupt_j2k_copy(root / "b_copy.dcm", root / "a_first.dcm")
    (root / "c_copy.dcm").write_bytes((root / "b_copy.dcm").read_bytes())
    write_dicom(root / "d_other.dcm", seed=2, PatientID="P2")
    for verify in (False, True):
        report = run_ingest("dicom", root, tmp_path / f"out{verify}", verify_pixels=verify, progress=False)
        reasons = {r["image_path"]: r["reason"] for r in report["set_aside"]}
        assert report["rows_kept"] == 2 and set(reasons) == {"a_first.dcm", "c_copy.dcm"}, reasons
        assert reasons["a_first.dcm"].startswith("pixel decode failed:")
        assert reasons["c_copy.dcm"] == "duplicate image: same SOPInstanceUID as row 2 (b_copy.dcm)"
        kept = set(read_manifest(tmp_path / f"out{verify}" / "dicom")["image_path"])
        assert kept == {"b_copy.dcm", "d_other.dcm"}


def test_no_copy_decodes_each_keeps_its_own_reason(tmp_path):
    from pydicom.uid import JPEG2000Lossless

    root = tmp_path / "export"
    root.mkdir()
    write_dicom(tmp_path / "good.dcm", seed=1, PatientID="P1", compress=JPEG2000Lossless)
    _corrupt_j2k_copy(tmp_path / "good.dcm", root / "x.dcm")
    _corrupt_j2k_copy(tmp_path / "good.dcm", root / "y.dcm")
    write_dicom(root / "z.dcm", seed=2, PatientID="P2")
    report = run_ingest("dicom", root, tmp_path / "out", progress=False)
    reasons = {r["image_path"]: r["reason"] for r in report["set_aside"]}
    assert set(reasons) == {"x.dcm", "y.dcm"} and all(r.startswith("pixel decode failed:") for r in reasons.values())
    assert report["rows_kept"] == 1


def test_labels_keyed_by_any_dicom_tag(tmp_path):
    """--labels-key AccessionNumber / PatientID=patientId: the csv keyed by a tag pydicom knows."""
    root = tmp_path / "export"
    write_dicom(root / "1.dcm", seed=1, PatientID="P1", AccessionNumber="ACC-1")
    write_dicom(root / "2.dcm", seed=2, PatientID="P1", AccessionNumber="ACC-2")
    write_dicom(root / "3.dcm", seed=3, PatientID="P2", AccessionNumber="ACC-3")
    by_accession = label_csv(tmp_path / "acc.csv", [{"Accession Number": "ACC-1", "Pneumonia": "1"},
                                                    {"Accession Number": "ACC-3", "Pneumonia": "0"}])
    table = read_dicom_folder(root, AdapterOptions(labels_csv=by_accession, labels_key="AccessionNumber"))
    raw = table.frame.set_index("image_path")["raw__pneumonia"]
    assert raw["1.dcm"] == 1 and np.isnan(raw["2.dcm"]) and raw["3.dcm"] == 0
    by_patient = label_csv(tmp_path / "rsna.csv", [{"patientId": "P1", "Target": "1"}, {"patientId": "P2", "Target": "0"}])
    with pytest.raises(IngestError, match="'Target' are neither finding names"):
        read_dicom_folder(root, AdapterOptions(labels_csv=by_patient, labels_key="PatientID"))
    by_patient = label_csv(tmp_path / "rsna.csv", [{"patientId": "P1", "pneumonia": "1"}, {"patientId": "P2", "pneumonia": "0"}])
    report = run_ingest("dicom", root, tmp_path / "out", labels_csv=by_patient, labels_key="PatientID=patientId",
                        progress=False)
    m = read_manifest(tmp_path / "out" / "dicom")
    assert report["rows_kept"] == 3 and sorted(m["raw__pneumonia"]) == [0.0, 1.0, 1.0]   # both of P1's images
    assert report["options"]["labels_key"] == "PatientID=patientId"


@pytest.mark.parametrize("key, message", [
    ("PatientName2", "'PatientName2' is not a DICOM keyword"),
    ("SeriesInstanceUID", "has no column named like 'SeriesInstanceUID'"),
    ("PatientID=pid", "has no column 'pid'"),
])
def test_labels_key_is_validated(tmp_path, key, message):
    write_dicom(tmp_path / "export" / "1.dcm", PatientID="P1")
    csv = label_csv(tmp_path / "l.csv", [{"PatientID": "P1", "Edema": "1"}])
    with pytest.raises(IngestError, match=message):
        read_dicom_folder(tmp_path / "export", AdapterOptions(labels_csv=csv, labels_key=key))


def test_labels_key_needs_a_label_csv_and_a_source_that_reads_one(tmp_path):
    write_dicom(tmp_path / "export" / "1.dcm", PatientID="P1")
    with pytest.raises(IngestError, match="--labels-key PatientID: no label csv"):
        run_ingest("dicom", tmp_path / "export", tmp_path / "out", labels_key="PatientID", progress=False)
    with pytest.raises(IngestError, match="--labels-key: SOURCE 'nih' does not read"):
        run_ingest("nih", tmp_path / "export", tmp_path / "out", labels_key="PatientID", progress=False)
