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

Augmentation (:mod:`fedcxr.pipeline.augment`): small rotation, zoom, gamma contrast and
optionally a horizontal flip (off by default: in a chest radiograph the heart is on the
patient's left, so a flipped image is not a plausible one), on the [0, 1] image before
normalisation (rotation/zoom padding and gamma are defined on [0, 1] intensities).

Loaders work **per batch** (:func:`make_loader`): a batch's rows are read from the uint8 cache
in one ``np.take`` (into a buffer the loader reuses when it runs in this process) and its labels
and masks sliced from per-dataset arrays built once, so a worker (or the main process) hands
over ``pixels`` uint8 ``(B, 1, H, W)`` — 4x fewer bytes than float32 to pin and copy — and the
loader finishes the batch on the training device (``device`` of :func:`make_loader`: the GPU
when training there, else the CPU): uint8 → float,
augmentation of the whole batch (:func:`fedcxr.pipeline.augment.augment_pixels`, each item
seeded by its own seed), normalisation. A batch's ``image`` therefore lives on that device;
labels, masks and ``index`` stay on the CPU. ``SiteDataset[i]`` still builds one item the old
way (MONAI's per-item transforms when augmenting), the reference the batch path is tested on.

Randomness belongs to the loader (:func:`make_loader`): shuffling is seeded from ``seed`` and
the epoch count of that loader, and each item's augmentation from ``(seed, epoch, position)``
— the seed travels with the index from the sampler to whichever process loads the item —
never from global RNG state. So the same seed gives the same batches and the same
augmentations whatever ``num_workers``, ``persistent_workers``, ``prefetch_factor`` or the
device are, and an item's augmentation never depends on its batch.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import weakref
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

import numpy as np
import pandas as pd
import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Sampler, Subset

from fedcxr.atomic import atomic_path
from fedcxr.errors import UserError
from fedcxr.parallel import map_chunks
from fedcxr.pipeline.augment import AugmentConfig, augment_item, augment_pixels, make_augmentation
from fedcxr.site_adapters.image_headers import MAX_PIXELS
from fedcxr.site_adapters.images import read_image_resized
from fedcxr.site_adapters.manifest import (
    SPLITS,
    atomic_write_json,
    content_hash,
    label_values,
    read_manifest,
    read_site_json,
)
from fedcxr.vocab import aux_column

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
    paths = [str(site.export_root / p) for p in site.manifest["image_path"].astype(str)]
    max_pixels = int((site.meta.get("options") or {}).get("max_pixels") or MAX_PIXELS)  # ingest's bound
    n = len(paths)
    if n == 0:
        tmp.write_bytes(b"")
        return
    out = np.memmap(tmp, dtype=np.uint8, mode="w+", shape=(n, size, size))
    try:
        parallel = workers > 1 and n > CACHE_CHUNK  # a pool costs more than it saves on a few images
        chunk = max(8, min(CACHE_CHUNK, -(-n // (4 * workers)))) if parallel else CACHE_CHUNK
        starts = range(0, n, chunk)
        parts = map_chunks(_decode_chunk, [paths[start:start + chunk] for start in starts], size, max_pixels,
                           workers=workers if parallel else 1, progress=progress,
                           desc=f"caching {site.name} at {size}px")
        with closing(parts):  # a bad image (_store raises) stops the pool here, not at garbage collection
            for start, part in zip(starts, parts):
                _store(out, start, part, paths, site, size)
        out.flush()
    finally:
        del out


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
        self.augment_config = augment_config or AugmentConfig()
        self._transform = None  # MONAI's per-item Compose, built on first use (imports MONAI)

    @property
    def transform(self):
        """MONAI's per-item augmentation (:func:`fedcxr.pipeline.augment.make_augmentation`)."""
        if self._transform is None:
            self._transform = make_augmentation(self.augment_config)
        return self._transform

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
            image = augment_item(self.transform, image)
        return {
            "image": ((image - NORM_MEAN) / NORM_STD).float(),
            "label": torch.from_numpy(self.labels[i]),
            "label_mask": torch.from_numpy(self.label_mask[i]),
            "aux": torch.from_numpy(self.aux[i]),
            "aux_mask": torch.from_numpy(self.aux_mask[i]),
            "index": i,
        }

    def set_random_state(self, seed: int) -> None:
        """Seed the per-item augmentation (MONAI's ``Randomizable`` protocol)."""
        self.transform.set_random_state(seed=int(seed) % (2**32))

    def fetch(self, local: np.ndarray, pixels: Optional[torch.Tensor] = None) -> dict[str, torch.Tensor]:
        """Items ``local`` (positions in this dataset) as one batch, without augmentation.

        ``pixels`` uint8 ``(B, 1, H, W)`` read from the cache in one pass; ``label``,
        ``label_mask``, ``aux``, ``aux_mask`` as in the module doc, stacked. Finishing the
        image (float, augmentation, normalisation) is the loader's, on the training device.
        ``pixels`` given (uint8, at least ``B`` rows of ``(1, H, W)``): read into its first
        ``B`` rows instead of a new tensor (the in-process loader reuses one buffer).
        """
        local = np.asarray(local, dtype=np.int64)
        rows = self.rows[local]
        shape = (len(rows), 1) + tuple(self.images.shape[1:])
        pixels = torch.empty(shape, dtype=torch.uint8) if pixels is None else pixels[: len(rows)]
        if tuple(pixels.shape) != shape or pixels.dtype != torch.uint8 or not pixels.is_contiguous():
            raise ValueError(f"pixel buffer {tuple(pixels.shape)} {pixels.dtype} cannot hold a batch {shape} uint8")
        _read_rows(self.images, rows, pixels.numpy()[:, 0])
        return {
            "pixels": pixels,
            "label": torch.from_numpy(self.labels[local]),
            "label_mask": torch.from_numpy(self.label_mask[local]),
            "aux": torch.from_numpy(self.aux[local]),
            "aux_mask": torch.from_numpy(self.aux_mask[local]),
        }

    def __getstate__(self) -> dict:
        # A memmap would pickle its whole content into each spawned worker: reopen it instead.
        state = dict(self.__dict__)
        state["_transform"] = None  # rebuilt on use in the worker (MONAI objects need not travel)
        if isinstance(self.images, np.memmap) and self.images.filename:
            state["images"] = ("memmap", self.images.filename, self.images.shape)
        return state

    def __setstate__(self, state: dict) -> None:
        images = state.get("images")
        if isinstance(images, tuple) and images and images[0] == "memmap":
            state["images"] = np.memmap(images[1], dtype=np.uint8, mode="r", shape=images[2])
        self.__dict__.update(state)


def _read_rows(images: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """``out[j] = images[rows[j]]`` in one ``np.take`` straight into ``out``.

    No temporary batch: a memmap's fancy-indexed read allocated one (and a scatter back to
    batch order another), and reading the rows in ascending order (a Python loop over rows, or
    a sorted take plus a second take back to batch order) cost 5-15% of a 224 px batch
    (benchmarks/bench_loader.py) for nothing once the cache is in the page cache — and 32
    random rows of a site's cache are 32 separate reads on disk in any order.
    """
    if len(rows):
        np.take(np.asarray(images), rows, axis=0, out=out, mode="clip")  # rows are valid; "clip" skips a buffered copy


def _label_arrays(frame: pd.DataFrame, classes: list[str], loss_classes: list[str],
                  missing_as_negative: bool, site: str) -> tuple[np.ndarray, np.ndarray]:
    # a class without a column (a manifest written before the class existed) is not labeled here
    values = np.stack([label_values(frame, c).astype(np.float32) for c in classes], 1) \
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


class _Batches(Dataset):
    """Whole batches of the dataset handed to :func:`make_loader`, keyed by the sampler's batches.

    A key is ``(positions, item seeds or None)`` from :class:`_SeededSampler`. The positions are
    mapped through ``Subset``/``ConcatDataset`` wrappers onto the site datasets inside
    (:func:`_locate`), each site dataset reads its share in one call
    (:meth:`SiteDataset.fetch`), and the parts are put back in batch order. ``index`` is each
    item's position in the wrapped dataset (predictions are mapped back by it); ``seed`` the
    item's augmentation seed. A dataset of another kind is read item by item and collated.
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[list[int], Optional[list[int]]]) -> dict[str, Any]:
        return self.batch(key)

    def batch(self, key: tuple[list[int], Optional[list[int]]],
              pixels: Optional[torch.Tensor] = None) -> dict[str, Any]:
        """The batch of ``key``; ``pixels``: a uint8 buffer to read the images into (see
        :meth:`SiteDataset.fetch`; only for a consumer done with each batch's ``pixels`` before
        asking for the next)."""
        positions, seeds = key
        parts = _locate(self.dataset, np.asarray(positions, dtype=np.int64))
        if parts is None:  # not made of site datasets: the per-item path (already normalised images)
            from torch.utils.data import default_collate

            batch = default_collate([self.dataset[int(i)] for i in positions])
        else:
            batch = _assemble(parts, len(positions), pixels)
        batch["index"] = torch.as_tensor(positions, dtype=torch.int64)
        if seeds is not None:
            batch["seed"] = torch.as_tensor(seeds, dtype=torch.int64)
        return batch


def _locate(dataset: Dataset, positions: np.ndarray) -> Optional[list[tuple[SiteDataset, np.ndarray, np.ndarray]]]:
    """``[(site dataset, its local indices, their slots in the batch)]`` for ``positions``, or None
    when ``dataset`` is not built from site datasets by ``Subset``/``ConcatDataset``."""
    slots = np.arange(len(positions))
    if isinstance(dataset, SiteDataset):
        return [(dataset, positions, slots)]
    if isinstance(dataset, Subset):
        inner = np.asarray(dataset.indices, dtype=np.int64)[positions]
        return _locate(dataset.dataset, inner)
    if isinstance(dataset, ConcatDataset):
        ends = np.asarray(dataset.cumulative_sizes, dtype=np.int64)
        which = np.searchsorted(ends, positions, side="right")
        found = []
        for k in np.unique(which):
            mine = which == k
            local = positions[mine] - (ends[k - 1] if k > 0 else 0)
            parts = _locate(dataset.datasets[int(k)], local)
            if parts is None:
                return None
            found += [(ds, idx, slots[mine][sub]) for ds, idx, sub in parts]
        return found
    return None


def _assemble(parts: list[tuple[SiteDataset, np.ndarray, np.ndarray]], n: int,
              pixels: Optional[torch.Tensor] = None) -> dict[str, torch.Tensor]:
    """One batch from the parts of several site datasets, each row in its slot (the images read
    into ``pixels`` when given and the batch comes from one site dataset in order)."""
    if len(parts) == 1 and np.array_equal(parts[0][2], np.arange(n)):
        return parts[0][0].fetch(parts[0][1], pixels)
    fetched = [(ds.fetch(idx), slots) for ds, idx, slots in parts]
    out = {}
    for key, first in fetched[0][0].items():
        whole = torch.empty((n,) + tuple(first.shape[1:]), dtype=first.dtype)
        for batch, slots in fetched:
            whole[torch.as_tensor(slots)] = batch[key]
        out[key] = whole
    return out


class _SeededSampler(Sampler):
    """Yields batches ``(positions, item seeds)``: positions in order, or shuffled by a generator
    seeded from the loader's current epoch seed only (never the ``DataLoader``'s own generator,
    whose draws differ between fresh and persistent workers), cut into ``batch_size`` pieces
    (the last one dropped when short and ``drop_last``), and per item the augmentation seed
    derived from the same epoch seed and the item's position (``None`` when not augmenting).

    It holds its loader by weak reference: a strong one made loader → worker iterator → sampler →
    loader a cycle, so a loader with persistent workers was freed only by the garbage collector,
    which tore it down in an order that left each worker to its 5 s join timeout (10 s per
    loader of two workers, at whatever moment the collector ran; 0.03 s when freed in order)."""

    def __init__(self, n: int, shuffle: bool, loader: "SeededLoader", batch_size: int, drop_last: bool) -> None:
        self.n = int(n)
        self.shuffle = bool(shuffle)
        self._loader = weakref.ref(loader)
        self.batch_size = max(1, int(batch_size))
        self.drop_last = bool(drop_last)

    def __iter__(self) -> Iterator[tuple[list[int], Optional[list[int]]]]:
        loader = self._loader()
        if loader is None:  # pragma: no cover - a sampler outliving its loader is never iterated
            raise RuntimeError("the loader of this sampler is gone")
        epoch_seed, augment = loader.epoch_seed, loader.augment
        if self.shuffle:
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(epoch_seed)).tolist()
        else:
            order = list(range(self.n))
        for start in range(0, self.n, self.batch_size):
            positions = order[start:start + self.batch_size]
            if self.drop_last and len(positions) < self.batch_size:
                return
            yield positions, ([_sub_seed(epoch_seed, i) for i in positions] if augment else None)

    def __len__(self) -> int:
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)


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


#: ``uint8 → [0, 1]``: the factor every image path multiplies by (float32, as the per-item path did)
_TO_UNIT = float(np.float32(1.0 / 255.0))
#: NORM_STD is a power of two: dividing by it and multiplying by its inverse give the same floats
#: (and scaling by a power of two commutes with rounding), so the batch path may fold the steps
_STD_IS_POWER_OF_TWO = math.frexp(NORM_STD)[0] == 0.5


def finish_images(pixels: torch.Tensor, *, device: torch.device | str = "cpu", seeds: Optional[torch.Tensor] = None,
                  augment_config: Optional[AugmentConfig] = None, non_blocking: bool = False) -> torch.Tensor:
    """uint8 ``(B, 1, H, W)`` → normalised float32 on ``device``, augmented when ``seeds`` are given.

    The same floats as :meth:`SiteDataset.image` and the item path (``x/255`` in float32,
    augmentation on [0, 1], ``(x − NORM_MEAN)/NORM_STD``), so an unaugmented batch equals the
    stacked items bit for bit. Without augmentation that is computed as
    ``x·(4/255) − 2`` (``NORM_STD`` = 1/4: the same two roundings scaled by 4, which is exact;
    tested on all 256 values), two passes over the batch instead of three and no division;
    an augmented batch is normalised as ``4x − 2`` in one pass (``4x`` is exact).
    """
    pixels = pixels.to(device, non_blocking=non_blocking)
    if seeds is not None:
        x = augment_pixels(pixels, seeds.tolist(), _TO_UNIT, augment_config)
    elif _STD_IS_POWER_OF_TWO:
        return pixels.float().mul_(_TO_UNIT / NORM_STD).sub_(NORM_MEAN / NORM_STD)
    else:
        x = pixels.float().mul_(_TO_UNIT)
    if _STD_IS_POWER_OF_TWO:  # (x − mean)·(1/std) in one pass: x·(1/std) is exact, so one rounding as before
        return torch.add(x.new_full((), -NORM_MEAN / NORM_STD), x, alpha=1.0 / NORM_STD, out=x)
    return x.sub_(NORM_MEAN).div_(NORM_STD)


class SeededLoader(DataLoader):
    """A ``DataLoader`` of whole batches whose shuffling and augmentation depend only on
    ``seed`` and its epoch.

    Each ``iter()`` is one epoch: the shuffle generator is re-seeded from ``(seed, epoch)`` and
    every item's augmentation from ``(seed, epoch, position)``, so iterating a fresh loader
    with the same seed repeats the same batches, and :meth:`set_epoch` reproduces any later
    epoch (resume) — with or without worker processes, persistent or not, on any device.
    Workers (or the main process) read uint8 batches; each batch's image is finished on
    ``device`` as it is handed out (:func:`finish_images`), augmented when ``augment``.
    """

    def __init__(self, dataset: Dataset, *, seed: int, augment: bool, shuffle: bool = False,
                 batch_size: int = 1, drop_last: bool = False, device: torch.device | str | None = None,
                 **kwargs: Any) -> None:
        self.seed = int(seed)
        self.augment = bool(augment)
        self.epoch = 0
        self.epoch_seed = _sub_seed(self.seed, 0)
        self.device = torch.device(device or "cpu")
        self.rows_per_batch = int(batch_size)
        wrapped = _Batches(dataset)
        sampler = _SeededSampler(len(wrapped), shuffle, self, batch_size, drop_last)
        super().__init__(wrapped, sampler=sampler, batch_size=None, generator=torch.Generator(), **kwargs)

    def set_epoch(self, epoch: int) -> None:
        """The next ``iter()`` yields epoch ``epoch`` (0-based)."""
        self.epoch = int(epoch)

    def reseed(self, seed: int) -> None:
        """Start over as a fresh loader with ``seed`` would (epoch 0), keeping the workers."""
        self.seed = int(seed)
        self.epoch = 0

    def augment_config(self) -> AugmentConfig:
        """The augmentation of the site datasets inside (they must agree)."""
        configs = [ds.augment_config for ds in site_datasets(self.dataset)]
        if any(c != configs[0] for c in configs[1:]):
            raise ValueError("the site datasets of one loader have different augmentation settings")
        return configs[0] if configs else AugmentConfig()

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self.epoch_seed = _sub_seed(self.seed, self.epoch)
        self.epoch += 1
        self.generator.manual_seed(self.epoch_seed)
        config = self.augment_config() if self.augment else None
        non_blocking = self.pin_memory and self.device.type == "cuda"
        if self.num_workers == 0 and not self.pin_memory:
            # In this process and nothing to pin: batches straight from the sampler (no DataLoader
            # machinery per batch), read into one uint8 buffer that each batch's finish_images
            # below has consumed (copied to a new float tensor) before the next read.
            batches: Iterator[Any] = self._in_process()
        else:
            batches = super().__iter__()
        for batch in batches:
            seeds = batch.pop("seed", None)
            if "pixels" in batch:
                batch["image"] = finish_images(batch.pop("pixels"), device=self.device, seeds=seeds,
                                               augment_config=config, non_blocking=non_blocking)
            yield batch

    def _in_process(self) -> Iterator[dict[str, Any]]:
        shapes = {(self.rows_per_batch, 1) + tuple(ds.images.shape[1:]) for ds in site_datasets(self.dataset)}
        buffer = getattr(self, "_pixel_buffer", None)  # kept across epochs: no multi-MB allocation per epoch
        if len(shapes) != 1:  # (a mix of image sizes cannot be batched: fetch raises as before)
            buffer = None
        elif buffer is None or tuple(buffer.shape) != next(iter(shapes)):
            buffer = self._pixel_buffer = torch.empty(next(iter(shapes)), dtype=torch.uint8)
        for key in self.sampler:
            yield self.dataset.batch(key, buffer if buffer is not None and len(key[0]) <= len(buffer) else None)


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
    device: torch.device | str | None = None,
) -> SeededLoader:
    """A :class:`SeededLoader` over ``dataset`` (a site dataset, or a Subset/Concat of them).

    Same ``seed`` → same batches and augmentations (whatever the worker settings or the
    device); ``augment`` switches the batch augmentation on for this loader's iterations.
    ``device``: where each batch's image is finished (float conversion, augmentation,
    normalisation; default CPU) — the training device, so a GPU gets uint8 batches and does
    that work itself. ``pin_memory`` only matters for CUDA training; ``persistent_workers``
    keeps the worker processes between the epochs of this loader and ``prefetch_factor`` is
    how many batches each prepares ahead (both need ``num_workers`` > 0; see
    :func:`fedcxr.pipeline.engine.loader_options`). Batches are dicts (see the module doc)
    with ``index`` = positions in ``dataset``.
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
        shuffle=bool(shuffle) and len(dataset) > 0,  # type: ignore[arg-type]
        num_workers=workers,
        pin_memory=bool(pin_memory),
        drop_last=bool(drop_last),
        device=device,
        **extra,
    )
