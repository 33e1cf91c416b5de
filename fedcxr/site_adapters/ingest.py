"""``fedcxr ingest``: one export → per-site manifests, with every set-aside row accounted for.

Flow: adapter (vendor format → canonical rows) → DICOMs whose tags say "not a chest
radiograph" set aside (:mod:`fedcxr.site_adapters.body_part`; ``keep_non_chest`` keeps them,
flagged) → image paths kept inside the export root (:mod:`fedcxr.site_adapters.paths`) →
duplicate check (same path, same file, same DICOM instance: the first copy that decodes is
kept) → image check (exists + header within ``max_pixels``; full decode with
``verify_pixels``; a missing file is looked for one folder deeper) → keyed pseudonyms for
patient and study ids (:mod:`fedcxr.site_adapters.sitekey`) → uncertain-label policy →
implied negatives (CheXpert/MIMIC's No Finding rule) → partition into sites →
patient-disjoint splits → one manifest per site → ``ingest_report.json`` and ``set_aside.csv``:
at the top of ``OUT`` every row the latest run set aside, each with its site; in each site's
folder (``OUT/<site>/``, never touched by an ingest of another site) that site's own rows only
(:mod:`fedcxr.site_adapters.set_aside_sites` says which rows are a site's).

``plan=True`` (``fedcxr ingest --plan``) runs the same steps on the metadata alone — no image
is opened, no path is resolved on disk — and writes ``OUT/ingest_plan.json`` (sites, splits,
per-class counts, rows that would be set aside and why, and :data:`PLAN_CANNOT_KNOW`) and
``OUT/ingest_plan_set_aside.csv`` instead of manifests. Sources whose metadata is in the
images have no plan (:mod:`fedcxr.site_adapters.sources`).

The adapters return the export's own patient/study ids; they are replaced by HMAC pseudonyms
under the site's secret key before partitions and splits look at them, and no set-aside row
carries one, so nothing ingest writes (manifests, site.json, reports) holds a raw id.

Invariant checked before anything is written: rows kept + rows set aside == rows read.

A source that labels no class at all (a folder of DICOM/PNG/JPEG with no label csv) becomes an
**unlabeled site**: every usable image is kept, its class set is empty and ``site.json`` says
``"unlabeled": true``. Training refuses it as a labeled source; FACT may use it as its
unlabeled target, and ``fedcxr predict`` scores it. (A site of a *labeled* source that ends up
with no labeled class is still set aside: there the missing labels are a problem.)
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pandas as pd

from fedcxr.atomic import json_bytes
from fedcxr.escape import to_csv_text
from fedcxr.parallel import map_chunks
from fedcxr.site_adapters.base import AdapterOptions, IngestError, SetAside, SourceTable, ensure_columns
from fedcxr.site_adapters.image_headers import MAX_PIXELS
from fedcxr.site_adapters.inputs import following_links, read_input_bytes
from fedcxr.site_adapters.manifest import (
    apply_implied_negatives,
    apply_uncertain_policy,
    assign_splits,
    atomic_write_bytes,
    atomic_write_json,
    implied_negative_counts,
    site_summary,
    write_site,
)
from fedcxr.site_adapters.partition import partition
from fedcxr.site_adapters.set_aside_sites import set_aside_sites, whole_export
from fedcxr.site_adapters.paths import contain_all, lexical, printable
from fedcxr.site_adapters.sources import SOURCES, get_source, labels_key_sources, plan_sources
from fedcxr.site_adapters.tables import deeper_hint
from fedcxr.site_adapters.sitekey import ENV_VAR as KEY_ENV
from fedcxr.site_adapters.sitekey import SiteKey, load_site_key
from fedcxr.vocab import label_column

log = logging.getLogger(__name__)

#: SOURCE name → "module:function" of its adapter (imported lazily), derived from the one declaration
#: of every source (:data:`fedcxr.site_adapters.sources.SOURCES`).
ADAPTERS: dict[str, str] = {name: spec.adapter for name, spec in SOURCES.items()}


def get_adapter(source: str):
    """The adapter function for ``source``; exit-2 error naming the valid sources otherwise."""
    return get_source(source).adapter_function()


def adapter_target(source: str) -> str:
    """``"module:function"`` of ``source``'s adapter; exit-2 error naming the valid sources otherwise."""
    return get_source(source).adapter


def help_for(source: str) -> str:
    """What ``fedcxr ingest SOURCE --help`` prints about the source (:meth:`SourceSpec.help`)."""
    return get_source(source).help()


#: What ``--plan`` cannot know, written into every plan (README: Plan mode).
PLAN_CANNOT_KNOW = [
    "images that are missing, unreadable, truncated, corrupt or undecodable (the image check opens them)",
    "images over --max-pixels (their size is in the image header)",
    "the same image under two names (symbolic or hard links) and symbolic links leading out of the export",
    "which of several copies of one DICOM instance decodes",
    "values read from DICOM tags (a csv mapping's demographics from_dicom/dicom_tag: unknown in the plan)",
    "with --site-by skew, rows the image check sets aside change the Dirichlet draw over the patients left",
]


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
    labels_key: Optional[str] = None,
    verify_pixels: bool = False,
    workers: int = 1,
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
    progress: bool = True,
    site_key: Optional[Path | str | SiteKey] = None,
    follow_links: bool = False,
    max_pixels: int = MAX_PIXELS,
    readers: str = "any",
    implied_negatives: bool = True,
    plan: bool = False,
    keep_non_chest: bool = False,
) -> dict:
    """Ingest one export; return the ``ingest_report.json`` payload (also written to OUT).

    ``site_key``: the secret key file for pseudonyms (see :func:`fedcxr.site_adapters.sitekey.load_site_key`;
    unset: ``$FEDCXR_SITE_KEY``, else ``OUT/.fedcxr_site_key``, created on first use).
    ``follow_links``: accept image paths whose symbolic links lead out of the export root
    (:mod:`fedcxr.site_adapters.paths`; by default such rows are set aside).
    ``max_pixels``: an image whose header declares more values is set aside before any decode
    (:func:`fedcxr.site_adapters.image_headers.check_pixel_count`); training decodes under the same bound.
    ``readers``: how several radiologists' reads of one image combine (``any``/``majority``; vindr).
    ``labels_key``: the DICOM keyword a ``dicom``/``images`` label csv is keyed by.
    ``implied_negatives``: CheXpert/MIMIC's No Finding rule (the adapters' docs).
    ``keep_non_chest``: keep DICOMs whose tags say they are not chest radiographs
    (:mod:`fedcxr.site_adapters.body_part`), flagged in the manifest's ``not_chest`` column.
    ``plan``: read the metadata only and write ``OUT/ingest_plan.json`` (sites, splits, counts,
    rows set aside) instead of manifests; no image is opened (:data:`PLAN_CANNOT_KNOW`).
    """
    started = time.perf_counter()
    input_dir, out_dir = Path(input_dir), Path(out_dir)
    if not input_dir.exists():
        raise IngestError(f"--input {input_dir}: no such directory" + deeper_hint(input_dir))
    if int(max_pixels) < 1:
        raise IngestError(f"--max-pixels must be a positive number of pixels, got {max_pixels}")
    spec = get_source(source)
    if plan:
        _check_plan(source, spec.plan, verify_pixels)
    adapter = spec.adapter_function()
    if labels_key and not spec.labels_key:
        able = sorted(labels_key_sources())
        raise IngestError(f"--labels-key: SOURCE {source!r} does not read a label csv keyed by DICOM tags "
                          f"(sources that do: {', '.join(able)})")
    # A key given by the user is checked before the (possibly long) adapter run; the default key
    # in OUT is created only after the adapter succeeded, so a failed ingest leaves OUT alone.
    if isinstance(site_key, SiteKey):  # a key object (synthetic exports: a fixed, public key)
        key: Optional[SiteKey] = site_key
    elif site_key is not None or os.environ.get(KEY_ENV):
        key = load_site_key(site_key, out_dir)
    else:
        key = None
    options = AdapterOptions(
        uncertain=uncertain,
        mapping=Path(mapping) if mapping else None,
        labels_csv=Path(labels_csv) if labels_csv else None,
        labels_key=labels_key,
        workers=max(1, int(workers)),
        implied_negatives=bool(implied_negatives),
        plan=bool(plan),
        keep_non_chest=bool(keep_non_chest),
        # adapters that must write files (medmnist PNGs) write under OUT; adapters that read
        # images themselves (dicom, midrc) keep them inside the export unless follow_links
        extra={"out_dir": out_dir, "follow_links": follow_links, "progress": progress,
               "max_pixels": int(max_pixels), "readers": readers},
    )
    with following_links(follow_links):  # metadata files too: a link out of the export needs --follow-links
        table: SourceTable = adapter(input_dir, options)
    frame = ensure_columns(table.frame, table.classes)
    set_aside: list[SetAside] = list(table.set_aside)
    if len(frame) + len(set_aside) != table.rows_read:
        raise IngestError(
            f"adapter {source!r} bug: {len(frame)} rows + {len(set_aside)} set aside != {table.rows_read} read"
        )
    key = key or load_site_key(None, out_dir)
    # what a set-aside row's site is found from (set_aside_sites): its row, patient and site column
    source_rows = frame[[c for c in frame.columns if c in ("source_file", "source_row", "patient_id")
                         or c.startswith("group__")]]
    frame, non_chest = set_aside_non_chest(frame, keep=keep_non_chest)
    set_aside += non_chest
    frame, outside = contain_paths(frame, table.root, follow_links=follow_links, lexical_only=plan)
    set_aside += outside

    decodable = None if plan else functools.partial(_decode_reason, os.path.join(str(table.root), ""),
                                                    max_pixels=int(max_pixels))
    frame, dupes = drop_duplicate_images(frame, decodable=decodable)
    set_aside += dupes
    frame = frame.drop(columns=[c for c in ("real_path", "instance_uid") if c in frame])
    hints: list[str] = []
    if not plan:
        frame, bad_images = check_images(
            frame, table.root, decode=verify_pixels, skip_headers=table.headers_checked,
            workers=options.workers, progress=progress, max_pixels=int(max_pixels),
        )
        bad_images, hints = explain_missing(bad_images, table.root)
        set_aside += bad_images
    # Keyed here, before partitions and splits see an id (set-aside rows never carry one), and
    # after the checks so a 10^5-row export with 25 images present hashes only what it keeps.
    frame = pseudonymise(frame, key)

    frame = apply_uncertain_policy(frame, table.classes, uncertain)
    frame = apply_implied_negatives(frame, table.implied_negative_classes)
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
    aside_sites = set_aside_sites(set_aside, source_rows, parts.frame, site_by, sites_payload, key)

    run_options = {
        "site_by": site_by, "uncertain": uncertain, "verify_pixels": verify_pixels, "follow_links": follow_links,
        "max_pixels": int(max_pixels), "readers": readers,
        "mapping": str(mapping) if mapping else None, "val_fraction": val_fraction,
        "test_fraction": test_fraction, "implied_negatives": bool(implied_negatives),
        "implied_negative_classes": list(table.implied_negative_classes), "labels_key": labels_key,
        "keep_non_chest": bool(keep_non_chest), "plan": bool(plan),
    }
    site_classes = {site: [c for c in parts.class_sets.get(site, table.classes) if c in table.classes]
                    for site in sites_payload}
    report = {
        "report_version": REPORT_VERSION,
        "source": source,
        "adapter_version": table.adapter_version,
        "input": str(input_dir.resolve()),
        "export_root": str(Path(table.root).resolve()),
        "rows_read": table.rows_read,
        "rows_kept": kept,
        "rows_set_aside": len(set_aside),
        "set_aside_by_reason": dict(Counter(_reason_family(s.reason) for s in set_aside).most_common()),
        "set_aside": [_printable_row(s, site) for s, site in zip(set_aside, aside_sites)],
        "sites": {},
        "options": run_options,
        "pseudonym_key_id": key.key_id,
        # the key file that reproduces these pseudonyms, hence these sites and splits (a plan's
        # reader passes it to the ingest: --site-key FILE); never the key itself
        "site_key": {"file": str(key.path) if key.path else None, "key_id": key.key_id,
                     "created": key.origin == "created"},
        "notes": [printable(n) for n in table.notes + parts.notes],
        "hints": [printable(h) for h in hints],
    }
    report["rows_set_aside_without_site"] = sum(site is None for site in aside_sites)
    if plan:
        return _write_plan(report, sites_payload, site_classes, unlabeled, out_dir, set_aside, aside_sites, key,
                           started)
    for site, rows in sites_payload.items():
        own = [s for s, where in zip(set_aside, aside_sites) if where == site]
        payload = write_site(
            out_dir, site, rows, classes=site_classes[site],
            source=source, adapter_version=table.adapter_version, export_root=table.root,
            set_aside=own, options=run_options, unlabeled=unlabeled, key_id=key.key_id,
        )
        report["sites"][site] = {
            "rows": payload["rows"], "rows_per_split": payload["rows_per_split"],
            "rows_set_aside": len(own),
            "class_set": payload["class_set"], "manifest": str(Path(site) / "manifest.parquet"),
            "report": str(Path(site) / REPORT_NAME),
            "unlabeled": unlabeled, "implied_negatives": implied_negative_counts(rows, site_classes[site]),
        }
    report["seconds"] = round(time.perf_counter() - started, 3)
    _write_reports(out_dir, report, set_aside, aside_sites, key, single=whole_export(site_by))
    if kept == 0:
        raise IngestError(nothing_kept_message(report, out_dir))
    return report


#: 2: hints, per-site implied negatives, per-site copies of the report; 3: each row's site, and
#: each site's folder holds its own rows only (``site_report``)
REPORT_VERSION = 3
REPORT_NAME, SET_ASIDE_NAME = "ingest_report.json", "set_aside.csv"
MAX_REPORT_BYTES = 256 << 20  # a report lists set-aside rows: megabytes, not gigabytes
PLAN_NAME, PLAN_SET_ASIDE_NAME = "ingest_plan.json", "ingest_plan_set_aside.csv"


def read_ingest_report(out_dir: Path | str, site: str) -> dict:
    """The report of the ingest that wrote ``OUT/<site>``.

    ``OUT/<site>/ingest_report.json`` (report version 2 on); for an ingest written before
    per-site reports, ``OUT/ingest_report.json`` when it lists the site. Raises
    :class:`IngestError` when neither holds the site.
    """
    out_dir = Path(out_dir)
    for path in (out_dir / site / REPORT_NAME, out_dir / REPORT_NAME):
        if not path.is_file():
            continue
        try:
            report = json.loads(read_input_bytes(path, name=str(path), limit=MAX_REPORT_BYTES, decompress=False).decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise IngestError(f"{path}: not valid JSON ({exc})") from None
        if isinstance(report, dict) and site in (report.get("sites") or {}):
            return report
    raise IngestError(f"{out_dir}: no ingest report lists site {site!r} (looked in {out_dir / site / REPORT_NAME} "
                      f"and {out_dir / REPORT_NAME})")


def _check_plan(source: str, has_plan: bool, verify_pixels: bool) -> None:
    """Refuse ``--plan`` where it cannot keep its promise (no image opened)."""
    if verify_pixels:
        raise IngestError("--plan reads metadata only; it cannot --verify-pixels (drop one of the two)")
    if not has_plan:
        able = sorted(plan_sources())
        raise IngestError(f"--plan: SOURCE {source!r} keeps its metadata inside the images (or builds them), and a "
                          f"plan never opens an image; sources with a plan: {', '.join(able)}")


def _write_plan(report: dict, sites: dict[str, pd.DataFrame], site_classes: dict[str, list[str]], unlabeled: bool,
                out_dir: Path, set_aside: list[SetAside], aside_sites: list[Optional[str]], key: SiteKey,
                started: float) -> dict:
    """``OUT/ingest_plan.json`` and ``OUT/ingest_plan_set_aside.csv``: what the ingest would write."""
    report["plan"] = True
    report["cannot_know"] = list(PLAN_CANNOT_KNOW)
    for site, rows in sites.items():
        ordered = rows.assign(site=site)
        summary = site_summary(ordered, site_classes[site])
        report["sites"][site] = {**summary, "unlabeled": unlabeled,
                                 "implied_negatives": implied_negative_counts(rows, site_classes[site])}
    report["seconds"] = round(time.perf_counter() - started, 3)
    atomic_write_json(out_dir / PLAN_NAME, report)
    write_set_aside_csv(out_dir / PLAN_SET_ASIDE_NAME, set_aside, key, aside_sites)
    if report["rows_kept"] == 0:
        raise IngestError(nothing_kept_message(report, out_dir, set_aside_file=PLAN_SET_ASIDE_NAME))
    return report


def _decode_reason(prefix: str, rel: str, max_pixels: int = MAX_PIXELS) -> Optional[str]:
    """Why ``prefix + rel`` does not decode (full check), or None: picks the copy to keep."""
    from fedcxr.site_adapters.image_checks import check_image

    return check_image(prefix + rel, decode=True, max_pixels=max_pixels)


def set_aside_non_chest(frame: pd.DataFrame, *, keep: bool) -> tuple[pd.DataFrame, list[SetAside]]:
    """Rows whose DICOM tags say "not a chest radiograph" (``not_chest``): set aside, or kept flagged.

    Kept (``keep``), the column stays and reaches the manifest; a frame in which no row is
    flagged loses the column (sources without tags never carry it).
    """
    if "not_chest" not in frame:
        return frame, []
    flagged = frame["not_chest"].notna().to_numpy()
    if keep or not flagged.any():
        return (frame if flagged.any() else frame.drop(columns=["not_chest"])), []
    aside = [SetAside(f, int(r), str(reason), p) for f, r, p, reason in
             zip(frame.loc[flagged, "source_file"], frame.loc[flagged, "source_row"],
                 frame.loc[flagged, "image_path"], frame.loc[flagged, "not_chest"])]
    return frame.loc[~flagged].drop(columns=["not_chest"]), aside


#: Missing images looked for one folder deeper, at most (each costs a few ``stat`` calls).
MISSING_PROBES = 1000


def explain_missing(aside: list[SetAside], root: Path) -> tuple[list[SetAside], list[str]]:
    """Name the path tried for missing images, and say when they exist one folder deeper.

    A row whose image is found at ``<root>/<sub>/<path>`` or ``<root>/<folder>/<sub>/<name>``
    (a zip unpacked into its own folder, NIH's ``images_001/images/``) gets the reason
    ``missing file: not at <path>, but one folder deeper at <found>``; the report's hints say
    where each missing file was looked for and what to change. The first
    :data:`MISSING_PROBES` missing rows are probed.
    """
    missing = [i for i, s in enumerate(aside) if s.reason == "missing file" and s.image_path]
    if not missing:
        return aside, []
    root = Path(root).resolve()
    finder = _DeeperFinder(root)
    out = list(aside)
    found = 0
    first_found = None
    for i in missing[:MISSING_PROBES]:
        deeper = finder.find(aside[i].image_path)
        if deeper is not None:
            found += 1
            first_found = first_found or (aside[i].image_path, deeper)
            out[i] = SetAside(aside[i].file, aside[i].row,
                              f"missing file: not at {aside[i].image_path}, but one folder deeper at {deeper}",
                              aside[i].image_path)
    example = root / aside[missing[0]].image_path
    hints = [f"{len(missing)} missing file(s): each was looked for at {root}/<image path> (e.g. {example})"]
    if found:
        probed = min(len(missing), MISSING_PROBES)
        hints.append(f"{found} of {probed} missing file(s) probed exist one folder deeper (e.g. {first_found[0]} "
                     f"→ {first_found[1]}): point --input (or the mapping's image prefix) at the folder that "
                     "holds them")
    return out, hints


class _DeeperFinder:
    """Looks for ``rel`` one folder below where it was expected, with cached folder listings."""

    def __init__(self, root: Path, max_subdirs: int = 50) -> None:
        self.root = root
        self.max_subdirs = max_subdirs
        self._subdirs: dict[Path, list[str]] = {}

    def _dirs(self, folder: Path) -> list[str]:
        if folder not in self._subdirs:
            names: list[str] = []
            try:
                with os.scandir(folder) as it:
                    for entry in it:
                        if entry.is_dir(follow_symlinks=False) and not entry.name.startswith("."):
                            names.append(entry.name)
                            if len(names) >= self.max_subdirs:
                                break
            except OSError:
                pass
            self._subdirs[folder] = sorted(names)
        return self._subdirs[folder]

    def find(self, rel: str) -> Optional[str]:
        """``<sub>/rel`` or ``<folder>/<sub>/<name>`` relative to the root, if such a file exists."""
        folder, _, name = rel.rpartition("/")
        tries = [f"{sub}/{rel}" for sub in self._dirs(self.root)]
        if folder:
            tries += [f"{folder}/{sub}/{name}" for sub in self._dirs(self.root / folder)]
        for candidate in tries:
            if os.path.isfile(self.root / candidate):
                return candidate
        return None


def nothing_kept_message(report: dict, out_dir: Path, set_aside_file: str = "set_aside.csv") -> str:
    """Why an ingest kept no row: the commonest reasons, hints, and where the full list is."""
    if report["rows_read"] == 0:
        return f"--input {report['input']}: the export has no data rows; nothing to ingest"
    reasons = "; ".join(f"{count} {reason}" for reason, count in list(report["set_aside_by_reason"].items())[:3])
    hints = "".join(f"\n  hint: {h}" for h in report.get("hints", []))
    return (f"no row kept: all {report['rows_read']} row(s) read were set aside ({reasons}); every row and "
            f"its reason is in {out_dir / set_aside_file}{hints}")


def _printable_row(row: SetAside, site: Optional[str]) -> dict:
    """A set-aside row for JSON (with its site, None: not known), undecodable bytes made visible."""
    return {**{k: printable(v) if isinstance(v, str) else v for k, v in row.as_dict().items()}, "site": site}


def write_set_aside_csv(path: Path, rows: list[SetAside], key: SiteKey, sites: list[Optional[str]]) -> None:
    """Write :func:`set_aside_csv_bytes` to ``path`` (atomically)."""
    atomic_write_bytes(path, set_aside_csv_bytes(rows, key, sites))


def set_aside_csv_bytes(rows: list[SetAside], key: SiteKey, sites: list[Optional[str]]) -> bytes:
    """``set_aside.csv``: one line per set-aside row: file, row, image_path, image_key, site, reason.

    ``file``/``row`` point into the export's own metadata (the csv and its 1-based data row, or
    the DICOM file), ``image_path`` is the path relative to the export root as the export named
    it, ``image_key`` its keyed hash (the manifest's pseudonymous row name), ``site`` the site
    the row belongs to (empty: not known, :mod:`fedcxr.site_adapters.set_aside_sites`). No
    patient or study id is written: reasons never quote one, and the file stays at the site with
    the manifests.
    """
    paths = [s.image_path or "" for s in rows]
    keys = key.pseudonyms("image", paths) if rows else []
    frame = pd.DataFrame({
        "file": [printable(str(s.file)) for s in rows],
        "row": [s.row if s.row is not None else "" for s in rows],
        "image_path": [printable(p) if p else "" for p in paths],
        "image_key": [k if p else "" for p, k in zip(paths, keys)],
        "site": [site or "" for site in sites],
        "reason": [printable(s.reason) for s in rows],
    }, columns=["file", "row", "image_path", "image_key", "site", "reason"])
    return to_csv_text(frame).encode("utf-8")  # file names are cells: no formula runs


def _write_reports(out_dir: Path, report: dict, set_aside: list[SetAside], sites: list[Optional[str]],
                   key: SiteKey, *, single: bool) -> None:
    """The root's report and list (every row set aside) and each site's own (its rows only).

    A site's folder never holds another site's rows (:mod:`fedcxr.site_adapters.set_aside_sites`);
    its folder is never touched by a later ingest of another site into the same OUT. The root's
    files are the latest ingest's. Serialised once each: NIH's 112,095 rows take seconds.
    """
    atomic_write_bytes(out_dir / REPORT_NAME, json_bytes(report))
    atomic_write_bytes(out_dir / SET_ASIDE_NAME, set_aside_csv_bytes(set_aside, key, sites))
    for site in report["sites"]:
        mine = [i for i, where in enumerate(sites) if where == site]
        atomic_write_bytes(out_dir / site / REPORT_NAME, json_bytes(site_report(report, site, mine, single=single)))
        atomic_write_bytes(out_dir / site / SET_ASIDE_NAME,
                           set_aside_csv_bytes([set_aside[i] for i in mine], key, [site] * len(mine)))


def site_report(report: dict, site: str, mine: list[int], *, single: bool) -> dict:
    """``OUT/<site>/ingest_report.json``: the ingest as one site sees it (its rows, its counts).

    ``rows_read`` counts the site's rows (kept + its set aside); ``export`` holds the whole
    export's counts and where the rest is listed. An ingest of one site is the whole export, so
    its hints (example paths) stay; a multi-site ingest keeps them at the root only (an example
    path may be another hospital's).
    """
    rows = [report["set_aside"][i] for i in mine]
    kept = report["sites"][site]["rows"]
    return {
        **report,
        "site": site,
        "rows_read": kept + len(rows),
        "rows_kept": kept,
        "rows_set_aside": len(rows),
        "set_aside_by_reason": dict(Counter(_reason_family(r["reason"]) for r in rows).most_common()),
        "set_aside": rows,
        "sites": {site: report["sites"][site]},
        "hints": report["hints"] if single else [],
        "export": {
            "rows_read": report["rows_read"], "rows_kept": report["rows_kept"],
            "rows_set_aside": report["rows_set_aside"],
            "rows_set_aside_without_site": report["rows_set_aside_without_site"],
            "sites": sorted(report["sites"]),
            "report": f"../{REPORT_NAME}",
            "note": "rows set aside of other sites, and those whose site is not known, are listed only in the "
                    "export's own report (the root of the ingest output)",
        },
    }


def contain_paths(frame: pd.DataFrame, root: Path, *, follow_links: bool = False,
                  lexical_only: bool = False) -> tuple[pd.DataFrame, list[SetAside]]:
    """Normalise every ``image_path`` inside ``root``; set aside the ones that leave it.

    See :mod:`fedcxr.site_adapters.paths`: absolute paths, ``..`` escapes, NUL bytes, non-UTF-8
    names and (unless ``follow_links``) symbolic links out of the export are set aside with
    the reason. Adds ``real_path`` (every link resolved; None for a missing file), used to find
    the same file under two names. ``lexical_only`` (``--plan``): no file system access at all —
    links are not followed and ``real_path`` is None.
    """
    paths = frame["image_path"].astype(str).tolist()
    if lexical_only:
        checked = [lexical(p) for p in paths]
        norms, reasons = [n for n, _ in checked], [r for _, r in checked]
        reals: list[Optional[str]] = [None] * len(paths)
    else:
        norms, reals, reasons = contain_all(root, paths, follow_links=follow_links)
    bad = np.array([r is not None for r in reasons], dtype=bool)
    aside = [
        SetAside(f, int(r), reasons[i], p)
        for i, f, r, p in zip(np.flatnonzero(bad), frame.loc[bad, "source_file"], frame.loc[bad, "source_row"],
                              frame.loc[bad, "image_path"])
    ]
    out = frame.copy()
    out["image_path"] = [n if n is not None else p for n, p in zip(norms, out["image_path"])]
    out["real_path"] = reals
    return out.loc[~bad].copy(), aside


def pseudonymise(frame: pd.DataFrame, key: SiteKey) -> pd.DataFrame:
    """Replace ``patient_id``/``study_id`` by keyed pseudonyms and add ``image_key``.

    The study pseudonym is keyed by patient and study together, so two patients whose exports
    reuse a study number (csv sources number studies per patient) never share a study id.
    ``image_key`` is the keyed hash of the image's relative path: a stable pseudonymous name
    for the row (same key, same path → same value) that does not reveal the path.
    """
    out = frame.copy()
    patient = out["patient_id"].astype(str)
    out["study_id"] = key.pseudonyms("study", patient + "\x00" + out["study_id"].astype(str))
    out["patient_id"] = key.pseudonyms("patient", patient)
    out["image_key"] = key.pseudonyms("image", out["image_path"].astype(str))
    return out


def _reason_family(reason: str) -> str:
    """Group reasons for the summary: text before the first ':' (details follow it)."""
    return reason.split(":", 1)[0].strip()


def drop_duplicate_images(
    frame: pd.DataFrame, decodable: Optional[Callable[[str], Optional[str]]] = None
) -> tuple[pd.DataFrame, list[SetAside]]:
    """Keep the first row of each image; later rows showing the same image are set aside.

    The same image is found three ways: the same relative path; the same file under another
    name (``real_path`` when present: a symbolic link, or a hard link with the same device and
    inode); and, for DICOM, the same SOPInstanceUID (``instance_uid`` when present: one
    instance copied into two folders). A copy under another patient gets a reason saying so:
    it could otherwise put one image in two splits. Reasons name rows and paths, never ids.

    Copies of one SOPInstanceUID are different files, and one may be corrupt: with
    ``decodable`` (``image_path`` → reason it does not decode, or None) the first copy *that
    decodes* is kept; copies before it are set aside with their own decode failure, copies
    after it as duplicates of it; when none decodes, each keeps its own failure. Only
    instances with several copies are decoded here.
    """
    dup = frame.duplicated(subset=["image_path"], keep="first")
    aside: list[SetAside] = []
    if dup.any():
        first_row = frame.loc[~dup].set_index("image_path")["source_row"]
        aside = [
            SetAside(f, int(r), f"duplicate row: same image as row {int(first_row[p])}", p)
            for f, r, p in zip(frame.loc[dup, "source_file"], frame.loc[dup, "source_row"],
                               frame.loc[dup, "image_path"])
        ]
        frame = frame.loc[~dup]
    for column, what in (("real_path", "same file as"), ("instance_uid", "same SOPInstanceUID as")):
        if column not in frame:
            continue
        identity = _file_identity(frame[column]) if column == "real_path" else frame[column]
        known = identity.notna() & (identity.astype(str) != "")
        if column == "instance_uid" and decodable is not None:
            frame, undecodable = _decodable_copy_first(frame, identity, known, decodable)
            aside += undecodable
            identity, known = identity.loc[frame.index], known.loc[frame.index]
        dup = known & identity.duplicated(keep="first")
        if not dup.any():
            continue
        first = frame.loc[known & ~dup].assign(_id=identity[known & ~dup]).set_index("_id")
        for f, r, p, pid, ident in zip(frame.loc[dup, "source_file"], frame.loc[dup, "source_row"],
                                       frame.loc[dup, "image_path"], frame.loc[dup, "patient_id"], identity[dup]):
            keeper = first.loc[ident]
            other = " under another patient" if keeper["patient_id"] != pid else ""
            aside.append(SetAside(f, int(r), f"duplicate image{other}: {what} row {int(keeper['source_row'])} "
                                              f"({keeper['image_path']})", p))
        frame = frame.loc[~dup]
    return frame.copy(), aside


def _decodable_copy_first(
    frame: pd.DataFrame, identity: pd.Series, known: pd.Series, decodable: Callable[[str], Optional[str]]
) -> tuple[pd.DataFrame, list[SetAside]]:
    """Among copies of one instance, set aside those before the first that decodes (their reason).

    The rows left keep their order, so the first copy of each instance is now a decodable one
    (or, when none decodes, every copy has been set aside here).
    """
    shared = known & identity.duplicated(keep=False)
    if not shared.any():
        return frame, []
    drop: list = []
    aside: list[SetAside] = []
    for _, members in frame.loc[shared].groupby(identity[shared], sort=False):
        for index, row in members.iterrows():
            reason = decodable(str(row["image_path"]))
            if reason is None:
                break
            drop.append(index)
            aside.append(SetAside(row["source_file"], int(row["source_row"]), reason, row["image_path"]))
    return frame.drop(index=drop), aside


def _file_identity(real_paths: pd.Series) -> pd.Series:
    """``dev:inode`` of each existing file (hard links agree); None where the file is missing."""
    out: list[Optional[str]] = []
    for real in real_paths.tolist():
        if not isinstance(real, str):
            out.append(None)
            continue
        try:
            info = os.stat(real)
            out.append(f"{info.st_dev}:{info.st_ino}")
        except (OSError, ValueError):
            out.append(real)
    return pd.Series(out, index=real_paths.index, dtype=object)


def check_images(
    frame: pd.DataFrame,
    root: Path,
    *,
    decode: bool,
    skip_headers: bool = False,
    workers: int = 1,
    progress: bool = True,
    max_pixels: int = MAX_PIXELS,
) -> tuple[pd.DataFrame, list[SetAside]]:
    """Set aside rows whose image is missing, unreadable or (with ``decode``) undecodable."""
    from fedcxr.site_adapters.image_checks import check_images_batch

    if skip_headers and not decode:
        return frame, []
    # Plain string joins: building 10^5 pathlib.Path objects cost ~1 s on NIH's 112,120 rows.
    prefix = os.path.join(str(root), "")
    paths = [prefix + p for p in frame["image_path"].tolist()]
    chunk = 256 if decode else 4096
    parts = map_chunks(check_images_batch, [paths[i:i + chunk] for i in range(0, len(paths), chunk)], decode,
                       int(max_pixels), workers=workers, progress=progress, desc="checking images", leave=False)
    reasons = [reason for part in parts for reason in part]
    bad = np.array([r is not None for r in reasons], dtype=bool)
    aside = [
        SetAside(f, int(r), reason, p)
        for f, r, p, reason in zip(
            frame.loc[bad, "source_file"], frame.loc[bad, "source_row"], frame.loc[bad, "image_path"],
            [reasons[i] for i in np.flatnonzero(bad)],
        )
    ]
    return frame.loc[~bad].copy(), aside


__all__ = ["ADAPTERS", "PLAN_CANNOT_KNOW", "run_ingest", "get_adapter", "help_for", "check_images", "contain_paths",
           "drop_duplicate_images", "explain_missing", "pseudonymise", "read_ingest_report", "set_aside_non_chest"]
