"""Steady-state epochs from a decode-once cache: fedcxr's batch loader against MONAI's datasets.

Every contender serves the same ``--n`` images (``--size`` px, uint8, as a site's cache holds
them) with their 14 labels, shuffled, in batches of ``--batch-size``, in this process with one
torch thread and no loader workers (per-core rates); the cache is built before timing, and each
contender runs one warm-up epoch. Then ``--repeats`` rounds run every contender once, in turn
(interleaved); a sample repeats whole epochs for at least ``--min-seconds`` of wall time and
records images/s of wall time and of this process's CPU time (the per-core cost, which other
jobs on a shared machine disturb less). Ratios are taken within each round (side by side) and
the median over rounds is reported, for wall and CPU time, with the load average before and after.

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

    python benchmarks/bench_loader.py                    # 224 px, 512 images, batch 32, 5 repeats
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


def epoch_rate(loader, min_seconds: float = 0.0) -> tuple[float, float]:
    """Images per second of wall time and of this process's CPU time over whole epochs.

    Epochs repeat until ``min_seconds`` of wall time have passed, so a fast loader's sample is
    not one 10 ms epoch that a single preemption by another job on a shared machine doubles.
    CPU time (one torch thread, no workers: this process is the only worker) is the per-core
    cost, which other jobs on the machine disturb much less than the wall time.
    """
    wall, cpu = time.perf_counter(), time.process_time()
    seen = 0
    while True:
        for batch in loader:
            seen += int(batch["image"].shape[0])
        if time.perf_counter() - wall >= min_seconds:
            break
    return seen / (time.perf_counter() - wall), seen / (time.process_time() - cpu)


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
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--min-seconds", type=float, default=0.3,
                        help="each sample repeats epochs for at least this long (wall)")
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
        rates: dict[str, list[tuple[float, float]]] = {name: [] for name in loaders}
        for _ in range(args.repeats):  # interleaved: every contender once per repeat
            for name, loader in loaders.items():
                rates[name].append(epoch_rate(loader, args.min_seconds))
    print(f"load average after {os.getloadavg()}")
    wall = {name: [w for w, _ in values] for name, values in rates.items()}
    cpu = {name: [c for _, c in values] for name, values in rates.items()}
    medians = {name: statistics.median(values) for name, values in wall.items()}
    print(f"\n{'loader':<30} {'img/s wall':>11} {'img/s CPU':>10}   per repeat (wall)")
    for name, value in medians.items():
        print(f"{name:<30} {value:11.0f} {statistics.median(cpu[name]):10.0f}   "
              f"{', '.join(f'{v:.0f}' for v in wall[name])}")
    megabytes = args.n * args.size * args.size / 2**20
    print(f"\ncache memory: fedcxr uint8 {megabytes:.1f} MiB, CacheDataset float32 {4 * megabytes:.1f} MiB (4x)")
    pairs = {"batch / CacheDataset": ("fedcxr batch", "MONAI CacheDataset"),
             "batch / per item": ("fedcxr batch", "fedcxr per item"),
             "batch / PersistentDataset": ("fedcxr batch", "MONAI PersistentDataset"),
             "augmented: batch / per item": ("fedcxr batch + augment", "fedcxr per item + augment"),
             "augmented: batch / CacheDataset + Rand*d": ("fedcxr batch + augment", "MONAI CacheDataset + Rand*d")}
    ratios, cpu_ratios = {}, {}
    print("\nratios: median over repeats of the ratio within a repeat (side by side), wall and CPU time")
    for label, (mine, theirs) in pairs.items():
        if mine not in rates or theirs not in rates:
            continue
        ratios[label] = statistics.median(a / b for a, b in zip(wall[mine], wall[theirs]))
        cpu_ratios[label] = statistics.median(a / b for a, b in zip(cpu[mine], cpu[theirs]))
        per_repeat = ", ".join(f"{a / b:.2f}" for a, b in zip(wall[mine], wall[theirs]))
        print(f"ratio {label}: {ratios[label]:.2f}x wall ({per_repeat}), {cpu_ratios[label]:.2f}x CPU")
    if "fedcxr batch + augment" in medians:
        print(f"augmented item, one core (CPU time): batch path "
              f"{1e3 / statistics.median(cpu['fedcxr batch + augment']):.3f} ms, per-item MONAI path "
              f"{1e3 / statistics.median(cpu['fedcxr per item + augment']):.3f} ms")
    print("goals: batch / CacheDataset >= 1.0; augmented batch / per item >= 5")
    return {"rates": medians, "ratios": ratios, "cpu_ratios": cpu_ratios}


if __name__ == "__main__":
    main()
