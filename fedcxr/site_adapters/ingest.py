"""``fedcxr ingest``: one export → per-site manifests, with every set-aside row accounted for.

Flow: adapter (vendor format → canonical rows) → duplicate check → image check (exists +
header; full decode with ``verify_pixels``) → uncertain-label policy → partition into sites →
patient-disjoint splits → one manifest per site → ``ingest_report.json``.

Invariant checked before anything is written: rows kept + rows set aside == rows read.

A source that labels no class at all (a folder of DICOM/PNG/JPEG with no label csv) becomes an
**unlabeled site**: every usable image is kept, its class set is empty and ``site.json`` says
``"unlabeled": true``. Training refuses it as a labeled source; FACT may use it as its
unlabeled target, and ``fedcxr predict`` scores it. (A site of a *labeled* source that ends up
with no labeled class is still set aside: there the missing labels are a problem.)
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd
from tqdm import tqdm

from fedcxr.site_adapters.base import AdapterOptions, IngestError, SetAside, SourceTable, ensure_columns
from fedcxr.site_adapters.manifest import (
    apply_uncertain_policy,
    assign_splits,
    atomic_write_json,
    write_site,
)
from fedcxr.site_adapters.partition import partition
from fedcxr.vocab import label_column

log = logging.getLogger(__name__)

#: SOURCE name → "module:function" of its adapter (imported lazily).
ADAPTERS: dict[str, str] = {
    "nih": "fedcxr.site_adapters.nih:read_nih",
    "chexpert": "fedcxr.site_adapters.chexpert:read_chexpert",
    "mimic": "fedcxr.site_adapters.mimic:read_mimic",
    "midrc": "fedcxr.site_adapters.midrc:read_midrc",
    "dicom": "fedcxr.site_adapters.dicom_folder:read_dicom_folder",
    "images": "fedcxr.site_adapters.dicom_folder:read_image_folder",
    "csv": "fedcxr.site_adapters.csv_mapping:read_csv_mapping",
    "medmnist": "fedcxr.site_adapters.medmnist:read_medmnist",
}


def get_adapter(source: str):
    """The adapter function for ``source``; exit-2 error naming the valid sources otherwise."""
    if source not in ADAPTERS:
        raise IngestError(f"unknown SOURCE {source!r}; choose one of: {', '.join(sorted(ADAPTERS))}")
    module_name, func_name = ADAPTERS[source].split(":")
    module = importlib.import_module(module_name)
    return getattr(module, func_name)


def run_ingest(
    source: str,
    input_dir: Path | str,
    out_dir: Path | str,
    *,
    site_by: Optional[str] = None,
    site_name: Optional[str] = None,
    uncertain: str = "ignore",
    mapping: Optional[Path | str] = None,
    labels_csv: Optional[Path | str] = None,
    verify_pixels: bool = False,
    workers: int = 1,
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
    progress: bool = True,
) -> dict:
    """Ingest one export; return the ``ingest_report.json`` payload (also written to OUT)."""
    started = time.perf_counter()
    input_dir, out_dir = Path(input_dir), Path(out_dir)
    if not input_dir.exists():
        raise IngestError(f"--input {input_dir}: no such directory")
    adapter = get_adapter(source)
    options = AdapterOptions(
        uncertain=uncertain,
        mapping=Path(mapping) if mapping else None,
        labels_csv=Path(labels_csv) if labels_csv else None,
        workers=max(1, int(workers)),
        extra={"out_dir": out_dir},  # adapters that must write files (medmnist PNGs) write under OUT
    )
    table: SourceTable = adapter(input_dir, options)
    frame = ensure_columns(table.frame, table.classes)
    set_aside: list[SetAside] = list(table.set_aside)
    if len(frame) + len(set_aside) != table.rows_read:
        raise IngestError(
            f"adapter {source!r} bug: {len(frame)} rows + {len(set_aside)} set aside != {table.rows_read} read"
        )

    frame, dupes = drop_duplicate_images(frame)
    set_aside += dupes
    frame, bad_images = check_images(
        frame, table.root, decode=verify_pixels, skip_headers=table.headers_checked,
        workers=options.workers, progress=progress,
    )
    set_aside += bad_images

    frame = apply_uncertain_policy(frame, table.classes, uncertain)
    parts = partition(frame, site_by, table.classes, default_site=site_name or source)
    set_aside += parts.set_aside
    frame, split_aside = assign_splits(parts.frame, val_fraction=val_fraction, test_fraction=test_fraction)
    set_aside += split_aside

    sites_payload = {}
    unlabeled = not table.classes
    for site in sorted(frame["site"].unique()):
        rows = frame.loc[frame["site"] == site]
        subset = [c for c in parts.class_sets.get(site, table.classes) if c in table.classes]
        if not unlabeled and not any(rows[label_column(c)].notna().any() for c in subset):
            set_aside += [
                SetAside(f, int(r), f"site {site!r} has no labeled class", p)
                for f, r, p in zip(rows["source_file"], rows["source_row"], rows["image_path"])
            ]
            frame = frame.loc[frame["site"] != site]
            continue
        sites_payload[site] = rows

    kept = sum(len(r) for r in sites_payload.values())
    if kept + len(set_aside) != table.rows_read:
        raise IngestError(f"internal error: {kept} kept + {len(set_aside)} set aside != {table.rows_read} read")

    run_options = {
        "site_by": site_by, "uncertain": uncertain, "verify_pixels": verify_pixels,
        "mapping": str(mapping) if mapping else None, "val_fraction": val_fraction,
        "test_fraction": test_fraction,
    }
    site_summaries = {}
    for site, rows in sites_payload.items():
        site_rows_aside = [s for s in set_aside if s.reason.startswith(f"site {site!r}")]
        payload = write_site(
            out_dir, site, rows,
            classes=[c for c in parts.class_sets.get(site, table.classes) if c in table.classes],
            source=source, adapter_version=table.adapter_version, export_root=table.root,
            set_aside=site_rows_aside, options=run_options, unlabeled=unlabeled,
        )
        site_summaries[site] = {
            "rows": payload["rows"], "rows_per_split": payload["rows_per_split"],
            "class_set": payload["class_set"], "manifest": str(Path(site) / "manifest.parquet"),
            "unlabeled": unlabeled,
        }

    report = {
        "report_version": 1,
        "source": source,
        "adapter_version": table.adapter_version,
        "input": str(input_dir.resolve()),
        "export_root": str(Path(table.root).resolve()),
        "rows_read": table.rows_read,
        "rows_kept": kept,
        "rows_set_aside": len(set_aside),
        "set_aside_by_reason": dict(Counter(_reason_family(s.reason) for s in set_aside).most_common()),
        "set_aside": [s.as_dict() for s in set_aside],
        "sites": site_summaries,
        "options": run_options,
        "notes": table.notes,
        "seconds": round(time.perf_counter() - started, 3),
    }
    atomic_write_json(out_dir / "ingest_report.json", report)
    return report


def _reason_family(reason: str) -> str:
    """Group reasons for the summary: text before the first ':' (details follow it)."""
    return reason.split(":", 1)[0].strip()


def drop_duplicate_images(frame: pd.DataFrame) -> tuple[pd.DataFrame, list[SetAside]]:
    """Keep the first row of each image; later rows pointing at the same file are set aside."""
    dup = frame.duplicated(subset=["image_path"], keep="first")
    if not dup.any():
        return frame, []
    first_row = frame.loc[~dup].set_index("image_path")["source_row"]
    aside = [
        SetAside(f, int(r), f"duplicate row: same image as row {int(first_row[p])}", p)
        for f, r, p in zip(frame.loc[dup, "source_file"], frame.loc[dup, "source_row"], frame.loc[dup, "image_path"])
    ]
    return frame.loc[~dup].copy(), aside


def check_images(
    frame: pd.DataFrame,
    root: Path,
    *,
    decode: bool,
    skip_headers: bool = False,
    workers: int = 1,
    progress: bool = True,
) -> tuple[pd.DataFrame, list[SetAside]]:
    """Set aside rows whose image is missing, unreadable or (with ``decode``) undecodable."""
    from fedcxr.site_adapters.images import check_images_batch

    if skip_headers and not decode:
        return frame, []
    # Plain string joins: building 10^5 pathlib.Path objects cost ~1 s on NIH's 112,120 rows.
    prefix = os.path.join(str(root), "")
    paths = [prefix + p for p in frame["image_path"].tolist()]
    reasons = _map_chunks(check_images_batch, paths, decode=decode, workers=workers, progress=progress)
    bad = np.array([r is not None for r in reasons], dtype=bool)
    aside = [
        SetAside(f, int(r), reason, p)
        for f, r, p, reason in zip(
            frame.loc[bad, "source_file"], frame.loc[bad, "source_row"], frame.loc[bad, "image_path"],
            [reasons[i] for i in np.flatnonzero(bad)],
        )
    ]
    return frame.loc[~bad].copy(), aside


def _map_chunks(func, items: Sequence[str], *, decode: bool, workers: int, progress: bool) -> list:
    """Run ``func(chunk, decode)`` over chunks, in a process pool when ``workers > 1``."""
    if not items:
        return []
    chunk = 256 if decode else 4096
    chunks = [list(items[i:i + chunk]) for i in range(0, len(items), chunk)]
    bar = tqdm(total=len(items), desc="checking images", unit="img", disable=not progress or len(items) < 2000,
               leave=False)
    results: list = []
    if workers > 1 and len(chunks) > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for part in pool.map(func, chunks, [decode] * len(chunks)):
                results.extend(part)
                bar.update(len(part))
    else:
        for c in chunks:
            part = func(c, decode)
            results.extend(part)
            bar.update(len(part))
    bar.close()
    return results


__all__ = ["ADAPTERS", "run_ingest", "get_adapter", "check_images", "drop_duplicate_images"]
