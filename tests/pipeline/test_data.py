"""Per-site data: decode-once cache, dataset items and masks, seeded loaders."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

import fedcxr.pipeline.data as data
from fedcxr.errors import UserError
from fedcxr.pipeline.data import (
    NORM_MEAN,
    NORM_STD,
    AugmentConfig,
    cache_images,
    load_site,
    make_dataset,
    make_loader,
)
from fedcxr.site_adapters.images import read_image_resized
from fedcxr.site_adapters.manifest import write_site
from fedcxr.vocab import AUX_TASKS, CLASSES, aux_column, label_column

SPLIT_CYCLE = ["train", "train", "val", "train", "test"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def write_toy_site(tmp_path, n: int = 20, name: str = "toy", shape=(40, 36)):
    """A PNG export and its ingested site: row i's image is grey 10 * i + 5 with one black and
    one white corner pixel (the decoder scales each image by its own min/max, so these keep the
    grey level unchanged).

    Labels: edema = i % 2 on every row, atelectasis observed on even rows only; the site's
    class set is {edema, atelectasis}. Aux: sex = i % 2 except every third row (unknown).
    """
    root = tmp_path / "export"
    root.mkdir(exist_ok=True)
    records = []
    for i in range(n):
        pixels = np.full(shape, (10 * i + 5) % 256, dtype=np.uint8)  # wraps past row 25
        pixels[0, 0], pixels[-1, -1] = 0, 255
        Image.fromarray(pixels).save(root / f"img{i:03d}.png")
        rec = {
            "image_path": f"img{i:03d}.png", "patient_id": f"p{i}", "study_id": f"s{i}", "site": name,
            "split": SPLIT_CYCLE[i % 5], "age": 50.0, "source_file": "labels.csv", "source_row": i + 1,
        }
        rec.update({label_column(c): np.nan for c in CLASSES})
        rec[label_column("edema")] = float(i % 2)
        rec[label_column("atelectasis")] = float(i % 4 == 0) if i % 2 == 0 else np.nan
        rec.update({aux_column(t): None for t in AUX_TASKS})
        rec[aux_column("sex")] = None if i % 3 == 0 else i % 2
        records.append(rec)
    frame = pd.DataFrame(records)
    for task in AUX_TASKS:
        frame[aux_column(task)] = frame[aux_column(task)].astype("Int64")
    write_site(tmp_path / "sites", name, frame, classes=["edema", "atelectasis"], source="test",
               adapter_version="0", export_root=root, set_aside=[], options={})
    return tmp_path / "sites" / name


@pytest.fixture()
def site(tmp_path):
    return load_site(write_toy_site(tmp_path))


def _counting_decoder(monkeypatch):
    calls = []

    def decode(path, size, *max_pixels):
        calls.append(path)
        return read_image_resized(path, size, *max_pixels)

    monkeypatch.setattr(data, "read_image_resized", decode)
    return calls


def test_load_site_reads_manifest_and_site_json(site, tmp_path):
    assert site.name == "toy"
    assert site.class_set == ["atelectasis", "edema"]
    assert len(site.manifest) == 20
    assert site.export_root == (tmp_path / "export").resolve()
    moved = load_site(tmp_path / "sites" / "toy", export_root=tmp_path / "elsewhere")
    assert moved.export_root == tmp_path / "elsewhere"


def test_load_site_without_ingest_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="site.json"):
        load_site(tmp_path)


def test_cache_is_decoded_once_across_datasets_and_calls(site, tmp_path, monkeypatch):
    calls = _counting_decoder(monkeypatch)
    cache = tmp_path / "cache"
    train = make_dataset(site, "train", classes=["edema"], aux_tasks=[], image_size=16, cache_dir=cache,
                         augment=False, progress=False)
    val = make_dataset(site, "val", classes=["edema"], aux_tasks=[], image_size=16, cache_dir=cache,
                       augment=False, progress=False)
    assert len(calls) == 20  # every manifest row once, for all splits
    again = load_site(site.site_dir)
    make_dataset(again, "test", classes=["edema"], aux_tasks=[], image_size=16, cache_dir=cache,
                 augment=False, progress=False)
    for _ in range(2):  # epochs read the memmap
        for batch in make_loader(train, batch_size=4, shuffle=True, seed=0, augment=False):
            pass
    assert len(calls) == 20
    assert len(train) + len(val) == 16
    make_dataset(site, "train", classes=["edema"], aux_tasks=[], image_size=8, cache_dir=cache,
                 augment=False, progress=False)
    assert len(calls) == 40  # another size is another cache


def test_cache_file_layout_and_alignment_with_manifest(site, tmp_path):
    images = cache_images(site, 12, tmp_path / "cache", progress=False)
    assert isinstance(images, np.memmap) and not images.flags.writeable
    assert images.shape == (20, 12, 12) and images.dtype == np.uint8
    digest = site.meta["content_hash"][:12]
    path = tmp_path / "cache" / f"toy-{digest}-12.u8"
    assert path.is_file() and json.loads(path.with_suffix(".json").read_text())["rows"] == 20
    # row i of the cache is manifest row i: an image of grey 10 * i + 5
    np.testing.assert_array_equal(images[:, 6, 6], np.arange(20) * 10 + 5)
    assert not list((tmp_path / "cache").glob("*.tmp"))


def test_incomplete_cache_is_rebuilt(site, tmp_path, monkeypatch):
    cache_images(site, 12, tmp_path / "cache", progress=False)
    path = next((tmp_path / "cache").glob("*.u8"))
    path.write_bytes(path.read_bytes()[:100])  # a truncated file (disk full, killed copy)
    calls = _counting_decoder(monkeypatch)
    images = cache_images(site, 12, tmp_path / "cache", progress=False)
    assert len(calls) == 20 and images.shape == (20, 12, 12)


def test_cache_of_an_older_decoder_format_is_rebuilt(site, tmp_path, monkeypatch):
    """A cache written before the VOI LUT step (format 1) holds other pixels: decode again."""
    cache_images(site, 12, tmp_path / "cache", progress=False)
    sidecar = next((tmp_path / "cache").glob("*.json"))
    info = json.loads(sidecar.read_text())
    assert info["format"] == data.CACHE_FORMAT >= 2
    sidecar.write_text(json.dumps({**info, "format": 1}))
    calls = _counting_decoder(monkeypatch)
    cache_images(site, 12, tmp_path / "cache", progress=False)
    assert len(calls) == 20
    assert json.loads(sidecar.read_text())["format"] == data.CACHE_FORMAT


def test_undecodable_image_names_the_file(site, tmp_path):
    (site.export_root / "img007.png").write_bytes(b"not an image at all")
    with pytest.raises(UserError, match="img007.png"):
        cache_images(site, 12, tmp_path / "cache", progress=False)
    assert not list((tmp_path / "cache").glob("*"))  # nothing half-written is left


def test_items_labels_masks_and_aux(site, tmp_path):
    classes = ["atelectasis", "edema", "cardiomegaly"]  # cardiomegaly: not labelled by this site
    ds = make_dataset(site, "train", classes=classes, aux_tasks=["view", "sex"], image_size=16,
                      cache_dir=tmp_path / "cache", augment=False, progress=False)
    rows = [i for i in range(20) if SPLIT_CYCLE[i % 5] == "train"]
    assert len(ds) == len(rows)
    for k, i in enumerate(rows):
        item = ds[k]
        assert item["index"] == k
        assert item["image"].shape == (1, 16, 16) and item["image"].dtype == torch.float32
        grey = (10 * i + 5) / 255.0
        assert item["image"][0, 8, 8].item() == pytest.approx((grey - NORM_MEAN) / NORM_STD, abs=1e-5)
        observed_atel = i % 2 == 0
        assert item["label"].tolist() == [float(i % 4 == 0) if observed_atel else 0.0, float(i % 2), 0.0]
        assert item["label_mask"].tolist() == [float(observed_atel), 1.0, 0.0]
        sex = -1 if i % 3 == 0 else i % 2
        assert item["aux"].dtype == torch.int64 and item["aux"].tolist() == [-1, sex]
        assert item["aux_mask"].tolist() == [0.0, float(sex >= 0)]


def test_loss_classes_and_missing_as_negative(site, tmp_path):
    kw = dict(classes=["atelectasis", "edema", "cardiomegaly"], aux_tasks=[], image_size=8,
              cache_dir=tmp_path / "cache", augment=False, progress=False)
    only_edema = make_dataset(site, "train", loss_classes=["edema"], **kw)
    assert only_edema.label_mask[:, 0].sum() == 0 and only_edema.label_mask[:, 1].all()
    vanilla = make_dataset(site, "train", loss_classes=kw["classes"], missing_as_negative=True, **kw)
    assert vanilla.label_mask.all()  # every class counts; unobserved labels are negatives
    assert vanilla.labels[:, 2].sum() == 0


def as_version_2(site_dir) -> None:
    """Rewrite a site as fedcxr wrote it with 22 classes (manifest version 2, no new label columns)."""
    from fedcxr.vocab import ADDED_CLASSES

    path = site_dir / "manifest.parquet"
    pd.read_parquet(path).drop(columns=[label_column(c) for c in ADDED_CLASSES]).to_parquet(path, index=False)
    meta = json.loads((site_dir / "site.json").read_text())
    meta.update(manifest_version=2, classes_all=CLASSES[:22])
    (site_dir / "site.json").write_text(json.dumps(meta))


def test_a_version_2_manifest_reads_its_missing_classes_as_not_labeled(tmp_path):
    """A site ingested before nodule_mass existed trains beside one that labels it: no error, masked out."""
    site_dir = write_toy_site(tmp_path)
    as_version_2(site_dir)
    old = load_site(site_dir)
    assert "label__nodule_mass" not in old.manifest and len(old.manifest.columns) > 0
    ds = make_dataset(old, "train", classes=["edema", "nodule_mass"], aux_tasks=[], image_size=8,
                      cache_dir=tmp_path / "cache", augment=False, progress=False)
    assert ds.label_mask[:, 1].sum() == 0 and ds.label_mask[:, 0].all()  # not labeled, not a negative
    assert ds.labels[:, 0].tolist() == [float(i % 2) for i in range(20) if SPLIT_CYCLE[i % 5] == "train"]
    vanilla = make_dataset(old, "train", classes=["edema", "nodule_mass"], aux_tasks=[], image_size=8,
                           cache_dir=tmp_path / "cache", augment=False, progress=False,
                           loss_classes=["edema", "nodule_mass"], missing_as_negative=True)
    assert vanilla.label_mask.all() and vanilla.labels[:, 1].sum() == 0  # as any class the site never labels


def test_aux_code_beyond_head_size_is_a_user_error(site, tmp_path):
    with pytest.raises(UserError, match="aux__sex"):
        make_dataset(site, "train", classes=["edema"], aux_tasks={"sex": 1}, image_size=8,
                     cache_dir=tmp_path / "cache", augment=False, progress=False)


def test_unknown_split_is_a_user_error(site, tmp_path):
    with pytest.raises(UserError, match="split"):
        make_dataset(site, "training", classes=["edema"], aux_tasks=[], image_size=8,
                     cache_dir=tmp_path / "cache", augment=False, progress=False)


def _textured_site(tmp_path):
    """Images with structure (a gradient plus noise) so that rotation and zoom change pixels."""
    site = load_site(write_toy_site(tmp_path))
    rng = np.random.default_rng(0)
    for i in range(20):
        img = (np.linspace(0, 200, 36)[None, :] + rng.integers(0, 50, (40, 36))).astype(np.uint8)
        Image.fromarray(img).save(site.export_root / f"img{i:03d}.png")
    return site


def _epoch(loader):
    return [(b["index"].clone(), b["image"].clone()) for b in loader]


def test_same_seed_same_batches_and_augmentations(tmp_path):
    site = _textured_site(tmp_path)
    ds = make_dataset(site, "train", classes=["edema"], aux_tasks=[], image_size=16,
                      cache_dir=tmp_path / "cache", augment=True, progress=False,
                      augment_config=AugmentConfig(prob=1.0, hflip=True))
    a = make_loader(ds, batch_size=4, shuffle=True, seed=7, augment=True)
    b = make_loader(ds, batch_size=4, shuffle=True, seed=7, augment=True)
    torch.manual_seed(123)  # global RNG state must not matter
    a0, a1 = _epoch(a), _epoch(a)
    torch.manual_seed(999)
    np.random.seed(5)
    b0, b1 = _epoch(b), _epoch(b)
    for (ia, xa), (ib, xb) in zip(a0 + a1, b0 + b1):
        assert torch.equal(ia, ib) and torch.equal(xa, xb)
    assert not all(torch.equal(x, y) for (_, x), (_, y) in zip(a0, a1))  # epochs differ
    c = make_loader(ds, batch_size=4, shuffle=True, seed=8, augment=True)
    assert not all(torch.equal(x, y) for (_, x), (_, y) in zip(a0, _epoch(c)))
    resumed = make_loader(ds, batch_size=4, shuffle=True, seed=7, augment=True)
    resumed.set_epoch(1)
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a1, _epoch(resumed)))


def test_augment_flag_of_the_loader_controls_augmentation(tmp_path):
    site = _textured_site(tmp_path)
    ds = make_dataset(site, "train", classes=["edema"], aux_tasks=[], image_size=16,
                      cache_dir=tmp_path / "cache", augment=True, progress=False,
                      augment_config=AugmentConfig(prob=1.0))
    plain = torch.cat([b["image"] for b in make_loader(ds, batch_size=4, shuffle=False, seed=0, augment=False)])
    expected = torch.stack([(ds.image(i) - NORM_MEAN) / NORM_STD for i in range(len(ds))])
    assert torch.allclose(plain, expected)
    augmented = torch.cat([b["image"] for b in make_loader(ds, batch_size=4, shuffle=False, seed=0, augment=True)])
    assert augmented.shape == plain.shape and not torch.allclose(augmented, plain)
    assert ds.augment is True  # the dataset's own setting is restored after iterating


def test_loader_index_is_position_in_a_subset(site, tmp_path):
    ds = make_dataset(site, "train", classes=["edema"], aux_tasks=[], image_size=8,
                      cache_dir=tmp_path / "cache", augment=False, progress=False)
    subset = torch.utils.data.Subset(ds, [5, 1, 3])
    batch = next(iter(make_loader(subset, batch_size=3, shuffle=False, seed=0, augment=False)))
    assert batch["index"].tolist() == [0, 1, 2]
    assert torch.equal(batch["label"], torch.stack([ds[5]["label"], ds[1]["label"], ds[3]["label"]]))


def test_worker_processes_give_reproducible_augmented_batches(tmp_path):
    site = _textured_site(tmp_path)
    ds = make_dataset(site, "train", classes=["edema"], aux_tasks=[], image_size=16,
                      cache_dir=tmp_path / "cache", augment=True, progress=False,
                      augment_config=AugmentConfig(prob=1.0))
    runs = [_epoch(make_loader(ds, batch_size=4, shuffle=True, seed=3, augment=True, num_workers=2))
            for _ in range(2)]
    for (ia, xa), (ib, xb) in zip(*runs):
        assert torch.equal(ia, ib) and torch.equal(xa, xb)


def test_cache_built_by_several_processes_equals_the_one_built_by_one(tmp_path):
    """More rows than one decode chunk, so the parallel path (bounded, in order) really runs."""
    site = load_site(write_toy_site(tmp_path, n=150, shape=(30, 26)))
    one = np.array(cache_images(site, 12, tmp_path / "one", progress=False, workers=1))
    many = np.array(cache_images(site, 12, tmp_path / "many", progress=False, workers=2))
    assert one.shape == (150, 12, 12)
    np.testing.assert_array_equal(one, many)
    np.testing.assert_array_equal(many[:, 6, 6], (np.arange(150) * 10 + 5) % 256)


def test_undecodable_image_names_the_file_in_parallel_too(tmp_path):
    site = load_site(write_toy_site(tmp_path, n=100, shape=(20, 20)))
    (site.export_root / "img077.png").write_bytes(b"broken")
    with pytest.raises(UserError, match=r"img077.png \(manifest row 77\)"):
        cache_images(site, 8, tmp_path / "cache", progress=False, workers=2)
    assert not list((tmp_path / "cache").glob("*"))


@pytest.mark.parametrize("options", [
    {"num_workers": 2},
    {"num_workers": 2, "persistent_workers": True, "prefetch_factor": 3},
])
def test_augmented_batches_do_not_depend_on_worker_settings(tmp_path, options):
    """An item's augmentation is seeded by (seed, epoch, position): workers, persistent or not,
    give the batches of the main process, epoch after epoch, and set_epoch still resumes."""
    site = _textured_site(tmp_path)
    ds = make_dataset(site, "train", classes=["edema"], aux_tasks=[], image_size=16,
                      cache_dir=tmp_path / "cache", augment=True, progress=False,
                      augment_config=AugmentConfig(prob=1.0))
    main = make_loader(ds, batch_size=4, shuffle=True, seed=3, augment=True)
    workers = make_loader(ds, batch_size=4, shuffle=True, seed=3, augment=True, **options)
    expected = [_epoch(main), _epoch(main), _epoch(main)]
    got = [_epoch(workers), _epoch(workers), _epoch(workers)]
    for epoch_expected, epoch_got in zip(expected, got):
        for (ia, xa), (ib, xb) in zip(epoch_expected, epoch_got):
            assert torch.equal(ia, ib) and torch.equal(xa, xb)
    resumed = make_loader(ds, batch_size=4, shuffle=True, seed=3, augment=True, **options)
    resumed.set_epoch(2)
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(expected[2], _epoch(resumed)))
    plain = make_loader(ds, batch_size=4, shuffle=False, seed=3, augment=False, **options)
    first = next(iter(plain))["image"]
    assert torch.equal(first, torch.stack([(ds.image(i) - NORM_MEAN) / NORM_STD for i in range(4)]))


def _all_levels_dataset(images: np.ndarray) -> "data.SiteDataset":
    frame = pd.DataFrame({label_column("edema"): np.arange(len(images)) % 2})
    return data.SiteDataset(images, frame, np.arange(len(images)), classes=["edema"], aux_tasks=[],
                            loss_classes=["edema"])


@pytest.mark.parametrize("on_disk", [False, True])
def test_unaugmented_batches_equal_the_items_for_every_pixel_value(tmp_path, on_disk):
    """The batch path's folded normalisation (x·4/255 − 2) is the item path's ((x/255 − ½)/¼)
    bit for bit on all 256 uint8 values, read from an array or a memmap, in and out of order."""
    levels = np.arange(256, dtype=np.uint8).reshape(16, 4, 4)
    if on_disk:
        path = tmp_path / "cache.u8"
        levels.tofile(path)
        levels = np.memmap(path, dtype=np.uint8, mode="r", shape=(16, 4, 4))
    ds = _all_levels_dataset(levels)
    for shuffle in (False, True):
        for batch in make_loader(ds, batch_size=5, shuffle=shuffle, seed=1, augment=False):
            expected = torch.stack([ds[int(i)]["image"] for i in batch["index"]])
            assert torch.equal(batch["image"], expected)
            assert torch.equal(batch["label"], torch.stack([ds[int(i)]["label"] for i in batch["index"]]))


def test_fetch_reads_into_a_given_buffer_or_refuses_one_that_does_not_fit():
    ds = _all_levels_dataset(np.arange(256, dtype=np.uint8).reshape(16, 4, 4))
    fresh = ds.fetch(np.array([7, 2, 9]))
    buffer = torch.zeros((5, 1, 4, 4), dtype=torch.uint8)
    reused = ds.fetch(np.array([7, 2, 9]), buffer)
    assert torch.equal(reused["pixels"], fresh["pixels"]) and reused["pixels"].data_ptr() == buffer.data_ptr()
    assert torch.equal(fresh["pixels"][:, 0], torch.from_numpy(ds.images[[7, 2, 9]]))
    with pytest.raises(ValueError, match="cannot hold"):
        ds.fetch(np.array([1, 2, 3]), torch.zeros((5, 1, 4, 5), dtype=torch.uint8))
