"""One site's own counts, computed where the data is (manifest, file headers, decode-once cache).

:func:`site_counts` reads the site's ``manifest.parquet`` for the row groups (splits, labels,
demographics), each image file's header for acquisition and stored size (DICOM tags through
:func:`fedcxr.site_adapters.image_checks.read_headers`, never a pixel decode), and the decode-once
cache (:func:`fedcxr.pipeline.data.cache_images`, built now when missing — training would build
the same file first) for the pixel-intensity histogram.

The result holds the site's **true** counts: it never leaves the site. What leaves is
:func:`fedcxr.stats.release.release` of it. A section that cannot be computed (the images are
not on this machine, the cache cannot be built) is reported as unavailable with a reason that
names a category of problem only — the full message (which may quote a file path, and paths
can hold patient ids) stays in this site's log.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from fedcxr.stats import groups as G
from fedcxr.vocab import AUX_VOCAB, aux_column, label_column, raw_column

log = logging.getLogger(__name__)

#: Rows of the cache read at a time for the intensity histogram (bounded memory on big sites).
INTENSITY_CHUNK = 512


class SiteFailure(Exception):
    """The site cannot report at all; ``public`` is the reason that may leave the site."""

    def __init__(self, public: str, detail: str = ""):
        super().__init__(detail or public)
        self.public = public


@dataclass
class SiteCounts:
    """A site's true counts (never sent) and what could not be counted, with public reasons."""

    site: str
    groups: dict[str, np.ndarray] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)  # section → public reason
    image_size: int = 0
    class_set: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        split = self.groups.get("split")
        return int(split.sum()) if split is not None else 0


def site_counts(site_dir: Path | str, *, image_size: int, cache_dir: Path | str, name: Optional[str] = None,
                build_cache: bool = True, headers: bool = True, workers: int = 1,
                progress: bool = False) -> SiteCounts:
    """Count everything :mod:`fedcxr.stats.groups` defines for the site in ``site_dir``.

    Raises :class:`SiteFailure` when the manifest itself cannot be read; a failure of the
    header or intensity pass only marks that section unavailable (the rest is still counted).
    """
    from fedcxr.pipeline.data import load_site

    try:
        site = load_site(site_dir)
    except Exception as exc:  # a missing, foreign or corrupt manifest / site.json
        log.error("site %s: cannot read its manifest: %s", name or Path(site_dir).name, exc)
        raise SiteFailure("manifest or site.json unreadable", str(exc)) from None
    out = SiteCounts(site=name or site.name, image_size=int(image_size), class_set=list(site.class_set))
    try:
        out.groups.update(manifest_groups(site.manifest, site.class_set))
    except Exception as exc:
        log.error("site %s: manifest columns unusable: %s", out.site, exc)
        raise SiteFailure("manifest columns unusable (re-run `fedcxr ingest`)", str(exc)) from None
    if len(site.manifest) == 0:
        log.warning("site %s: its manifest has no rows", out.site)
        return out
    if headers:
        _section(out, "acquisition", lambda: acquisition_groups(site, workers=workers, progress=progress))
    else:
        out.unavailable["acquisition"] = "not computed (file headers not read)"
    _section(out, "intensity", lambda: {"intensity": intensity_counts(
        site, image_size, cache_dir, build=build_cache, workers=workers, progress=progress)})
    return out


def _section(out: SiteCounts, section: str, compute) -> None:
    try:
        out.groups.update(compute())
    except SiteFailure as exc:
        log.warning("site %s: %s unavailable: %s", out.site, section, exc)
        out.unavailable[section] = exc.public
    except Exception as exc:  # one unreadable file, a full disk: the other sections still count
        log.warning("site %s: %s unavailable: %s", out.site, section, exc)
        out.unavailable[section] = f"failed at the site ({type(exc).__name__}; see the site's log)"


# --------------------------------------------------------------------------- manifest


def manifest_groups(frame: pd.DataFrame, class_set: list[str]) -> dict[str, np.ndarray]:
    """Split, label, demographic and pyramid counts of a manifest (all splits)."""
    out = {"split": _category_counts(frame["split"].astype(str), G.categories("split"))}
    train = (frame["split"] == "train").to_numpy()
    cols = [label_column(c) for c in class_set if label_column(c) in frame]
    labeled = frame[cols].notna().any(axis=1).to_numpy() if cols else np.zeros(len(frame), bool)
    out["train_labels"] = np.array([int((train & labeled).sum()), int((train & ~labeled).sum())], np.int64)
    for cls in class_set:
        out[G.label_group(cls)] = label_counts(frame, cls)
    codes = {task: _codes(frame, task) for task in G.DEMOGRAPHICS}
    for task in G.DEMOGRAPHICS:
        out[task] = _code_counts(codes[task], len(AUX_VOCAB[task]))
    n_age = len(AUX_VOCAB["age_bin"])
    sex, age = codes["sex"], codes["age_bin"]
    both = (sex >= 0) & (age >= 0)
    joint = np.where(both, sex * n_age + age, -1)
    out[G.PYRAMID] = _code_counts(joint, len(AUX_VOCAB["sex"]) * n_age)
    return out


def label_counts(frame: pd.DataFrame, cls: str) -> np.ndarray:
    """positive / negative / uncertain / not_labeled of one class (uncertain = raw -1)."""
    label = frame[label_column(cls)].to_numpy(dtype=float, na_value=np.nan) if label_column(cls) in frame \
        else np.full(len(frame), np.nan)
    raw = raw_column(cls)
    uncertain = (frame[raw].to_numpy(dtype=float, na_value=np.nan) == -1.0) if raw in frame \
        else np.zeros(len(frame), bool)
    positive = (label == 1.0) & ~uncertain
    negative = (label == 0.0) & ~uncertain
    blank = np.isnan(label) & ~uncertain
    return np.array([positive.sum(), negative.sum(), uncertain.sum(), blank.sum()], dtype=np.int64)


def _codes(frame: pd.DataFrame, task: str) -> np.ndarray:
    column = aux_column(task)
    if column not in frame:
        return np.full(len(frame), -1, dtype=np.int64)
    codes = pd.to_numeric(frame[column], errors="coerce").astype("Float64").fillna(-1).to_numpy(dtype=np.int64)
    return np.where((codes >= 0) & (codes < len(AUX_VOCAB[task])), codes, -1)


def _code_counts(codes: np.ndarray, n: int) -> np.ndarray:
    """Counts of codes 0..n-1, then the unknowns (-1) as the last cell."""
    known = np.bincount(codes[codes >= 0], minlength=n)[:n]
    return np.append(known, int((codes < 0).sum())).astype(np.int64)


def _category_counts(values: pd.Series, cats: list[str]) -> np.ndarray:
    counts = values.value_counts()
    return np.array([int(counts.get(c, 0)) for c in cats], dtype=np.int64)


# --------------------------------------------------------------------------- file headers


def acquisition_groups(site, *, workers: int = 1, progress: bool = False) -> dict[str, np.ndarray]:
    """Format, modality, manufacturer, photometric interpretation and stored size from each file's header."""
    from fedcxr.site_adapters.image_checks import read_headers
    from fedcxr.site_adapters.image_headers import MAX_PIXELS

    root = Path(site.export_root)
    if not root.is_dir():
        raise SiteFailure("images not reachable at the site (export root missing)",
                          f"export root {root} is not a folder")
    paths = [str(root / p) for p in site.manifest["image_path"].astype(str)]
    max_pixels = int((site.meta.get("options") or {}).get("max_pixels") or MAX_PIXELS)
    found = read_headers(paths, workers=max(1, int(workers)), progress=progress, max_pixels=max_pixels)
    unreadable = sum(1 for header, _ in found if header is None)
    if unreadable:
        log.warning("site %s: %d of %d image headers unreadable (counted as 'unreadable'/'unknown')",
                    site.name, unreadable, len(found))
    values: dict[str, list[str]] = {name: [] for name in G.ACQUISITION}
    for header, _ in found:
        for name, value in G.header_categories(header).items():
            values[name].append(value)
    return {name: _category_counts(pd.Series(vals, dtype=object), G.categories(name))
            for name, vals in values.items()}


# --------------------------------------------------------------------------- pixels


def intensity_counts(site, image_size: int, cache_dir: Path | str, *, build: bool = True, workers: int = 1,
                     progress: bool = False) -> np.ndarray:
    """Histogram of the 256 uint8 levels over every pixel of every cached image (all splits).

    The cache holds each image decoded once (DICOM LUTs, MONOCHROME1 inverted, min/max scaled)
    and resized to ``image_size``: the pixels training sees, before augmentation.
    """
    from fedcxr.pipeline.data import cache_images, cache_path

    path = cache_path(site, image_size, cache_dir)
    if not build and not (path.is_file() and path.with_suffix(".json").is_file()):
        raise SiteFailure("no decode-once cache at this image size (not built: --no-cache-build)",
                          f"no cache at {path}")
    if not path.is_file():
        log.info("site %s: building its decode-once cache at %d px (training reuses it)", site.name, image_size)
    try:
        images = cache_images(site, image_size, cache_dir, progress=progress, workers=max(1, int(workers)))
    except Exception as exc:
        raise SiteFailure("the decode-once cache could not be built (an image is missing or undecodable)",
                          str(exc)) from None
    counts = np.zeros(G.INTENSITY_LEVELS, dtype=np.int64)
    for start in range(0, len(images), INTENSITY_CHUNK):
        block = np.asarray(images[start:start + INTENSITY_CHUNK])
        counts += np.bincount(block.ravel(), minlength=G.INTENSITY_LEVELS)[:G.INTENSITY_LEVELS]
    return counts
