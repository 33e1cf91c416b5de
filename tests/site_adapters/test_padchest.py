"""``padchest`` source: fixtures built from PadChest's published schema (no real file is here)."""

from __future__ import annotations

import json

import pytest

from fedcxr.site_adapters.ingest import run_ingest
from fedcxr.site_adapters.manifest import read_manifest
from fedcxr.site_adapters.padchest import LABEL_CLASSES, SOURCE_CLASSES, labels_row, parse_labels, read_padchest_labels

from .public_exports import PADCHEST_COLUMNS, padchest_row, tiny_png, write_csv

CSV = "PADCHEST_chest_x_ray_images_labels_160K_01.02.19.csv"


def test_label_strings_parse_as_literals_only():
    assert parse_labels("['pleural effusion', ' cardiomegaly', '']") == ["pleural effusion", "cardiomegaly"]
    assert parse_labels("['normal']") == ["normal"]
    for bad, reason in ((None, "empty 'Labels'"), ("  ", "empty 'Labels'"), ("pleural effusion", "not a list"),
                        ("__import__('os').system('true')", "not a list"), ("[1, 2]", "not a list of strings"),
                        ("[" * 5001 + "]" * 5001, "10002-character"), ("[" * 4000 + "]" * 4000, "not a list")):
        with pytest.raises(ValueError, match=reason):
            parse_labels(bad)


def test_whole_labels_map_onto_classes():
    row = labels_row(["subcutaneous emphysema", "pseudonodule", "calcified granuloma", "nsg tube",
                      "central venous catheter via jugular vein", "descendent aortic elongation", "kyphosis"])
    positive = sorted(c for c, v in row.items() if v == 1.0)
    assert positive == ["aortic_elongation", "calcified_granuloma", "granuloma", "support_devices"]
    assert row["emphysema"] == 0 and row["nodule"] == 0  # look-alikes, not the finding
    assert labels_row(["normal"])["no_finding"] == 1 and labels_row(["normal"])["cardiomegaly"] == 0
    assert LABEL_CLASSES["consolidation"] == ("consolidation", "infiltration")
    assert len(SOURCE_CLASSES) == 32


def _export(root):
    rows = [
        padchest_row("a.png", "P1", ["pleural effusion", "cardiomegaly"], folder=0, projection="PA", birth=1939.0,
                     date="20090115"),
        padchest_row("b.png", "P1", ["normal"], folder=0, projection="L", birth=1939.0, date="20090115",
                     study="s-a.png"),                            # the same study as a.png
        padchest_row("c.png", "P2", ["copd signs", "unchanged", "kyphosis"], folder=1, projection="AP_horizontal",
                     sex="F", birth="", method="RNN_model"),
        padchest_row("d.png", "P3", ["exclude"], folder=1),
        padchest_row("e.png", "P4", None, folder=1),                      # no labels: set aside
        padchest_row("f.png", "P5", "['pneumonia'", folder=2),           # unterminated list
        padchest_row("g.png", "P6", ["nodule"], folder=2, projection="COSTAL", sex="O", date="20170101",
                     birth=1921.0) | {"StudyID": ""},
    ]
    write_csv(root / CSV, rows, PADCHEST_COLUMNS)
    for name, folder in (("a.png", "0"), ("b.png", "0"), ("c.png", "1"), ("d.png", "1"), ("e.png", "1"),
                         ("f.png", "2")):
        tiny_png(root / folder / name)
    tiny_png(root / "flat" / "g.png")  # a file outside its ImageDir folder is found by name
    return root


def test_rows_labels_and_demographics(tmp_path):
    frame, aside, notes, rows_read = read_padchest_labels(_export(tmp_path))
    assert rows_read == 7 == len(frame) + len(aside)
    assert {a.row: a.reason.split(" (")[0] for a in aside} == {
        4: "labeled 'exclude' by PadChest", 5: "missing value: empty 'Labels'",
        6: "unknown label value: \"['pneumonia'\" in column 'Labels'"}
    f = frame.set_index("source_row")
    assert f.loc[1, "raw__pleural_effusion"] == 1 and f.loc[1, "raw__no_finding"] == 0 and f.loc[2, "raw__no_finding"] == 1
    assert f.loc[3, "raw__copd"] == 1 and f.loc[3, "raw__cardiomegaly"] == 0
    assert f.loc[1, "age"] == 70 and f.loc[7, "age"] == 96 and f[["age"]].isna().sum().item() == 1  # c: no birth year
    assert f["aux__view"].tolist()[:3] == [0, 2, 1] and f["aux__view"].isna()[7]  # PA, L, AP_horizontal; COSTAL
    assert f.loc[3, "aux__sex"] == 0 and f["aux__sex"].isna()[7]    # 'O' → unknown
    assert f.loc[1, "image_path"] == "0/a.png" and f.loc[1, "study_id"] == "s-a.png" == f.loc[2, "study_id"]
    assert f.loc[7, "study_id"] == "g.png"  # a blank StudyID: the image is its own study
    assert f["group__label_method"].tolist() == ["physician", "physician", "rnn_model", "physician"]
    assert any("'kyphosis' 1" in n for n in notes) and any("'COSTAL' 1" in n for n in notes)


def test_ingest_by_label_method(tmp_path):
    out = tmp_path / "out"
    report = run_ingest("padchest", _export(tmp_path / "export"), out, site_by="label_method", progress=False)
    assert report["rows_read"] == 7 == report["rows_kept"] + report["rows_set_aside"] and report["rows_kept"] == 4
    assert sorted(report["sites"]) == ["physician", "rnn_model"]
    physician = read_manifest(out / "physician")
    assert sorted(physician["image_path"]) == ["0/a.png", "0/b.png", "flat/g.png"]
    site = json.loads((out / "physician" / "site.json").read_text())
    assert site["class_counts"]["nodule"] == {"positive": 1, "negative": 2, "missing": 0, "uncertain": 0,
                                            "implied_negative": 0}
