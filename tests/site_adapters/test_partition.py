"""Partitions (``--site-by``): whole, column, conditions, iid:K (+ class subsets), skew:K."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedcxr.site_adapters.base import IngestError
from fedcxr.site_adapters.manifest import apply_uncertain_policy
from fedcxr.site_adapters.partition import CHEXPERT_CONDITIONS, partition, slug
from fedcxr.vocab import label_column, raw_column

SIX = ["atelectasis", "cardiomegaly", "consolidation", "edema", "pneumonia", "lung_lesion"]


def _frame(patients: int, classes: list[str], *, per_patient: int = 2, seed: int = 0,
           missing: float = 0.0, prevalence: float = 0.3) -> pd.DataFrame:
    """Canonical rows: ``per_patient`` images per patient, random labels, some not labeled."""
    rng = np.random.default_rng(seed)
    n = patients * per_patient
    frame = pd.DataFrame({
        "patient_id": [f"p{i // per_patient}" for i in range(n)],
        "image_path": [f"img/{i}.png" for i in range(n)],
        "source_file": "data.csv",
        "source_row": np.arange(1, n + 1),
    })
    for cls in classes:
        values = (rng.random(n) < prevalence).astype(float)
        values[rng.random(n) < missing] = np.nan
        frame[raw_column(cls)] = values
    return apply_uncertain_policy(frame, classes, "ignore")


def _sites_per_patient(frame: pd.DataFrame) -> int:
    return int(frame.groupby("patient_id")["site"].nunique().max())


def test_no_spec_is_one_site_named_after_the_source():
    frame = _frame(10, ["covid19"])
    parts = partition(frame, None, ["covid19"], default_site="My Hospital")
    assert set(parts.frame["site"]) == {"My-Hospital"} and parts.class_sets == {"My-Hospital": ["covid19"]}
    assert slug("  São Paulo / ICU ") == "S-o-Paulo-ICU"


def test_column_sites_and_rows_without_value(tmp_path):
    frame = _frame(6, ["covid19"], per_patient=1)
    frame["group__country"] = ["Spain", "Spain", "United Kingdom", None, "", "Italy"]
    for spec in ("country", "column:country"):
        parts = partition(frame, spec, ["covid19"], default_site="x")
        assert parts.frame["site"].value_counts().to_dict() == {"Spain": 2, "United-Kingdom": 1, "Italy": 1}
        assert [(s.row, s.reason) for s in parts.set_aside] == [
            (4, "no value for site column 'country'"), (5, "no value for site column 'country'")]
    with pytest.raises(IngestError, match="no such column; available: country"):
        partition(frame, "state", ["covid19"], default_site="x")


def test_conditions_one_site_per_patient_labeling_only_its_condition():
    frame = _frame(300, SIX, missing=0.5)
    parts = partition(frame, "chexpert-conditions", SIX, default_site="x")
    assert parts.class_sets == {slug(c): [c] for c in CHEXPERT_CONDITIONS}
    out = parts.frame
    assert _sites_per_patient(out) == 1
    assert len(out) + len(parts.set_aside) == len(frame)
    for cond in CHEXPERT_CONDITIONS:
        rows = out.loc[out["site"] == slug(cond)]
        assert len(rows) > 20 and rows[label_column(cond)].notna().all()
        others = [label_column(c) for c in SIX if c != cond]
        assert rows[others].isna().all().all()
        assert rows[[raw_column(c) for c in SIX]].notna().any().any()     # raw values are kept
    assert {s.reason for s in parts.set_aside} == {"no label for any condition site this patient was assigned to"}
    again = partition(frame, "chexpert-conditions", SIX, default_site="x")
    pd.testing.assert_series_equal(again.frame["site"], out["site"])


@pytest.mark.parametrize("spec, message", [
    ("conditions:edema", "at least two conditions"),
    ("conditions:edema,banana", "unknown class 'banana'"),
    ("conditions:edema,pneumonai", r"unknown class 'pneumonai' \(did you mean `pneumonia`\?\)"),
    ("conditions:edema,covid19", "'covid19' is not labeled by this source"),
])
def test_condition_errors(spec, message):
    with pytest.raises(IngestError, match=message):
        partition(_frame(5, SIX), spec, SIX, default_site="x")


def test_iid_patient_hash_is_disjoint_balanced_and_seeded():
    frame = _frame(2000, SIX, per_patient=1)
    parts = partition(frame, "iid:4", SIX, default_site="x")
    sizes = parts.frame["site"].value_counts()
    assert sorted(sizes.index) == ["site-1", "site-2", "site-3", "site-4"]
    assert sizes.min() > 400 and sizes.max() < 600
    assert parts.class_sets == {f"site-{i}": SIX for i in range(1, 5)}
    multi = _frame(500, SIX, per_patient=3)
    assert _sites_per_patient(partition(multi, "iid:4", SIX, default_site="x").frame) == 1
    first = partition(frame, "iid:4", SIX, default_site="x").frame["site"]
    assert (first == parts.frame["site"]).all()
    assert (partition(frame, "iid:4:seed=1", SIX, default_site="x").frame["site"] != first).any()


def test_iid_shared_classes_cover_every_class():
    frame = _frame(400, SIX, per_patient=1)
    parts = partition(frame, "iid:3:shared=1", SIX, default_site="x")
    sets = list(parts.class_sets.values())
    common = set.intersection(*map(set, sets))
    assert len(common) == 1
    assert set().union(*map(set, sets)) == set(SIX)             # every class appears at least once
    for site, subset in parts.class_sets.items():
        rows = parts.frame.loc[parts.frame["site"] == site]
        for cls in SIX:
            assert rows[label_column(cls)].notna().all() == (cls in subset)
            assert rows[raw_column(cls)].notna().all()


def test_iid_explicit_class_subsets():
    frame = _frame(100, SIX, per_patient=1)
    parts = partition(frame, "iid:2:classes=edema,Pneumonia;atelectasis", SIX, default_site="x")
    assert parts.class_sets == {"site-1": ["edema", "pneumonia"], "site-2": ["atelectasis"]}
    site2 = parts.frame.loc[parts.frame["site"] == "site-2"]
    assert site2[label_column("edema")].isna().all() and site2[label_column("atelectasis")].notna().all()


@pytest.mark.parametrize("spec, message", [
    ("iid:x", "needs an integer K"),
    ("iid:0", "K >= 1"),
    ("iid:2:colour=red", "unknown option"),
    ("iid:2:classes=edema", "needs 2 ';'-separated groups"),
    ("iid:2:classes=edema;banana", "unknown class 'banana'"),
    ("iid:2:shared=9", "0 <= S <= 6"),
])
def test_iid_errors(spec, message):
    with pytest.raises(IngestError, match=message):
        partition(_frame(20, SIX), spec, SIX, default_site="x")


def _prevalence_spread(parts) -> float:
    """Mean absolute difference between each site's prevalence and the overall one."""
    col = parts.frame[label_column("pneumonia")]
    overall = col.mean()
    return float(col.groupby(parts.frame["site"]).mean().sub(overall).abs().mean())


def test_skew_dirichlet_label_skew_over_patients():
    frame = _frame(1500, ["pneumonia"], per_patient=2, prevalence=0.5)
    skewed = partition(frame, "skew:4:alpha=0.1", ["pneumonia"], default_site="x")
    near_iid = partition(frame, "skew:4:alpha=1000", ["pneumonia"], default_site="x")
    for parts in (skewed, near_iid):
        assert sorted(parts.frame["site"].unique()) == ["site-1", "site-2", "site-3", "site-4"]
        assert _sites_per_patient(parts.frame) == 1 and len(parts.frame) == len(frame)
        assert parts.class_sets == {f"site-{i}": ["pneumonia"] for i in range(1, 5)}
    assert _prevalence_spread(skewed) > 0.15 > 0.05 > _prevalence_spread(near_iid)
    again = partition(frame.sample(frac=1, random_state=3), "skew:4:alpha=0.1", ["pneumonia"], default_site="x")
    assert again.frame.set_index("image_path")["site"].sort_index().equals(
        skewed.frame.set_index("image_path")["site"].sort_index())        # row order does not matter
    other_seed = partition(frame, "skew:4:alpha=0.1:seed=7", ["pneumonia"], default_site="x")
    assert (other_seed.frame["site"] != skewed.frame["site"]).any()


@pytest.mark.parametrize("spec, message", [
    ("skew:1", "K >= 2"),
    ("skew:four", "integer K"),
    ("skew:3:alpha=0", "alpha must be > 0"),
    ("skew:3:alpha=abc", "alpha must be a number"),
    ("skew:3:beta=1", "unknown option"),
    ("skew:50", "only 20 patient"),
])
def test_skew_errors(spec, message):
    with pytest.raises(IngestError, match=message):
        partition(_frame(20, ["pneumonia"]), spec, ["pneumonia"], default_site="x")
