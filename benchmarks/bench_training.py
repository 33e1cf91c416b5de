"""Benchmark of local training and of the decode-once cache (run on demand, not in tests).

    python benchmarks/bench_training.py [--device cpu|cuda] [--backbone resnet18]
                                        [--image-size 224] [--n 128] [--batch-size 32]
                                        [--epochs 1] [--repeat 3] [--threads N] [--workers 0]

1. Training throughput, images/s, side by side in one run on the same machine state:

   * ``train_local`` — the project's loop: a site dataset over a uint8 image array
     (the cache), :func:`make_loader` (seeded shuffle, per-item normalisation, default
     collate), masked BCE (+ nothing else: ``use_aux`` off), fresh Adam, AMP on CUDA;
   * bare PyTorch — the same network (same init), the same images already normalised as one
     float tensor in memory, ``randperm`` batches of the same size, Adam, BCE-with-logits,
     the same AMP setting.

   Each is run ``--repeat`` times after a warm-up, alternating; the best run counts.
   Goal: train_local / bare ≥ 0.9.

2. Cached epoch vs decoding epoch, images/s: one pass over a site's images through a
   ``DataLoader`` of the same batch size, once reading the memmap cache
   (:func:`fedcxr.pipeline.data.cache_images`, built first and timed separately) and once
   decoding every file with :func:`fedcxr.site_adapters.images.read_image_resized`, as a
   pipeline without a cache would do every epoch. The files are the real NIH 1024² PNGs
   and chest DICOMs of ``../shared/data`` (cycled up to ``--n`` rows through symlinks) or,
   without it, synthetic 1024² PNGs. Goal: cached / decoding ≥ 20.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedcxr.models.network import CXRNet  # noqa: E402
from fedcxr.pipeline.data import NORM_MEAN, NORM_STD, SiteDataset, cache_images, load_site, make_loader  # noqa: E402
from fedcxr.pipeline.devices import resolve_device
from fedcxr.pipeline.local import LocalConfig, train_local
from fedcxr.site_adapters.images import read_image_resized  # noqa: E402
from fedcxr.site_adapters.manifest import write_site  # noqa: E402
from fedcxr.vocab import AUX_TASKS, CLASSES, aux_column, label_column  # noqa: E402

BENCH_CLASSES = CLASSES[:14]


def _shared_data() -> Path:
    env = os.environ.get("FEDCXR_SHARED")
    return (Path(env) if env else Path(__file__).resolve().parents[2] / "shared") / "data"


# --------------------------------------------------------------------------- 1. training


def synthetic_cache(n: int, size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, size, size), dtype=np.uint8)
    labels = (rng.random((n, len(BENCH_CLASSES))) < 0.2).astype(np.float32)
    return images, labels


def site_dataset(images: np.ndarray, labels: np.ndarray) -> SiteDataset:
    frame = pd.DataFrame({label_column(c): labels[:, i] for i, c in enumerate(BENCH_CLASSES)})
    return SiteDataset(images, frame, np.arange(len(images)), classes=BENCH_CLASSES, aux_tasks=[],
                       loss_classes=BENCH_CLASSES)


def run_train_local(model, images, labels, args, device) -> float:
    loader = make_loader(site_dataset(images, labels), batch_size=args.batch_size, shuffle=True, seed=0,
                         augment=False, num_workers=args.workers, pin_memory=device.type == "cuda")
    cfg = LocalConfig(lr=1e-4, batch_size=args.batch_size, epochs=args.epochs, use_aux=False, amp=not args.no_amp)
    _sync(device)
    start = time.perf_counter()
    result = train_local(model, loader, cfg, device=device, seed=0)
    _sync(device)
    return result.samples_seen / (time.perf_counter() - start)


def run_bare(model, images, labels, args, device) -> float:
    """The floor: tensors in memory, randperm batches, Adam, BCE-with-logits."""
    x_all = (torch.from_numpy(images).float().div_(255.0).sub_(NORM_MEAN).div_(NORM_STD)).unsqueeze(1)
    y_all = torch.from_numpy(labels)
    amp = device.type == "cuda" and not args.no_amp
    _sync(device)
    start = time.perf_counter()
    model.to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    seen = 0
    generator = torch.Generator().manual_seed(0)
    for _ in range(args.epochs):
        order = torch.randperm(len(x_all), generator=generator)
        for s in range(0, len(order), args.batch_size):
            idx = order[s:s + args.batch_size]
            if len(idx) < 2:
                continue
            x, y = x_all[idx].to(device, non_blocking=True), y_all[idx].to(device, non_blocking=True)
            with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=amp):
                logits = model(x)["main"]
            loss = F.binary_cross_entropy_with_logits(logits.float(), y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            seen += len(idx)
    _sync(device)
    return seen / (time.perf_counter() - start)


def bench_training(args, device) -> None:
    torch.manual_seed(0)
    base = CXRNet(BENCH_CLASSES, backbone=args.backbone, hidden=128)
    images, labels = synthetic_cache(args.n, args.image_size)
    warm = max(2 * args.batch_size, 8)
    for fn in (run_train_local, run_bare):  # warm-up: allocator, oneDNN/cuDNN kernel choice
        fn(copy.deepcopy(base), images[:warm], labels[:warm], _with(args, epochs=1), device)
    ours, bare = [], []
    for _ in range(args.repeat):
        ours.append(run_train_local(copy.deepcopy(base), images, labels, args, device))
        bare.append(run_bare(copy.deepcopy(base), images, labels, args, device))
    best_ours, best_bare = max(ours), max(bare)
    print(f"\n[1] training, {args.backbone} {args.image_size}px, batch {args.batch_size}, "
          f"{args.n} images x {args.epochs} epoch(s), device {device}, best of {args.repeat}")
    print(f"    train_local  : {best_ours:9.1f} img/s   (runs: {_fmt(ours)})")
    print(f"    bare PyTorch : {best_bare:9.1f} img/s   (runs: {_fmt(bare)})")
    print(f"    ratio train_local / bare = {best_ours / best_bare:.3f}   (goal >= 0.9)")


# --------------------------------------------------------------------------- 2. cache vs decode


def source_files(tmp: Path, count: int) -> list[Path]:
    data = _shared_data()
    files = sorted((data / "nih-chestxray14" / "images").glob("*.png")) + sorted((data / "dicom").glob("*.dcm"))
    if files:
        return files
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for i in range(min(count, 16)):
        path = tmp / f"synthetic{i}.png"
        Image.fromarray(rng.integers(0, 256, (1024, 1024), dtype=np.uint8)).save(path)
        out.append(path)
    return out


def make_site(tmp: Path, n: int):
    export = tmp / "export"
    export.mkdir()
    files = source_files(tmp, n)
    records = []
    for i in range(n):
        src = files[i % len(files)]
        link = export / f"img{i:05d}{src.suffix}"
        link.symlink_to(src.resolve())
        rec = {"image_path": link.name, "patient_id": f"p{i}", "study_id": f"s{i}", "site": "bench",
               "split": "train", "age": np.nan, "source_file": "bench.csv", "source_row": i + 1}
        rec.update({label_column(c): (0.0 if c in BENCH_CLASSES else np.nan) for c in CLASSES})
        rec.update({aux_column(t): None for t in AUX_TASKS})
        records.append(rec)
    frame = pd.DataFrame(records)
    for task in AUX_TASKS:
        frame[aux_column(task)] = frame[aux_column(task)].astype("Int64")
    write_site(tmp / "sites", "bench", frame, classes=BENCH_CLASSES, source="bench", adapter_version="0",
               export_root=export, set_aside=[], options={})
    kinds = sorted({f.suffix for f in files})
    return load_site(tmp / "sites" / "bench"), f"{len(files)} distinct files ({', '.join(kinds)})"


class DecodingDataset(torch.utils.data.Dataset):
    """What a pipeline without a cache does every epoch: decode + resize each file per item."""

    def __init__(self, paths: list[str], size: int):
        self.paths, self.size = paths, size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict:
        pixels = read_image_resized(self.paths[i], self.size).astype(np.float32) / 255.0
        return {"image": (torch.from_numpy(pixels)[None] - NORM_MEAN) / NORM_STD, "index": i}


def epoch_rate(loader) -> float:
    start = time.perf_counter()
    seen = sum(len(batch["index"]) for batch in loader)
    return seen / (time.perf_counter() - start)


def bench_cache(args) -> None:
    with tempfile.TemporaryDirectory(prefix="fedcxr-bench-train-") as tmp_name:
        tmp = Path(tmp_name)
        site, what = make_site(tmp, args.n)
        start = time.perf_counter()
        images = cache_images(site, args.image_size, tmp / "cache", progress=False, workers=args.workers or 1)
        build = time.perf_counter() - start
        ds = SiteDataset(images, site.manifest, np.arange(len(site.manifest)), classes=BENCH_CLASSES,
                         aux_tasks=[], loss_classes=BENCH_CLASSES)
        paths = [str(site.export_root / p) for p in site.manifest["image_path"]]
        decoding = torch.utils.data.DataLoader(DecodingDataset(paths, args.image_size), batch_size=args.batch_size,
                                               num_workers=args.workers)
        cached_rates, decode_rates = [], []
        for _ in range(args.repeat):
            cached_rates.append(epoch_rate(make_loader(ds, batch_size=args.batch_size, shuffle=True, seed=0,
                                                       augment=False, num_workers=args.workers)))
            decode_rates.append(epoch_rate(decoding))
        best_cached, best_decode = max(cached_rates), max(decode_rates)
        print(f"\n[2] one epoch of {args.n} images at {args.image_size}px from {what}, batch {args.batch_size}, "
              f"{args.workers} loader worker(s), best of {args.repeat}")
        print(f"    building the cache (decode once): {args.n / build:9.1f} img/s ({build:.1f} s)")
        print(f"    cached epoch (memmap)           : {best_cached:9.1f} img/s   (runs: {_fmt(cached_rates)})")
        print(f"    decoding epoch (files)          : {best_decode:9.1f} img/s   (runs: {_fmt(decode_rates)})")
        print(f"    ratio cached / decoding = {best_cached / best_decode:.1f}   (goal >= 20)")


# --------------------------------------------------------------------------- main


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _with(args, **changes):
    out = copy.copy(args)
    for key, value in changes.items():
        setattr(out, key, value)
    return out


def _fmt(values) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--n", type=int, default=128, help="images per epoch")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--no-amp", action="store_true", help="no mixed precision on CUDA (both loops)")
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--skip-cache", action="store_true")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))
    if not args.skip_training:
        bench_training(args, device)
    if not args.skip_cache:
        bench_cache(args)


if __name__ == "__main__":
    main()
