"""SOURCE ``csv``: the YAML mapping's schema, every label/demographic path, and both real sets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from fedcxr.site_adapters.base import AdapterOptions, IngestError
from fedcxr.site_adapters.csv_mapping import read_csv_mapping
from fedcxr.site_adapters.csv_mapping_schema import load_mapping
from fedcxr.site_adapters.ingest import run_ingest
from fedcxr.site_adapters.manifest import read_manifest, read_site_json
from fedcxr.vocab import AUX_VOCAB

REPO = Path(__file__).resolve().parents[2]
BASE = {"image": {"column": "image", "extension": ".png"}, "patient": "pid"}


def _read(export: Path, mapping: Path):
    return read_csv_mapping(export, AdapterOptions(mapping=mapping))


def _by_row(table) -> dict[int, dict]:
    return {int(r["source_row"]): r for _, r in table.frame.iterrows()}


def _aside(table) -> dict[int, str]:
    return {s.row: s.reason for s in table.set_aside}


def _codes(table, task: str) -> list:
    return [None if pd.isna(v) else AUX_VOCAB[task][int(v)] for v in table.frame[f"aux__{task}"]]


# --------------------------------------------------------------------------- labels


def test_per_class_columns_with_value_maps_and_defaults(csv_export):
    rows = [
        {"image": "a", "pid": "p1", "cov": "yes", "eff": "1.0", "pna": "x"},
        {"image": "b", "pid": "p1", "cov": "no", "eff": "-1", "pna": "1"},
        {"image": "c", "pid": "p2", "cov": "", "eff": "", "pna": "0"},
        {"image": "d", "pid": "p3", "cov": "maybe", "eff": "0.0", "pna": "1"},
        {"image": "e", "pid": "p4", "cov": "yes", "eff": "2", "pna": "1"},
    ]
    mapping = {**BASE, "classes": ["covid19", "Effusion", "pneumonia", "edema"], "labels": {
        "covid19": {"column": "cov", "values": {"yes": 1, "no": 0, "": None}},
        "pleural_effusion": "eff",                              # shorthand: default numeric map
        "pneumonia": {"column": "pna", "default": None},        # unmapped → not labeled
        "edema": {"column": "pna", "values": {"1": 1}, "default": 0},  # unmapped → negative
    }}
    table = _read(*csv_export(rows, mapping))
    assert table.classes == ["edema", "pleural_effusion", "pneumonia", "covid19"]
    assert table.rows_read == 5 and len(table.frame) + len(table.set_aside) == 5
    aside = _aside(table)
    assert set(aside) == {4, 5}
    assert aside[4] == "unmapped label value: column 'cov' value 'maybe'"
    assert aside[5] == "unmapped label value: column 'eff' value '2'"
    got = _by_row(table)
    assert got[1]["raw__covid19"] == 1 and got[2]["raw__covid19"] == 0 and np.isnan(got[3]["raw__covid19"])
    assert got[1]["raw__pleural_effusion"] == 1 and got[2]["raw__pleural_effusion"] == -1
    assert np.isnan(got[3]["raw__pleural_effusion"])
    assert np.isnan(got[1]["raw__pneumonia"]) and got[2]["raw__pneumonia"] == 1
    assert got[1]["raw__edema"] == 0 and got[2]["raw__edema"] == 1
    assert got[1]["image_path"] == "a.png"
    assert [s.image_path for s in table.set_aside] == ["d.png", "e.png"]


def test_finding_column_with_unlabeled_values_and_unmapped_default(csv_export):
    rows = [
        {"image": "a", "pid": "p1", "finding": "COVID-19"},
        {"image": "b", "pid": "p2", "finding": "COVID-19, ARDS"},
        {"image": "c", "pid": "p3", "finding": "No Finding"},
        {"image": "d", "pid": "p4", "finding": "Pneumocystis"},
        {"image": "e", "pid": "p5", "finding": "todo"},
        {"image": "f", "pid": "p6", "finding": "Lipoid"},
    ]
    mapping = {**BASE, "classes": ["covid19", "pneumonia", "no_finding"], "finding": {
        "column": "finding",
        "values": {
            "COVID-19": {"covid19": 1, "pneumonia": 1},
            "COVID-19, ARDS": {"covid19": 1},
            "No Finding": {"no_finding": 1},
            "Pneumocystis": {"covid19": 0, "pneumonia": 1},
        },
        "unlabeled": ["todo"],
        "unmentioned": 0,
    }}
    table = _read(*csv_export(rows, mapping))
    assert _aside(table) == {6: "unmapped finding value: column 'finding' value 'Lipoid'"}
    got = _by_row(table)
    assert (got[1]["raw__covid19"], got[1]["raw__pneumonia"], got[1]["raw__no_finding"]) == (1, 1, 0)
    assert (got[2]["raw__covid19"], got[2]["raw__pneumonia"]) == (1, 0)   # unmentioned: 0
    assert (got[3]["raw__covid19"], got[3]["raw__no_finding"]) == (0, 1)
    assert (got[4]["raw__covid19"], got[4]["raw__pneumonia"]) == (0, 1)
    assert all(np.isnan(got[5][f"raw__{c}"]) for c in ("covid19", "pneumonia", "no_finding"))


def test_finding_default_map_and_unmentioned_null(csv_export):
    rows = [{"image": "a", "pid": "p1", "f": "COVID-19"}, {"image": "b", "pid": "p2", "f": "E.Coli"}]
    mapping = {**BASE, "classes": ["covid19", "pneumonia"], "finding": {
        "column": "f", "values": {"COVID-19": {"covid19": 1}}, "default": {"covid19": 0}}}
    got = _by_row(_read(*csv_export(rows, mapping)))
    assert got[1]["raw__covid19"] == 1 and np.isnan(got[1]["raw__pneumonia"])
    assert got[2]["raw__covid19"] == 0 and np.isnan(got[2]["raw__pneumonia"])


def test_constant_label_for_every_row(csv_export):
    rows = [{"image": "a", "pid": "p1", "x": "1"}, {"image": "b", "pid": "p2", "x": "0"}]
    mapping = {**BASE, "classes": ["covid19", "pneumonia"], "constant": {"covid19": 1},
               "labels": {"pneumonia": "x"}}
    table = _read(*csv_export(rows, mapping))
    assert table.frame["raw__covid19"].tolist() == [1.0, 1.0]
    assert table.frame["raw__pneumonia"].tolist() == [1.0, 0.0]


# --------------------------------------------------------------------------- demographics


def test_demographics_through_maps_and_vocab_parsers(csv_export):
    rows = [
        {"image": "a", "pid": "1", "sex": "m", "age": "54.0", "view": "ap", "race": "White", "eth": ""},
        {"image": "b", "pid": "2", "sex": "F", "age": "054Y", "view": "AP Supine", "race": "Asian", "eth": ""},
        {"image": "c", "pid": "3", "sex": "w", "age": "013M", "view": "PA", "race": "Other",
         "eth": "Hispanic or Latino"},
        {"image": "d", "pid": "4", "sex": "", "age": "", "view": "L", "race": "weird", "eth": ""},
        {"image": "e", "pid": "5", "sex": "X", "age": "411Y", "view": "Oblique", "race": "Unknown", "eth": ""},
    ]
    mapping = {**BASE, "classes": ["covid19"], "constant": {"covid19": 1}, "demographics": {
        "sex": {"column": "sex", "values": {"X": None}},
        "age": "age",
        "view": {"column": "view"},
        "race": {"column": "race", "ethnicity_column": "eth", "values": {"weird": "other"}},
    }}
    table = _read(*csv_export(rows, mapping))
    assert not table.set_aside
    assert _codes(table, "sex") == ["M", "F", "F", None, None]
    assert _codes(table, "view") == ["AP", "AP", "PA", "LATERAL", None]
    assert _codes(table, "race") == ["white", "asian", "hispanic", "other", None]
    ages = table.frame["age"].tolist()
    assert ages[:2] == [54.0, 54.0] and ages[2] == pytest.approx(13 / 12) and np.isnan(ages[3])
    assert np.isnan(ages[4])                       # 411Y is not an age: unknown, row kept
    assert _codes(table, "age_bin") == ["40-59", "40-59", "0-19", None, None]
    notes = " | ".join(table.notes)
    assert "age in column 'age'" in notes and "'411Y'" in notes
    assert "view in column 'view'" in notes and "'Oblique'" in notes


def test_demographic_on_unknown_set_aside(csv_export):
    rows = [{"image": "a", "pid": "1", "sex": "m"}, {"image": "b", "pid": "2", "sex": "X"}]
    mapping = {**BASE, "classes": ["covid19"], "constant": {"covid19": 1},
               "demographics": {"sex": {"column": "sex", "on_unknown": "set_aside"}}}
    table = _read(*csv_export(rows, mapping))
    assert _aside(table) == {2: "unrecognised sex value: column 'sex' value 'X'"}


# --------------------------------------------------------------------------- rows


def test_ids_paths_filters_groups_and_split(csv_export):
    rows = [
        {"image": "a", "pid": "p1", "study": "s1", "mod": "X-ray", "grp": "North", "sp": "train"},
        {"image": "b", "pid": "p1", "study": "", "mod": "X-ray", "grp": "", "sp": "validate"},
        {"image": "", "pid": "p2", "study": "s3", "mod": "X-ray", "grp": "South", "sp": "test"},
        {"image": "c", "pid": "", "study": "s4", "mod": "X-ray", "grp": "South", "sp": "test"},
        {"image": "../../etc/x", "pid": "p5", "study": "s5", "mod": "X-ray", "grp": "South", "sp": "test"},
        {"image": "d", "pid": "p6", "study": "s6", "mod": "CT", "grp": "South", "sp": "test"},
        {"image": "e", "pid": "p7", "study": "s7", "mod": "X-ray", "grp": "South", "sp": "holdout"},
    ]
    mapping = {"image": {"column": "image", "prefix": "imgs", "extension": ".png"}, "patient": "pid",
               "study": "study", "classes": ["covid19"], "constant": {"covid19": 1},
               "groups": {"region": "grp"}, "split": "sp",
               "keep_rows": [{"column": "mod", "in": ["X-ray"]}]}
    table = _read(*csv_export(rows, mapping))
    assert _aside(table) == {
        3: "no image path in column 'image'",
        4: "no patient id in column 'pid'",
        5: "image path outside the export folder",
        6: "excluded by keep_rows: column 'mod' value 'CT' not in ['X-ray']",
        7: "unmapped split value: column 'sp' value 'holdout'",
    }
    got = _by_row(table)
    assert got[1]["image_path"] == "imgs/a.png" and got[1]["study_id"] == "s1"
    assert got[2]["study_id"] not in {"s1", ""}                 # blank study: the image is its own study
    assert got[1]["official_split"] == "train" and got[2]["official_split"] == "val"
    assert got[1]["group__region"] == "North" and got[2]["group__region"] is None
    assert (got[1]["source_file"], got[1]["source_row"]) == ("data.csv", 1)


def test_not_in_filter_and_group_list_and_delimiter(tmp_path):
    export = tmp_path / "e"
    export.mkdir()
    (export / "t.tsv").write_text("img;pid;view;site\na.png;1;PA;x\nb.png;2;L;y\n")
    mapping = tmp_path / "m.yaml"
    mapping.write_text(yaml.safe_dump({
        "csv": "t.tsv", "delimiter": ";", "image": "img", "patient": "pid", "classes": ["covid19"],
        "constant": {"covid19": 1}, "groups": ["site"], "keep_rows": [{"column": "view", "not_in": ["L"]}],
    }))
    table = _read(export, mapping)
    assert table.frame["group__site"].tolist() == ["x"]
    assert _aside(table) == {2: "excluded by keep_rows: column 'view' value 'L' excluded value"}


# --------------------------------------------------------------------------- errors


GOOD = {"csv": "data.csv", "image": "image", "patient": "pid", "classes": ["covid19"],
        "labels": {"covid19": "cov"}}


@pytest.mark.parametrize("change, expected", [
    ({"patient": None}, "patient: missing required key"),
    ({"colour": "red"}, "colour: unknown key"),
    ({"image": {"column": "image", "suffix": ".png"}}, "image.suffix: unknown key"),
    ({"labels": {"covid19": {"column": "cov", "values": {"1": 2}}}}, "labels.covid19.values.1: label value"),
    ({"labels": {"covid19": {"column": "cov", "default": "maybe"}}}, "labels.covid19.default: expected"),
    ({"classes": ["covid19", "banana"]}, "classes.1: unknown class 'banana'"),
    ({"classes": ["covid19", "edema"]}, "['edema'] have no label source"),
    ({"constant": {"covid19": 1}}, "class 'covid19' has two label sources"),
    ({"labels": {"edema": "e"}}, "labels.edema: class 'edema' is not listed in 'classes'"),
    ({"finding": {"column": "f", "values": {}}}, "either 'labels'"),
    ({"demographics": {"sex": {"column": "s", "values": {"w": "female"}}}}, "'female' is not one of"),
    ({"csv": "../other.csv"}, "csv must be a path inside --input"),
    ({"keep_rows": [{"column": "m"}]}, "keep_rows.0: give exactly one of 'in' or 'not_in'"),
    ({"delimiter": ";;"}, "delimiter must be one character"),
    # typos get the nearest key of their own section, and the nearest class
    ({"pateint": "pid"}, "pateint: unknown key (did you mean `patient`?)"),
    ({"image": {"column": "image", "prefx": "images"}}, "image.prefx: unknown key (did you mean `prefix`?)"),
    ({"classes": ["covid19", "pneumonai"]}, "classes.1: unknown class 'pneumonai' (did you mean `pneumonia`?)"),
])
def test_mapping_errors_name_the_key(tmp_path, change, expected):
    raw = {**GOOD, **change}
    raw = {k: v for k, v in raw.items() if v is not None}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(IngestError) as info:
        load_mapping(path)
    assert expected in str(info.value)
    assert str(path) in str(info.value)


def test_unreadable_mapping_files(tmp_path):
    with pytest.raises(IngestError, match="no such file"):
        load_mapping(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [\n")
    with pytest.raises(IngestError, match="not valid YAML"):
        load_mapping(bad)
    bad.write_text("- a\n- b\n")
    with pytest.raises(IngestError, match="expected a mapping"):
        load_mapping(bad)
    with pytest.raises(IngestError, match="--mapping"):
        read_csv_mapping(tmp_path, AdapterOptions())


def test_missing_csv_column_and_file_are_named(csv_export):
    rows = [{"image": "a", "pid": "p1"}]
    export, mapping = csv_export(rows, {**BASE, "classes": ["covid19"], "labels": {"covid19": "cov"}})
    with pytest.raises(IngestError, match="missing required column.*'cov'"):
        _read(export, mapping)
    (export / "data.csv").unlink()
    with pytest.raises(IngestError, match="data.csv: no such file"):
        _read(export, mapping)


# --------------------------------------------------------------------------- real data


COVID_SITES = {"Australia": 28, "Germany": 93, "Italy": 21, "Other": 83, "Spain": 44, "United-Kingdom": 34}


@pytest.fixture(scope="module")
def covid_ingest(shared_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("covid")
    report = run_ingest(
        "csv", shared_data / "covid-chestxray-dataset", out,
        mapping=REPO / "examples" / "covid_chestxray_by_site_group.yaml", site_by="site_group", progress=False,
    )
    return out, report


def test_covid_chestxray_by_site_group(covid_ingest):
    out, report = covid_ingest
    assert {s: v["rows"] for s, v in report["sites"].items()} == COVID_SITES
    assert (report["rows_read"], report["rows_kept"], report["rows_set_aside"]) == (307, 303, 4)
    assert report["set_aside_by_reason"] == {"duplicate row": 4}
    germany = read_manifest(out / "Germany")
    assert germany["age"].isna().all() and germany["aux__age_bin"].isna().all()
    assert (germany["label__covid19"] == 1).sum() == 85 and (germany["label__covid19"] == 0).sum() == 8
    australia = read_site_json(out / "Australia")["class_counts"]["covid19"]
    assert (australia["positive"], australia["negative"], australia["missing"]) == (4, 16, 8)


def test_covid_duplicate_images_land_in_one_split_only(covid_ingest):
    """Patients 339/340 repeat images of 285/287: only the first row of each image is kept."""
    out, report = covid_ingest
    frames = pd.concat([read_manifest(out / s) for s in COVID_SITES], ignore_index=True)
    assert frames["image_path"].is_unique
    assert not set(frames["patient_id"]) & {"339", "340"}
    dupes = [s for s in report["set_aside"] if s["reason"].startswith("duplicate row")]
    assert sorted(s["image_path"] for s in dupes) == [
        "images/000001-24.png", "images/000001-27.png", "images/000006-17.png", "images/000007-15.png"]
    assert frames.groupby("patient_id")["split"].nunique().max() == 1


def test_covid_finding_strings_agree_with_covid19_column(shared_data, tmp_path):
    """The finding mode on the real vocabulary reproduces the dataset's own covid19 column."""
    mapping = tmp_path / "finding.yaml"
    mapping.write_text(yaml.safe_dump({
        "csv": "selected.csv", "image": "image_path", "patient": "patientid", "classes": ["covid19"],
        "finding": {"column": "finding", "values": {"COVID-19": {"covid19": 1}, "COVID-19, ARDS": {"covid19": 1}},
                    "unlabeled": ["todo"], "default": {"covid19": 0}},
    }))
    table = read_csv_mapping(shared_data / "covid-chestxray-dataset", AdapterOptions(mapping=mapping))
    truth = pd.read_csv(shared_data / "covid-chestxray-dataset" / "selected.csv")["covid19"].to_numpy(dtype=float)
    np.testing.assert_array_equal(table.frame["raw__covid19"].to_numpy(), truth)


def test_hannover_one_class_site(shared_data, tmp_path):
    report = run_ingest(
        "csv", shared_data / "hannover-covid-19-image-repository", tmp_path,
        mapping=REPO / "examples" / "hannover.yaml", site_name="hannover", progress=False,
    )
    assert report["rows_kept"] == 243 and report["rows_set_aside"] == 0
    site = json.loads((tmp_path / "hannover" / "site.json").read_text())
    assert site["class_set"] == ["covid19"]
    assert site["class_counts"]["covid19"] == {"positive": 243, "negative": 0, "missing": 0, "uncertain": 0,
                                             "implied_negative": 0}
    assert site["aux"]["sex"]["counts"] == {"F": 63, "M": 180}
    assert site["aux"]["view"]["counts"] == {"PA": 49, "AP": 194}
    assert site["aux"]["age_bin"]["available"] == 0
    frame = read_manifest(tmp_path / "hannover")
    assert frame["age"].isna().all() and frame["patient_id"].nunique() == 71


# --------------------------------------------------------------------------- demographics from DICOM tags


RSNA_MAPPING = {  # RSNA Pneumonia's own layout: stage_2_train_labels.csv + stage_2_train_images/<patientId>.dcm
    "csv": "stage_2_train_labels.csv",
    "image": {"column": "patientId", "prefix": "stage_2_train_images", "extension": ".dcm"},
    "patient": "patientId",
    "classes": ["pneumonia"],
    "labels": {"pneumonia": "Target"},
    "demographics": {"from_dicom": True},
}


def _rsna_like(root: Path, rows: list[tuple], mapping: dict = RSNA_MAPPING) -> tuple[Path, Path]:
    """An RSNA-style export: the label csv (one row per box) and one DICOM per patient with its tags."""
    from tests.site_adapters.test_dicom_folder import write_dicom

    export = root / "export"
    labels = []
    for i, (pid, target, sex, age, view, body) in enumerate(rows):
        labels.append({"patientId": pid, "x": "" if target == "0" else "10", "y": "", "width": "", "height": "",
                       "Target": target})
        path = export / "stage_2_train_images" / f"{pid}.dcm"
        if not path.exists() and sex != "missing":
            write_dicom(path, seed=i, PatientID=pid, PatientSex=sex, PatientAge=age, ViewPosition=view,
                        BodyPartExamined=body)
    pd.DataFrame(labels).to_csv(export / "stage_2_train_labels.csv", index=False)
    path = root / "rsna.yaml"
    path.write_text(yaml.safe_dump(mapping, sort_keys=False))
    return export, path


RSNA_ROWS = [
    ("p1", "1", "F", "43", "AP", "CHEST"),
    ("p1", "1", "F", "43", "AP", "CHEST"),      # a second box of the same image
    ("p2", "0", "M", "062Y", "PA", "CHEST"),
    ("p3", "0", "O", "7", "PA", "HIP"),         # a hip film in the export
    ("p4", "1", "missing", "", "", ""),         # no image
]


@pytest.mark.filterwarnings("ignore:Invalid value for VR AS")
def test_demographics_from_the_dicom_tags_of_the_images_the_csv_names(tmp_path):
    export, mapping = _rsna_like(tmp_path, RSNA_ROWS)
    out = tmp_path / "out"
    report = run_ingest("csv", export, out, mapping=mapping, progress=False)
    reasons = {r["row"]: r["reason"] for r in report["set_aside"]}
    assert reasons == {2: "duplicate row: same image as row 1", 4: "not a chest radiograph: BodyPartExamined 'HIP'",
                       5: "missing file"}
    m = read_manifest(out / "csv").set_index("source_row")
    assert [AUX_VOCAB["sex"][int(v)] for v in m["aux__sex"]] == ["F", "M"]
    assert m["age"].tolist() == [43.0, 62.0]
    assert [AUX_VOCAB["view"][int(v)] for v in m["aux__view"]] == ["AP", "PA"]
    assert m["label__pneumonia"].tolist() == [1.0, 0.0]
    assert any("demographics from DICOM tags PatientSex, PatientAge, ViewPosition: read for 4 of 5" in n
               for n in report["notes"])


@pytest.mark.filterwarnings("ignore:Invalid value for VR AS")
def test_one_field_from_a_tag_the_others_from_columns_and_the_plan_reads_none(tmp_path):
    mapping = {**RSNA_MAPPING, "demographics": {"sex": {"dicom_tag": "PatientSex", "values": {"F": "M", "M": "F"}},
                                                "view": "Target"}}
    mapping["demographics"]["view"] = {"column": "x", "values": {"10": "AP", "": None}}
    export, path = _rsna_like(tmp_path, RSNA_ROWS[:3], mapping)
    table = read_csv_mapping(export, AdapterOptions(mapping=path))
    assert _codes(table, "sex") == ["M", "M", "F"] and _codes(table, "view") == ["AP", "AP", None]
    assert table.frame["age"].isna().all()
    plan = read_csv_mapping(export, AdapterOptions(mapping=path, plan=True))
    assert plan.frame["aux__sex"].isna().all() and "not_chest" not in plan.frame
    assert any("plan: demographics from DICOM tags (PatientSex) not read" in n for n in plan.notes)


@pytest.mark.parametrize("demographics, expected", [
    ({"sex": {"column": "s", "dicom_tag": "PatientSex"}}, "give exactly one of 'column'"),
    ({"age": {"dicom_tag": "PatientAges"}}, "'PatientAges' is not a DICOM keyword"),
    ({"from_dicom": "sometimes"}, "demographics.from_dicom"),
])
def test_dicom_tag_fields_are_validated(tmp_path, demographics, expected):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({**RSNA_MAPPING, "demographics": demographics}))
    with pytest.raises(IngestError, match=expected):
        load_mapping(path)


def _xrv_data() -> Path:
    import os

    root = os.environ.get("FEDCXR_XRV")
    data = Path(root) / "torchxrayvision" / "data" if root else None
    if data is None or not (data / "kaggle_stage_2_train_labels.csv.zip").is_file():
        pytest.skip("real RSNA Pneumonia metadata not given: set FEDCXR_XRV to a mlmed/torchxrayvision checkout "
                    "(its torchxrayvision/data holds the label csv and the DICOM header csv)")
    return data


@pytest.mark.filterwarnings("ignore:Invalid value for VR AS")
def test_real_rsna_labels_and_dicom_tags_ingest_with_no_hand_edit(tmp_path):
    """RSNA Pneumonia's real stage_2_train_labels.csv, untouched, and DICOMs carrying the real tags of
    the first 60 patients (from its DICOM header csv): labels, sex, age and view equal the header csv's
    values, read as TorchXRayVision's RSNA_Pneumonia_Dataset does (a patient's first label row, the
    header csv's tags); the other box rows of one image are set aside as duplicates."""
    from tests.site_adapters.test_dicom_folder import write_dicom

    data = _xrv_data()
    headers = pd.read_csv(data / "kaggle_stage_2_train_images_dicom_headers.csv.gz", dtype=str).head(60)
    labels = pd.read_csv(data / "kaggle_stage_2_train_labels.csv.zip", dtype=str, keep_default_na=False)
    labels = labels.loc[labels["patientId"].isin(set(headers["PatientID"]))]
    export = tmp_path / "export"
    for i, h in enumerate(headers.itertuples()):
        write_dicom(export / "stage_2_train_images" / f"{h.PatientID}.dcm", seed=i, PatientID=h.PatientID,
                    PatientSex=h.PatientSex, PatientAge=h.PatientAge, ViewPosition=h.ViewPosition,
                    BodyPartExamined=h.BodyPartExamined, Modality=h.Modality)
    labels.to_csv(export / "stage_2_train_labels.csv", index=False)
    mapping = tmp_path / "rsna.yaml"
    mapping.write_text(yaml.safe_dump(RSNA_MAPPING))
    report = run_ingest("csv", export, tmp_path / "out", mapping=mapping, progress=False)
    assert report["rows_read"] == len(labels) and report["rows_kept"] == 60
    assert report["set_aside_by_reason"] == ({"duplicate row": len(labels) - 60} if len(labels) > 60 else {})
    m = read_manifest(tmp_path / "out" / "csv").set_index("source_row")
    truth = headers.set_index("PatientID")
    pid = labels["patientId"].to_numpy()[m.index.to_numpy() - 1]
    assert [AUX_VOCAB["sex"][int(v)] for v in m["aux__sex"]] == truth.loc[pid, "PatientSex"].tolist()
    assert m["age"].tolist() == truth.loc[pid, "PatientAge"].astype(float).tolist()
    assert [AUX_VOCAB["view"][int(v)] for v in m["aux__view"]] == truth.loc[pid, "ViewPosition"].tolist()
    first = labels.groupby("patientId")["Target"].first().astype(float)
    assert m["label__pneumonia"].tolist() == first.loc[pid].tolist()
