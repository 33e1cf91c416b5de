"""Batch augmentation on the device: the same draws and pixels as MONAI's per-item transforms."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from fedcxr.pipeline.augment import (
    AugmentConfig,
    _runs,
    _zoom_taps,
    augment_batch,
    augment_item,
    augment_pixels,
    draw,
    make_augmentation,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _images(n: int, size: int, seed: int = 0) -> torch.Tensor:
    """Smooth structure plus noise in [0, 1], so rotation and zoom move real content."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 0.8, size, dtype=np.float32)
    base = ramp[None, :] * ramp[:, None] + 0.2 * rng.random((n, size, size), dtype=np.float32)
    return torch.from_numpy(base.astype(np.float32))[:, None]


def _monai_draws(cfg: AugmentConfig, seed: int) -> dict:
    """What MONAI's own Compose drew for ``seed`` (read back from its transforms after a call)."""
    compose = make_augmentation(cfg)
    augment_item(compose, torch.zeros(1, 8, 8), seed)
    out = {"angle": np.nan, "zoom": np.nan, "gamma": np.nan, "flip": False}
    for step, transform in zip(cfg.steps(), compose.transforms):
        if not transform._do_transform:
            continue
        if step == "rotate":
            out["angle"] = transform.rand_rotate.x
        elif step == "zoom":
            out["zoom"] = transform.rand_zoom._zoom[0]
        elif step == "gamma":
            out["gamma"] = transform.adjuster.gamma_value
        else:
            out["flip"] = True
    return out


@pytest.mark.parametrize("cfg", [AugmentConfig(), AugmentConfig(prob=0.7, hflip=True, rotate_deg=25, zoom=(0.8, 1.3))])
def test_draws_are_the_ones_monai_makes_for_each_seed(cfg):
    seeds = [0, 1, 7, 2**31 + 5, 2**40 + 3, 123456789]
    ours = draw(cfg, seeds)
    for i, seed in enumerate(seeds):
        theirs = _monai_draws(cfg, seed)
        np.testing.assert_equal(ours.angle[i], theirs["angle"])
        np.testing.assert_equal(ours.zoom[i], theirs["zoom"])
        np.testing.assert_equal(ours.gamma[i], theirs["gamma"])
        assert ours.flip[i] == theirs["flip"]
    assert np.isnan(ours.angle).any() and not np.isnan(ours.angle).all()  # some seeds rotate, some do not


@pytest.mark.parametrize("size", [16, 31])
def test_batch_path_equals_monai_item_by_item(size):
    """Every item of a batch comes out as MONAI's per-item Compose makes it (float rounding apart)."""
    cfg = AugmentConfig(prob=0.5, hflip=True)
    images = _images(24, size)
    seeds = list(range(500, 524))
    batch = augment_batch(images, seeds, cfg)
    reference = make_augmentation(cfg)
    expected = torch.stack([augment_item(reference, images[i], seeds[i]) for i in range(len(seeds))])
    assert batch.shape == images.shape and batch.dtype == torch.float32
    torch.testing.assert_close(batch, expected, rtol=0, atol=2e-5)
    changed = (batch - images).flatten(1).abs().amax(1) > 1e-4
    assert changed.any() and not changed.all()  # prob 0.5: some items augmented, some untouched
    assert torch.equal(batch[~changed], images[~changed])  # untouched items are the input, bit for bit


def test_an_items_augmentation_does_not_depend_on_its_batch():
    cfg = AugmentConfig(prob=1.0)
    images = _images(6, 20)
    seeds = [11, 12, 13, 14, 15, 16]
    whole = augment_batch(images, seeds, cfg)
    halves = torch.cat([augment_batch(images[:2], seeds[:2], cfg), augment_batch(images[2:], seeds[2:], cfg)])
    reordered = augment_batch(images[[5, 0, 3]], [seeds[5], seeds[0], seeds[3]], cfg)
    torch.testing.assert_close(whole, halves, rtol=0, atol=1e-6)
    torch.testing.assert_close(whole[[5, 0, 3]], reordered, rtol=0, atol=1e-6)


def test_zoom_taps_by_hand():
    """Area zoom of 4 px by 0.5: 2 output px averaging pairs, padded by 1 each side."""
    idx, w = _zoom_taps(4, 0.5)
    assert idx.tolist() == [[0, 0], [0, 1], [2, 3], [0, 0]]
    assert w.tolist() == [[0.0, 0.0], [0.5, 0.5], [0.5, 0.5], [0.0, 0.0]]
    # zoom in by 1.5 to 6 px: windows [0] [0,1] [1] [2] [2,3] [3]; centre crop from 6//2 - 4//2 = 1
    idx, w = _zoom_taps(4, 1.5)
    assert idx.tolist() == [[0, 1], [1, 2], [2, 3], [2, 3]]
    assert w.tolist() == [[0.5, 0.5], [1.0, 0.0], [1.0, 0.0], [0.5, 0.5]]


def test_augmentation_runs_on_the_tensors_device():
    images = _images(4, 12)
    out = augment_batch(images.to("cpu"), [1, 2, 3, 4], AugmentConfig(prob=1.0))
    assert out.device == images.device and torch.isfinite(out).all()


@pytest.mark.slow  # a fresh interpreter importing torch
def test_monai_transforms_are_imported_only_for_augmentation(tmp_path):
    """Loading batches without augmentation imports no MONAI; with it, the batch path needs none
    either (MONAI is only the per-item reference)."""
    script = textwrap.dedent("""
        import sys
        import numpy as np, pandas as pd
        from fedcxr.pipeline.data import SiteDataset, make_loader
        from fedcxr.vocab import label_column
        images = np.zeros((8, 16, 16), np.uint8)
        frame = pd.DataFrame({label_column("edema"): np.zeros(8)})
        ds = SiteDataset(images, frame, np.arange(8), classes=["edema"], aux_tasks=[], loss_classes=["edema"])
        for augment in (False, True):
            for batch in make_loader(ds, batch_size=4, shuffle=True, seed=0, augment=augment):
                pass
            print(augment, "monai.transforms" in sys.modules, "monai" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False", "True", "False", "False"]


def test_runs_order_items_so_each_transform_is_a_few_slices():
    """Items 0-7 draw (rotate, zoom, gamma) = the bits of their number: Gray-code order
    001 011 010 110 111 101 100 (item 0 draws nothing and is left out)."""
    flags = np.array([[i >> 2 & 1, i >> 1 & 1, i & 1] for i in range(8)], dtype=bool)
    order, runs = _runs(flags)
    assert order.tolist() == [1, 3, 2, 6, 7, 5, 4]
    assert runs == [[(3, 7)], [(1, 5)], [(0, 2), (4, 6)]]
    order, runs = _runs(np.zeros((3, 2), dtype=bool))
    assert order.size == 0 and runs == [[], []]


def test_batch_path_equals_monai_on_a_non_square_image():
    """The rotation grid's aspect terms (H != W) and the zoom's two axes, against MONAI."""
    cfg = AugmentConfig(prob=1.0)
    rng = np.random.default_rng(3)
    images = torch.from_numpy((np.linspace(0, 0.8, 28, dtype=np.float32)[None, None, None, :]
                               + 0.2 * rng.random((6, 1, 20, 28), dtype=np.float32)))
    seeds = list(range(40, 46))
    batch = augment_batch(images, seeds, cfg)
    reference = make_augmentation(cfg)
    expected = torch.stack([augment_item(reference, images[i], seeds[i]) for i in range(len(seeds))])
    torch.testing.assert_close(batch, expected, rtol=0, atol=2e-5)


def test_the_loaders_uint8_entry_equals_augment_batch_bit_for_bit():
    """augment_pixels (uint8 in, reordered before conversion) is augment_batch on pixels·scale."""
    cfg = AugmentConfig(prob=0.5, hflip=True)
    pixels = (_images(24, 18) * 255).to(torch.uint8)
    seeds = list(range(900, 924))
    scale = float(np.float32(1 / 255))
    expected = augment_batch(pixels.float() * scale, seeds, cfg)
    assert torch.equal(augment_pixels(pixels, seeds, scale, cfg), expected)
    nothing = AugmentConfig(prob=0.0)
    assert torch.equal(augment_pixels(pixels, seeds, scale, nothing), pixels.float() * scale)
