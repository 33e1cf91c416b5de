"""Helpers shared by the csv-based adapters: file search, distinct-value mapping, label checks."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedcxr.site_adapters.base import IngestError
from fedcxr.site_adapters.tables import (
    code_names,
    failed_note,
    find_file,
    label_columns,
    map_distinct,
    member_of,
    read_table,
)
from fedcxr.vocab import parse_age, sex_code


def test_find_file_prefers_names_in_order_and_skips_image_trees(tmp_path):
    (tmp_path / "release" / "2.0").mkdir(parents=True)
    (tmp_path / "release" / "2.0" / "wanted.csv").write_text("a\n")
    (tmp_path / "fallback.csv").write_text("a\n")
    (tmp_path / "files" / "p10").mkdir(parents=True)
    (tmp_path / "files" / "p10" / "hidden.csv").write_text("a\n")
    assert find_file(tmp_path, ["wanted.csv", "fallback.csv"]) == tmp_path / "release" / "2.0" / "wanted.csv"
    assert find_file(tmp_path, ["hidden.csv"]) is None  # never searched inside files/
    assert find_file(tmp_path, ["wanted.csv"], max_depth=1) is None
    assert find_file(tmp_path, ["wanted.csv"], subdirs=["release/2.0"], max_depth=0) is not None


def test_map_distinct_applies_vocab_once_per_value_and_flags_failures():
    values = pd.Series(["060Y", "013M", "411Y", None, "060Y", "abc"], dtype="str")
    ages, failed = map_distinct(values, parse_age)
    assert ages[0] == 60 and ages[1] == pytest.approx(13 / 12) and np.isnan(ages[2:4]).all()
    assert failed.tolist() == [False, False, True, False, False, True]
    note = failed_note("age", values, failed, "age unknown")
    assert note.startswith("2 row(s) with unmappable age") and "'411Y'" in note and "'abc'" in note
    assert failed_note("age", values, np.zeros(6, dtype=bool), "x") is None
    sex, _ = map_distinct(pd.Series(["Male", "Female", "Unknown"]), sex_code)
    assert code_names("sex", sex).tolist() == ["M", "F", None]


def test_label_columns_keep_raw_values_and_name_the_first_bad_column():
    frame = pd.DataFrame({"Edema": [1.0, -1.0, np.nan, 0.0], "Mass": ["1", "yes", "", "2"]})
    raw, bad, reasons = label_columns(frame, {"Edema": "edema", "Mass": "mass"})
    np.testing.assert_array_equal(raw["raw__edema"], [1.0, -1.0, np.nan, 0.0])
    assert bad.tolist() == [False, True, False, True]
    assert reasons[1] == "unknown label value: 'yes' in column 'Mass'" and "'2'" in reasons[3]


def test_member_of_matches_set_lookup():
    values = pd.Series(["a.png", "b.png", None], dtype="str")
    assert member_of(values, {"b.png"}).tolist() == [False, True, False]


def test_read_table_keeps_vendor_strings_and_names_the_file_on_error(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("a,b\nNA,\nNone,1\n")
    frame = read_table(path, base=tmp_path, dtype=str)
    assert frame["a"].tolist() == ["NA", "None"] and pd.isna(frame["b"].iloc[0])
    bad = tmp_path / "bad.csv.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(IngestError, match="bad.csv.gz: cannot read"):
        read_table(bad, base=tmp_path)
