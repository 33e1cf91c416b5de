"""Shared helpers of the public-dataset adapters: per-image rows, finding files by name, DICOM tags."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedcxr.site_adapters.base import AdapterOptions
from fedcxr.site_adapters.export_images import attach_dicom_tags, group_rows, index_files, locate, row_list

from .public_exports import tiny_dicom, tiny_png


def test_group_rows_keeps_first_appearance_and_skips_blank_ids():
    keys, first, groups = group_rows(pd.Series(["b", "a", "b", None, "c", "a"]))
    assert keys.tolist() == ["b", "a", "c"] and first.tolist() == [1, 2, 5]
    assert [g.tolist() for g in groups] == [[1, 3], [2, 6], [5]]
    assert row_list([4]) == "row 4" and row_list([1, 2, 9]) == "rows 1, 2 and 9"
    assert row_list(range(1, 8)) == "rows 1, 2, 3, 4 ... (7 rows)"


def test_files_are_found_by_name_anywhere_and_duplicates_are_ambiguous(tmp_path):
    for rel in ("train/x.dicom", "deep/er/y.DCM", "copy1/z.dcm", "copy2/z.dcm", ".hidden/w.dcm", "notes.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    index = index_files(tmp_path, (".dicom", ".dcm"))
    assert index == {"x": "train/x.dicom", "y": "deep/er/y.DCM", "z": None}
    paths, reasons = locate(["x", "y", "z", "w"], index, ["d/x", "d/y", "d/z.dcm", "d/w.dcm"])
    assert paths == ["train/x.dicom", "deep/er/y.DCM", "d/z.dcm", "d/w.dcm"]
    assert reasons[:2] == [None, None] and "several files" in reasons[2] and "z" not in reasons[2]
    assert reasons[3] is None


def test_tags_win_and_metadata_fills_files_without_them(tmp_path):
    tiny_dicom(tmp_path / "a.dcm", PatientID="P9", PatientSex="F", PatientAge="040Y", ViewPosition="AP")
    tiny_dicom(tmp_path / "b.dcm", seed=1)  # no demographic tags
    tiny_png(tmp_path / "c.png")
    frame = pd.DataFrame({
        "image_path": ["a.dcm", "b.dcm", "c.png", "gone.dcm"], "patient_id": ["ia", "ib", "ic", "id"],
        "source_file": "meta.csv", "source_row": [1, 2, 3, 4],
        "aux__sex": pd.array([1, 1, None, None], dtype="Int64"), "age": [70.0, 70.0, np.nan, np.nan],
    })
    notes: list[str] = []
    kept, aside, checked = attach_dicom_tags(frame, tmp_path, AdapterOptions(extra={"progress": False}), notes,
                                             patient_from_tag=True)
    assert checked and [(a.row, a.reason) for a in aside] == [
        (3, "not a DICOM file (a PNG image in a DICOM export)"), (4, "missing file")]
    assert kept["aux__sex"].tolist() == [0, 1] and kept["age"].tolist() == [40.0, 70.0]  # a's tags win; b keeps
    assert kept["aux__view"].tolist()[0] == 1 and pd.isna(kept["aux__view"][1])
    assert kept["patient_id"].tolist() == ["P9", "ib"] and any("without PatientID" in n for n in notes)
    raster = AdapterOptions(extra={"progress": False, "raster": True})
    kept, aside, _ = attach_dicom_tags(frame, tmp_path, raster, [])
    assert [a.row for a in aside] == [4] and kept["image_path"].tolist() == ["a.dcm", "b.dcm", "c.png"]


@pytest.mark.parametrize("source", ["rsna", "vindr", "siim", "openi", "padchest"])
def test_every_new_source_is_a_registered_ingest_source(source):
    from fedcxr.site_adapters.ingest import get_adapter

    assert callable(get_adapter(source))


def test_the_readme_mapping_tables_are_the_adapters_tables():
    """README "Sources and their findings" lists, per class, exactly the labels the adapter maps."""
    import re
    from pathlib import Path

    from fedcxr.site_adapters import openi, padchest, vindr

    readme = Path(__file__).resolve().parents[2] / "README.md"
    text = readme.read_text().split("### Sources and their findings", 1)[1].split("\n### ", 1)[0]
    vindr_by_class: dict[str, list[str]] = {}
    for label, cls in vindr.COLUMN_CLASSES.items():
        vindr_by_class.setdefault(cls, []).append(label)
    expected = {"VinDr label": vindr_by_class, "automatic MeSH terms": openi.CLASS_TERMS,
                "PadChest labels": padchest.CLASS_LABELS}
    for header, table in expected.items():
        block = text.split(f"| class | {header} |", 1)[1].split("\n\n", 1)[0]
        rows = re.findall(r"^\| `([a-z0-9_]+)` \| (.*) \|$", block, flags=re.M)
        assert {cls: re.findall(r"`([^`]+)`", cell) for cls, cell in rows} == {c: list(v) for c, v in table.items()}


def test_dicom_sources_set_aside_films_whose_tags_name_another_body_part(tmp_path):
    """rsna/vindr/siim read the same headers as the dicom source, so the chest check applies to them."""
    import pydicom

    from fedcxr.site_adapters.ingest import run_ingest

    from .public_exports import write_rsna

    export = write_rsna(tmp_path / "export")
    hip = sorted((export / "stage_2_train_images").glob("*.dcm"))[0]
    ds = pydicom.dcmread(hip)
    ds.BodyPartExamined = "HIP"
    ds.save_as(hip)
    report = run_ingest("rsna", export, tmp_path / "out", progress=False)
    reasons = report["set_aside_by_reason"]
    assert reasons.get("not a chest radiograph") == 1, reasons
    (aside,) = [r for r in report["set_aside"] if r["reason"].startswith("not a chest")]
    assert aside["reason"] == "not a chest radiograph: BodyPartExamined 'HIP'"
    assert report["rows_read"] == report["rows_kept"] + report["rows_set_aside"]
