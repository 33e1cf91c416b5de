"""Steady-state epochs from a decode-once cache: fedcxr's batch loader against MONAI's datasets.

Every contender serves the same ``--n`` images (``--size`` px, uint8, as a site's cache holds
them) with their 14 labels, shuffled, in batches of ``--batch-size``, in this process with one
torch thread and no loader workers (per-core rates); the cache is built before timing, and each
epoch is timed after one warm-up epoch. Epochs of all contenders are interleaved
``--repeats`` times (the median counts) and the load average is printed with them.

Without augmentation (goal: fedcxr ≥ 1.0× MONAI CacheDataset):

* ``fedcxr batch``: :func:`fedcxr.pipeline.data.make_loader` over a :class:`SiteDataset` (uint8
  memmap; whole batches read, converted and normalised at once, labels/masks sliced);
* ``fedcxr per item``: the same dataset item by item + ``default_collate`` (the loader before
  the batch path);
* ``MONAI CacheDataset``: ``CacheDataset`` of ``{"image", "label"}`` with the deterministic
  transforms (cast to float, scale to [0, 1], normalise) cached in memory (float32: 4x the
  bytes of the uint8 cache), ``monai.data.DataLoader``;
* ``MONAI PersistentDataset``: the same transforms cached on disk, one file per item.

With augmentation (rotation, zoom, gamma with probability 0.5: :class:`AugmentConfig`; goal:
batch path ≥ 5x the per-item path per core):

* ``fedcxr batch + augment``: the batch path, augmentation of whole batches
  (:func:`fedcxr.pipeline.augment.augment_batch`);
* ``fedcxr per item + augment``: MONAI's per-item ``Rand*d`` transforms (the path before);
* ``MONAI CacheDataset + Rand*d``: the cached deterministic part, then the same MONAI random
  transforms per item.

    python benchmarks/bench_loader.py                    # 224 px, 512 images, batch 32, 3 repeats
    python benchmarks/bench_loader.py --size 28 --n 4096 --batch-size 64
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedcxr.pipeline.augment import AugmentConfig, make_augmentation  # noqa: E402
from fedcxr.pipeline.data import NORM_MEAN, NORM_STD, SiteDataset, make_loader  # noqa: E402
from fedcxr.vocab import CLASSES, label_column  # noqa: E402

BENCH_CLASSES = CLASSES[:14]


def make_cache(folder: Path, n: int, size: int) -> tuple[np.memmap, np.ndarray]:
    """A uint8 memmap of ``n`` textured images (as a site cache) and (n, 14) labels."""
    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 180, size, dtype=np.float32)
    path = folder / "cache.u8"
    images = np.memmap(path, dtype=np.uint8, mode="w+", shape=(n, size, size))
    for start in range(0, n, 256):
        stop = min(n, start + 256)
        noise = rng.integers(0, 70, (stop - start, size, size))
        images[start:stop] = (ramp[None, None, :] + noise).astype(np.uint8)
    images.flush()
    labels = (rng.random((n, len(BENCH_CLASSES))) < 0.2).astype(np.float32)
    return np.memmap(path, dtype=np.uint8, mode="r", shape=(n, size, size)), labels


def site_dataset(images: np.ndarray, labels: np.ndarray, augment: bool) -> SiteDataset:
    frame = pd.DataFrame({label_column(c): labels[:, i] for i, c in enumerate(BENCH_CLASSES)})
    return SiteDataset(images, frame, np.arange(len(images)), classes=BENCH_CLASSES, aux_tasks=[],
                       loss_classes=BENCH_CLASSES, augment=augment, augment_config=AugmentConfig())


class PerItem(torch.utils.data.Dataset):
    """The loader before the batch path: one item at a time, MONAI's transforms seeded per item."""

    def __init__(self, data: SiteDataset, augment: bool):
        self.data, self.augment = data, augment

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        if self.augment:
            self.data.set_random_state(i)
        return self.data[i]


def monai_items(images: np.ndarray, labels: np.ndarray) -> list[dict]:
    return [{"image": np.asarray(images[i])[None], "label": labels[i]} for i in range(len(images))]


def monai_transforms(augment: bool):
    from monai.transforms import CastToTyped, Compose, NormalizeIntensityd, ScaleIntensityRanged

    steps = [CastToTyped(keys="image", dtype=np.float32),
             ScaleIntensityRanged(keys="image", a_min=0, a_max=255, b_min=0, b_max=1),
             NormalizeIntensityd(keys="image", subtrahend=NORM_MEAN, divisor=NORM_STD)]
    if augment:  # random transforms after the cached deterministic part (MONAI caches up to the first)
        steps += list(make_augmentation(AugmentConfig()).transforms)
    return Compose(steps)


def epoch_rate(loader) -> float:
    started = time.perf_counter()
    seen = 0
    for batch in loader:
        seen += int(batch["image"].shape[0])
    return seen / (time.perf_counter() - started)


def contenders(images, labels, args, folder: Path) -> dict:
    from monai.data import CacheDataset, DataLoader, PersistentDataset

    bs = args.batch_size
    items = monai_items(images, labels)
    out = {}
    plain, augmented = site_dataset(images, labels, False), site_dataset(images, labels, True)
    out["fedcxr batch"] = make_loader(plain, batch_size=bs, shuffle=True, seed=0, augment=False)
    out["fedcxr per item"] = torch.utils.data.DataLoader(PerItem(plain, False), batch_size=bs, shuffle=True)
    out["MONAI CacheDataset"] = DataLoader(CacheDataset(items, monai_transforms(False), progress=False),
                                           batch_size=bs, shuffle=True)
    if not args.skip_persistent:
        out["MONAI PersistentDataset"] = DataLoader(
            PersistentDataset(items, monai_transforms(False), cache_dir=folder / "persistent"), batch_size=bs,
            shuffle=True)
    if not args.skip_augment:
        out["fedcxr batch + augment"] = make_loader(augmented, batch_size=bs, shuffle=True, seed=0, augment=True)
        out["fedcxr per item + augment"] = torch.utils.data.DataLoader(PerItem(augmented, True), batch_size=bs,
                                                                       shuffle=True)
        out["MONAI CacheDataset + Rand*d"] = DataLoader(CacheDataset(items, monai_transforms(True), progress=False),
                                                        batch_size=bs, shuffle=True)
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (per-core rates: 1)")
    parser.add_argument("--skip-persistent", action="store_true")
    parser.add_argument("--skip-augment", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"{args.n} images at {args.size} px, batch {args.batch_size}, {torch.get_num_threads()} thread(s), "
          f"no loader workers; load average {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="fedcxr-bench-loader-") as tmp:
        images, labels = make_cache(Path(tmp), args.n, args.size)
        loaders = contenders(images, labels, args, Path(tmp))
        for loader in loaders.values():  # warm-up epoch (builds PersistentDataset's files)
            epoch_rate(loader)
        rates: dict[str, list[float]] = {name: [] for name in loaders}
        for _ in range(args.repeats):
            for name, loader in loaders.items():
                rates[name].append(epoch_rate(loader))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print(f"load average after {os.getloadavg()}")
    print(f"\n{'loader':<30} {'img/s (median)':>15}   runs")
    for name, value in medians.items():
        print(f"{name:<30} {value:15.0f}   {', '.join(f'{v:.0f}' for v in rates[name])}")
    megabytes = args.n * args.size * args.size / 2**20
    print(f"\ncache memory: fedcxr uint8 {megabytes:.1f} MiB, CacheDataset float32 {4 * megabytes:.1f} MiB (4x)")
    ratios = {"batch / CacheDataset": medians["fedcxr batch"] / medians["MONAI CacheDataset"],
              "batch / per item": medians["fedcxr batch"] / medians["fedcxr per item"]}
    if "MONAI PersistentDataset" in medians:
        ratios["batch / PersistentDataset"] = medians["fedcxr batch"] / medians["MONAI PersistentDataset"]
    if "fedcxr batch + augment" in medians:
        ratios["augmented: batch / per item"] = medians["fedcxr batch + augment"] / medians["fedcxr per item + augment"]
        ratios["augmented: batch / CacheDataset + Rand*d"] = (medians["fedcxr batch + augment"]
                                                              / medians["MONAI CacheDataset + Rand*d"])
        print(f"augmented item, one core: batch path {1e3 / medians['fedcxr batch + augment']:.2f} ms, "
              f"per-item MONAI path {1e3 / medians['fedcxr per item + augment']:.2f} ms")
    for name, value in ratios.items():
        print(f"ratio {name}: {value:.2f}x")
    print("goals: batch / CacheDataset >= 1.0; augmented batch / per item >= 5")
    return {"rates": medians, "ratios": ratios}


if __name__ == "__main__":
    main()
