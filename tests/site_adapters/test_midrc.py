"""``midrc`` source: a MIDRC-style export built here (TSVs + DICOMs), ingested end to end.

:func:`build_midrc_export` writes the layout documented in :mod:`fedcxr.site_adapters.midrc`:
``case.tsv``, ``imaging_study.tsv``, ``cr_series_file.tsv``, ``dx_series_file.tsv`` (columns
named as in the Gen3 submission templates, ``*`` prefixes included) and DICOM files under
``images/<case>/<study>/``, some MONOCHROME1, some RLE or JPEG 2000 compressed.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pydicom
import pytest
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import (
    ExplicitVRLittleEndian,
    JPEG2000Lossless,
    RLELossless,
    SecondaryCaptureImageStorage,
    generate_uid,
)

from fedcxr.site_adapters.base import AdapterOptions, IngestError
from fedcxr.site_adapters.dicom_folder import pseudonym
from fedcxr.site_adapters.images import read_image
from fedcxr.site_adapters.ingest import run_ingest
from fedcxr.site_adapters.manifest import read_manifest
from fedcxr.site_adapters.midrc import find_tsvs, read_midrc

CASE_COLUMNS = ["*type", "project_id", "*submitter_id", "*datasets.submitter_id", "age_at_index",
                "age_at_index_gt89", "covid19_positive", "ethnicity", "race", "sex", "site_id", "zip"]
STUDY_COLUMNS = ["*type", "project_id", "*submitter_id", "*cases.submitter_id", "age_at_imaging",
                 "age_at_imaging_gt89", "body_part_examined", "study_description", "study_modality", "study_uid"]
SERIES_COLUMNS = ["*type", "project_id", "*submitter_id", "imaging_studies.submitter_id", "*data_category",
                  "*data_format", "*data_type", "*file_name", "*file_size", "*md5sum", "case_ids", "modality",
                  "series_uid", "view_position"]

#: (case id, sex, race, ethnicity, age, gt89, covid19_positive, zip, site) — three states.
CASES = [
    ("C-001", "Male", "White", "Not Hispanic or Latino", "45", "No", "Yes", "606", "S1"),  # IL
    ("C-002", "Female", "Black or African American", "Not Reported", "", "Yes", "No", "606", "S1"),
    ("C-003", "Female", "White", "Hispanic or Latino", "61", "No", "Not Reported", "021", "S2"),  # MA
    ("C-004", "Not Reported", "Asian", "Not Hispanic or Latino", "30", "No", "Yes", "021", "S2"),
    ("C-005", "Male", "Other", "Not Reported", "77", "No", "No", "770", "S3"),  # TX
    ("C-006", "Male", "White", "Not Reported", "50", "No", "Yes", "770", "S3"),
    ("C-007", "Female", "White", "Not Reported", "52", "No", "No", "000", "S3"),  # small area: no state
    ("C-008", "Male", "White", "Not Reported", "40", "No", "Maybe", "606", "S1"),  # bad label value
]


def write_dicom(path: Path, *, patient: str, study_uid: str, seed: int, photometric: str,
                compress=None, view: str = "PA", modality: str = "DX") -> str:
    """A 48×48 12-bit DICOM; returns its SOPInstanceUID."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID = SecondaryCaptureImageStorage
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.PatientID, ds.StudyInstanceUID, ds.SeriesInstanceUID = patient, study_uid, generate_uid()
    ds.Modality, ds.ViewPosition = modality, view
    ds.Rows = ds.Columns = 48
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, photometric
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    ds.PixelData = np.random.default_rng(seed).integers(0, 4096, (48, 48)).astype("<u2").tobytes()
    if compress:
        ds.compress(compress)
    ds.save_as(path, enforce_file_format=True)
    return str(ds.SOPInstanceUID)


def write_tsv(path: Path, columns: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([row.get(c.lstrip("*"), "") for c in columns])


def build_midrc_export(root: Path, *, series_tsvs: bool = True) -> dict:
    """A MIDRC-style export: 8 cases, one study each, two images per study (16 DICOMs).

    Images alternate MONOCHROME1/2 and uncompressed/RLE/JPEG 2000; CR for odd cases, DX for
    even. Returns facts the tests check against.
    """
    root.mkdir(parents=True, exist_ok=True)
    case_rows, study_rows, series = [], [], {"cr_series_file": [], "dx_series_file": []}
    codecs = [None, RLELossless, JPEG2000Lossless]
    files = {}
    for k, (cid, sex, race, eth, age, gt89, covid, zip3, site) in enumerate(CASES):
        case_rows.append({"type": "case", "project_id": "MIDRC-TEST", "submitter_id": cid,
                          "datasets.submitter_id": "ds-1", "age_at_index": age, "age_at_index_gt89": gt89,
                          "covid19_positive": covid, "ethnicity": eth, "race": race, "sex": sex,
                          "site_id": site, "zip": zip3})
        study_id, study_uid = f"{cid}_study", generate_uid()
        study_rows.append({"type": "imaging_study", "project_id": "MIDRC-TEST", "submitter_id": study_id,
                           "cases.submitter_id": cid, "age_at_imaging": "" if k != 0 else "46",
                           "study_modality": '["DX"]', "body_part_examined": '["CHEST"]', "study_uid": study_uid})
        node = "cr_series_file" if k % 2 else "dx_series_file"
        for j in range(2):
            name = f"{cid}_{j}.dcm"
            rel = f"images/{cid}/{study_id}/{name}"
            n = 2 * k + j
            write_dicom(root / rel, patient=cid, study_uid=study_uid, seed=n,
                        photometric="MONOCHROME1" if n % 2 else "MONOCHROME2", compress=codecs[n % 3],
                        view="AP" if j else "PA", modality=node[:2].upper())
            files[(cid, j)] = rel
            series[node].append({"type": node, "project_id": "MIDRC-TEST", "submitter_id": f"{cid}_{j}_file",
                                 "imaging_studies.submitter_id": study_id, "data_category": node[:2].upper(),
                                 "data_format": "DCM", "data_type": "DICOM", "file_name": name,
                                 "file_size": str((root / rel).stat().st_size), "md5sum": "0" * 32,
                                 "case_ids": cid, "modality": node[:2].upper(), "series_uid": generate_uid(),
                                 "view_position": '["AP"]' if j else "PA"})
    write_tsv(root / "case.tsv", CASE_COLUMNS, case_rows)
    write_tsv(root / "imaging_study.tsv", STUDY_COLUMNS, study_rows)
    if series_tsvs:
        for node, rows in series.items():
            write_tsv(root / f"{node}.tsv", SERIES_COLUMNS, rows)
    return {"files": files}


@pytest.fixture
def export(tmp_path):
    root = tmp_path / "midrc"
    facts = build_midrc_export(root)
    return root, facts


def test_fixture_columns_follow_the_real_submission_templates(shared_data):
    templates = shared_data / "schemas" / "midrc"
    for columns, node in ((CASE_COLUMNS, "case"), (STUDY_COLUMNS, "imaging_study"),
                          (SERIES_COLUMNS, "cr_series_file"), (SERIES_COLUMNS, "dx_series_file")):
        header = (templates / f"submission_{node}_template.tsv").read_text().splitlines()[0].split("\t")
        assert set(columns) <= set(header), set(columns) - set(header)


def test_real_templates_are_recognised_by_node(shared_data, tmp_path):
    for path in (shared_data / "schemas" / "midrc").glob("submission_*_template.tsv"):
        shutil.copy(path, tmp_path / path.name)
    tables = find_tsvs(tmp_path)
    assert set(tables) == {"case", "imaging_study", "cr_series_file", "dx_series_file", "measurement"}
    assert all(len(t.frame) == 0 for t in tables.values())  # the lone node-name line is not a row
    assert "submitter_id" in tables["case"].frame.columns  # '*' prefix stripped
    with pytest.raises(IngestError, match="no images"):
        read_midrc(tmp_path, AdapterOptions())


def test_adapter_labels_demographics_and_groups(export):
    root, facts = export
    table = read_midrc(root, AdapterOptions())
    assert table.classes == ["covid19"] and table.headers_checked
    assert table.rows_read == 16 and len(table.frame) + len(table.set_aside) == 16
    assert [s.reason for s in table.set_aside] == [
        "unknown covid19_positive value: 'Maybe' (expected Yes, No or Not Reported; case.tsv row 8)"] * 2
    assert {(s.file, s.row) for s in table.set_aside} == {("cr_series_file.tsv", 7), ("cr_series_file.tsv", 8)}
    frame = table.frame.set_index("image_path")
    row = {cid: frame.loc[facts["files"][(cid, 0)]] for cid, *_ in CASES[:7]}
    assert row["C-001"]["raw__covid19"] == 1 and row["C-002"]["raw__covid19"] == 0
    assert np.isnan(row["C-003"]["raw__covid19"])  # Not Reported → not labeled
    assert row["C-001"]["age"] == 46.0  # age_at_imaging wins over age_at_index (45)
    assert row["C-002"]["age"] == 90.0 and row["C-002"]["aux__age_bin"] == 4  # age_at_index_gt89
    assert row["C-001"]["aux__sex"] == 1 and row["C-002"]["aux__sex"] == 0 and pd.isna(row["C-004"]["aux__sex"])
    assert row["C-001"]["aux__race"] == 0 and row["C-002"]["aux__race"] == 1
    assert row["C-003"]["aux__race"] == 3  # Hispanic ethnicity wins over race White
    assert row["C-005"]["aux__race"] == 4 and row["C-004"]["aux__race"] == 2
    assert [row[c]["group__state"] for c in ("C-001", "C-003", "C-005")] == ["IL", "MA", "TX"]
    assert row["C-007"]["group__state"] is None or pd.isna(row["C-007"]["group__state"])
    assert row["C-001"]["group__site_id"] == "S1"
    assert row["C-001"]["patient_id"] == pseudonym("case:C-001")
    assert frame.loc[facts["files"][("C-001", 0)], "aux__view"] == 0
    assert frame.loc[facts["files"][("C-001", 1)], "aux__view"] == 1  # '["AP"]' array cell


def test_ingest_sites_by_state(export, tmp_path):
    root, _ = export
    out = tmp_path / "out"
    report = run_ingest("midrc", root, out, site_by="state", verify_pixels=True, progress=False)
    assert report["rows_read"] == 16
    assert report["rows_kept"] + report["rows_set_aside"] == 16
    assert set(report["sites"]) == {"IL", "MA", "TX"}
    assert report["set_aside_by_reason"] == {"unknown covid19_positive value": 2,
                                             "no value for site column 'state'": 2}
    assert {s: report["sites"][s]["rows"] for s in report["sites"]} == {"IL": 4, "MA": 4, "TX": 4}
    manifest = read_manifest(out / "TX")
    assert set(manifest["group__state"]) == {"TX"}
    reasons = " ".join(row["reason"] for row in report["set_aside"]) + " ".join(report["notes"])
    assert "C-00" not in reasons  # reasons and notes never name a case (paths are the export's own)


def test_ingest_sites_by_site_id(export, tmp_path):
    root, _ = export
    report = run_ingest("midrc", root, tmp_path / "out", site_by="site_id", progress=False)
    assert set(report["sites"]) == {"S1", "S2", "S3"}
    assert report["rows_kept"] + report["rows_set_aside"] == report["rows_read"] == 16


def test_monochrome1_and_compressed_images_decode(export):
    root, facts = export
    paths = [root / p for p in facts["files"].values()]
    images = [read_image(p) for p in paths]
    assert all(im.shape == (48, 48) and im.min() == 0 and im.max() == 1 for im in images)


def test_without_series_tsvs_images_link_by_study_uid(tmp_path):
    root = tmp_path / "midrc"
    build_midrc_export(root, series_tsvs=False)
    table = read_midrc(root, AdapterOptions(workers=2))
    assert table.rows_read == 16 and len(table.frame) == 14
    assert set(table.frame["source_file"]) == set(table.frame["image_path"])  # the DICOMs are the rows
    assert table.frame["aux__view"].notna().all()  # from the ViewPosition tag


def test_bad_images_and_missing_links_are_set_aside(export):
    root, facts = export
    # a truncated DICOM, a series row naming a missing file, a stray DICOM linked to nothing
    target = root / facts["files"][("C-003", 1)]
    target.write_bytes(target.read_bytes()[:-200])
    (root / facts["files"][("C-004", 0)]).unlink()
    write_dicom(root / "images" / "stray.dcm", patient="NOBODY", study_uid=generate_uid(), seed=99,
                photometric="MONOCHROME2")
    table = read_midrc(root, AdapterOptions())
    reasons = {s.image_path: s.reason for s in table.set_aside}
    assert reasons[facts["files"][("C-003", 1)]].startswith("truncated DICOM")
    assert reasons["C-004_0.dcm"] == "missing file"  # the series row's bare file_name, found nowhere
    assert reasons["images/stray.dcm"] == "no case row: the image links to no imaging study or case"
    assert table.rows_read == 17 and len(table.frame) + len(table.set_aside) == 17


def test_case_missing_from_case_tsv(export):
    root, facts = export
    lines = (root / "case.tsv").read_text().splitlines()
    (root / "case.tsv").write_text("\n".join(line for line in lines if "C-005" not in line) + "\n")
    table = read_midrc(root, AdapterOptions())
    reasons = {s.image_path: s.reason for s in table.set_aside}
    assert reasons[facts["files"][("C-005", 0)]] == (
        "no case row: the case named by the imaging study found by imaging_studies.submitter_id is not in the case TSV")


def test_conflicting_duplicate_case_rows(export):
    root, facts = export
    with open(root / "case.tsv", "a") as handle:
        handle.write("case\tMIDRC-TEST\tC-006\tds-1\t50\tNo\tNo\tNot Reported\tWhite\tMale\tS3\t770\n")
    table = read_midrc(root, AdapterOptions())
    reasons = {s.image_path: s.reason for s in table.set_aside}
    assert reasons[facts["files"][("C-006", 0)]] == (
        "conflicting case rows: case.tsv row 6 and case.tsv row 9 describe the same case differently")


def test_no_case_tsv_is_a_user_error(tmp_path):
    (tmp_path / "notes.tsv").write_text("a\tb\n1\t2\n")
    with pytest.raises(IngestError, match="no case TSV found"):
        read_midrc(tmp_path, AdapterOptions())


def test_case_tsv_without_submitter_id(tmp_path):
    (tmp_path / "case.tsv").write_text("type\tsex\ncase\tMale\n")
    with pytest.raises(IngestError, match=r"case\.tsv: case TSV lacks column 'submitter_id'"):
        read_midrc(tmp_path, AdapterOptions())


def test_integer_zip_without_leading_zero(export):
    root, facts = export
    text = (root / "case.tsv").read_text().replace("\t021\n", "\t21\n")
    (root / "case.tsv").write_text(text)
    table = read_midrc(root, AdapterOptions())
    frame = table.frame.set_index("image_path")
    assert frame.loc[facts["files"][("C-003", 0)], "group__state"] == "MA"


def test_a_film_whose_tags_name_another_body_part_is_set_aside(export, tmp_path):
    root, facts = export
    path = root / facts["files"][("C-002", 0)]
    ds = pydicom.dcmread(path)
    ds.BodyPartExamined = "KNEE"
    ds.save_as(path)
    report = run_ingest("midrc", root, tmp_path / "out", progress=False)
    reasons = {r["image_path"]: r["reason"] for r in report["set_aside"]}
    assert reasons[facts["files"][("C-002", 0)]] == "not a chest radiograph: BodyPartExamined 'KNEE'"
    assert report["set_aside_by_reason"]["not a chest radiograph"] == 1
    kept = run_ingest("midrc", root, tmp_path / "kept", progress=False, keep_non_chest=True)
    assert kept["rows_kept"] == report["rows_kept"] + 1
