"""One site's training data: manifest → decode-once cache → dataset → seeded loader.

DESIGN §3 and §9. Decoding a chest radiograph (DICOM with LUTs, 2–3 k pixels a side) costs
tens of milliseconds; a training run reads every image once per epoch per round. So each site
is decoded **once** per image size into a uint8 memmap (:func:`cache_images`), row-aligned
with its manifest, and every epoch of every run reads that file.

Item of :class:`SiteDataset` (shapes for one row; ``C`` = model classes, ``T`` = aux tasks)::

    image       float32 (1, H, W)  cached uint8 / 255 → random augmentation (training) →
                                   (x - 0.5) / 0.25, i.e. roughly zero mean, unit spread
    label       float32 (C,)       1 / 0; unobserved (NaN) entries are 0 and masked out
    label_mask  float32 (C,)       1 where the label is observed AND the class is in
                                   ``loss_classes`` (default: the site's class set)
    aux         int64 (T,)         aux codes (fedcxr.vocab), -1 when unknown
    aux_mask    float32 (T,)       1 where ``aux`` is known
    index       int                position of the item in the dataset the loader iterates

Augmentation (:class:`AugmentConfig`, MONAI dictionary transforms, one flat ``Compose`` of
random transforms applied to the [0, 1] image; normalisation comes after them because
rotation/zoom padding and gamma contrast are defined on [0, 1] intensities): small rotation,
zoom, gamma contrast, and optionally a horizontal flip (off by default: in a chest radiograph
the heart is on the patient's left, so a flipped image is not a plausible one).

Randomness belongs to the loader (:func:`make_loader`): shuffling is seeded from ``seed`` and
the epoch count of that loader, and each item's augmentation from ``(seed, epoch, position)``
— the seed travels with the index from the sampler to whichever process loads the item —
never from global RNG state. So the same seed gives the same batches and the same
augmentations whatever ``num_workers``, ``persistent_workers`` or ``prefetch_factor`` are.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import weakref
from collections import deque
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence

import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from fedcxr.atomic import atomic_path
from fedcxr.errors import UserError
from fedcxr.logs import bar_disabled
from fedcxr.site_adapters.images import MAX_PIXELS, read_image_resized
from fedcxr.site_adapters.manifest import (
    SPLITS,
    atomic_write_json,
    content_hash,
    read_manifest,
    read_site_json,
)
from fedcxr.vocab import aux_column, label_column

log = logging.getLogger(__name__)

#: Normalisation applied after augmentation: ``(x - NORM_MEAN) / NORM_STD`` on [0, 1] images.
NORM_MEAN = 0.5
NORM_STD = 0.25
CACHE_CHUNK = 64  # images per decode job (a few MB of uint8 at 224 px)
CACHE_FORMAT = 2  # bump when the cached pixels change meaning (decoder rules, dtype, layout); 2: VOI LUT / window


# --------------------------------------------------------------------------- sites


@dataclass
class SiteInfo:
    """A site as ingest wrote it: its manifest (all splits, row order = cache order) and site.json."""

    name: str
    site_dir: Path
    manifest: pd.DataFrame
    meta: dict
    export_root: Path
    class_set: list[str]


def load_site(site_dir: Path | str, export_root: Path | str | None = None) -> SiteInfo:
    """Read ``<site_dir>/manifest.parquet`` and ``site.json``.

    ``export_root`` overrides the folder the image paths are relative to (e.g. the export was
    moved after ingest); by default it is the one recorded in ``site.json``. Images are only
    opened when a cache is built, so a site whose cache exists trains without its images.
    """
    site_dir = Path(site_dir)
    try:
        meta = read_site_json(site_dir)
        manifest = read_manifest(site_dir)
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from None
    root = Path(export_root) if export_root is not None else Path(meta.get("export_root", site_dir))
    return SiteInfo(
        name=str(meta.get("site") or site_dir.name),
        site_dir=site_dir,
        manifest=manifest,
        meta=meta,
        export_root=root,
        class_set=list(meta.get("class_set") or []),
    )


# --------------------------------------------------------------------------- decode-once cache


def default_cache_dir() -> Path:
    """Decoded-image cache shared by runs (keyed by manifest content hash and image size).

    ``$FEDCXR_CACHE``, else ``$XDG_CACHE_HOME/fedcxr``, else ``~/.cache/fedcxr``.
    """
    env = os.environ.get("FEDCXR_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fedcxr"


def cache_path(site: SiteInfo, size: int, cache_dir: Path | str) -> Path:
    """``<cache_dir>/<site>-<content_hash[:12]>-<size>.u8`` (site name made file-name safe)."""
    digest = site.meta.get("content_hash") or content_hash(site.manifest)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", site.name)
    return Path(cache_dir) / f"{safe}-{str(digest)[:12]}-{int(size)}.u8"


def cache_images(
    site: SiteInfo, size: int, cache_dir: Path | str, *, progress: bool = True, workers: int = 1
) -> np.ndarray:
    """Every manifest row's image as uint8 ``(N, size, size)``, decoded once and memory-mapped.

    Row ``i`` of the result is manifest row ``i`` (all splits). The first call decodes with
    :func:`fedcxr.site_adapters.images.read_image_resized` (``workers`` processes) into a
    temporary file that is renamed into place with a JSON sidecar; later calls (later epochs,
    rounds, runs) only open the file. The key is the manifest's content hash and the size, so
    a re-ingest that changes the manifest gets a fresh cache. Returns a read-only memmap.
    Raises :class:`UserError` naming the file when an image cannot be decoded.
    """
    size = int(size)
    path = cache_path(site, size, cache_dir)
    n = len(site.manifest)
    cached = _open_cache(path, n, size)
    if cached is not None:
        return cached
    with atomic_path(path) as tmp:
        _decode_into(site, size, tmp, progress=progress, workers=workers)
    atomic_write_json(_sidecar(path), {
        "format": CACHE_FORMAT, "site": site.name, "rows": n, "size": size, "dtype": "uint8",
        "content_hash": site.meta.get("content_hash") or content_hash(site.manifest),
        "decoder": "fedcxr.site_adapters.images.read_image_resized",
    })
    opened = _open_cache(path, n, size)
    assert opened is not None, f"cache {path} unreadable right after writing it"
    return opened


def _sidecar(path: Path) -> Path:
    return path.with_suffix(".json")


def _open_cache(path: Path, n: int, size: int) -> Optional[np.ndarray]:
    """The cache as a read-only memmap if file and sidecar agree with (n, size), else None."""
    sidecar = _sidecar(path)
    if not (path.is_file() and sidecar.is_file()):
        return None
    try:
        info = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        return None
    expected = (info.get("format"), info.get("rows"), info.get("size"))
    if expected != (CACHE_FORMAT, n, size) or path.stat().st_size != n * size * size:
        log.info("cache %s is stale or incomplete; decoding again", path.name)
        return None
    if n == 0:
        empty = np.zeros((0, size, size), dtype=np.uint8)
        empty.flags.writeable = False
        return empty
    return np.memmap(path, dtype=np.uint8, mode="r", shape=(n, size, size))


def _decode_into(site: SiteInfo, size: int, tmp: Path, *, progress: bool, workers: int) -> None:
    from tqdm import tqdm

    paths = [str(site.export_root / p) for p in site.manifest["image_path"].astype(str)]
    max_pixels = int((site.meta.get("options") or {}).get("max_pixels") or MAX_PIXELS)  # ingest's bound
    n = len(paths)
    if n == 0:
        tmp.write_bytes(b"")
        return
    out = np.memmap(tmp, dtype=np.uint8, mode="w+", shape=(n, size, size))
    bar = tqdm(total=n, desc=f"caching {site.name} at {size}px", unit="img", disable=bar_disabled(progress))
    try:
        parallel = workers > 1 and n > CACHE_CHUNK  # a pool costs more than it saves on a few images
        chunk = max(8, min(CACHE_CHUNK, -(-n // (4 * workers)))) if parallel else CACHE_CHUNK
        starts = range(0, n, chunk)
        if parallel:
            with ProcessPoolExecutor(max_workers=min(workers, len(starts))) as pool:
                jobs = ((start, paths[start:start + chunk]) for start in starts)
                for start, part in bounded_map(pool, _decode_chunk, jobs, size, max_pixels, limit=2 * workers):
                    _store(out, start, part, paths, site, size)
                    bar.update(len(part))
        else:
            for start in starts:
                part = _decode_chunk(paths[start:start + chunk], size, max_pixels)
                _store(out, start, part, paths, site, size)
                bar.update(len(part))
        out.flush()
    finally:
        bar.close()
        del out


def bounded_map(pool: Executor, fn, jobs: Iterable[tuple[int, Any]], *args: Any,
                limit: int) -> Iterator[tuple[int, Any]]:
    """``(key, fn(job, *args))`` for ``(key, job)`` in ``jobs``, in order, with at most ``limit``
    jobs submitted and not yet consumed.

    ``Executor.map`` submits every chunk at once and keeps every finished one until the
    consumer reaches it; here at most ``limit`` decoded chunks exist at a time, so building
    the cache of a 200,000-image site needs a few chunks of memory, not the site.
    """
    pending: deque = deque()
    for key, job in jobs:
        if len(pending) >= limit:
            done_key, future = pending.popleft()
            yield done_key, future.result()
        pending.append((key, pool.submit(fn, job, *args)))
    while pending:
        done_key, future = pending.popleft()
        yield done_key, future.result()


def _decode_chunk(
    paths: list[str], size: int, max_pixels: int = MAX_PIXELS
) -> list[tuple[Optional[np.ndarray], Optional[str]]]:
    """Decode a chunk; a failure becomes a reason string (module-level: process pools pickle it).

    ``max_pixels`` bounds each image's declared size before it is decoded (ingest's option).
    """
    results: list[tuple[Optional[np.ndarray], Optional[str]]] = []
    for path in paths:
        try:
            results.append((read_image_resized(path, size, max_pixels), None))
        except Exception as exc:  # any decoder failure is reported with the file's name
            results.append((None, f"{type(exc).__name__}: {exc}"))
    return results


def _store(out: np.ndarray, start: int, part: list, paths: list[str], site: SiteInfo, size: int) -> None:
    for offset, (image, reason) in enumerate(part):
        row = start + offset
        if reason is None and (image is None or image.shape != (size, size) or image.dtype != np.uint8):
            reason = f"decoder returned {getattr(image, 'dtype', None)} {getattr(image, 'shape', None)}"
        if reason is not None:
            raise UserError(
                f"site {site.name}: cannot decode image {paths[row]} (manifest row {row}): {reason}. "
                "Check the export root (site.json 'export_root') or re-run `fedcxr ingest "
                "--verify-pixels` to set undecodable files aside."
            )
        out[row] = image


# --------------------------------------------------------------------------- augmentation


@dataclass
class AugmentConfig:
    """On-the-fly augmentation of training images (each transform applied with ``prob``)."""

    rotate_deg: float = 10.0
    zoom: tuple[float, float] = (0.9, 1.1)
    gamma: tuple[float, float] = (0.8, 1.25)
    hflip: bool = False
    prob: float = 0.5


def make_augmentation(cfg: AugmentConfig | None = None):
    """One flat MONAI ``Compose`` of ``Rand*d`` transforms on key ``image`` ((1, H, W) in [0, 1])."""
    from monai.transforms import Compose, RandAdjustContrastd, RandFlipd, RandRotated, RandZoomd

    cfg = cfg or AugmentConfig()
    steps = []
    if cfg.rotate_deg:
        angle = math.radians(cfg.rotate_deg)
        steps.append(RandRotated(keys="image", range_x=angle, prob=cfg.prob, padding_mode="zeros"))
    if cfg.zoom and tuple(cfg.zoom) != (1.0, 1.0):
        steps.append(RandZoomd(keys="image", min_zoom=cfg.zoom[0], max_zoom=cfg.zoom[1], prob=cfg.prob,
                               padding_mode="constant"))
    if cfg.gamma and tuple(cfg.gamma) != (1.0, 1.0):
        steps.append(RandAdjustContrastd(keys="image", gamma=tuple(cfg.gamma), prob=cfg.prob))
    if cfg.hflip:
        steps.append(RandFlipd(keys="image", spatial_axis=1, prob=cfg.prob))  # axis 1 of (H, W) = columns
    return Compose(steps)


# --------------------------------------------------------------------------- dataset


class SiteDataset(Dataset):
    """Rows of one site's split over its cached images (see the module doc for the item)."""

    def __init__(
        self,
        images: np.ndarray,
        frame: pd.DataFrame,
        rows: np.ndarray,
        *,
        classes: Sequence[str],
        aux_tasks: Sequence[str],
        loss_classes: Sequence[str],
        site: str = "",
        augment: bool = False,
        augment_config: AugmentConfig | None = None,
        missing_as_negative: bool = False,
        aux_sizes: Optional[Mapping[str, int]] = None,
    ) -> None:
        self.site = site
        self.images = images
        self.frame = frame.reset_index(drop=True)
        self.rows = np.asarray(rows, dtype=np.int64)  # cache rows (= manifest positions)
        self.classes = list(classes)
        self.aux_tasks = list(aux_tasks)
        self.loss_classes = [c for c in self.classes if c in set(loss_classes)]
        self.labels, self.label_mask = _label_arrays(self.frame, self.classes, self.loss_classes,
                                                     missing_as_negative, site)
        self.aux, self.aux_mask = _aux_arrays(self.frame, self.aux_tasks, aux_sizes, site)
        self.augment = bool(augment)
        self.transform = make_augmentation(augment_config)

    def __len__(self) -> int:
        return len(self.rows)

    def image(self, i: int) -> torch.Tensor:
        """Cached image ``i`` as float32 (1, H, W) in [0, 1] (no augmentation, no normalisation)."""
        pixels = np.asarray(self.images[self.rows[i]], dtype=np.float32) * np.float32(1.0 / 255.0)
        return torch.from_numpy(pixels)[None]

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = int(i)
        image = self.image(i)
        if self.augment:
            image = _augment(self.transform, image)
        return {
            "image": ((image - NORM_MEAN) / NORM_STD).float(),
            "label": torch.from_numpy(self.labels[i]),
            "label_mask": torch.from_numpy(self.label_mask[i]),
            "aux": torch.from_numpy(self.aux[i]),
            "aux_mask": torch.from_numpy(self.aux_mask[i]),
            "index": i,
        }

    def set_random_state(self, seed: int) -> None:
        """Seed the augmentation (MONAI's ``Randomizable`` protocol; loaders call it)."""
        self.transform.set_random_state(seed=int(seed) % (2**32))

    def __getstate__(self) -> dict:
        # A memmap would pickle its whole content into each spawned worker: reopen it instead.
        state = dict(self.__dict__)
        if isinstance(self.images, np.memmap) and self.images.filename:
            state["images"] = ("memmap", self.images.filename, self.images.shape)
        return state

    def __setstate__(self, state: dict) -> None:
        images = state.get("images")
        if isinstance(images, tuple) and images and images[0] == "memmap":
            state["images"] = np.memmap(images[1], dtype=np.uint8, mode="r", shape=images[2])
        self.__dict__.update(state)


def _augment(transform, image: torch.Tensor) -> torch.Tensor:
    """Apply the random transforms without MONAI's metadata tracking (half the cost per item).

    ``set_track_meta`` is process-global, so it is switched off only around this call and
    restored; data loading runs one item at a time per process.
    """
    from monai.data import get_track_meta, set_track_meta
    from monai.utils import convert_to_tensor

    previous = get_track_meta()
    set_track_meta(False)
    try:
        out = transform({"image": image})["image"]
    finally:
        set_track_meta(previous)
    return convert_to_tensor(out, track_meta=False, dtype=torch.float32)


def _label_arrays(frame: pd.DataFrame, classes: list[str], loss_classes: list[str],
                  missing_as_negative: bool, site: str) -> tuple[np.ndarray, np.ndarray]:
    missing = [label_column(c) for c in classes if label_column(c) not in frame]
    if missing:
        raise UserError(f"site {site}: manifest lacks label column(s) {missing}")
    values = np.stack([frame[label_column(c)].to_numpy(dtype=np.float32, na_value=np.nan) for c in classes], 1) \
        if len(frame) else np.zeros((0, len(classes)), np.float32)
    observed = ~np.isnan(values)
    in_loss = np.array([c in set(loss_classes) for c in classes], dtype=bool)[None, :]
    mask = in_loss if missing_as_negative else observed & in_loss
    mask = np.broadcast_to(mask, values.shape).astype(np.float32)
    return np.nan_to_num(values, nan=0.0).astype(np.float32), np.ascontiguousarray(mask)


def _aux_arrays(frame: pd.DataFrame, tasks: list[str], sizes: Optional[Mapping[str, int]],
                site: str) -> tuple[np.ndarray, np.ndarray]:
    columns = []
    for task in tasks:
        col = aux_column(task)
        if col not in frame:
            columns.append(np.full(len(frame), -1, dtype=np.int64))
            continue
        codes = pd.to_numeric(frame[col], errors="coerce").astype("Float64").fillna(-1)
        codes = codes.to_numpy(dtype=np.int64)
        if sizes and task in sizes and (codes >= sizes[task]).any():
            raise UserError(f"site {site}: {col} has code(s) ≥ {sizes[task]}, the model's {task} head size")
        columns.append(codes)
    aux = np.stack(columns, 1) if columns else np.zeros((len(frame), 0), dtype=np.int64)
    aux = np.ascontiguousarray(aux.astype(np.int64))
    return aux, (aux >= 0).astype(np.float32)


def make_dataset(
    site: SiteInfo,
    split: str,
    *,
    classes: Sequence[str],
    aux_tasks: Sequence[str] | Mapping[str, int] | None,
    image_size: int,
    cache_dir: Path | str,
    augment: bool,
    loss_classes: Optional[Sequence[str]] = None,
    max_rows: Optional[int] = None,
    missing_as_negative: bool = False,
    augment_config: AugmentConfig | None = None,
    progress: bool = True,
    workers: int = 1,
) -> SiteDataset:
    """The rows of ``split`` of ``site`` (manifest order; the first ``max_rows`` if given).

    ``classes``: the model head's class order; ``aux_tasks``: the model's aux task order (a
    mapping task → head size also checks the codes fit). ``loss_classes`` (default: the site's
    class set) limits which classes count in the loss; ``missing_as_negative`` (Vanilla FL /
    Central baselines) counts every row of those classes, unobserved labels as negatives.
    Builds the site's image cache on first use.
    """
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    images = cache_images(site, image_size, cache_dir, progress=progress, workers=workers)
    rows = np.flatnonzero((site.manifest["split"] == split).to_numpy())
    if max_rows is not None:
        rows = rows[: int(max_rows)]
    sizes = dict(aux_tasks) if isinstance(aux_tasks, Mapping) else None
    return SiteDataset(
        images,
        site.manifest.iloc[rows],
        rows,
        classes=classes,
        aux_tasks=list(aux_tasks or []),
        loss_classes=site.class_set if loss_classes is None else loss_classes,
        site=site.name,
        augment=augment,
        augment_config=augment_config,
        missing_as_negative=missing_as_negative,
        aux_sizes=sizes,
    )


# --------------------------------------------------------------------------- loaders


class _Positioned(Dataset):
    """Sets ``index`` to the item's position in the dataset handed to :func:`make_loader`.

    With a ``Subset`` or ``ConcatDataset`` around site datasets, each site dataset's own index
    is not the position the caller asked for; predictions are mapped back by this one. Keys
    are ``(position, augmentation seed or None)`` from :class:`_SeededSampler`: the site
    datasets are seeded for that one item before it is loaded (one item at a time per
    process), so the item's augmentation does not depend on which worker loads it.
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self._sites: Optional[list[SiteDataset]] = None

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: Any) -> dict[str, Any]:
        if isinstance(key, tuple):
            i, seed = key
            if self._sites is None:
                self._sites = site_datasets(self.dataset)
            for ds in self._sites:
                ds.augment = seed is not None
                if seed is not None:
                    ds.set_random_state(seed)
        else:
            i = key
        item = dict(self.dataset[i])
        item["index"] = int(i)
        return item


class _SeededSampler(Sampler):
    """Yields ``(position, item seed)``: positions in order, or shuffled by a generator seeded
    from the loader's current epoch seed only (never the ``DataLoader``'s own generator, whose
    draws differ between fresh and persistent workers), and per item the augmentation seed
    derived from the same epoch seed (``None`` when the loader does not augment).

    It holds its loader by weak reference: a strong one made loader → worker iterator → sampler →
    loader a cycle, so a loader with persistent workers was freed only by the garbage collector,
    which tore it down in an order that left each worker to its 5 s join timeout (10 s per
    loader of two workers, at whatever moment the collector ran; 0.03 s when freed in order)."""

    def __init__(self, n: int, shuffle: bool, loader: "SeededLoader") -> None:
        self.n = int(n)
        self.shuffle = bool(shuffle)
        self._loader = weakref.ref(loader)

    def __iter__(self) -> Iterator[tuple[int, Optional[int]]]:
        loader = self._loader()
        if loader is None:  # pragma: no cover - a sampler outliving its loader is never iterated
            raise RuntimeError("the loader of this sampler is gone")
        epoch_seed, augment = loader.epoch_seed, loader.augment
        if self.shuffle:
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(epoch_seed)).tolist()
        else:
            order = range(self.n)
        for i in order:
            yield int(i), (_sub_seed(epoch_seed, int(i)) if augment else None)

    def __len__(self) -> int:
        return self.n


def site_datasets(obj: Any, _seen: Optional[set] = None) -> list[SiteDataset]:
    """Every :class:`SiteDataset` inside ``obj`` (through Subset, ConcatDataset, wrappers)."""
    seen = set() if _seen is None else _seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, SiteDataset):
        return [obj]
    found: list[SiteDataset] = []
    children = list(getattr(obj, "datasets", None) or [])
    children += [v for v in vars(obj).values() if isinstance(v, Dataset)] if hasattr(obj, "__dict__") else []
    for child in children:
        found += site_datasets(child, seen)
    return found


def _sub_seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) % (2**63) for p in parts]).generate_state(1)[0])


class SeededLoader(DataLoader):
    """A ``DataLoader`` whose shuffling and augmentation depend only on ``seed`` and its epoch.

    Each ``iter()`` is one epoch: the shuffle generator is re-seeded from ``(seed, epoch)`` and
    every item's augmentation from ``(seed, epoch, position)``, so iterating a fresh loader
    with the same seed repeats the same batches, and :meth:`set_epoch` reproduces any later
    epoch (resume) — with or without worker processes, persistent or not. While iterating, the
    site datasets augment exactly when ``augment`` is true.
    """

    def __init__(self, dataset: Dataset, *, seed: int, augment: bool, shuffle: bool = False,
                 **kwargs: Any) -> None:
        self.seed = int(seed)
        self.augment = bool(augment)
        self.epoch = 0
        self.epoch_seed = _sub_seed(self.seed, 0)
        wrapped = _Positioned(dataset)
        sampler = _SeededSampler(len(wrapped), shuffle, self)
        super().__init__(wrapped, sampler=sampler, generator=torch.Generator(), **kwargs)

    def set_epoch(self, epoch: int) -> None:
        """The next ``iter()`` yields epoch ``epoch`` (0-based)."""
        self.epoch = int(epoch)

    def reseed(self, seed: int) -> None:
        """Start over as a fresh loader with ``seed`` would (epoch 0), keeping the workers."""
        self.seed = int(seed)
        self.epoch = 0

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self.epoch_seed = _sub_seed(self.seed, self.epoch)
        self.epoch += 1
        self.generator.manual_seed(self.epoch_seed)
        datasets = site_datasets(self.dataset)
        previous = [ds.augment for ds in datasets]
        try:
            yield from super().__iter__()
        finally:
            for ds, flag in zip(datasets, previous):
                ds.augment = flag


def make_loader(
    dataset: Dataset,
    *,
    batch_size: int,
    shuffle: bool,
    seed: int,
    augment: bool,
    num_workers: int = 0,
    pin_memory: bool = False,
    drop_last: bool = False,
    persistent_workers: bool = False,
    prefetch_factor: Optional[int] = None,
) -> SeededLoader:
    """A :class:`SeededLoader` over ``dataset`` (a site dataset, or a Subset/Concat of them).

    Same ``seed`` → same batches and augmentations (whatever the worker settings);
    ``augment`` switches the site datasets' random transforms on for this loader's
    iterations. ``pin_memory`` only matters for CUDA training; ``persistent_workers`` keeps
    the worker processes between the epochs of this loader and ``prefetch_factor`` is how
    many batches each prepares ahead (both need ``num_workers`` > 0; see
    :func:`fedcxr.pipeline.engine.loader_options`). Batches are dicts of stacked tensors (see
    the module doc) with ``index`` = positions in ``dataset``.
    """
    workers = int(num_workers)
    extra: dict[str, Any] = {}
    if workers > 0:
        extra["persistent_workers"] = bool(persistent_workers)
        if prefetch_factor is not None:
            extra["prefetch_factor"] = int(prefetch_factor)
    return SeededLoader(
        dataset,
        seed=seed,
        augment=augment,
        batch_size=int(batch_size),
        shuffle=bool(shuffle) and len(dataset) > 0,  # type: ignore[arg-type]  (RandomSampler rejects 0 rows)
        num_workers=workers,
        pin_memory=bool(pin_memory),
        drop_last=bool(drop_last),
        **extra,
    )
