"""``rsna`` source: RSNA Pneumonia box table + detailed classes + DICOMs, through the ingest."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fedcxr.site_adapters.base import AdapterOptions, IngestError
from fedcxr.site_adapters.ingest import run_ingest
from fedcxr.site_adapters.manifest import read_manifest
from fedcxr.site_adapters.rsna import read_rsna, read_rsna_labels

from .public_exports import RSNA_IMAGES, write_csv, write_rsna

pytestmark = pytest.mark.filterwarnings("ignore:Invalid value for VR AS")


def test_boxes_become_one_row_per_image_with_the_challenge_labels(tmp_path):
    frame, aside, notes, rows_read, classes = read_rsna_labels(write_rsna(tmp_path))
    assert rows_read == 6 and not aside and classes == ["pneumonia", "lung_opacity", "no_finding"]
    assert frame["patient_id"].tolist() == [p for p, *_ in RSNA_IMAGES]
    assert frame["source_row"].tolist() == [1, 3, 4, 5, 6, 7]  # first box row of each image (two boxes: rows 1-2)
    assert frame["raw__pneumonia"].tolist() == [1, 1, 0, 0, 0, 0] == frame["raw__lung_opacity"].tolist()
    assert frame["raw__no_finding"].tolist() == [0, 0, 1, 0, 1, 1]  # "Normal"; "Not Normal" is 0
    assert frame["image_path"][0] == "stage_2_train_images/p-pos-2box.dcm"


def test_ingest_accounts_for_every_image_and_reads_sex_age_view_from_tags(tmp_path):
    out = tmp_path / "out"
    report = run_ingest("rsna", write_rsna(tmp_path / "export"), out, progress=False)
    assert report["rows_read"] == 6 == report["rows_kept"] + report["rows_set_aside"]
    assert report["rows_kept"] == 5 and report["set_aside"][0]["reason"] == "missing file"
    assert report["set_aside"][0]["image_path"] == "stage_2_train_images/p-no-file.dcm"
    site = json.loads((out / "rsna" / "site.json").read_text())
    assert site["class_set"] == ["pneumonia", "lung_opacity", "no_finding"]
    assert site["class_counts"]["pneumonia"] == {"positive": 2, "negative": 3, "missing": 0, "uncertain": 0,
                                                "implied_negative": 0}
    assert site["aux"]["sex"]["counts"] == {"F": 3, "M": 2}
    assert site["aux"]["view"]["counts"] == {"PA": 3, "AP": 2}
    assert site["aux"]["age_bin"] == {"available": 4, "missing": 1, "counts": {"0-19": 1, "20-39": 1, "40-59": 1,
                                                                                 "60-79": 1}}
    frame = read_manifest(out / "rsna")
    assert frame["patient_id"].nunique() == 5 and not frame["patient_id"].str.startswith("p-").any()  # keyed


def test_without_the_detailed_class_file_no_finding_is_not_a_class(tmp_path):
    table = read_rsna(write_rsna(tmp_path, detailed=False), AdapterOptions(extra={"progress": False}))
    assert table.classes == ["pneumonia", "lung_opacity"] and "raw__no_finding" not in table.frame
    assert any("no_finding is not labeled" in n for n in table.notes)


def test_disagreeing_rows_set_the_image_aside_naming_them(tmp_path):
    write_csv(tmp_path / "stage_2_train_labels.csv", [
        {"patientId": "a", "Target": 1}, {"patientId": "a", "Target": 0},   # Target differs within an image
        {"patientId": "b", "Target": 2},                                   # not 0/1
        {"patientId": "c", "Target": 0}, {"patientId": "d", "Target": 1}, {"patientId": "", "Target": 0},
        {"patientId": "e", "Target": 0},
    ])
    write_csv(tmp_path / "stage_2_detailed_class_info.csv", [
        {"patientId": "a", "class": "Lung Opacity"}, {"patientId": "b", "class": "Normal"},
        {"patientId": "c", "class": "Lung Opacity"},                       # contradicts Target 0
        {"patientId": "d", "class": "Opaque"},                             # unknown class
    ])
    frame, aside, notes, rows_read, _ = read_rsna_labels(tmp_path)
    reasons = {a.row: a.reason for a in aside}
    assert rows_read == 6 == len(frame) + len(aside) and frame["patient_id"].tolist() == ["e"]
    assert reasons[1] == "conflicting 'Target' values ['0', '1'] in rows 1 and 2"
    assert reasons[3] == "unknown label value: '2' in column 'Target' (row 3)"
    assert reasons[4] == "'class' disagrees with Target 0 (stage_2_detailed_class_info.csv row 3)"
    assert reasons[5].startswith("unknown label value: 'Opaque' in column 'class'")
    assert reasons[6] == "missing value: empty 'patientId'"
    assert np.isnan(frame["raw__no_finding"][0])  # e has no detailed row
    assert any("1 image(s) have no row" in n for n in notes)


def test_a_label_file_without_target_stops_with_the_file_named(tmp_path):
    write_csv(tmp_path / "stage_2_train_labels.csv", [{"patientId": "a", "Label": 1}])
    with pytest.raises(IngestError, match=r"stage_2_train_labels.csv: missing required column\(s\) 'Target'"):
        read_rsna_labels(tmp_path)
    with pytest.raises(IngestError, match="no RSNA label file"):
        read_rsna_labels(tmp_path / "nowhere")


def test_plan_mode_opens_no_image(tmp_path, monkeypatch):
    import fedcxr.site_adapters.dicom_folder as dicom_folder

    monkeypatch.setattr(dicom_folder, "read_headers", lambda *a, **k: pytest.fail("an image was opened"))
    table = read_rsna(write_rsna(tmp_path), AdapterOptions(plan=True))
    assert len(table.frame) == 6 and not table.headers_checked and not table.set_aside
    assert pd.isna(table.frame.get("aux__sex", pd.Series([pd.NA]))).all()
