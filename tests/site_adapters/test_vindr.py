"""``vindr`` source: several radiologists per image, the any/majority rules, both table layouts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedcxr.site_adapters.base import IngestError
from fedcxr.site_adapters.ingest import run_ingest
from fedcxr.site_adapters.manifest import read_manifest
from fedcxr.site_adapters.vindr import SOURCE_CLASSES, read_vindr_labels, vote

from .public_exports import vindr_reader, write_csv, write_vindr

pytestmark = pytest.mark.filterwarnings("ignore:Invalid value for VR AS")


def test_vote_any_and_majority_by_hand():
    positive, read = np.array([0, 1, 2, 3, 1, 0]), np.array([3, 3, 3, 3, 2, 0])
    np.testing.assert_array_equal(vote(positive, read, "any"), [0, 1, 1, 1, 1, np.nan])
    np.testing.assert_array_equal(vote(positive, read, "majority"), [0, 0, 1, 1, -1, np.nan])  # 1 of 2: a tie
    # no_finding (dual): under "any" only when every reader says "No finding"
    np.testing.assert_array_equal(vote(positive, read, "any", dual=True), [0, 0, 0, 1, 0, np.nan])
    np.testing.assert_array_equal(vote(positive, read, "majority", dual=True), [0, 0, 1, 1, -1, np.nan])


def _three_readers(tmp_path):
    train = [
        vindr_reader("img-a", "R1", "Cardiomegaly"), vindr_reader("img-a", "R2", "Cardiomegaly", "Rib fracture"),
        vindr_reader("img-a", "R3"),                                                   # "No finding"
        vindr_reader("img-b", "R4"), vindr_reader("img-b", "R5"), vindr_reader("img-b", "R6"),
        vindr_reader("img-c", "R1", "Nodule/Mass", "Clavicle fracture"), vindr_reader("img-c", "R2", "Nodule/Mass"),
    ]
    test = [vindr_reader("img-t", None, "COPD", "Pleural effusion", test=True)]       # consensus, "Other disease"
    return write_vindr(tmp_path, train, test)


def test_any_rule_is_torchxrayvisions_reading(tmp_path):
    frame, aside, notes, rows_read, classes = read_vindr_labels(_three_readers(tmp_path), "any")
    assert rows_read == 4 and not aside and classes == list(SOURCE_CLASSES) and len(classes) == 27  # 28 labels, two fractures
    f = frame.set_index("patient_id")
    assert f.loc["img-a", "raw__cardiomegaly"] == 1 and f.loc["img-a", "raw__fracture"] == 1  # one reader enough
    assert f.loc["img-a", "raw__no_finding"] == 0          # R3 said "No finding", two readers did not
    assert f.loc["img-b", "raw__no_finding"] == 1 and f.loc["img-b", "raw__cardiomegaly"] == 0
    assert f.loc["img-c", "raw__nodule_mass"] == 1 and f.loc["img-c", "raw__fracture"] == 1
    assert f.loc["img-t", "raw__copd"] == 1 and f.loc["img-t", "raw__pleural_effusion"] == 1
    assert f.loc["img-t", "raw__other_disease"] == 0       # the test file's singular column name
    assert f["official_split"].to_dict() == {"img-a": "train_val", "img-b": "train_val", "img-c": "train_val",
                                             "img-t": "test"}
    assert f.loc["img-a", "source_row"] == 1 and f.loc["img-c", "source_row"] == 7
    assert f.loc["img-t", "image_path"] == "test/img-t.dicom"


def test_majority_rule_needs_most_readers_and_marks_ties_uncertain(tmp_path):
    frame, *_ = read_vindr_labels(_three_readers(tmp_path), "majority")
    f = frame.set_index("patient_id")
    assert f.loc["img-a", "raw__cardiomegaly"] == 1 and f.loc["img-a", "raw__fracture"] == 0  # 2 of 3; 1 of 3
    assert f.loc["img-c", "raw__nodule_mass"] == 1 and f.loc["img-c", "raw__fracture"] == -1   # 1 of 2: a tie
    assert f.loc["img-b", "raw__no_finding"] == 1 and f.loc["img-t", "raw__copd"] == 1


def test_bad_cells_duplicates_and_unknown_columns(tmp_path):
    rows = [vindr_reader("x", "R1"), vindr_reader("x", "R1"),                 # one radiologist twice
            vindr_reader("y", "R1") | {"ILD": "maybe"}, vindr_reader("z", "R2"), vindr_reader("", "R2")]
    write_csv(tmp_path / "annotations" / "image_labels_train.csv", rows)
    frame, aside, notes, rows_read, _ = read_vindr_labels(tmp_path)
    reasons = {a.row: a.reason for a in aside}
    assert rows_read == 4 and frame["patient_id"].tolist() == ["z"]
    assert reasons == {1: "the same radiologist twice for one image (annotations/image_labels_train.csv rows 1 and 2)",
                       3: "unknown label value: 'maybe' in column 'ILD' (annotations/image_labels_train.csv row 3)",
                       5: "missing value: empty 'image_id'"}
    assert frame["official_split"].isna().all() and any("no official split" in n for n in notes)
    write_csv(tmp_path / "annotations" / "image_labels_train.csv", [vindr_reader("x", "R1") | {"Lung nodule": 1}])
    with pytest.raises(IngestError, match="'Lung nodule' are not VinDr-CXR labels"):
        read_vindr_labels(tmp_path)
    with pytest.raises(IngestError, match="--readers must be one of any, majority"):
        read_vindr_labels(tmp_path, "all")


def test_kaggle_box_table_counts_each_reader_once_per_class(tmp_path):
    box = {"x_min": 1.0, "y_min": 2.0, "x_max": 3.0, "y_max": 4.0}
    none = {"x_min": "", "y_min": "", "x_max": "", "y_max": ""}
    rows = [
        {"image_id": "a", "class_name": "Aortic enlargement", "class_id": 0, "rad_id": "R8", **box},
        {"image_id": "a", "class_name": "Aortic enlargement", "class_id": 0, "rad_id": "R8", **box},  # 2nd box
        {"image_id": "a", "class_name": "Pleural effusion", "class_id": 10, "rad_id": "R9", **box},
        {"image_id": "a", "class_name": "No finding", "class_id": 14, "rad_id": "R10", **none},
        {"image_id": "b", "class_name": "No finding", "class_id": 14, "rad_id": "R1", **none},
        {"image_id": "b", "class_name": "No finding", "class_id": 14, "rad_id": "R2", **none},
        {"image_id": "b", "class_name": "No finding", "class_id": 14, "rad_id": "R3", **none},
        {"image_id": "c", "class_name": "Lung nodule", "class_id": 99, "rad_id": "R3", **box},
    ]
    write_csv(tmp_path / "train.csv", rows)
    any_rule, aside, _, rows_read, classes = read_vindr_labels(tmp_path, "any")
    assert rows_read == 3 and [a.row for a in aside] == [8] and "'Lung nodule'" in aside[0].reason
    assert len(classes) == 15 and "copd" not in classes  # a box table holds the 14 local findings + No finding
    a = any_rule.set_index("patient_id")
    assert a.loc["a", "raw__aortic_enlargement"] == 1 and a.loc["a", "raw__pleural_effusion"] == 1
    assert a.loc["a", "raw__no_finding"] == 0 and a.loc["b", "raw__no_finding"] == 1
    assert a.loc["b", "raw__aortic_enlargement"] == 0
    majority = read_vindr_labels(tmp_path, "majority")[0].set_index("patient_id")
    assert majority.loc["a", "raw__aortic_enlargement"] == 0   # R8's two boxes are one vote of three
    assert majority.loc["a", "raw__no_finding"] == 0


def test_ingest_with_dicoms_keeps_sex_and_age_and_documents_pa(tmp_path):
    export = write_vindr(tmp_path / "export", [
        vindr_reader("v1", "R1", "ILD"), vindr_reader("v1", "R2"), vindr_reader("v1", "R3", "ILD"),
        vindr_reader("v2", "R1"), vindr_reader("v2", "R2"), vindr_reader("v2", "R3"),
        vindr_reader("v3", "R1", "Calcification"), vindr_reader("v3", "R2"), vindr_reader("v3", "R3"),
    ], images={"v1": {"PatientSex": "F", "PatientAge": "061Y"}, "v2": {"PatientSex": "M", "PatientAge": "033Y"},
               "v3": {"PatientSex": "O", "PatientAge": ""}})
    out = tmp_path / "out"
    report = run_ingest("vindr", export, out, readers="majority", progress=False)
    assert report["rows_read"] == 3 == report["rows_kept"] and report["options"]["readers"] == "majority"
    site = json.loads((out / "vindr" / "site.json").read_text())
    assert site["class_counts"]["ild"]["positive"] == 1 and site["class_counts"]["calcification"]["positive"] == 0
    assert len(site["class_set"]) == 27   # every class read, negatives included (no reader named COPD)
    assert site["class_counts"]["copd"] == {"positive": 0, "negative": 3, "missing": 0, "uncertain": 0,
                                                "implied_negative": 0}
    assert site["aux"]["sex"]["counts"] == {"F": 1, "M": 1} and site["aux"]["view"]["counts"] == {"PA": 3}
    frame = read_manifest(out / "vindr")
    assert frame["patient_id"].nunique() == 3 and sorted(frame["age"].dropna()) == [33.0, 61.0]
