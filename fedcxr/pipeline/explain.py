"""Grad-CAM overlays: where in the image the model looked for a class (opt-in, local use).

``monai.visualize.GradCAM`` on the backbone's last feature block (ResNet ``layer4``, DenseNet
``features.norm5``) of the main-head logits (:class:`~fedcxr.pipeline.inference.MainLogits`),
upsampled to the input size and drawn over the preprocessed image.

Used by ``fedcxr predict --cam N`` (the N highest-scoring images per class of a new folder) and
``fedcxr evaluate --cam`` (a gallery of the top-scoring test images per class in report.md).
Files are named by the image's pseudonymous key, never by a path or id. The overlays ARE
derived from patient pixels: they are written only when asked for and stay with the images.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from fedcxr.pipeline.data import NORM_MEAN, NORM_STD
from fedcxr.pipeline.inference import MainLogits, preprocess
from fedcxr.rundir import RunDir

log = logging.getLogger(__name__)

#: Grad-CAM layer per backbone (names inside :class:`MainLogits`)
TARGET_LAYERS = {
    "resnet18": "model.backbone.layer4", "resnet10": "model.backbone.layer4",
    "resnet_tiny": "model.backbone.layer4", "densenet121": "model.backbone.features.norm5",
}


def grad_cam(model: torch.nn.Module, image: torch.Tensor, class_index: int, device: torch.device) -> np.ndarray:
    """Grad-CAM of class ``class_index`` for one preprocessed image ``(1, H, W)`` → ``(H, W)`` in [0, 1]."""
    from monai.visualize import GradCAM

    layer = TARGET_LAYERS.get(getattr(model, "backbone_name", ""), "model.backbone.layer4")
    wrapped = MainLogits(model).to(device).eval()
    cam = GradCAM(nn_module=wrapped, target_layers=layer)
    try:
        with torch.enable_grad():
            heat = cam(x=image[None].to(device), class_idx=int(class_index))
    finally:
        model.zero_grad(set_to_none=True)  # the backward pass must not leave gradients in the model
    return heat[0, 0].detach().cpu().numpy().astype(np.float32)


def save_overlay(image: torch.Tensor, heat: np.ndarray, path: Path, title: str) -> Path:
    """The grey image with the heat map over it (jet, 40 %) as a PNG; returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grey = (image[0].cpu().numpy() * NORM_STD + NORM_MEAN).clip(0, 1)
    fig, axes = plt.subplots(1, 2, figsize=(6, 3.2), dpi=100)
    for ax in axes:
        ax.imshow(grey, cmap="gray", vmin=0, vmax=1)
        ax.axis("off")
    axes[1].imshow(heat, cmap="jet", alpha=0.4, vmin=0, vmax=1)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def write_overlays(model: torch.nn.Module, paths: Sequence[str | Path], keys: Sequence[str], probs: np.ndarray,
                   classes: Sequence[str], out_dir: Path | str, *, size: int, top_n: int,
                   device: torch.device) -> list[Path]:
    """Overlays of the ``top_n`` highest-probability images per class: ``out_dir/<class>/<key>.png``.

    ``paths[i]``, ``keys[i]`` and ``probs[i]`` describe image ``i``. Returns the files written.
    """
    out_dir = Path(out_dir)
    written: list[Path] = []
    if top_n <= 0 or len(paths) == 0:
        return written
    cache: dict[int, torch.Tensor] = {}
    for j, cls in enumerate(classes):
        for rank, i in enumerate(np.argsort(-probs[:, j], kind="stable")[:top_n]):
            i = int(i)
            if i not in cache:
                cache[i] = preprocess(paths[i], size)
            heat = grad_cam(model, cache[i], j, device)
            title = f"{cls}: p = {probs[i, j]:.3f} (rank {rank + 1})  key {keys[i]}"
            written.append(save_overlay(cache[i], heat, out_dir / cls / f"{keys[i]}.png", title))
    log.info("wrote %d Grad-CAM overlay(s) into %s", len(written), out_dir)
    return written


def write_gallery(run_dir: Path | str, *, split: str = "test", top_n: int = 3,
                  device: torch.device | str | None = None) -> dict[str, dict[str, list[str]]]:
    """Overlays of the ``top_n`` top-scoring ``split`` images per class and evaluated site.

    Reads ``RUN_DIR/predictions/<split>.parquet`` (written by ``fedcxr evaluate``), finds each
    row's image through its site's manifest (:func:`fedcxr.pipeline.predictions.row_keys`; only the
    site's own manifest can do that), scores it with the model the site was evaluated with, and
    writes ``RUN_DIR/cam/<site>/<class>/<row_key>.png``. Returns ``{site: {class: [paths
    relative to RUN_DIR]}}``.
    """
    import pandas as pd

    from fedcxr.pipeline.data import load_site
    from fedcxr.pipeline.inference import load_run_model
    from fedcxr.pipeline.devices import resolve_device
    from fedcxr.pipeline.predictions import row_keys

    run = RunDir(run_dir)
    dev = resolve_device(device)
    shutil.rmtree(run.cam, ignore_errors=True)  # no stale overlays of an earlier gallery
    predictions = pd.read_parquet(run.predictions(split))
    gallery: dict[str, dict[str, list[str]]] = {}
    for site in dict.fromkeys(predictions["site"].astype(str)):
        loaded = load_run_model(run_dir, site, warn_global=False)
        info = load_site(loaded.run["site_dirs"][site])
        where = dict(zip(row_keys(info.manifest), info.manifest["image_path"].astype(str)))
        rows = predictions.loc[predictions["site"].astype(str) == site].reset_index(drop=True)
        known = rows["row_key"].isin(where)
        if not known.all():
            log.warning("site %s: %d of %d %s predictions match no row of its manifest (re-ingested since "
                        "`fedcxr evaluate` wrote them?): left out of the gallery", site, int((~known).sum()),
                        len(rows), split)
        rows = rows.loc[known].reset_index(drop=True)
        if rows.empty:
            continue
        probs = rows[[f"prob__{c}" for c in loaded.classes]].to_numpy(dtype=np.float32)
        paths = [info.export_root / where[k] for k in rows["row_key"]]
        files = write_overlays(loaded.model, paths, list(rows["row_key"]), probs, loaded.classes,
                               run.cam / site, size=loaded.image_size, top_n=top_n, device=dev)
        per_class: dict[str, list[str]] = {}
        for path in files:
            per_class.setdefault(path.parent.name, []).append(path.relative_to(run.root).as_posix())
        gallery[site] = per_class
    return gallery


__all__ = ["TARGET_LAYERS", "grad_cam", "save_overlay", "write_gallery", "write_overlays"]
