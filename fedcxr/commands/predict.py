"""``fedcxr predict RUN_DIR --input DIR --out FILE.csv``: a trained model on new images.

``DIR`` is a site's manifest folder (written by ``fedcxr ingest``: every row of every split is
scored) or a plain folder of DICOM/PNG/JPEG files, ingested on the fly as an unlabeled site
(the ``images`` source) into a temporary folder that is deleted afterwards; nothing is ever
written into ``DIR``.

Two files come out:

``FILE.csv``
    one row per image: ``key`` (a pseudonymous key, the same ``row_key`` ``fedcxr evaluate``
    uses for a manifest row), ``prob__<class>`` for every class of the model, and
    ``<rule>__<class>`` (1/0) for every operating point stored in ``RUN_DIR/operating_points.json``
    (thresholds chosen on validation data by ``fedcxr evaluate``: ``youden``, ``sens90``,
    ``spec90``; empty where a threshold is undefined). No patient id, no file name, no path:
    the CSV can be shared.
``FILE.private-key-map.csv``
    ``key, image_path, status``: the only link from a key back to an image (paths relative to
    DIR), plus every file that could not be scored and why (``status``). It identifies images,
    so it stays where the images are.

The model is the run's global one; ``--site NAME`` takes that site's own model where the
method keeps one (PFL heads, FedBN statistics, Individual) and that site's thresholds.
Without ``--site``, thresholds come from the run's target (or its only evaluated site).
``--cam N`` also writes Grad-CAM overlays of the N highest-scoring images per class
(:mod:`fedcxr.pipeline.explain`) into ``FILE.cam/`` (derived from patient pixels: local use).
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path
from typing import Optional

import pandas as pd

from fedcxr.atomic import atomic_path
from fedcxr.commands.evaluate import OPERATING_POINTS
from fedcxr.errors import UserError
from fedcxr.logs import progress_wanted

log = logging.getLogger(__name__)



def private_map_path(out: Path) -> Path:
    """``FILE.private-key-map.csv`` beside ``FILE.csv``: key → image path (stays local)."""
    out = Path(out)
    return out.with_name(out.stem + ".private-key-map.csv")


def cam_dir(out: Path) -> Path:
    """``FILE.cam/`` beside ``FILE.csv``: Grad-CAM overlays named by key."""
    out = Path(out)
    return out.with_name(out.stem + ".cam")


def thresholds_for(run_dir: Path, run: dict, site: Optional[str]) -> tuple[Optional[str], dict]:
    """``(site whose thresholds apply, {class: {rule: t}})`` from ``operating_points.json``, or ``(None, {})``."""
    path = Path(run_dir) / OPERATING_POINTS
    if not path.is_file():
        log.warning("%s has no %s (run `fedcxr evaluate %s` first): probabilities only, no decisions",
                    run_dir, OPERATING_POINTS, run_dir)
        return None, {}
    try:
        stored = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None
    if site is None:
        candidates = [run.get("target")] if run.get("target") in stored else list(stored)
        if len(candidates) != 1:
            log.warning("%s holds thresholds of sites %s: pass --site NAME to apply one site's; "
                        "probabilities only", path.name, sorted(stored))
            return None, {}
        site = candidates[0]
    if site not in stored:
        log.warning("%s has no thresholds for site %s: probabilities only", path.name, site)
        return None, {}
    return site, stored[site]


def _input_site(input_dir: Path, tmp: Path, progress: bool) -> tuple[pd.DataFrame, Path, list[dict]]:
    """``(manifest, export root, files set aside)`` of DIR: a manifest folder, or a folder ingested here."""
    from fedcxr.pipeline.data import load_site
    from fedcxr.site_adapters.ingest import run_ingest

    if not input_dir.is_dir():
        raise UserError(f"--input {input_dir}: no such directory")
    if (input_dir / "manifest.parquet").is_file():
        site = load_site(input_dir)
        return site.manifest, site.export_root, []
    report = run_ingest("images", input_dir, tmp, site_name="input", progress=progress)
    aside = report["set_aside"]
    if not report["sites"]:
        reasons = "; ".join(f"{k}: {v}" for k, v in report["set_aside_by_reason"].items())
        raise UserError(f"--input {input_dir}: no image could be read ({reasons or 'no image files'})")
    site = load_site(tmp / "input")
    return site.manifest, input_dir, aside


def _contained(root: Path, relative: str, row: int) -> Path:
    """``root / relative``, refusing a path that leaves ``root`` (a tampered manifest)."""
    path = (root / relative).resolve()
    if not path.is_relative_to(root.resolve()):
        raise UserError(f"manifest row {row}: image path {relative!r} leaves the export root {root}")
    return path


def predict_folder(run_dir: Path | str, input_dir: Path | str, out: Path | str, *, site: Optional[str] = None,
                   device: Optional[str] = None, cam: int = 0, batch_size: int = 32,
                   progress: bool = True) -> dict:
    """Score every image of ``input_dir``; writes ``out`` and its private key map. Returns a summary."""
    from fedcxr.pipeline.inference import load_run_model, score_files
    from fedcxr.pipeline.local import resolve_device
    from fedcxr.pipeline.predict import row_keys

    run_dir, input_dir, out = Path(run_dir), Path(input_dir), Path(out)
    if out.suffix.lower() != ".csv":
        raise UserError(f"--out {out}: give a .csv file name")
    if out.resolve().is_relative_to(input_dir.resolve()):
        raise UserError(f"--out {out}: lies inside --input {input_dir}; predict never writes into the input")
    loaded = load_run_model(run_dir, site)
    dev = resolve_device(device or "auto")
    with tempfile.TemporaryDirectory(prefix="fedcxr-predict-") as tmp:
        manifest, root, aside = _input_site(input_dir, Path(tmp), progress)
        keys = row_keys(manifest).to_numpy()
        relative = manifest["image_path"].astype(str).tolist()
        paths = [_contained(root, rel, i) for i, rel in enumerate(relative)]
        probs = score_files(loaded.model, paths, size=loaded.image_size, device=dev, names=relative,
                            batch_size=batch_size, progress=progress)
    threshold_site, thresholds = thresholds_for(run_dir, loaded.run, site)
    frame = pd.DataFrame({"key": keys})
    for j, cls in enumerate(loaded.classes):
        frame[f"prob__{cls}"] = probs[:, j]
    for j, cls in enumerate(loaded.classes):
        entry = thresholds.get(cls) or {}
        for rule in (r for r in entry if r != "reason"):
            t = entry[rule]
            decided = (probs[:, j] >= t).astype(int) if t is not None else [pd.NA] * len(frame)
            frame[f"{rule}__{cls}"] = pd.array(decided, dtype="Int64")
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp_out:
        frame.to_csv(tmp_out, index=False)
    mapping = pd.DataFrame({"key": keys, "image_path": relative, "status": "scored"})
    if aside:
        mapping = pd.concat([mapping, pd.DataFrame({
            "key": "", "image_path": [a["image_path"] or a["file"] for a in aside],
            "status": [f"not scored: {a['reason']}" for a in aside]})], ignore_index=True)
    with atomic_path(private_map_path(out)) as tmp_map:
        mapping.to_csv(tmp_map, index=False)
    summary = {"scored": len(frame), "not_scored": len(aside), "out": str(out),
               "private_key_map": str(private_map_path(out)), "model": site or "global",
               "thresholds_from": threshold_site, "classes": loaded.classes, "cam": []}
    if cam:
        from fedcxr.pipeline.explain import write_overlays

        summary["cam"] = write_overlays(loaded.model, paths, keys, probs, loaded.classes, cam_dir(out),
                                        size=loaded.image_size, top_n=int(cam), device=dev)
    return summary


def cli_predict(args: argparse.Namespace) -> int:
    summary = predict_folder(args.run_dir, args.input, args.out, site=args.site, device=args.device,
                             cam=int(args.cam or 0), batch_size=int(args.batch_size),
                             progress=progress_wanted(args))
    print(f"scored {summary['scored']} image(s) with the {summary['model']} model "
          f"({len(summary['classes'])} classes): {summary['out']}")
    if summary["thresholds_from"]:
        print(f"  decisions at the operating points chosen on {summary['thresholds_from']}'s validation split")
    if summary["not_scored"]:
        print(f"  {summary['not_scored']} file(s) could not be read: see the status column of the key map")
    print(f"  key → image path (identifies images: keep it local): {summary['private_key_map']}")
    if summary["cam"]:
        print(f"  {len(summary['cam'])} Grad-CAM overlay(s) in {cam_dir(Path(summary['out']))}")
    return 0
