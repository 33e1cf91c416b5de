"""What a fedcxr MONAI bundle runs: shipped as ``BUNDLE/scripts/fedcxr_runtime.py`` at export.

MONAI's runner (``python -m monai.bundle run``) instantiates these from
``configs/inference.json``:

* :func:`list_images` — the image files under ``dataset_dir`` (DICOM with or without ``.dcm``,
  PNG, JPEG; hidden files and obvious metadata skipped), sorted by relative path;
* :class:`LoadFedcxrImaged` — decodes and normalises an image with fedcxr's own preprocessing
  (:func:`fedcxr.pipeline.inference.preprocess`: the decoder the training cache uses, resize,
  ``(x/255 - 0.5) / 0.25``), so the bundle gives the same probabilities as ``fedcxr predict``
  whatever decoding rules the installed fedcxr has; it needs ``fedcxr`` importable;
* :class:`ProbabilityWriter` — an ignite handler writing ``output_dir/predictions.csv``
  (``image`` relative to ``dataset_dir``, ``prob__<class>``). The file names identify images:
  the CSV stays where the images are.

Only numpy, torch, MONAI, pandas and fedcxr are imported: nothing from the run directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Hashable, Mapping, Sequence

import numpy as np
import torch
from monai.transforms import MapTransform

_SKIP_SUFFIXES = frozenset({".csv", ".tsv", ".txt", ".json", ".md", ".xml", ".yaml", ".yml", ".pdf", ".html",
                            ".log", ".zip", ".gz", ".parquet", ".py"})
_SKIP_NAMES = frozenset({"DICOMDIR", "Thumbs.db", "desktop.ini"})


def list_images(dataset_dir: str) -> list[dict[str, str]]:
    """``[{"image": absolute path, "image_path": path relative to dataset_dir}]``, sorted."""
    root = Path(dataset_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"dataset_dir {dataset_dir}: no such directory")
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            if name.startswith(".") or name in _SKIP_NAMES or os.path.splitext(name)[1].lower() in _SKIP_SUFFIXES:
                continue
            path = Path(folder) / name
            found.append({"image": str(path), "image_path": path.relative_to(root).as_posix()})
    if not found:
        raise FileNotFoundError(f"dataset_dir {dataset_dir}: no image files")
    return sorted(found, key=lambda item: item["image_path"])


class LoadFedcxrImaged(MapTransform):
    """Path under ``keys`` → float32 ``(1, size, size)`` exactly as fedcxr preprocesses it."""

    def __init__(self, keys: Sequence[str] | str, size: int, allow_missing_keys: bool = False) -> None:
        super().__init__(keys, allow_missing_keys)
        self.size = int(size)

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        from fedcxr.pipeline.inference import preprocess

        d = dict(data)
        for key in self.key_iterator(d):
            d[key] = preprocess(d[key], self.size)
        return d


class ProbabilityWriter:
    """Collects every item's ``pred`` (sigmoid probabilities) and writes ``predictions.csv`` at the end."""

    def __init__(self, output_dir: str, classes: Sequence[str], name: str = "predictions.csv") -> None:
        self.path = Path(output_dir) / name
        self.classes = list(classes)
        self.rows: list[tuple[str, np.ndarray]] = []

    def attach(self, engine) -> None:
        from ignite.engine import Events

        engine.add_event_handler(Events.ITERATION_COMPLETED, self.collect)
        engine.add_event_handler(Events.COMPLETED, self.write)

    def collect(self, engine) -> None:
        batch, output = engine.state.batch, engine.state.output
        items = output if isinstance(output, list) else [output]
        sources = batch if isinstance(batch, list) else [batch]
        for src, out in zip(sources, items):
            pred = out["pred"]
            pred = pred.detach().cpu().numpy() if isinstance(pred, torch.Tensor) else np.asarray(pred)
            self.rows.append((str(src["image_path"]), pred.astype(np.float32).reshape(-1)))

    def write(self, engine) -> None:
        import pandas as pd

        frame = pd.DataFrame({"image": [r[0] for r in self.rows]})
        probs = np.stack([r[1] for r in self.rows]) if self.rows else np.zeros((0, len(self.classes)), np.float32)
        for j, cls in enumerate(self.classes):
            frame[f"prob__{cls}"] = probs[:, j]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(self.path, index=False)
