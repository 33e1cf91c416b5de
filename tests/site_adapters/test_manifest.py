"""Per-site manifests: uncertain-label policy, patient-disjoint splits, atomic writes, site.json."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedcxr import atomic
from fedcxr.site_adapters import manifest
from fedcxr.site_adapters.base import IngestError, SetAside, ensure_columns
from fedcxr.site_adapters.manifest import (
    apply_uncertain_policy,
    assign_splits,
    atomic_write_bytes,
    read_manifest,
    read_site_json,
    verify_patient_disjoint,
    write_site,
)
from fedcxr.vocab import CLASSES, MANIFEST_VERSION, label_column


def _canonical(patients: list[str], *, raw: dict[str, list] | None = None, official=None,
               policy: str = "ignore", **columns) -> pd.DataFrame:
    """Canonical adapter rows (one per entry of ``patients``) after the label policy."""
    n = len(patients)
    raw = raw if raw is not None else {"pneumonia": [1.0] * n}
    frame = pd.DataFrame({
        "image_path": [f"img/{i}.png" for i in range(n)],
        "patient_id": patients,
        "study_id": [f"s{i}" for i in range(n)],
        "source_file": "data.csv",
        "source_row": np.arange(1, n + 1),
        **{f"raw__{c}": v for c, v in raw.items()},
        **columns,
    })
    if official is not None:
        frame["official_split"] = pd.Series(official, dtype=object)
    return apply_uncertain_policy(ensure_columns(frame, list(raw)), list(raw), policy)


# --------------------------------------------------------------------------- labels


@pytest.mark.parametrize("policy, expected", [
    ("zeros", [1.0, 0.0, 0.0, np.nan]),
    ("ones", [1.0, 0.0, 1.0, np.nan]),
    ("ignore", [1.0, 0.0, np.nan, np.nan]),
])
def test_uncertain_policies(policy, expected):
    frame = _canonical(list("abcd"), raw={"edema": [1.0, 0.0, -1.0, np.nan]}, policy=policy)
    np.testing.assert_array_equal(frame[label_column("edema")].to_numpy(), expected)
    np.testing.assert_array_equal(frame["raw__edema"].to_numpy(), [1.0, 0.0, -1.0, np.nan])   # raw kept
    assert all(label_column(c) in frame for c in CLASSES)
    assert frame[label_column("covid19")].isna().all()          # a class the source never labels


def test_unknown_uncertain_policy_is_a_user_error():
    with pytest.raises(IngestError, match="--uncertain must be one of zeros, ones, ignore"):
        _canonical(["a"], policy="maybe")


# --------------------------------------------------------------------------- splits


def test_hashed_splits_are_patient_disjoint_deterministic_and_sized():
    patients = [f"patient{i // 2}" for i in range(6000)]          # 3,000 patients, 2 images each
    frame = _canonical(patients)
    out, aside = assign_splits(frame)
    assert not aside
    assert out.groupby("patient_id")["split"].nunique().max() == 1
    share = out.drop_duplicates("patient_id")["split"].value_counts(normalize=True)
    assert share["train"] == pytest.approx(0.7, abs=0.03)
    assert share["val"] == pytest.approx(0.1, abs=0.02) and share["test"] == pytest.approx(0.2, abs=0.03)
    shuffled, _ = assign_splits(frame.sample(frac=1, random_state=1))
    pd.testing.assert_series_equal(
        shuffled.set_index("image_path")["split"].sort_index(), out.set_index("image_path")["split"].sort_index())
    bigger_test, _ = assign_splits(frame, val_fraction=0.2, test_fraction=0.3)
    assert (bigger_test["split"] == "test").mean() == pytest.approx(0.3, abs=0.03)


def test_official_splits_are_kept_and_train_val_is_cut_into_train_and_val():
    patients = [f"p{i}" for i in range(2000)]
    official = ["train_val"] * 1600 + ["test"] * 300 + ["validate"] * 50 + ["val"] * 50
    out, aside = assign_splits(_canonical(patients, official=official))
    assert not aside
    assert (out["split"].iloc[1600:1900] == "test").all() and (out["split"].iloc[1900:] == "val").all()
    cut = out["split"].iloc[:1600]
    assert set(cut) == {"train", "val"}
    assert (cut == "val").mean() == pytest.approx(0.1 / 0.8, abs=0.03)


def test_patient_in_two_official_splits_is_set_aside_whole():
    patients = ["a", "a", "b", "c", "c"]
    official = ["train", "test", "train", "val", None]
    out, aside = assign_splits(_canonical(patients, official=official))
    assert out["patient_id"].tolist() == ["b"]
    reasons = {(s.row, s.reason) for s in aside}
    assert reasons == {
        (1, "patient in two official splits (test, train)"), (2, "patient in two official splits (test, train)"),
        (4, "patient in two official splits (none, val)"), (5, "patient in two official splits (none, val)"),
    }
    assert [s.image_path for s in aside] == ["img/0.png", "img/1.png", "img/3.png", "img/4.png"]


def test_unknown_official_split_and_leaks_are_refused():
    with pytest.raises(IngestError, match="unknown split value"):
        assign_splits(_canonical(["a"], official=["holdout"]))
    leaked = pd.DataFrame({"patient_id": ["a", "a"], "split": ["train", "test"]})
    with pytest.raises(IngestError, match="1 patient"):
        verify_patient_disjoint(leaked)


# --------------------------------------------------------------------------- writing


def _site_frame() -> pd.DataFrame:
    frame = _canonical(
        ["p1", "p1", "p2", "p3", "p4"],
        raw={"edema": [1.0, 0.0, -1.0, np.nan, 1.0], "pneumonia": [np.nan] * 5},
        official=["train", "train", "val", "test", "test"],
        aux__sex=pd.array([1, 1, 0, None, 0], dtype="Int64"),
        age=[70.0, 70.0, np.nan, 30.0, 81.0],
    )
    frame["aux__age_bin"] = pd.array([3, 3, None, 1, 4], dtype="Int64")
    frame["site"] = "h"
    out, _ = assign_splits(frame)
    return out


def _write(out_dir: Path, frame: pd.DataFrame, **kwargs) -> dict:
    args = dict(classes=["edema", "pneumonia"], source="csv", adapter_version="1", export_root=out_dir,
                set_aside=[SetAside("data.csv", 9, "site 'h' has no labeled class", "x.png")], options={"a": 1})
    args.update(kwargs)
    return write_site(out_dir, "h", frame, **args)


def test_site_json_counts(tmp_path):
    payload = _write(tmp_path, _site_frame())
    site = read_site_json(tmp_path / "h")
    assert site == json.loads(json.dumps(payload))
    assert site["manifest_version"] == MANIFEST_VERSION and site["site"] == "h" and site["source"] == "csv"
    assert site["class_set"] == ["edema"]                        # pneumonia has no labeled row
    assert site["class_counts"]["edema"] == {"positive": 2, "negative": 1, "missing": 2, "uncertain": 1,
                                           "implied_negative": 0}
    assert site["class_counts"]["pneumonia"]["missing"] == 5
    assert site["aux"]["sex"] == {"available": 4, "missing": 1, "counts": {"F": 2, "M": 2}}
    assert site["aux"]["age_bin"]["counts"] == {"20-39": 1, "60-79": 2, "80+": 1}
    assert site["aux"]["race"]["available"] == 0
    assert site["rows"] == 5
    assert site["rows_per_split"] == {"train": 2, "val": 1, "test": 2}
    assert site["patients_per_split"] == {"train": 1, "val": 1, "test": 2}
    assert site["set_aside"]["count"] == 1 and site["set_aside"]["list"] == "set_aside.csv"
    frame = read_manifest(tmp_path / "h")
    assert (frame["site"] == "h").all() and len(frame) == 5
    assert read_manifest(tmp_path / "h", split="test")["patient_id"].tolist() == ["p3", "p4"]


def test_manifests_of_the_22_class_vocabulary_still_load_and_rewrite_with_every_class(tmp_path):
    """Version 2 (22 classes, before VinDr/Open-i/PadChest) reads; missing classes are not labeled."""
    from fedcxr.site_adapters.manifest import label_values
    from fedcxr.vocab import ADDED_CLASSES, CLASSES_V2

    assert CLASSES[:22] == list(CLASSES_V2) and len(CLASSES) == 22 + len(ADDED_CLASSES) == 47
    old = _site_frame().drop(columns=[label_column(c) for c in ADDED_CLASSES])
    assert np.isnan(label_values(old, "nodule_mass")).all() and len(label_values(old, "nodule_mass")) == 5
    np.testing.assert_array_equal(label_values(old, "edema"), old[label_column("edema")].to_numpy(dtype=float))
    payload = _write(tmp_path, old)  # fedcxr shift re-writes an old site: it gains every column
    assert payload["manifest_version"] == MANIFEST_VERSION == 3 and payload["classes_all"] == CLASSES
    assert all(label_column(c) in read_manifest(tmp_path / "h") for c in CLASSES)
    site_json = tmp_path / "h" / "site.json"
    for version, readable in ((2, True), (3, True), (4, False)):
        site_json.write_text(json.dumps({**payload, "manifest_version": version}))
        if readable:
            assert read_site_json(tmp_path / "h")["manifest_version"] == version
        else:
            with pytest.raises(IngestError, match="manifest_version 4 is newer"):
                read_site_json(tmp_path / "h")


def test_content_hash_is_stable_and_follows_content(tmp_path):
    frame = _site_frame()
    first = _write(tmp_path / "a", frame)["content_hash"]
    assert _write(tmp_path / "a", frame)["content_hash"] == first       # re-run into the same folder
    assert _write(tmp_path / "b", frame.copy())["content_hash"] == first  # another folder, same content
    changed = frame.copy()
    changed.loc[changed.index[0], label_column("edema")] = 0.0
    assert _write(tmp_path / "c", changed)["content_hash"] != first


def test_crash_mid_write_leaves_the_previous_files(tmp_path, monkeypatch):
    frame = _site_frame()
    _write(tmp_path, frame)
    before = {p.name: p.read_bytes() for p in (tmp_path / "h").iterdir()}

    def crash(fd):
        raise OSError("disk full")

    monkeypatch.setattr(atomic.os, "fsync", crash)        # bytes are in the temp file, not yet renamed
    changed = frame.copy()
    changed[label_column("edema")] = 0.0
    with pytest.raises(OSError, match="disk full"):
        _write(tmp_path, changed)
    after = {p.name: p.read_bytes() for p in (tmp_path / "h").iterdir()}
    assert after == before                                  # old manifest intact, no temp file left


def test_atomic_write_never_leaves_a_partial_new_file(tmp_path, monkeypatch):
    target = tmp_path / "deep" / "manifest.parquet"

    def crash(src, dst):
        raise OSError("killed")

    monkeypatch.setattr(atomic.os, "replace", crash)
    with pytest.raises(OSError, match="killed"):
        atomic_write_bytes(target, b"x" * 10_000)
    assert list(target.parent.iterdir()) == []


def test_missing_manifest_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="run `fedcxr ingest` first"):
        read_manifest(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="site.json"):
        read_site_json(tmp_path / "nowhere")
