"""A finished run's model applied to image files: the preprocessing, the model, the scores.

``fedcxr predict`` (new images), the MONAI bundle export (:mod:`fedcxr.bundle`) and Grad-CAM
(:mod:`fedcxr.pipeline.explain`) all go through here, so an image is scored exactly as training
saw it: :func:`fedcxr.site_adapters.images.read_image_resized` (the decoder the training cache
uses, whatever windowing/decoding rules ``images.py`` has) → ``/ 255`` →
``(x - NORM_MEAN) / NORM_STD`` (:mod:`fedcxr.pipeline.data`). No augmentation.

The model is the run's global one, or a site's own (``site=``) for methods that keep one
(PFL heads, FedBN statistics, Individual): the same rule ``fedcxr evaluate`` scores a site with.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from fedcxr.errors import UserError
from fedcxr.logs import bar_disabled
from fedcxr.pipeline.data import NORM_MEAN, NORM_STD

log = logging.getLogger(__name__)


def preprocess(path: str | Path, size: int) -> torch.Tensor:
    """One image file → float32 ``(1, size, size)``, normalised exactly as training's cache + dataset."""
    from fedcxr.site_adapters.images import read_image_resized

    pixels = np.asarray(read_image_resized(path, int(size)), dtype=np.float32) * np.float32(1.0 / 255.0)
    return ((torch.from_numpy(pixels)[None] - NORM_MEAN) / NORM_STD).float()


class ImageFiles(Dataset):
    """Image files as ``{"image": (1, H, W), "index": i}`` items (no labels: new images)."""

    def __init__(self, paths: Sequence[str | Path], size: int, names: Optional[Sequence[str]] = None) -> None:
        self.paths = [str(p) for p in paths]
        self.size = int(size)
        self.names = list(names) if names is not None else self.paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict[str, Any]:
        try:
            image = preprocess(self.paths[i], self.size)
        except Exception as exc:  # any decoder failure names the file (the user's own)
            raise UserError(f"{self.names[i]}: cannot decode this image ({type(exc).__name__}: {exc})") from None
        return {"image": image, "index": int(i)}


class MainLogits(torch.nn.Module):
    """The network's main-head logits only: one tensor out (TorchScript export, Grad-CAM)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)["main"]


@dataclass
class RunModel:
    """A run's model ready to score: the network (eval mode) and what describes it."""

    model: torch.nn.Module
    classes: list[str]
    image_size: int
    site: Optional[str]  # whose model it is (None: the global one)
    run: dict  # run.json


def load_run_model(run_dir: Path | str, site: Optional[str] = None, *, warn_global: bool = True) -> RunModel:
    """The run's global model, or ``site``'s own; raises :class:`UserError` for an unknown site.

    ``warn_global``: warn when ``site`` is asked for but the method keeps no per-site model."""
    from fedcxr.models.network import network_from_config
    from fedcxr.pipeline.predictions import load_final, site_params
    from fedcxr.vocab import AUX_VOCAB

    run, final = load_final(Path(run_dir))
    cfg = dict(final.get("model") or {})
    model = network_from_config(final["classes"], cfg, {t: len(AUX_VOCAB[t]) for t in final.get("aux_tasks", [])},
                                load_weights_file=False)
    if site is None:
        params = final["global"]
    else:
        sites = list(run.get("sites") or [])
        if site not in sites:
            raise UserError(f"--site {site!r}: not a site of this run (its sites: {', '.join(sites)})")
        if warn_global and site not in final.get("per_site", {}) and not final.get("eval_local_keys"):
            log.warning("method %s keeps no per-site model: site %s uses the global model",
                        run.get("method"), site)
        params = site_params(final, site)
    model.load_state_dict(params)
    model.eval()
    return RunModel(model=model, classes=list(final["classes"]), image_size=int(final["image_size"]),
                    site=site, run=run)


@torch.no_grad()
def score_files(model: torch.nn.Module, paths: Sequence[str | Path], *, size: int, device: torch.device,
                names: Optional[Sequence[str]] = None, batch_size: int = 32, progress: bool = True,
                desc: str = "scoring") -> np.ndarray:
    """Sigmoid probabilities ``(N, C)`` float32 of every file, in order (full precision)."""
    from tqdm import tqdm

    data = ImageFiles(paths, size, names)
    loader = DataLoader(data, batch_size=int(batch_size), shuffle=False)
    model.to(device).eval()
    out = np.zeros((len(data), len(getattr(model, "classes", []))), dtype=np.float32)
    with tqdm(total=len(data), desc=desc, unit="img", disable=bar_disabled(progress)) as bar:
        for batch in loader:
            logits = model(batch["image"].to(device))["main"].float()
            out[np.asarray(batch["index"])] = torch.sigmoid(logits).cpu().numpy()
            bar.update(len(batch["index"]))
    return out


__all__ = ["ImageFiles", "MainLogits", "RunModel", "load_run_model", "preprocess", "score_files"]
