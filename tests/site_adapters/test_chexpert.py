"""CheXpert adapter: native train/valid csvs, path prefixes, views, race sheet, policies, sites."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from fedcxr.cli import main as cli_main
from fedcxr.site_adapters.base import AdapterOptions, IngestError
from fedcxr.site_adapters.chexpert import SOURCE_CLASSES as CHEXPERT_CLASSES, LABEL_COLUMNS, PRIMARY_RACE, chexpert_race_code, read_chexpert
from fedcxr.site_adapters.ingest import run_ingest
from fedcxr.site_adapters.manifest import read_manifest, read_site_json
from fedcxr.site_adapters.partition import CHEXPERT_CONDITIONS
from fedcxr.vocab import AUX_VOCAB

HEADER = ["Path", "Sex", "Age", "Frontal/Lateral", "AP/PA"] + LABEL_COLUMNS
RELEASE = "CheXpert-v1.0-small"


def write_jpg(path: Path, size: int = 16) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("L", (size, size), 90).save(path, format="JPEG")


def row(patient: int, study: int, view: int, *, split="train", sex="Male", age="60", fl="Frontal", appa="AP",
        release=RELEASE, **labels) -> dict:
    """One csv row in the release's own spelling; ``labels`` use column names with _ for spaces."""
    kind = "frontal" if fl == "Frontal" else "lateral"
    out = {"Path": f"{release}/{split}/patient{patient:05d}/study{study}/view{view}_{kind}.jpg",
           "Sex": sex, "Age": age, "Frontal/Lateral": fl, "AP/PA": appa}
    out.update({c: "" for c in LABEL_COLUMNS})
    out.update({k.replace("_", " "): v for k, v in labels.items()})
    return out


def write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=HEADER).to_csv(path, index=False)


def write_export(root: Path, train: list[dict], valid: list[dict] = (), *, release=RELEASE,
                 images=True) -> Path:
    base = root / release
    write_csv(base / "train.csv", train)
    if valid:
        write_csv(base / "valid.csv", list(valid))
    if images:
        for r in list(train) + list(valid):
            write_jpg(base / r["Path"].split("/", 1)[1])
    return root


TRAIN = [
    row(1, 1, 1, Cardiomegaly="1.0", Edema="-1.0", Pneumonia="0.0"),
    row(1, 1, 2, fl="Lateral", appa="", Cardiomegaly="1.0", Edema="-1.0", Pneumonia="0.0"),
    row(2, 1, 1, sex="Female", age="0", appa="PA", No_Finding="1.0"),
    row(3, 2, 1, sex="Unknown", age="90", appa="LL", Atelectasis="-1.0", Support_Devices="1.0"),
]
VALID = [row(64541, 1, 1, split="valid", sex="Female", age="45", appa="PA",
             **{**{c.replace(" ", "_"): "0.0" for c in LABEL_COLUMNS}, "Edema": "1.0"})]


def test_reads_paths_ids_views_demographics_and_official_splits(tmp_path):
    table = read_chexpert(write_export(tmp_path / "in", TRAIN, VALID), AdapterOptions())
    assert table.classes == list(CHEXPERT_CLASSES) and len(CHEXPERT_CLASSES) == 14
    assert table.root == tmp_path / "in" / RELEASE and table.rows_read == 5 and not table.set_aside
    f = table.frame
    assert f["image_path"].tolist()[0] == "train/patient00001/study1/view1_frontal.jpg"
    assert f["patient_id"].tolist() == ["patient00001"] * 2 + ["patient00002", "patient00003", "patient64541"]
    assert f["study_id"].tolist()[3] == "patient00003/study2"
    assert f["official_split"].tolist() == ["train_val"] * 4 + ["test"]
    assert f["source_file"].tolist() == [f"{RELEASE}/train.csv"] * 4 + [f"{RELEASE}/valid.csv"]
    assert f["source_row"].tolist() == [1, 2, 3, 4, 1]
    view = AUX_VOCAB["view"]
    assert [view[int(v)] for v in f["aux__view"]] == ["AP", "LATERAL", "PA", "LATERAL", "PA"]
    assert f["group__view"].tolist()[:2] == ["frontal", "lateral"]
    assert f["aux__sex"].tolist()[:3] == [1, 1, 0] and pd.isna(f["aux__sex"].iloc[3])
    assert f.loc[2, "age"] == 0 and f.loc[2, "aux__age_bin"] == 0  # age 0 is a real value
    assert f.loc[3, "aux__age_bin"] == 4
    # Raw values stay raw: -1 uncertain, blank = not mentioned, No Finding 1/blank.
    assert f["raw__edema"].tolist()[:2] == [-1.0, -1.0]
    assert f.loc[0, "raw__pneumonia"] == 0 and pd.isna(f.loc[0, "raw__fracture"])
    assert f.loc[2, "raw__no_finding"] == 1 and pd.isna(f.loc[0, "raw__no_finding"])
    assert f["aux__race"].isna().all() and "group__race" not in f
    assert any("no demographics sheet" in n for n in table.notes)


@pytest.mark.parametrize("policy, expected", [("zeros", 0.0), ("ones", 1.0), ("ignore", np.nan)])
def test_uncertain_policies_resolve_labels_and_keep_raw(tmp_path, policy, expected):
    out = tmp_path / "out"
    report = run_ingest("chexpert", write_export(tmp_path / "in", TRAIN, VALID), out, uncertain=policy,
                        progress=False)
    assert report["rows_kept"] == 5
    m = read_manifest(out / "chexpert").set_index("image_path")
    frontal = m.loc["train/patient00001/study1/view1_frontal.jpg"]
    np.testing.assert_equal(frontal["label__edema"], expected)
    assert frontal["raw__edema"] == -1.0 and frontal["label__cardiomegaly"] == 1.0
    np.testing.assert_equal(m.loc["train/patient00003/study2/view1_frontal.jpg", "label__atelectasis"], expected)
    assert m.loc["valid/patient64541/study1/view1_frontal.jpg", "split"] == "test"
    assert set(m["split"]) <= {"train", "val", "test"}
    assert np.isnan(m["label__covid19"]).all() and np.isnan(m["label__infiltration"]).all()
    site = read_site_json(out / "chexpert")
    assert site["class_counts"]["edema"]["uncertain"] == 2


def test_unknown_label_values_set_rows_aside_naming_column_and_value(tmp_path):
    train = TRAIN + [row(4, 1, 1, Edema="2.0"), row(5, 1, 1, Pneumonia="yes"), row(6, 1, 1, Edema="1")]
    table = read_chexpert(write_export(tmp_path / "in", train), AdapterOptions())
    assert table.rows_read == 7 and len(table.frame) == 5
    reasons = {s.row: s.reason for s in table.set_aside}
    assert "2.0" in reasons[5] and "'Edema'" in reasons[5]
    assert "'yes'" in reasons[6] and "'Pneumonia'" in reasons[6]
    assert table.frame.loc[table.frame["patient_id"] == "patient00006", "raw__edema"].item() == 1.0


def test_bad_path_is_set_aside(tmp_path):
    train = TRAIN + [{**row(7, 1, 1), "Path": f"{RELEASE}/train/somebody/view1_frontal.jpg"}]
    table = read_chexpert(write_export(tmp_path / "in", train, images=False), AdapterOptions())
    assert [s.row for s in table.set_aside] == [5]
    assert table.set_aside[0].reason.startswith("unrecognised path")


def test_missing_required_column_exits_2_naming_column_and_file(tmp_path, capsys):
    root = write_export(tmp_path / "in", TRAIN, images=False)
    csv = root / RELEASE / "train.csv"
    pd.read_csv(csv).drop(columns=["Edema"]).to_csv(csv, index=False)
    with pytest.raises(IngestError, match="'Edema'"):
        read_chexpert(root, AdapterOptions())
    code = cli_main(["ingest", "chexpert", "--input", str(root), "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "'Edema'" in err and "train.csv" in err


def test_full_release_prefix_and_chexbert_file_beside_the_release_folder(tmp_path):
    root = tmp_path / "in"
    rows = [row(1, 1, 1, release="CheXpert-v1.0", Edema="1.0"), row(2, 1, 1, release="CheXpert-v1.0", Edema="0.0")]
    write_csv(root / "train_cheXbert.csv", rows)
    for r in rows:
        write_jpg(root / r["Path"])
    table = read_chexpert(root, AdapterOptions())
    assert table.root == root / "CheXpert-v1.0"
    assert table.frame["image_path"].tolist()[0] == "train/patient00001/study1/view1_frontal.jpg"
    assert table.frame["source_file"].tolist() == ["train_cheXbert.csv"] * 2
    assert run_ingest("chexpert", root, tmp_path / "out", progress=False)["rows_kept"] == 2


def test_race_strings_of_the_demographics_sheet_are_mapped_explicitly():
    def name(code):
        return None if code is None else AUX_VOCAB["race"][code]

    assert name(chexpert_race_code("White, non-Hispanic")) == "white"
    assert name(chexpert_race_code("White or Caucasian")) == "white"
    assert name(chexpert_race_code("Asian - Historical Conv")) == "asian"
    assert name(chexpert_race_code("Black, Hispanic")) == "hispanic"
    assert name(chexpert_race_code("Native American, non-Hispanic")) == "other"
    assert name(chexpert_race_code("White", "Hispanic/Latino")) == "hispanic"
    assert name(chexpert_race_code("White", "Non-Hispanic/Non-Latino")) == "white"
    for unknown in ("Unknown", "Race and Ethnicity Unknown", "Patient Refused", None):
        assert chexpert_race_code(unknown) is None
    assert len(PRIMARY_RACE) == 23  # every string of the release (24 with blank)
    with pytest.raises(ValueError):
        chexpert_race_code("Martian")


@pytest.mark.parametrize("fmt", ["csv", "xlsx"])
def test_demographics_sheet_joins_race_and_keeps_unmappable_rows(tmp_path, fmt):
    root = write_export(tmp_path / "in", TRAIN, VALID)
    demo = pd.DataFrame({
        "PATIENT": ["patient00001", "patient00002", "patient00003", "patient64541"],
        "GENDER": ["Male", "Female", "Unknown", "Female"],
        "AGE_AT_CXR": [60, 0, 90, 45],
        "PRIMARY_RACE": ["White, non-Hispanic", "Other, Hispanic", "Martian", "Race and Ethnicity Unknown"],
        "ETHNICITY": ["Non-Hispanic/Non-Latino", "Hispanic/Latino", "Unknown", "Unknown"],
    })
    if fmt == "csv":
        demo.to_csv(root / "CHEXPERT DEMO.csv", index=False)
    else:
        demo.to_excel(root / "CHEXPERT DEMO.xlsx", index=False)
    table = read_chexpert(root, AdapterOptions())
    f = table.frame
    assert f["group__race"].tolist() == ["white", "white", "hispanic", None, None]
    assert f["aux__race"].tolist()[:3] == [0, 0, 3] and f["aux__race"].isna().sum() == 2
    assert len(f) == 5 and not table.set_aside
    assert any("1 row(s) with unmappable PRIMARY_RACE" in n and "'Martian'" in n for n in table.notes)


def test_site_by_chexpert_conditions_gives_one_single_class_site_per_condition(tmp_path):
    train = []
    rng = np.random.default_rng(0)
    for p in range(1, 41):
        values = {}
        for cond in ("Lung_Lesion", "Pneumonia", "Atelectasis", "Consolidation", "Edema"):
            values[cond] = str(float(rng.integers(0, 2)))
        train.append(row(p, 1, 1, **values))
    train.append(row(99, 1, 1, Cardiomegaly="1.0"))  # labels none of the conditions
    out = tmp_path / "out"
    report = run_ingest("chexpert", write_export(tmp_path / "in", train), out, site_by="chexpert-conditions",
                        progress=False)
    assert set(report["sites"]) == set(CHEXPERT_CONDITIONS)
    assert report["rows_kept"] == 40 and report["rows_set_aside"] == 1
    assert report["set_aside"][0]["reason"].startswith("no label for any condition site")
    seen = set()
    for cond in CHEXPERT_CONDITIONS:
        assert report["sites"][cond]["class_set"] == [cond]
        m = read_manifest(out / cond)
        others = [f"label__{c}" for c in CHEXPERT_CLASSES if c != cond]
        assert m[f"label__{cond}"].notna().all() and m[others].isna().all().all()
        assert not seen & set(m["patient_id"])
        seen |= set(m["patient_id"])


# --------------------------------------------------------------------------- the labeler's No Finding rule


NO_FINDING_TRAIN = [
    row(11, 1, 1, No_Finding="1.0", Pneumothorax="0.0", Support_Devices="1.0"),   # a device on a normal film
    row(12, 1, 1, No_Finding="1.0"),                                                 # every pathology blank
    row(13, 1, 1, Edema="1.0"),                                                      # a finding: blanks stay blank
]


def _path(patient: int) -> str:
    return f"train/patient{patient + 10:05d}/study1/view1_frontal.jpg"


def test_blank_pathology_on_a_no_finding_row_is_an_implied_negative(tmp_path):
    from fedcxr.site_adapters.chexpert import IMPLIED_NEGATIVE_CLASSES

    assert "support_devices" not in IMPLIED_NEGATIVE_CLASSES and len(IMPLIED_NEGATIVE_CLASSES) == 12
    out = tmp_path / "out"
    report = run_ingest("chexpert", write_export(tmp_path / "in", NO_FINDING_TRAIN), out, progress=False)
    m = read_manifest(out / "chexpert").set_index("image_path")
    for cls in IMPLIED_NEGATIVE_CLASSES:
        assert m.loc[_path(2), f"label__{cls}"] == 0 and np.isnan(m.loc[_path(2), f"raw__{cls}"]), cls
        assert np.isnan(m.loc[_path(3), f"label__{cls}"]) or cls == "edema"
    assert m.loc[_path(1), "label__atelectasis"] == 0 and m.loc[_path(1), "raw__pneumothorax"] == 0
    assert m.loc[_path(1), "label__support_devices"] == 1
    assert np.isnan(m.loc[_path(2), "label__support_devices"])      # Support Devices is never implied
    counts = read_site_json(out / "chexpert")["class_counts"]
    assert counts["atelectasis"]["implied_negative"] == 2 and counts["atelectasis"]["negative"] == 2
    assert counts["pneumothorax"]["implied_negative"] == 1 and counts["pneumothorax"]["negative"] == 2
    assert counts["support_devices"]["implied_negative"] == 0 and counts["support_devices"]["missing"] == 2
    implied = report["sites"]["chexpert"]["implied_negatives"]
    assert implied["atelectasis"] == 2 and implied["pneumothorax"] == 1 and "support_devices" not in implied
    assert report["options"]["implied_negatives"] is True


def test_no_implied_negatives_keeps_blanks_unlabeled(tmp_path, capsys):
    export = write_export(tmp_path / "in", NO_FINDING_TRAIN)
    code = cli_main(["ingest", "chexpert", "--input", str(export), "--out", str(tmp_path / "off"), "-q",
                     "--no-implied-negatives"])
    assert code == 0 and "implied negatives" not in capsys.readouterr().out
    m = read_manifest(tmp_path / "off" / "chexpert").set_index("image_path")
    assert np.isnan(m.loc[_path(2), "label__atelectasis"]) and m.loc[_path(1), "label__pneumothorax"] == 0
    assert read_site_json(tmp_path / "off" / "chexpert")["class_counts"]["atelectasis"]["implied_negative"] == 0
    assert cli_main(["ingest", "chexpert", "--input", str(export), "--out", str(tmp_path / "on"), "-q"]) == 0
    printed = capsys.readouterr().out
    assert "implied negatives" in printed and "atelectasis 2" in printed


def test_chexbert_relabel_gets_no_implied_negatives(tmp_path):
    base = tmp_path / "in" / RELEASE
    write_csv(base / "train_cheXbert.csv", NO_FINDING_TRAIN)
    table = read_chexpert(tmp_path / "in", AdapterOptions())
    assert table.implied_negative_classes == ()
    assert any("not the CheXpert labeler" in n for n in table.notes)


def _xrv_path():
    import os

    path = os.environ.get("FEDCXR_XRV")
    if not path or not Path(path).exists():
        pytest.skip("TorchXRayVision reference not given: set FEDCXR_XRV to a mlmed/torchxrayvision checkout "
                    "(or its torchxrayvision/datasets.py)")
    return Path(path)


def test_labels_equal_torchxrayvision_chex_dataset_on_a_fixture(tmp_path):
    """TorchXRayVision's own CheX_Dataset code (from FEDCXR_XRV) reads the fixture as fedcxr does."""
    from tests.benchmarks.conftest import load_bench

    ref = load_bench("ref_xrv_labels")
    xrv = ref.load_xrv(_xrv_path())
    train = NO_FINDING_TRAIN + TRAIN
    export = write_export(tmp_path / "in", train, images=False)
    result = ref.compare(ref.fedcxr_labels("chexpert", export), ref.xrv_chexpert(xrv, export / RELEASE / "train.csv"))
    assert result["images_compared"] == len(train) and result["cells_differ"] == 0
    off = ref.compare(ref.fedcxr_labels("chexpert", export, implied_negatives=False),
                      ref.xrv_chexpert(xrv, export / RELEASE / "train.csv"))
    assert off["cells_differ"] == 12 + 11 + 12   # every blank of patients 12 and 2, all but pneumothorax of 11
