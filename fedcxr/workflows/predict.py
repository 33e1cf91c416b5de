"""``fedcxr predict RUN_DIR --input DIR --out FILE.csv`` as a library function: a trained model on new images.

:func:`predict` returns a :class:`PredictResult` (the scores as a DataFrame, the files written)
and prints nothing; the command prints its summary.

``DIR`` is a site's manifest folder (written by ``fedcxr ingest``: every row of every split is
scored) or a plain folder of DICOM/PNG/JPEG files, ingested on the fly as an unlabeled site
(the ``images`` source) into a temporary folder that is deleted afterwards; nothing is ever
written into ``DIR``.

Two files come out:

``FILE.csv``
    one row per image: ``key`` (a pseudonymous key, the same ``row_key`` ``fedcxr evaluate``
    uses for a manifest row), ``not_chest_radiograph`` (1 when the image's DICOM tags say it is
    not a chest radiograph — a hip, teeth, a CT: :mod:`fedcxr.site_adapters.body_part`; it is
    scored anyway, and its scores mean nothing), ``prob__<class>`` for every class of the model, and
    ``<rule>__<class>`` (1/0) for every operating point stored in ``RUN_DIR/operating_points.json``
    (thresholds chosen on validation data by ``fedcxr evaluate``: ``youden``, ``sens90``,
    ``spec90``; empty where a threshold is undefined). No patient id, no file name, no path:
    the CSV can be shared. When there are no thresholds to apply (the run was never evaluated,
    or it has no ``target:`` and was evaluated at several sites without ``--site``) the CSV has
    probabilities only and the command says why.
``FILE.private-key-map.csv``
    ``key, image_path, status, not_chest``: the only link from a key back to an image (paths
    relative to DIR), plus every file that could not be scored and why (``status``), and why a
    flagged image is not a chest radiograph (``not_chest``). It identifies images, so it stays
    where the images are.

Keys of a plain folder are stable from one ``fedcxr predict`` to the next only under the same
site key (``--site-key FILE`` or ``$FEDCXR_SITE_KEY``, :mod:`fedcxr.site_adapters.sitekey`);
without one, the on-the-fly ingest draws a fresh key and each run's keys are new (the key map
of each run still links them to the images).

The model is the run's global one; ``--site NAME`` takes that site's own model where the
method keeps one (PFL heads, FedBN statistics, Individual) and that site's thresholds.
Without ``--site``, thresholds come from the run's target (or its only evaluated site).
``--cam N`` also writes Grad-CAM overlays of the N highest-scoring images per class
(:mod:`fedcxr.pipeline.explain`) into ``FILE.cam/`` (derived from patient pixels: local use).
"""

from __future__ import annotations

import os
import secrets
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from fedcxr.atomic import atomic_path
from fedcxr.errors import UserError
from fedcxr.escape import csv_frame
from fedcxr.evaluation.runs import decision_thresholds
from fedcxr.rundir import RunDir

#: 1 where the image's DICOM tags say it is not a chest radiograph (:mod:`fedcxr.site_adapters.body_part`).
NOT_CHEST_COLUMN = "not_chest_radiograph"


def private_map_path(out: Path) -> Path:
    """``FILE.private-key-map.csv`` beside ``FILE.csv``: key → image path (stays local)."""
    out = Path(out)
    return out.with_name(out.stem + ".private-key-map.csv")


def cam_dir(out: Path) -> Path:
    """``FILE.cam/`` beside ``FILE.csv``: Grad-CAM overlays named by key."""
    out = Path(out)
    return out.with_name(out.stem + ".cam")


def _input_site(input_dir: Path, tmp: Path, progress: bool,
                site_key: Optional[Path] = None) -> tuple[pd.DataFrame, Path, list[dict]]:
    """``(manifest, export root, files set aside)`` of DIR: a manifest folder, or a folder ingested here."""
    from fedcxr.pipeline.data import load_site
    from fedcxr.site_adapters.ingest import run_ingest
    from fedcxr.site_adapters.sitekey import ENV_VAR as KEY_ENV

    if not input_dir.is_dir():
        raise UserError(f"--input {input_dir}: no such directory")
    if (input_dir / "manifest.parquet").is_file():
        site = load_site(input_dir)
        return site.manifest, site.export_root, []
    if site_key is None and not os.environ.get(KEY_ENV):
        site_key = _ephemeral_key(tmp)
    report = run_ingest("images", input_dir, tmp / "manifests", site_name="input", progress=progress,
                        site_key=site_key, keep_non_chest=True)  # scored, and flagged (not_chest)
    aside = report["set_aside"]
    if not report["sites"]:
        reasons = "; ".join(f"{k}: {v}" for k, v in report["set_aside_by_reason"].items())
        raise UserError(f"--input {input_dir}: no image could be read ({reasons or 'no image files'})")
    site = load_site(tmp / "manifests" / "input")
    return site.manifest, input_dir, aside


def _ephemeral_key(tmp: Path) -> Path:
    """A one-run site key in the temporary folder (deleted with it): fresh keys, nothing to keep."""
    path = tmp / "ephemeral_site_key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32) + "\n")
    return path


def _contained(root: Path, relative: str, row: int) -> Path:
    """``root / relative``, refusing a path that leaves ``root`` (a tampered manifest)."""
    path = (root / relative).resolve()
    if not path.is_relative_to(root.resolve()):
        raise UserError(f"manifest row {row}: image path {relative!r} leaves the export root {root}")
    return path


def _regular_files_only(relative: list[str], paths: list[Path]) -> tuple[list[int], list[dict]]:
    """Set aside (never open) a manifest row whose file is gone or is a named pipe, socket or device:
    reading a pipe would block forever. ``(kept row indices, set-aside rows)``."""
    from fedcxr.site_adapters.paths import regular_file_problem

    problems = [regular_file_problem(p) for p in paths]
    keep = [i for i, problem in enumerate(problems) if problem is None]
    if not keep:
        raise UserError(f"no image could be read: {problems[0] if problems else 'no rows'}")
    unread = [{"image_path": relative[i], "file": relative[i], "reason": problems[i]}
              for i in range(len(paths)) if problems[i] is not None]
    return keep, unread


@dataclass(frozen=True)
class PredictResult:
    """What :func:`predict` wrote and found.

    ``predictions``: the CSV's rows as a DataFrame (``key``, ``not_chest_radiograph``,
    ``prob__<class>``, ``<rule>__<class>``); ``csv`` and ``private_key_map`` the two files;
    ``model``: ``global`` or the site whose own model scored; ``thresholds_from``: the site whose
    operating points decided, or None with ``no_decisions`` saying why."""

    csv: Path
    private_key_map: Path
    predictions: pd.DataFrame = field(repr=False)
    model: str
    classes: list[str]
    thresholds_from: Optional[str]
    no_decisions: Optional[str]
    not_scored: int
    not_chest: int
    cam: list[Path] = field(default_factory=list, repr=False)

    @property
    def scored(self) -> int:
        return len(self.predictions)

    def summary(self) -> dict:
        """The plain-dict form the command prints from."""
        return {"scored": self.scored, "not_scored": self.not_scored, "not_chest": self.not_chest,
                "out": str(self.csv), "private_key_map": str(self.private_key_map), "model": self.model,
                "thresholds_from": self.thresholds_from, "no_decisions": self.no_decisions,
                "classes": self.classes, "cam": self.cam}


def predict(run_dir: "RunDir | Path | str", input_dir: Path | str, out: Path | str, *, site: Optional[str] = None,
            device: Optional[str] = "auto", cam: int = 0, batch_size: int = 32,
            progress: bool = True, site_key: Optional[Path | str] = None) -> PredictResult:
    """Score every image of ``input_dir`` (a site's manifest folder or a plain folder of
    DICOM/PNG/JPEG files) with the run's model; writes ``out`` (a ``.csv``) and its private key map
    beside it (see the module doc). ``site``: that site's own model and thresholds; ``cam`` > 0:
    Grad-CAM overlays of the ``cam`` top-scoring images per class into ``FILE.cam/``."""
    from fedcxr.pipeline.inference import load_run_model, score_files
    from fedcxr.pipeline.devices import resolve_device
    from fedcxr.pipeline.predictions import row_keys

    run_dir, input_dir, out = RunDir.existing(run_dir).root, Path(input_dir), Path(out)
    if out.suffix.lower() != ".csv":
        raise UserError(f"--out {out}: give a .csv file name")
    if out.resolve().is_relative_to(input_dir.resolve()):
        raise UserError(f"--out {out}: lies inside --input {input_dir}; predict never writes into the input")
    loaded = load_run_model(run_dir, site)
    dev = resolve_device(device or "auto")
    with tempfile.TemporaryDirectory(prefix="fedcxr-predict-") as tmp:
        manifest, root, aside = _input_site(input_dir, Path(tmp), progress, Path(site_key) if site_key else None)
        keys = row_keys(manifest).to_numpy()
        relative = manifest["image_path"].astype(str).tolist()
        paths = [_contained(root, rel, i) for i, rel in enumerate(relative)]
        not_chest = (manifest["not_chest"].where(manifest["not_chest"].notna(), "").astype(str).to_numpy()
                     if "not_chest" in manifest else np.full(len(manifest), "", dtype=object))
        keep, unread = _regular_files_only(relative, paths)
        keys, not_chest = keys[keep], not_chest[keep]
        relative, paths = [relative[i] for i in keep], [paths[i] for i in keep]
        aside = aside + unread
        probs = score_files(loaded.model, paths, size=loaded.image_size, device=dev, names=relative,
                            batch_size=batch_size, progress=progress)
    threshold_site, thresholds, no_decisions = decision_thresholds(run_dir, loaded.run, site)
    frame = pd.DataFrame({"key": keys})
    frame[NOT_CHEST_COLUMN] = [int(bool(reason)) for reason in not_chest]
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
        csv_frame(frame).to_csv(tmp_out, index=False)
    mapping = pd.DataFrame({"key": keys, "image_path": relative, "status": "scored", "not_chest": not_chest})
    if aside:
        mapping = pd.concat([mapping, pd.DataFrame({
            "key": "", "image_path": [a["image_path"] or a["file"] for a in aside],
            "status": [f"not scored: {a['reason']}" for a in aside], "not_chest": ""})], ignore_index=True)
    with atomic_path(private_map_path(out)) as tmp_map:
        csv_frame(mapping).to_csv(tmp_map, index=False)
    overlays = []
    if cam:
        from fedcxr.pipeline.explain import write_overlays

        overlays = write_overlays(loaded.model, paths, keys, probs, loaded.classes, cam_dir(out),
                                  size=loaded.image_size, top_n=int(cam), device=dev)
    return PredictResult(csv=out, private_key_map=private_map_path(out), predictions=frame, model=site or "global",
                         classes=list(loaded.classes), thresholds_from=threshold_site, no_decisions=no_decisions,
                         not_scored=len(aside), not_chest=int(frame[NOT_CHEST_COLUMN].sum()), cam=list(overlays))


__all__ = ["NOT_CHEST_COLUMN", "PredictResult", "cam_dir", "predict", "private_map_path"]
