"""``openi`` source: Open-i report XML (MeSH terms) → labels, PNG or DICOM images, metadata table."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest

from fedcxr.site_adapters.ingest import run_ingest
from fedcxr.site_adapters.manifest import read_manifest
from fedcxr.site_adapters.openi import (
    SOURCE_CLASSES,
    TERM_CLASSES,
    age_from_dates,
    labels_of,
    parse_report,
    read_openi_labels,
)

from .public_exports import openi_report, tiny_dicom, tiny_png, write_csv


def test_terms_map_exactly_not_by_substring():
    report = parse_report(openi_report(7, ["CXR7_1"], ["Pericardial effusion", "Subcutaneous Emphysema",
                                                      "cystic fibrosis", "Calcified Granuloma", "pleural fluid",
                                                      "Enlarged heart", "degenerative change"], ["Cardiomegaly"])
                          .encode(), "7.xml")
    assert report.uid == "CXR7" and report.images == ["CXR7_1"] and report.major == ["cardiomegaly"]
    labels = labels_of(report)
    positive = sorted(c for c, v in labels.items() if v == 1.0)
    assert positive == ["calcified_granuloma", "cardiomegaly", "granuloma", "pleural_effusion"]
    assert labels["emphysema"] == 0 and labels["fibrosis"] == 0  # subcutaneous emphysema, cystic fibrosis
    assert TERM_CLASSES["calcified granuloma"] == ("granuloma", "calcified_granuloma")


def test_a_report_without_automatic_terms_is_negative_only_when_coded_normal():
    normal = parse_report(openi_report(1, ["CXR1_1"], [], ["normal"]).encode(), "1.xml")
    coded = parse_report(openi_report(2, ["CXR2_1"], [], ["Calcified Granuloma/lung/right"]).encode(), "2.xml")
    assert set(labels_of(normal).values()) == {0.0}
    assert all(np.isnan(v) for v in labels_of(coded).values())  # MTI missed what the coder saw


def test_unreadable_reports_are_named():
    assert parse_report(b"<eCitation><uId id='CXR1'/>", "1.xml").problem.startswith("unreadable report: XML error")
    assert parse_report(b"<eCitation/>", "2.xml").problem == "unreadable report: no <uId id=...>"
    assert "bytes" in parse_report(b"x" * (2 << 20), "3.xml").problem


def _export(root):
    reports = {
        1: openi_report(1, ["CXR1_1_IM-0001-3001", "CXR1_1_IM-0001-4001"], [], ["normal"]),
        2: openi_report(2, ["CXR2_IM-0652-1001"], ["Cardiomegaly", "pleural effusions", "scarring"], ["Cardiomegaly"]),
        3: openi_report(3, ["CXR3_IM-1384-1001"], ["pneumonia"], ["Pneumonia"]),
        4: openi_report(4, [], ["opacity"], ["Opacity"]),                 # names no image: no row
        5: "<eCitation><uId id='CXR5'>",                                  # broken: one row set aside
    }
    for uid, text in reports.items():
        (root / "ecgen-radiology").mkdir(parents=True, exist_ok=True)
        (root / "ecgen-radiology" / f"{uid}.xml").write_text(text)
    tiny_png(root / "NLMCXR_png" / "CXR1_1_IM-0001-3001.png", 1)
    tiny_png(root / "NLMCXR_png" / "CXR1_1_IM-0001-4001.png", 2)
    tiny_png(root / "NLMCXR_png" / "CXR2_IM-0652-1001.png", 3)       # a DICOM of it exists too: used
    tiny_dicom(root / "NLMCXR_dcm" / "2_IM-0652-1001.dcm", seed=4, PatientID="2", PatientSex="",
               ViewPosition="AP", PatientBirthDate="19500615", StudyDate="20120301")
    write_csv(root / "nlmcxr_dicom_metadata.csv", [
        {"imageid": "CXR1_1_IM-0001-3001", "View Position": "PA", "Patient's Sex": "",
         "Patient's Birth Date": "19800101", "Study Date": "20110101"},
        {"imageid": "CXR1_1_IM-0001-4001", "View Position": "LL", "Patient's Sex": "",
         "Patient's Birth Date": "19800101", "Study Date": "20110101"},
        {"imageid": "CXR2_IM-0652-1001", "View Position": "PA", "Patient's Sex": "",
         "Patient's Birth Date": "19400101", "Study Date": "20120301"},
    ])
    return root


def test_ingest_reads_reports_images_and_demographics(tmp_path):
    out = tmp_path / "out"
    report = run_ingest("openi", _export(tmp_path / "export"), out, progress=False)
    assert report["rows_read"] == 5 == report["rows_kept"] + report["rows_set_aside"]
    assert {r["reason"].split(":")[0] for r in report["set_aside"]} == {"unreadable report", "missing file"}
    frame = read_manifest(out / "openi").set_index("image_path")
    assert sorted(frame.index) == ["NLMCXR_dcm/2_IM-0652-1001.dcm", "NLMCXR_png/CXR1_1_IM-0001-3001.png",
                                   "NLMCXR_png/CXR1_1_IM-0001-4001.png"]
    dcm = frame.loc["NLMCXR_dcm/2_IM-0652-1001.dcm"]
    assert dcm["label__cardiomegaly"] == 1 and dcm["label__pleural_effusion"] == 1 and dcm["label__pneumonia"] == 0
    assert dcm["aux__view"] == 1 and dcm["age"] == pytest.approx(61.7, abs=0.05)  # tags win over the table
    png = frame.loc["NLMCXR_png/CXR1_1_IM-0001-4001.png"]
    assert png["aux__view"] == 2 and png["age"] == pytest.approx(31.0, abs=0.05)  # from the metadata table
    assert frame.loc["NLMCXR_png/CXR1_1_IM-0001-3001.png", "label__atelectasis"] == 0  # a normal report
    assert frame["patient_id"].nunique() == 2  # report 1's two images are one patient
    site = json.loads((out / "openi" / "site.json").read_text())
    assert set(site["class_set"]) == set(SOURCE_CLASSES)
    assert any("'scarring' 1" in n for n in report["notes"])


def test_the_packed_report_archive_reads_like_the_folder(tmp_path):
    folder = _export(tmp_path / "folder")
    packed = tmp_path / "packed"
    packed.mkdir()
    with tarfile.open(packed / "NLMCXR_reports.tgz", "w:gz") as tar:
        for path in sorted((folder / "ecgen-radiology").iterdir()):
            data = path.read_bytes()
            info = tarfile.TarInfo(f"ecgen-radiology/{path.name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    a, a_aside, _, a_read = read_openi_labels(folder)
    b, b_aside, _, b_read = read_openi_labels(packed)
    assert a_read == b_read == 5 and len(a_aside) == len(b_aside) == 1
    assert b_aside[0].file == "NLMCXR_reports.tgz:ecgen-radiology/5.xml"
    assert a.drop(columns="source_file").equals(b.drop(columns="source_file"))


def test_age_from_dicom_dates():
    assert age_from_dates("19500615", "20120301") == pytest.approx(61.71, abs=0.01)
    assert age_from_dates("19550820.0", 20110328) == pytest.approx(55.6, abs=0.1)
    assert age_from_dates("", "20110328") is None and age_from_dates("20200101", "20110101") is None


def test_a_metadata_table_without_imageid_stops_naming_it(tmp_path):
    from fedcxr.site_adapters.base import AdapterOptions, IngestError
    from fedcxr.site_adapters.openi import read_openi

    export = _export(tmp_path)
    write_csv(export / "nlmcxr_dicom_metadata.csv", [{"image": "CXR1_1_IM-0001-3001", "View Position": "PA"}])
    with pytest.raises(IngestError, match=r"nlmcxr_dicom_metadata.csv: missing required column\(s\) 'imageid'"):
        read_openi(export, AdapterOptions(extra={"progress": False}))


@pytest.mark.timeout(120)
def test_a_pipe_or_a_device_among_the_reports_is_set_aside_never_read(tmp_path):
    import os

    from fedcxr.site_adapters.inputs import following_links

    export = _export(tmp_path / "export")
    os.mkfifo(export / "ecgen-radiology" / "6.xml")  # reading it would wait for a writer forever
    (export / "ecgen-radiology" / "7.xml").symlink_to("/dev/zero")  # reading it would never end
    frame, aside, _, rows_read = read_openi_labels(export)
    reasons = {a.file: a.reason for a in aside}
    assert reasons["ecgen-radiology/6.xml"] == "unreadable report: not a regular file (a named pipe)"
    assert "leads out of the export folder" in reasons["ecgen-radiology/7.xml"]
    assert rows_read == len(frame) + len(aside) and len(frame) == 4
    with following_links(True):  # links out allowed: the device is still never read
        frame, aside, _, _ = read_openi_labels(export)
    reasons = {a.file: a.reason for a in aside}
    assert reasons["ecgen-radiology/7.xml"] == "unreadable report: not a regular file (a character device)"
    assert len(frame) == 4


def test_a_report_linked_out_of_the_export_needs_follow_links(tmp_path):
    from fedcxr.site_adapters.inputs import following_links

    export = _export(tmp_path / "export")
    (tmp_path / "elsewhere.xml").write_text(openi_report(8, ["CXR8_1"], ["pneumonia"], ["Pneumonia"]))
    (export / "ecgen-radiology" / "8.xml").symlink_to(tmp_path / "elsewhere.xml")
    frame, aside, _, _ = read_openi_labels(export)
    reason = {a.file: a.reason for a in aside}["ecgen-radiology/8.xml"]
    assert "leads out of the export folder" in reason and "--follow-links" in reason
    assert "CXR8" not in set(frame["patient_id"])
    with following_links(True):
        frame, aside, _, _ = read_openi_labels(export)
    assert "ecgen-radiology/8.xml" not in {a.file for a in aside} and "CXR8" in set(frame["patient_id"])
