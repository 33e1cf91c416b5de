"""SOURCE ``medmnist``: npz → PNG files + canonical rows, on real PneumoniaMNIST and a tiny ChestMNIST."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedcxr.site_adapters.base import AdapterOptions, IngestError
from fedcxr.site_adapters.ingest import run_ingest
from fedcxr.site_adapters.manifest import read_manifest, read_site_json
from fedcxr.site_adapters.medmnist import read_medmnist

CHEST_CLASSES = [
    "atelectasis", "cardiomegaly", "pleural_effusion", "infiltration", "mass", "nodule", "pneumonia",
    "pneumothorax", "consolidation", "edema", "emphysema", "fibrosis", "pleural_thickening", "hernia",
]


def _npz(path: Path, sizes=(6, 3, 4), width=14, shape=(28, 28), seed=0, **override) -> Path:
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, n in zip(("train", "val", "test"), sizes):
        arrays[f"{split}_images"] = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
        arrays[f"{split}_labels"] = rng.integers(0, 2, (n, width), dtype=np.uint8)
    arrays.update(override)
    arrays = {k: v for k, v in arrays.items() if v is not None}
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return path


def _opts(tmp_path: Path, **extra) -> AdapterOptions:
    return AdapterOptions(extra={"image_dir": tmp_path / "png", **extra})


# --------------------------------------------------------------------------- real PneumoniaMNIST


@pytest.fixture(scope="module")
def pneumonia(shared_data, tmp_path_factory):
    npz = shared_data / "medmnist" / "pneumoniamnist_merged.npz"
    table = read_medmnist(npz, AdapterOptions(extra={"out_dir": tmp_path_factory.mktemp("pm")}))
    return npz, table


def test_real_pneumoniamnist_counts_and_labels(pneumonia):
    _, table = pneumonia
    frame = table.frame
    assert table.classes == ["pneumonia"] and table.rows_read == len(frame) == 5835
    counts = frame.groupby("official_split")["raw__pneumonia"].agg(["size", "sum"]).to_dict("index")
    assert counts == {"train": {"size": 4690, "sum": 3477}, "val": {"size": 524, "sum": 389},
                      "test": {"size": 621, "sum": 387}}
    assert frame["patient_id"].is_unique and frame["patient_id"].iloc[0] == "train-0"
    assert any("no patient ids" in n for n in table.notes)
    assert frame["aux__sex"].isna().all() and frame["age"].isna().all()


def test_real_pneumoniamnist_pngs_hold_the_npz_pixels(pneumonia):
    npz, table = pneumonia
    with np.load(npz) as data:
        for split, i in (("train", 0), ("val", 523), ("test", 620)):
            row = table.frame.loc[table.frame["image_path"] == f"{split}/{i}.png"].iloc[0]
            assert row["source_file"] == f"{npz.name}:{split}" and row["source_row"] == i + 1
            png = np.asarray(Image.open(table.root / row["image_path"]))
            np.testing.assert_array_equal(png, data[f"{split}_images"][i])
            assert row["raw__pneumonia"] == data[f"{split}_labels"][i, 0]


# --------------------------------------------------------------------------- synthetic ChestMNIST


def test_chestmnist_labels_in_medmnist_order(tmp_path):
    npz = _npz(tmp_path / "in" / "chestmnist_tiny.npz")
    table = read_medmnist(npz.parent, _opts(tmp_path))      # a folder holding exactly one npz
    assert sorted(table.classes) == sorted(CHEST_CLASSES)
    with np.load(npz) as data:
        labels = data["val_labels"]
    val = table.frame.loc[table.frame["official_split"] == "val"].reset_index(drop=True)
    for j, cls in enumerate(CHEST_CLASSES):
        np.testing.assert_array_equal(val[f"raw__{cls}"].to_numpy(), labels[:, j])
    assert val["patient_id"].tolist() == ["val-0", "val-1", "val-2"]


def test_rgb_and_channel_last_images_become_grey_pngs(tmp_path):
    rgb = np.zeros((6, 8, 8, 3), dtype=np.uint8)
    rgb[..., 0] = 255                                        # pure red → luma 76
    npz = _npz(tmp_path / "chestmnist_rgb.npz", shape=(8, 8), train_images=rgb,
               val_images=np.full((3, 8, 8, 1), 7, dtype=np.uint8))
    table = read_medmnist(npz, _opts(tmp_path))
    assert np.asarray(Image.open(table.root / "train/0.png")).tolist() == [[76] * 8] * 8
    assert np.asarray(Image.open(table.root / "val/2.png")).max() == 7


def test_rerun_rewrites_only_changed_pngs(tmp_path):
    npz = _npz(tmp_path / "chestmnist_x.npz")
    table = read_medmnist(npz, _opts(tmp_path))
    kept, damaged = table.root / "train/0.png", table.root / "train/1.png"
    damaged.write_bytes(b"not a png")
    before = kept.stat().st_mtime_ns
    read_medmnist(npz, _opts(tmp_path))
    assert kept.stat().st_mtime_ns == before
    assert damaged.read_bytes()[:4] == b"\x89PNG"


def test_npz_selection(tmp_path):
    folder = tmp_path / "two"
    _npz(folder / "chestmnist_a.npz")
    _npz(folder / "chestmnist_b.npz", sizes=(2, 2, 2))
    with pytest.raises(IngestError, match=r"exactly one \.npz.*chestmnist_a\.npz, chestmnist_b\.npz"):
        read_medmnist(folder, _opts(tmp_path))
    table = read_medmnist(folder, _opts(tmp_path, npz="chestmnist_b.npz"))
    assert len(table.frame) == 6


@pytest.mark.parametrize("name, override, message", [
    ("chestmnist_k.npz", {"test_labels": None}, "missing array 'test_labels'"),
    ("chestmnist_v.npz", {"val_labels": np.full((3, 14), 2, dtype=np.uint8)}, "val_labels row 1 column 0 holds 2"),
    ("chestmnist_s.npz", {"train_labels": np.zeros((5, 14), dtype=np.uint8)}, "train_labels has shape"),
    ("chestmnist_d.npz", {"train_images": np.zeros((6, 4, 4), dtype=np.float32)}, "expected uint8"),
])
def test_bad_npz_contents_are_named(tmp_path, name, override, message):
    npz = _npz(tmp_path / name, **override)
    with pytest.raises(IngestError, match=message):
        read_medmnist(npz, _opts(tmp_path))


def test_task_from_name_or_width(tmp_path):
    with pytest.raises(IngestError, match="pneumoniamnist file has 1 label"):
        read_medmnist(_npz(tmp_path / "pneumoniamnist_bad.npz"), _opts(tmp_path))
    with pytest.raises(IngestError, match="cannot tell the MedMNIST task"):
        read_medmnist(_npz(tmp_path / "mystery.npz", width=1), _opts(tmp_path))
    table = read_medmnist(_npz(tmp_path / "mystery14.npz"), _opts(tmp_path))   # 14 labels → ChestMNIST
    assert len(table.classes) == 14
    with pytest.raises(IngestError, match="no folder to write the PNGs"):
        read_medmnist(_npz(tmp_path / "chestmnist_n.npz"), AdapterOptions())
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(IngestError, match="expected a MedMNIST .npz"):
        read_medmnist(tmp_path / "notes.txt", _opts(tmp_path))


def test_ingest_keeps_official_splits_and_writes_pngs_under_out(tmp_path):
    npz = _npz(tmp_path / "in" / "pneumoniamnist_tiny.npz", sizes=(40, 10, 12), width=1)
    out = tmp_path / "out"
    report = run_ingest("medmnist", npz, out, site_by="skew:2:alpha=1", progress=False)
    assert report["rows_read"] == report["rows_kept"] == 62
    frames = [read_manifest(out / s) for s in report["sites"]]
    assert sum((f["split"] == "train").sum() for f in frames) == 40
    assert all((f["split"] == f["image_path"].str.split("/").str[0]).all() for f in frames)
    assert not any(f["patient_id"].str.contains("-").any() for f in frames)  # keyed, not <split>-<i>
    assert (out / "_images" / "pneumoniamnist_tiny" / "test" / "11.png").is_file()
    assert read_site_json(out / "site-1")["export_root"].endswith("pneumoniamnist_tiny")
