"""NIH ChestX-ray14 adapter: native Data_Entry quirks, official lists, bad input, real data."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from fedcxr.cli import main as cli_main
from fedcxr.site_adapters.base import AdapterOptions, IngestError
from fedcxr.site_adapters.ingest import run_ingest
from fedcxr.site_adapters.sitekey import load_site_key
from fedcxr.site_adapters.manifest import read_manifest, read_site_json
from fedcxr.site_adapters.nih import SOURCE_CLASSES as NIH_CLASSES, read_nih

HEADER_2017 = ("Image Index,Finding Labels,Follow-up #,Patient ID,Patient Age,Patient Gender,View Position,"
               "OriginalImage[Width,Height],OriginalImagePixelSpacing[x,y],")
HEADER_SAMPLE = ("Image Index,Finding Labels,Follow-up #,Patient ID,Patient Age,Patient Gender,View Position,"
                 "OriginalImageWidth,OriginalImageHeight,OriginalImagePixelSpacing_x,OriginalImagePixelSpacing_y")

#: (image, findings, follow-up, patient, age, sex, view) — NIH's own value spellings.
ROWS = [
    ("00000001_000.png", "Cardiomegaly", 0, 1, "57", "M", "PA"),
    ("00000001_001.png", "Cardiomegaly|Effusion", 1, 1, "58", "M", "PA"),
    ("00000002_000.png", "No Finding", 0, 2, "0", "F", "AP"),
    ("00000003_000.png", "Pleural_Thickening|Hernia|Mass", 0, 3, "81", "F", "PA"),
    ("00000003_001.png", "Infiltration", 1, 3, "81", "F", "AP"),
    ("00000004_000.png", "Nodule|Pneumothorax", 0, 4, "35", "M", "PA"),
]
TRAIN_VAL = ["00000001_000.png", "00000001_001.png", "00000002_000.png", "00000004_000.png"]
TEST = ["00000003_000.png", "00000003_001.png"]


def write_png(path: Path, size: int = 16) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("L", (size, size), 100).save(path)


def write_export(root: Path, rows=ROWS, *, header=HEADER_2017, name="Data_Entry_2017.csv",
                 train_val=TRAIN_VAL, test=TEST, images=True) -> Path:
    """An NIH export as Kaggle ships it: 2017 csv with trailing commas, images_NNN/images/."""
    root.mkdir(parents=True, exist_ok=True)
    trailing = "," if header.endswith(",") else ""
    lines = [header] + [
        f"{img},{labels},{fu},{pid},{age},{sex},{view},2500,2048,0.143,0.143{trailing}"
        for img, labels, fu, pid, age, sex, view in rows
    ]
    (root / name).write_text("\n".join(lines) + "\n")
    if train_val is not None:
        (root / "train_val_list.txt").write_text("\n".join(train_val))  # no trailing newline, as NIH
    if test is not None:
        (root / "test_list.txt").write_text("\n".join(test))
    if images:
        for i, row in enumerate(rows):
            write_png(root / f"images_{1 + i % 2:03d}" / "images" / row[0])
    return root


def by_image(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(name=frame["image_path"].str.rsplit("/", n=1).str[-1]).set_index("name")


def test_reads_2017_csv_with_trailing_comma_and_nested_image_folders(tmp_path):
    table = read_nih(write_export(tmp_path / "nih"), AdapterOptions())
    assert table.classes == list(NIH_CLASSES) and len(NIH_CLASSES) == 15
    assert table.rows_read == 6 and not table.set_aside
    f = by_image(table.frame)
    assert f.loc["00000001_000.png", "image_path"] == "images_001/images/00000001_000.png"
    assert f.loc["00000001_001.png", "image_path"] == "images_002/images/00000001_001.png"
    # Absence from the pipe list is a negative: NIH labels every class on every image.
    row = f.loc["00000001_001.png"]
    assert row["raw__cardiomegaly"] == 1 and row["raw__pleural_effusion"] == 1
    assert row["raw__no_finding"] == 0 and row["raw__hernia"] == 0
    assert f.loc["00000003_000.png", ["raw__pleural_thickening", "raw__hernia", "raw__mass"]].tolist() == [1, 1, 1]
    assert f.loc["00000002_000.png", "raw__no_finding"] == 1
    assert not f[[f"raw__{c}" for c in NIH_CLASSES]].isna().any().any()
    assert f.loc["00000001_001.png", "study_id"] == "1_1" and f.loc["00000001_001.png", "patient_id"] == "1"
    assert f.loc["00000003_000.png", "official_split"] == "test"
    assert f.loc["00000004_000.png", "official_split"] == "train_val"
    assert f.loc["00000004_000.png", "source_row"] == 6
    # Age 0 is a real age; sex/view/age-bin codes follow fedcxr.vocab.
    assert f.loc["00000002_000.png", "age"] == 0 and f.loc["00000002_000.png", "aux__age_bin"] == 0
    assert f.loc["00000002_000.png", ["aux__sex", "aux__view"]].tolist() == [0, 1]
    assert f.loc["00000003_000.png", "aux__age_bin"] == 4 and f.loc["00000001_000.png", "aux__sex"] == 1


def test_unknown_finding_sets_row_aside_naming_the_value(tmp_path):
    rows = ROWS + [("00000005_000.png", "Mass|Lung Opacity", 0, 5, "40", "M", "PA"),
                   ("00000006_000.png", "Cardiomegaly|Foo", 0, 6, "40", "M", "PA")]
    table = read_nih(write_export(tmp_path / "nih", rows, train_val=TRAIN_VAL + ["00000005_000.png",
                                                                                  "00000006_000.png"]),
                     AdapterOptions())
    assert table.rows_read == 8 and len(table.frame) == 6
    reasons = {s.row: s.reason for s in table.set_aside}
    assert set(reasons) == {7, 8}
    assert "'Lung Opacity'" in reasons[7] and "'Finding Labels'" in reasons[7]  # a class NIH never labels
    assert "'Foo'" in reasons[8] and reasons[8].startswith("unknown label value")
    assert all(s.file == "Data_Entry_2017.csv" for s in table.set_aside)


def test_kaggle_sample_ages_and_unparseable_age_kept_as_unknown(tmp_path):
    rows = [
        ("00000001_000.png", "Cardiomegaly", 0, 1, "060Y", "M", "PA"),
        ("00000002_000.png", "No Finding", 0, 2, "013M", "F", "AP"),
        ("00000003_000.png", "Mass", 0, 3, "411Y", "F", "PA"),
        ("00000004_000.png", "Mass", 0, 4, "abc", "X", "PA"),
    ]
    root = write_export(tmp_path / "nih", rows, header=HEADER_SAMPLE, name="sample_labels.csv",
                        train_val=None, test=None)
    table = read_nih(root, AdapterOptions())
    f = by_image(table.frame)
    assert len(f) == 4 and not table.set_aside
    assert f.loc["00000001_000.png", "age"] == 60
    assert f.loc["00000002_000.png", "age"] == pytest.approx(13 / 12)
    assert pd.isna(f.loc["00000003_000.png", "age"]) and pd.isna(f.loc["00000003_000.png", "aux__age_bin"])
    assert pd.isna(f.loc["00000004_000.png", "aux__sex"])
    assert f["official_split"].isna().all()
    notes = " | ".join(table.notes)
    assert "2 row(s) with unmappable age" in notes and "'411Y'" in notes
    assert "1 row(s) with unmappable sex" in notes and "no train_val_list.txt" in notes

    out = tmp_path / "out"
    report = run_ingest("nih", root, out, progress=False)
    assert report["rows_kept"] == 4
    aux = read_site_json(out / "nih")["aux"]
    assert aux["age_bin"]["missing"] == 2 and aux["age_bin"]["available"] == 2
    assert aux["sex"]["missing"] == 1


def test_v2020_header_gzipped_wins_over_sample(tmp_path):
    root = write_export(tmp_path / "nih", ROWS[:2], header=HEADER_SAMPLE, name="sample_labels.csv")
    header_2020 = HEADER_2017.rstrip(",")
    text = "\n".join([header_2020] + [f"{r[0]},{r[1]},{r[2]},{r[3]},{r[4]},{r[5]},{r[6]},1,2,0.1,0.1" for r in ROWS])
    with gzip.open(root / "Data_Entry_2017_v2020.csv.gz", "wt") as handle:
        handle.write(text + "\n")
    table = read_nih(root, AdapterOptions())
    assert table.rows_read == 6
    assert set(table.frame["source_file"]) == {"Data_Entry_2017_v2020.csv.gz"}


def test_missing_required_column_exits_2_naming_column_and_file(tmp_path, capsys):
    root = tmp_path / "nih"
    root.mkdir()
    (root / "Data_Entry_2017.csv").write_text("Image Index,Follow-up #,Patient ID\n00000001_000.png,0,1\n")
    with pytest.raises(IngestError, match="Finding Labels"):
        read_nih(root, AdapterOptions())
    code = cli_main(["ingest", "nih", "--input", str(root), "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert "'Finding Labels'" in err and "Data_Entry_2017.csv" in err


def test_no_metadata_file_is_a_user_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(IngestError, match="no NIH metadata file"):
        read_nih(tmp_path / "empty", AdapterOptions())


def test_duplicate_row_missing_image_and_split_conflicts_are_set_aside_with_reasons(tmp_path):
    rows = ROWS + [
        ROWS[0],                                                       # same image twice
        ("00000004_001.png", "Mass", 1, 4, "36", "M", "PA"),           # patient 4 also in test
        ("00000007_000.png", "Mass", 0, 7, "50", "F", "PA"),           # image in both lists
        ("00000008_000.png", "Mass", 0, 8, "50", "F", "PA"),           # image in neither list
    ]
    root = write_export(tmp_path / "nih", rows,
                        train_val=TRAIN_VAL + ["00000007_000.png"],
                        test=TEST + ["00000004_001.png", "00000007_000.png"])
    (root / "images_001" / "images" / "00000003_001.png").unlink(missing_ok=True)
    (root / "images_002" / "images" / "00000003_001.png").unlink(missing_ok=True)
    table = read_nih(root, AdapterOptions())
    assert any("1 row(s) in no official split list" in n for n in table.notes)
    report = run_ingest("nih", root, tmp_path / "out", progress=False)
    assert report["rows_read"] == 10
    assert report["rows_kept"] + report["rows_set_aside"] == report["rows_read"]
    reasons = {(r["row"], r["reason"].split(":")[0].split(" (")[0]) for r in report["set_aside"]}
    assert (7, "duplicate row") in reasons
    assert (9, "image in both official splits") in reasons
    assert (5, "missing file") in reasons
    assert {(6, "patient in two official splits"), (8, "patient in two official splits")} <= reasons
    kept = read_manifest(tmp_path / "out" / "nih")
    pid = load_site_key(None, tmp_path / "out").pseudonym
    assert set(kept["patient_id"]) == {pid("patient", p) for p in ("1", "2", "3", "8")}
    assert kept.loc[kept["patient_id"] == pid("patient", "3"), "split"].tolist() == ["test"]
    assert kept.groupby("patient_id")["split"].nunique().max() == 1
    on_disk = json.loads((tmp_path / "out" / "ingest_report.json").read_text())
    assert on_disk["rows_set_aside"] == report["rows_set_aside"] == 5


# --------------------------------------------------------------------------- real data


@pytest.fixture(scope="module")
def real_table(shared_data):
    return read_nih(shared_data / "nih-chestxray14", AdapterOptions())


def test_real_data_entry_reads_every_row_with_patient_disjoint_official_splits(real_table):
    f = real_table.frame
    assert real_table.rows_read == 112_120 and len(f) == 112_120 and not real_table.set_aside
    assert f["patient_id"].nunique() == 30_805
    assert f["official_split"].value_counts().to_dict() == {"train_val": 86_524, "test": 25_596}
    assert f.groupby("patient_id")["official_split"].nunique().max() == 1
    # Label counts of the README's table (Effusion → pleural_effusion, Pleural_Thickening).
    assert int(f["raw__no_finding"].sum()) == 60_361
    assert int(f["raw__pleural_effusion"].sum()) == 13_317
    assert int(f["raw__pleural_thickening"].sum()) == 3_385
    assert int(f["raw__hernia"].sum()) == 227
    assert f["aux__sex"].value_counts().to_dict() == {1: 63_340, 0: 48_780}
    assert f["aux__view"].value_counts().to_dict() == {0: 67_310, 1: 44_810}
    assert f["age"].notna().all() and (f["age"] == 0).sum() == 14
    found = f["image_path"].str.startswith("images_512/") | f["image_path"].isin(
        [f"images/{p.name}" for p in (real_table.root / "images").iterdir()])
    assert int(found.sum()) == 25


# slow (~5 s): the full ingest checks 112,120 image paths and writes 112,095 set-aside rows. The fast tier
# keeps the same behaviour covered: the real 112,120 rows and their 25 present images
# (test_real_data_entry_reads_every_row...), the real metadata path at full scale (test_real_plan_runs...),
# and missing-file set-asides with patient 3 kept in test through run_ingest (test_duplicate_row_...).
@pytest.mark.slow
def test_real_ingest_keeps_the_25_present_images_and_accounts_for_the_rest(shared_data, tmp_path):
    report = run_ingest("nih", shared_data / "nih-chestxray14", tmp_path / "out", progress=False)
    assert report["rows_read"] == 112_120
    assert report["rows_kept"] == 25 and report["rows_set_aside"] == 112_095
    assert report["set_aside_by_reason"] == {"missing file": 112_095}
    assert report["rows_kept"] + report["rows_set_aside"] == report["rows_read"]
    manifest = read_manifest(tmp_path / "out" / "nih")
    three = load_site_key(None, tmp_path / "out").pseudonym("patient", "3")
    patient3 = manifest.loc[manifest["patient_id"] == three]
    assert len(patient3) == 8 and set(patient3["split"]) == {"test"}
    assert set(manifest.loc[manifest["patient_id"] != three, "split"]) <= {"train", "val"}
    site = read_site_json(tmp_path / "out" / "nih")
    assert site["rows"] == 25 and site["rows_per_split"]["test"] == 8
    assert "images_512/00027426_000.png" in set(manifest["image_path"])


def test_real_kaggle_sample_labels_with_impossible_age(shared_data, tmp_path):
    root = tmp_path / "sample"
    root.mkdir()
    shutil.copy(shared_data / "nih-chestxray14" / "sample_labels.csv", root / "sample_labels.csv")
    table = read_nih(root, AdapterOptions())
    f = table.frame
    assert table.rows_read == 5_606 and len(f) == 5_606 and not table.set_aside
    raw = pd.read_csv(root / "sample_labels.csv", usecols=["Patient Age"])["Patient Age"]
    impossible = raw.str[:-1].astype(int).gt(120) & raw.str.endswith("Y")
    assert impossible.sum() >= 1 and "411Y" in set(raw[impossible])
    assert f.loc[impossible.to_numpy(), "age"].isna().all()
    assert f["age"].notna().sum() == len(f) - impossible.sum()
    months = raw.str.endswith("M").to_numpy()
    assert months.any() and (f.loc[months, "age"] < 10).all()
    assert any("'411Y'" in n and "age unknown" in n for n in table.notes)
    assert np.isin(f[[f"raw__{c}" for c in NIH_CLASSES]].to_numpy(), [0.0, 1.0]).all()


@pytest.mark.slow
def test_real_plan_runs_the_metadata_path_at_full_scale(shared_data, tmp_path):
    """--plan over all 112,120 Data_Entry rows with (almost) no image present: every row would be kept,
    the official test list lands in test, and the four IID sites split the patients."""
    report = run_ingest("nih", shared_data / "nih-chestxray14", tmp_path / "plan", progress=False, plan=True,
                        site_by="iid:4")
    assert report["rows_read"] == report["rows_kept"] == 112_120 and report["rows_set_aside"] == 0
    test_list = (shared_data / "nih-chestxray14" / "test_list.txt").read_text().split()
    assert sum(site["rows_per_split"]["test"] for site in report["sites"].values()) == len(test_list) == 25_596
    assert sum(site["patients_per_split"]["test"] for site in report["sites"].values()) == 2_797
    assert sorted(report["sites"]) == ["site-1", "site-2", "site-3", "site-4"]
    assert not any((tmp_path / "plan").glob("*/manifest.parquet"))
