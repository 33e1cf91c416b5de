"""MIMIC-CXR-JPG adapter: native gz csvs, study-label join, splits, MIMIC-IV age and race, sites."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from fedcxr.cli import main as cli_main
from fedcxr.site_adapters.base import AdapterOptions, IngestError
from fedcxr.site_adapters.chexpert import LABEL_COLUMNS
from fedcxr.site_adapters.ingest import run_ingest
from fedcxr.site_adapters.sitekey import load_site_key
from fedcxr.site_adapters.manifest import read_manifest
from fedcxr.site_adapters.mimic import read_mimic, subject_race
from fedcxr.vocab import AUX_VOCAB

RELEASE = Path("mimic-cxr-jpg") / "2.0.0"
HOSP = Path("mimiciv") / "2.2" / "hosp"
LABELS_ALPHABETICAL = sorted(LABEL_COLUMNS)

#: (dicom_id, subject, study, ViewPosition, StudyDate, split)
IMAGES = [
    ("d1a", 10000001, 50000001, "PA", 21520305, "train"),
    ("d1b", 10000001, 50000001, "LATERAL", 21520305, "train"),
    ("d1c", 10000001, 50000002, "AP AXIAL", 21530101, "train"),
    ("d2a", 10000002, 50000003, "AP", 21531111, "validate"),
    ("d3a", 10000003, 50000004, "", 21750101, "test"),
    ("d4a", 10000004, 50000005, "PA", 21600101, "train"),
    ("d5a", 11000005, 50000006, "LL", 21600101, "train"),
    ("d6a", 12000006, 50000007, "PA", 21600101, "train"),
]
PATIENTS = [  # subject_id, gender, anchor_age, anchor_year, anchor_year_group, dod
    (10000001, "F", 50, 2150, "2014 - 2016", ""),
    (10000002, "M", 88, 2150, "2017 - 2019", ""),
    (10000003, "M", 2, 2180, "2011 - 2013", ""),
    (11000005, "F", 40, 2160, "2011 - 2013", ""),
    (12000006, "M", 70, 2160, "2011 - 2013", ""),
]
ADMISSIONS = [  # subject_id, hadm_id, admittime, race
    (10000001, 1, "2150-01-01 10:00:00", "WHITE"),
    (10000001, 2, "2151-01-01 10:00:00", "WHITE - OTHER EUROPEAN"),
    (10000001, 3, "2152-01-01 10:00:00", "BLACK/AFRICAN AMERICAN"),
    (10000002, 4, "2150-01-01 10:00:00", "ASIAN"),
    (10000002, 5, "2151-06-01 10:00:00", "HISPANIC/LATINO - PUERTO RICAN"),
    (10000002, 6, "2152-01-01 10:00:00", "UNKNOWN"),
    (10000002, 7, "2153-01-01 10:00:00", "UNKNOWN"),
    (10000003, 8, "2180-01-01 10:00:00", "UNABLE TO OBTAIN"),
    (10000004, 9, "2160-01-01 10:00:00", "BLACK/CAPE VERDEAN"),
    (11000005, 10, "2160-01-01 10:00:00", "ASIAN - CHINESE"),
    (11000005, 11, "2160-02-01 10:00:00", "MARTIAN"),
]


def labels_for(subject, study, **values) -> dict:
    out = {"subject_id": subject, "study_id": study}
    out.update({c: np.nan for c in LABELS_ALPHABETICAL})
    out.update({k.replace("_", " "): v for k, v in values.items()})
    return out


STUDY_LABELS = [
    labels_for(10000001, 50000001, Edema=1.0, Cardiomegaly=-1.0, Pneumonia=0.0),
    labels_for(10000001, 50000002, No_Finding=1.0),
    labels_for(10000002, 50000003, Atelectasis=1.0, Edema=0.0),
    labels_for(10000003, 50000004, Edema=-1.0),
    labels_for(10000004, 50000005, Pneumothorax=1.0, Edema=0.0),
    labels_for(11000005, 50000006, Edema=1.0),
    labels_for(12000006, 50000007, Edema=0.0),
]


def write_export(root: Path, *, images=IMAGES, labels=STUDY_LABELS, release=RELEASE, hosp=HOSP, negbio=None,
                 admissions=ADMISSIONS, race_column="race", write_images=True, suffix=".csv.gz") -> Path:
    """A MIMIC-CXR-JPG 2.0.0 release (gzipped csvs, files/ tree) plus MIMIC-IV hosp tables."""
    rel = root / release
    rel.mkdir(parents=True, exist_ok=True)
    meta = pd.DataFrame(
        [(d, s, st, "CHEST (PA AND LAT)", v, 3056, 2544, date, 123456.789, "Chest 2V", "", "Erect")
         for d, s, st, v, date, _ in images],
        columns=["dicom_id", "subject_id", "study_id", "PerformedProcedureStepDescription", "ViewPosition",
                 "Rows", "Columns", "StudyDate", "StudyTime", "ProcedureCodeSequence_CodeMeaning",
                 "ViewCodeSequence_CodeMeaning", "PatientOrientationCodeSequence_CodeMeaning"])
    meta.to_csv(rel / f"mimic-cxr-2.0.0-metadata{suffix}", index=False)
    if labels is not None:
        pd.DataFrame(labels, columns=["subject_id", "study_id"] + LABELS_ALPHABETICAL).to_csv(
            rel / f"mimic-cxr-2.0.0-chexpert{suffix}", index=False)
    if negbio is not None:
        pd.DataFrame(negbio, columns=["subject_id", "study_id"] + LABELS_ALPHABETICAL).to_csv(
            rel / f"mimic-cxr-2.0.0-negbio{suffix}", index=False)
    pd.DataFrame([(d, st, s, sp) for d, s, st, _, _, sp in images],
                 columns=["dicom_id", "study_id", "subject_id", "split"]).to_csv(
        rel / f"mimic-cxr-2.0.0-split{suffix}", index=False)
    if write_images:
        for d, s, st, *_ in images:
            path = rel / "files" / f"p{str(s)[:2]}" / f"p{s}" / f"s{st}" / f"{d}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("L", (16, 16), 80).save(path, format="JPEG")
    if hosp is not None:
        (root / hosp).mkdir(parents=True, exist_ok=True)
        pd.DataFrame(PATIENTS, columns=["subject_id", "gender", "anchor_age", "anchor_year",
                                        "anchor_year_group", "dod"]).to_csv(root / hosp / f"patients{suffix}",
                                                                             index=False)
        adm = pd.DataFrame(admissions, columns=["subject_id", "hadm_id", "admittime", race_column])
        adm.insert(3, "dischtime", adm["admittime"])
        adm.to_csv(root / hosp / f"admissions{suffix}", index=False)
    return root


def indexed(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(dicom=frame["image_path"].str.rsplit("/", n=1).str[-1].str[:-4]).set_index("dicom")


def test_reads_release_and_joins_study_labels_to_every_image(tmp_path):
    table = read_mimic(write_export(tmp_path / "in"), AdapterOptions())
    assert table.root == tmp_path / "in" / RELEASE and table.rows_read == 8 and not table.set_aside
    f = indexed(table.frame)
    assert f.loc["d1a", "image_path"] == "files/p10/p10000001/s50000001/d1a.jpg"
    assert f.loc["d5a", "image_path"] == "files/p11/p11000005/s50000006/d5a.jpg"
    assert f.loc["d1a", "patient_id"] == "10000001" and f.loc["d1a", "study_id"] == "50000001"
    # Both images of study 50000001 (frontal and lateral) inherit its labels, raw -1 kept.
    for dicom in ("d1a", "d1b"):
        assert f.loc[dicom, ["raw__edema", "raw__cardiomegaly", "raw__pneumonia"]].tolist() == [1.0, -1.0, 0.0]
        assert pd.isna(f.loc[dicom, "raw__fracture"])
    assert f.loc["d1c", "raw__no_finding"] == 1.0
    assert f["official_split"].tolist() == ["train"] * 3 + ["val", "test"] + ["train"] * 3
    views = {d: (None if pd.isna(v) else AUX_VOCAB["view"][int(v)]) for d, v in f["aux__view"].items()}
    assert views == {"d1a": "PA", "d1b": "LATERAL", "d1c": "AP", "d2a": "AP", "d3a": None, "d4a": "PA",
                     "d5a": "LATERAL", "d6a": "PA"}
    assert f["source_file"].iloc[0] == f"{RELEASE.as_posix()}/mimic-cxr-2.0.0-metadata.csv.gz"


def test_age_at_study_from_anchor_year_with_over_89_grouped_and_sex(tmp_path):
    table = read_mimic(write_export(tmp_path / "in"), AdapterOptions())
    f = indexed(table.frame)
    assert f.loc["d1a", "age"] == 52 and f.loc["d1c", "age"] == 53  # 50 + (2152 - 2150), + (2153 - 2150)
    assert f.loc["d2a", "age"] == 91  # 88 + 3 = 91 > 89 → grouped at 91
    assert pd.isna(f.loc["d3a", "age"])  # 2 + (2175 - 2180) < 0 → unknown, kept
    assert pd.isna(f.loc["d4a", "age"]) and pd.isna(f.loc["d4a", "aux__sex"])  # not in patients.csv
    assert f.loc["d1a", "aux__sex"] == 0 and f.loc["d2a", "aux__sex"] == 1
    assert f.loc["d1a", "aux__age_bin"] == 2 and f.loc["d2a", "aux__age_bin"] == 4
    notes = " | ".join(table.notes)
    assert "1 row(s) with unmappable age at study" in notes and "1 image(s) of subjects not in it" in notes


def test_race_is_most_frequent_known_family_ties_to_most_recent_admission(tmp_path):
    root = write_export(tmp_path / "in", write_images=False)
    per_subject, notes = subject_race(root / HOSP / "admissions.csv.gz", root)
    race = {s: AUX_VOCAB["race"][int(c)] for s, c in per_subject.items()}
    # 10000001: WHITE + WHITE - OTHER EUROPEAN (2) beat BLACK (1), although BLACK is the latest.
    # 10000002: ASIAN vs HISPANIC/LATINO 1-1 (UNKNOWN twice does not count) → latest: hispanic.
    # 10000003: only UNABLE TO OBTAIN → no race. 11000005: MARTIAN unmappable → ASIAN.
    assert race == {10000001: "white", 10000002: "hispanic", 10000004: "black", 11000005: "asian"}
    assert any("unmappable race" in n and "'MARTIAN'" in n for n in notes if n)

    table = read_mimic(root, AdapterOptions())
    f = indexed(table.frame)
    assert f.loc["d1a", "group__race"] == "white" and f.loc["d1a", "aux__race"] == 0
    assert f.loc["d6a", "group__race"] is None and pd.isna(f.loc["d6a", "aux__race"])  # no admission


def test_mimic_iv_v1_ethnicity_column_and_flat_uncompressed_layout(tmp_path):
    root = write_export(tmp_path / "in", release=Path("."), hosp=Path("hosp"), race_column="ethnicity",
                        suffix=".csv")
    table = read_mimic(root, AdapterOptions())
    assert table.root == root
    f = indexed(table.frame)
    assert f.loc["d1a", "image_path"] == "files/p10/p10000001/s50000001/d1a.jpg"
    assert f.loc["d2a", "group__race"] == "hispanic"
    assert any("column 'ethnicity'" in n for n in table.notes)


def test_site_by_race_gives_one_site_per_race_family(tmp_path):
    out = tmp_path / "out"
    report = run_ingest("mimic", write_export(tmp_path / "in"), out, site_by="race", progress=False)
    assert set(report["sites"]) == {"white", "black", "asian", "hispanic"}
    assert report["sites"]["white"]["rows"] == 3
    aside = {r["image_path"].rsplit("/", 1)[-1]: r["reason"] for r in report["set_aside"]}
    assert set(aside) == {"d3a.jpg", "d6a.jpg"}
    assert all(reason == "no value for site column 'race'" for reason in aside.values())
    white = read_manifest(out / "white")
    pid = load_site_key(None, out).pseudonym
    assert set(white["patient_id"]) == {pid("patient", "10000001")} and (white["aux__race"] == 0).all()
    assert report["rows_kept"] + report["rows_set_aside"] == report["rows_read"] == 8


def test_negbio_used_when_chexpert_absent_or_requested(tmp_path):
    negbio = [labels_for(s["subject_id"], s["study_id"], Edema=0.0) for s in STUDY_LABELS]
    root = write_export(tmp_path / "a", labels=None, negbio=negbio, write_images=False)
    assert (read_mimic(root, AdapterOptions()).frame["raw__edema"] == 0).all()
    root = write_export(tmp_path / "b", negbio=negbio, write_images=False)
    assert (read_mimic(root, AdapterOptions()).frame["raw__edema"] != 0).any()
    assert (read_mimic(root, AdapterOptions(extra={"labeler": "negbio"})).frame["raw__edema"] == 0).all()
    with pytest.raises(IngestError, match="labeler"):
        read_mimic(root, AdapterOptions(extra={"labeler": "gpt"}))


def test_bad_label_values_conflicting_rows_and_unlabeled_studies(tmp_path):
    labels = [dict(r) for r in STUDY_LABELS[1:]]  # study 50000001 (two images) has no label row
    labels[1]["Edema"] = "2.0"                     # study 50000003: unknown value
    labels.append(labels_for(10000004, 50000005, Pneumothorax=0.0))  # disagrees with its first row
    table = read_mimic(write_export(tmp_path / "in", labels=labels, write_images=False), AdapterOptions())
    assert table.rows_read == 8 and len(table.frame) + len(table.set_aside) == 8
    reasons = {s.image_path.rsplit("/", 1)[-1]: s.reason for s in table.set_aside}
    assert set(reasons) == {"d2a.jpg", "d4a.jpg"}
    assert reasons["d2a.jpg"].startswith("unknown label value") and "'Edema'" in reasons["d2a.jpg"]
    assert "2.0" in reasons["d2a.jpg"] and "row 2" in reasons["d2a.jpg"]
    assert reasons["d4a.jpg"].startswith("conflicting label rows")
    f = indexed(table.frame)
    assert f.loc[["d1a", "d1b"], [c for c in f if c.startswith("raw__")]].isna().all().all()
    assert any("2 image(s) whose study has no row" in n for n in table.notes)


def test_unknown_split_value_and_patient_in_two_official_splits(tmp_path):
    images = list(IMAGES)
    images[2] = images[2][:5] + ("test",)      # subject 10000001: study 2 in test, study 1 in train
    images[5] = images[5][:5] + ("holdout",)   # unknown split value
    report = run_ingest("mimic", write_export(tmp_path / "in", images=images), tmp_path / "out", progress=False)
    aside = {r["image_path"].rsplit("/", 1)[-1]: r["reason"] for r in report["set_aside"]}
    assert aside["d4a.jpg"].startswith("unknown split value") and "'holdout'" in aside["d4a.jpg"]
    for dicom in ("d1a.jpg", "d1b.jpg", "d1c.jpg"):
        assert aside[dicom] == "patient in two official splits (test, train)"
    assert report["rows_kept"] == 4
    m = read_manifest(tmp_path / "out" / "mimic")
    pid = load_site_key(None, tmp_path / "out").pseudonym
    assert m.set_index("patient_id").loc[pid("patient", "10000002"), "split"] == "val"


def test_missing_required_column_exits_2_naming_column_and_file(tmp_path, capsys):
    root = write_export(tmp_path / "in", write_images=False)
    path = root / RELEASE / "mimic-cxr-2.0.0-metadata.csv.gz"
    pd.read_csv(path).drop(columns=["study_id"]).to_csv(path, index=False)
    with pytest.raises(IngestError, match="'study_id'"):
        read_mimic(root, AdapterOptions())
    code = cli_main(["ingest", "mimic", "--input", str(root), "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "'study_id'" in err and "mimic-cxr-2.0.0-metadata.csv.gz" in err


def test_missing_metadata_or_labels_is_a_user_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(IngestError, match="metadata"):
        read_mimic(tmp_path / "empty", AdapterOptions())
    root = write_export(tmp_path / "in", labels=None, write_images=False)
    with pytest.raises(IngestError, match="negbio"):
        read_mimic(root, AdapterOptions())


def test_no_finding_study_implies_negatives_for_every_image_support_devices_excepted(tmp_path):
    labels = STUDY_LABELS[:1] + [labels_for(10000001, 50000002, No_Finding=1.0, Support_Devices=1.0)] + STUDY_LABELS[2:]
    labels[6] = labels_for(12000006, 50000007, No_Finding=1.0)
    out = tmp_path / "out"
    report = run_ingest("mimic", write_export(tmp_path / "in", labels=labels), out, progress=False)
    m = indexed(read_manifest(out / "mimic"))
    assert m.loc["d1c", "label__atelectasis"] == 0 and np.isnan(m.loc["d1c", "raw__atelectasis"])
    assert m.loc["d1c", "label__support_devices"] == 1
    assert m.loc["d6a", "label__edema"] == 0 and np.isnan(m.loc["d6a", "label__support_devices"])
    assert np.isnan(m.loc["d1a", "label__atelectasis"])                  # not a No Finding study
    assert report["sites"]["mimic"]["implied_negatives"]["atelectasis"] == 2
    off = run_ingest("mimic", tmp_path / "in", tmp_path / "off", progress=False, implied_negatives=False)
    assert np.isnan(indexed(read_manifest(tmp_path / "off" / "mimic")).loc["d1c", "label__atelectasis"])
    assert off["sites"]["mimic"]["implied_negatives"] == {}


def test_labels_differ_from_torchxrayvision_mimic_dataset_only_on_support_devices(tmp_path):
    """TorchXRayVision's MIMIC_Dataset (from FEDCXR_XRV) also zeroes Support Devices on No Finding studies;
    the labelers except it (chexpert-labeler / NegBio stages/aggregate.py), and so does fedcxr."""
    import os

    from tests.benchmarks.conftest import load_bench

    path = os.environ.get("FEDCXR_XRV")
    if not path or not Path(path).exists():
        pytest.skip("TorchXRayVision reference not given: set FEDCXR_XRV to a mlmed/torchxrayvision checkout")
    ref = load_bench("ref_xrv_labels")
    labels = list(STUDY_LABELS)
    labels[6] = labels_for(12000006, 50000007, No_Finding=1.0)
    export = write_export(tmp_path / "in", labels=labels, write_images=False, suffix=".csv")
    rel = export / RELEASE
    result = ref.compare(ref.fedcxr_labels("mimic", export),
                         ref.xrv_mimic(ref.load_xrv(Path(path)), rel / "mimic-cxr-2.0.0-chexpert.csv",
                                       rel / "mimic-cxr-2.0.0-metadata.csv"))
    assert result["images_compared"] == len(IMAGES)
    differ = {c: r["differ"] for c, r in result["per_class"].items() if r["differ"]}
    assert differ == {"support_devices": 2}    # d1c and d6a: blank (fedcxr) vs 0 (TorchXRayVision)
