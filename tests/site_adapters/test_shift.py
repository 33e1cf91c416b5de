"""``fedcxr shift``: a seeded covariate shift of real PneumoniaMNIST X-rays into a new site."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedcxr.cli import main
from fedcxr.errors import UserError
from fedcxr.site_adapters.images import read_image, read_image_resized
from fedcxr.site_adapters.ingest import run_ingest
from fedcxr.site_adapters.manifest import read_manifest, read_site_json
from fedcxr.site_adapters.shift import KINDS, LEVELS, shift_image, shift_site, shifted_path


@pytest.fixture(scope="module")
def real_site(shared_data, tmp_path_factory) -> Path:
    """12 real PneumoniaMNIST images per split (from the merged npz) ingested as one site."""
    data = np.load(shared_data / "medmnist" / "pneumoniamnist_merged.npz")
    root = tmp_path_factory.mktemp("shift")
    small = {f"{s}_{k}": data[f"{s}_{k}"][:12] for s in ("train", "val", "test") for k in ("images", "labels")}
    np.savez(root / "pneumoniamnist_small.npz", **small)
    run_ingest("medmnist", root / "pneumoniamnist_small.npz", root / "manifests", progress=False)
    return root / "manifests" / "medmnist"


def _pixels(site_dir: Path, size: int = 28) -> np.ndarray:
    meta, frame = read_site_json(site_dir), read_manifest(site_dir)
    return np.stack([read_image_resized(Path(meta["export_root"]) / p, size) for p in frame["image_path"]])


def test_level_zero_is_the_identity(real_site, tmp_path):
    for kind in KINDS:
        image = read_image(Path(read_site_json(real_site)["export_root"]) / read_manifest(real_site)["image_path"][0])
        assert np.array_equal(shift_image(image, kind, 0, seed=3), image)
    shift_site(real_site, tmp_path / "out", kind="mix", level=0, progress=False)
    # what training decodes (the cache's pixels) is unchanged
    assert np.array_equal(_pixels(tmp_path / "out" / "medmnist"), _pixels(real_site))


def test_rows_labels_and_splits_are_kept_and_the_hash_changes(real_site, tmp_path):
    payload = shift_site(real_site, tmp_path / "out", kind="noise", level=2, seed=1, site_name="shifted", progress=False)
    before, after = read_manifest(real_site), read_manifest(tmp_path / "out" / "shifted")
    cols = ["patient_id", "image_key", "split", "label__pneumonia"]  # same images, same keyed names
    assert after[cols].equals(before[cols])
    assert all(p.startswith("noise2-seed1/") and p.endswith(".png") for p in after["image_path"])
    assert payload["content_hash"] != read_site_json(real_site)["content_hash"]
    recorded = payload["options"]["shift"]
    assert (recorded["kind"], recorded["level"], recorded["seed"], recorded["noise_std"]) == ("noise", 2, 1, LEVELS[2].noise_std)
    assert payload["class_set"] == ["pneumonia"] and payload["rows_per_split"] == {"train": 12, "val": 12, "test": 12}


def test_same_seed_same_bytes_other_seed_other_noise(real_site, tmp_path):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        shift_site(real_site, tmp_path / name, kind="mix", level=3, seed=seed, progress=False)
    files = sorted((tmp_path / "a" / "_images").rglob("*.png"))
    assert len(files) == 36
    for f in files:
        rel = f.relative_to(tmp_path / "a")
        assert (tmp_path / "b" / rel).read_bytes() == f.read_bytes()
    assert not np.array_equal(_pixels(tmp_path / "a" / "medmnist"), _pixels(tmp_path / "c" / "medmnist"))


@pytest.mark.parametrize("kind", KINDS)
def test_strength_grows_with_the_level(real_site, kind):
    meta, frame = read_site_json(real_site), read_manifest(real_site)
    images = [read_image(Path(meta["export_root"]) / p) for p in frame["image_path"][:8]]
    distance = [np.mean([np.abs(shift_image(im, kind, level, seed=i) - im).mean() for i, im in enumerate(images)])
                for level in sorted(LEVELS)]
    assert distance[0] == 0.0
    assert all(b > a for a, b in zip(distance, distance[1:])), distance


def test_cli_writes_a_site_and_rejects_bad_input(real_site, tmp_path, capsys):
    assert main(["shift", str(real_site), "--out", str(tmp_path / "o"), "--kind", "blur", "--level", "1", "-q"]) == 0
    assert (tmp_path / "o" / "medmnist" / "manifest.parquet").is_file()
    assert main(["shift", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o2"), "--kind", "blur",
                 "--level", "1", "-q"]) == 2
    assert "no site.json" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["shift", str(real_site), "--out", str(tmp_path / "o3"), "--kind", "blur", "--level", "7"])
    assert exc.value.code == 2


def test_paths_that_leave_the_root_are_refused():
    assert shifted_path("a/b.jpg", "gamma", 2, 0) == "gamma2-seed0/a/b.jpg.png"
    with pytest.raises(UserError, match="leaves the export root"):
        shifted_path("../x.png", "gamma", 2, 0)
    with pytest.raises(UserError, match="--level"):
        shift_image(np.zeros((4, 4), np.float32), "gamma", 9)


# --------------------------------------------------------------------------- shortcut marker


def test_shortcut_marks_the_given_share_of_each_label_in_every_split(real_site, tmp_path):
    """Sources 0.95/0.05, target reversed: exact counts per split and label, only the corner changes."""
    from fedcxr.site_adapters.shift import Shortcut, add_marker

    spec = Shortcut("pneumonia", 0.75, 0.25)
    payload = shift_site(real_site, tmp_path / "out", kind="shortcut", shortcut=spec, seed=0, progress=False)
    before, after = read_manifest(real_site), read_manifest(tmp_path / "out" / "medmnist")
    assert after[["patient_id", "split", "label__pneumonia"]].equals(before[["patient_id", "split", "label__pneumonia"]])
    assert all(p.startswith("shortcut75-25-seed0/") for p in after["image_path"])
    old, new = _pixels(real_site), _pixels(tmp_path / "out" / "medmnist")
    corner = (new[:, :4, :4] == 255).all(axis=(1, 2))
    assert np.array_equal(new[~corner], old[~corner])  # unmarked images: the very same pixels
    outside = np.abs(new.astype(int) - old.astype(int))
    outside[:, :4, :4] = 0
    # marked: the corner only, up to the decode path's min/max rescaling when the marker hides the darkest pixel
    assert outside[corner].max() <= 16 and outside[corner].mean() < 1
    for split in ("train", "val", "test"):
        for value, rate in ((1.0, 0.75), (0.0, 0.25)):
            rows = ((after["split"] == split) & (after["label__pneumonia"] == value)).to_numpy()
            assert corner[rows].sum() == round(rate * rows.sum()), (split, value)
    assert payload["options"]["shift"]["positive_rate"] == 0.75
    assert add_marker(np.zeros((28, 28), np.float32)).sum() == 16.0  # 4 x 4 px at 28 px


def test_shortcut_cli_and_its_errors(real_site, tmp_path, capsys):
    assert main(["shift", str(real_site), "--out", str(tmp_path / "o"), "--kind", "shortcut",
                 "--marker-rates", "0.05", "0.95", "-q"]) == 0
    assert "5% of pneumonia-positive" in capsys.readouterr().out
    for bad, message in ((["--kind", "shortcut"], "needs --marker-rates"),
                         (["--kind", "shortcut", "--marker-rates", "0.9", "0.1", "--level", "2"], "no --level"),
                         (["--kind", "shortcut", "--marker-rates", "1.5", "0.1"], "must lie in"),
                         (["--kind", "shortcut", "--marker-rates", "0.9", "0.1", "--marker-class", "edema"],
                          "does not label it"),
                         (["--kind", "noise"], "needs --level")):
        assert main(["shift", str(real_site), "--out", str(tmp_path / "bad"), *bad, "-q"]) == 2
        assert message in capsys.readouterr().err
