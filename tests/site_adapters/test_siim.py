"""``siim`` source: SIIM-ACR run-length mask rows → one pneumothorax label per image."""

from __future__ import annotations

import json

import pytest

from fedcxr.site_adapters.ingest import run_ingest
from fedcxr.site_adapters.manifest import read_manifest
from fedcxr.site_adapters.siim import mask_row_value, read_siim_labels

from .public_exports import write_siim

pytestmark = pytest.mark.filterwarnings("ignore:Invalid value for VR AS")

RLE = "557374 2 1015 8 1009 14"


def test_mask_cells():
    assert mask_row_value(" -1") == 0.0 and mask_row_value(RLE) == 1.0
    for bad, reason in ((" ", "empty mask cell"), ("12 3 4", "not a run-length"), ("-2", "not a run-length"),
                        ("1 x", "not a run-length"), (None, "empty mask cell")):
        with pytest.raises(ValueError, match=reason):
            mask_row_value(bad)


def _export(root):
    rows = [("1.2.3.1", RLE), ("1.2.3.1", "60 4"),        # two pneumothorax regions: one positive image
            ("1.2.3.2", " -1"), ("1.2.3.3", " -1"), ("1.2.3.4", "7 x 9"), ("", " -1"),
            ("1.2.3.5", " -1"), ("1.2.3.6", "10 2")]
    files = {"1.2.3.1": {"PatientID": "pat-A", "PatientSex": "M", "PatientAge": "38", "ViewPosition": "PA"},
             "1.2.3.2": {"PatientID": "pat-A", "PatientSex": "M", "PatientAge": "38", "ViewPosition": "AP"},
             "1.2.3.3": {"PatientID": "pat-B", "PatientSex": "F", "PatientAge": "71", "ViewPosition": "PA"},
             "1.2.3.4": {"PatientID": "pat-C", "PatientSex": "F", "PatientAge": "44", "ViewPosition": "PA"},
             "1.2.3.6": {"PatientID": "", "PatientSex": "F", "PatientAge": "20", "ViewPosition": "PA"}}
    return write_siim(root, rows, files)  # 1.2.3.5 has no file


def test_one_row_per_image_positive_when_any_mask_row_is(tmp_path):
    frame, aside, notes, rows_read = read_siim_labels(_export(tmp_path))
    assert rows_read == 7 == len(frame) + len(aside)
    assert dict(zip(frame["patient_id"], frame["raw__pneumothorax"])) == {
        "1.2.3.1": 1.0, "1.2.3.2": 0.0, "1.2.3.3": 0.0, "1.2.3.5": 0.0, "1.2.3.6": 1.0}
    assert {a.row: a.reason for a in aside} == {
        5: "unknown label value: not a run-length mask or -1: '7 x 9' in column 'EncodedPixels' (row 5)",
        6: "missing value: empty 'ImageId'"}
    assert frame["source_row"].tolist() == [1, 3, 4, 7, 8] and "1 image(s) with several rows" in notes[0]


def test_ingest_finds_nested_dicoms_and_keys_patients_by_the_patientid_tag(tmp_path):
    out = tmp_path / "out"
    report = run_ingest("siim", _export(tmp_path / "export"), out, progress=False)
    assert report["rows_read"] == 7 == report["rows_kept"] + report["rows_set_aside"] and report["rows_kept"] == 4
    assert report["set_aside_by_reason"] == {"unknown label value": 1, "missing value": 1, "missing file": 1}
    frame = read_manifest(out / "siim")
    assert frame["image_path"].str.startswith("dicom-images-train/1.2.").all()
    by_path = frame.set_index(frame["image_path"].str.rsplit("/", n=1).str[-1])
    assert by_path.loc["1.2.3.1.dcm", "patient_id"] == by_path.loc["1.2.3.2.dcm", "patient_id"]  # both pat-A
    assert by_path.loc["1.2.3.1.dcm", "split"] == by_path.loc["1.2.3.2.dcm", "split"]
    assert frame["patient_id"].nunique() == 3  # pat-A, pat-B and the image without a PatientID
    site = json.loads((out / "siim" / "site.json").read_text())
    assert site["class_set"] == ["pneumothorax"]
    assert site["class_counts"]["pneumothorax"] == {"positive": 2, "negative": 2, "missing": 0, "uncertain": 0,
                                                "implied_negative": 0}
    assert site["aux"]["view"]["counts"] == {"PA": 3, "AP": 1} and site["aux"]["sex"]["counts"] == {"F": 2, "M": 2}
    assert any("without PatientID" in n for n in report["notes"])


def test_second_stage_file_and_a_header_without_the_space(tmp_path):
    write_siim(tmp_path, [("x", "-1"), ("y", "1 2")], {}, name="stage_2_train.csv", pixel_header="EncodedPixels")
    frame, aside, _, rows_read = read_siim_labels(tmp_path)
    assert rows_read == 2 and not aside and frame["raw__pneumothorax"].tolist() == [0.0, 1.0]
