"""SOURCE ``medmnist``: a MedMNIST ``.npz`` (PneumoniaMNIST, ChestMNIST) → canonical rows.

``fedcxr ingest medmnist --input FILE.npz --out OUT [--site-by iid:4 | skew:4:alpha=0.5]``

Which file: ``--input`` is the ``.npz`` itself, or a folder holding exactly one ``.npz``
(several → an error listing them; Python callers may name one with ``options.extra['npz']``).

The npz holds ``{train,val,test}_images`` — uint8, shape ``(N, H, W)``, ``(N, H, W, 1)`` or
``(N, H, W, 3)`` (RGB → grey, Pillow's ``L``), any size (28, 64, 128, 224) — and
``{split}_labels`` of shape ``(N, L)``. The task comes from the file name, else the label width:

* ``pneumoniamnist*`` (``L == 1``, 0 normal / 1 pneumonia) → class ``pneumonia``;
* ``chestmnist*`` (``L == 14``, NIH ChestX-ray14 in MedMNIST's order: atelectasis,
  cardiomegaly, effusion, infiltration, mass, nodule, pneumonia, pneumothorax, consolidation,
  edema, emphysema, fibrosis, pleural (thickening), hernia) → the canonical NIH classes.

The canonical manifest points at image **files**, so each array is written once as a PNG:
``<image dir>/<split>/<index>.png`` with ``<image dir>`` = ``options.extra['image_dir']`` or,
by default, ``<OUT>/_images/<npz stem>`` (``run_ingest`` passes ``extra['out_dir']``); the input
folder may be read-only. Re-running rewrites only files whose bytes changed.

Splits: MedMNIST's official ``train``/``val``/``test``. **MedMNIST has no patient ids** (nor
demographics): every image is its own patient, ``patient_id = <split>-<index>``, so patient-
disjoint splitting cannot guard against one child's two films landing in two splits (the
MedMNIST authors split the source dataset themselves). Rows: ``source_file`` is
``<npz name>:<split>``, ``source_row`` the 1-based index within that split.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
import numpy as np
import pandas as pd
from PIL import Image

from fedcxr.atomic import atomic_write_bytes
from fedcxr.site_adapters.base import AdapterOptions, IngestError, SourceTable, empty_aux
from fedcxr.site_adapters.inputs import check_npz
from fedcxr.vocab import canonical_class, raw_column

ADAPTER_VERSION = "1"
#: The classes this source labels: ``None`` — read from the export (the .npz's label set decides).
SOURCE_CLASSES: None = None
SOURCE = "medmnist"
SPLITS = ("train", "val", "test")

#: ChestMNIST label columns (MedMNIST ``info.py`` order) → canonical classes.
CHESTMNIST_LABELS = [
    "atelectasis", "cardiomegaly", "effusion", "infiltration", "mass", "nodule", "pneumonia",
    "pneumothorax", "consolidation", "edema", "emphysema", "fibrosis", "pleural", "hernia",
]
TASKS: dict[str, list[str]] = {
    "pneumoniamnist": ["pneumonia"],
    "chestmnist": [str(canonical_class(n)) for n in CHESTMNIST_LABELS],
}


def find_npz(input_path: Path, extra: dict) -> Path:
    """The npz to read: ``--input`` itself, ``extra['npz']`` in it, or its only ``*.npz``."""
    if input_path.is_file():
        if input_path.suffix != ".npz":
            raise IngestError(f"--input {input_path}: expected a MedMNIST .npz file or a folder holding one")
        return input_path
    if extra.get("npz"):
        path = input_path / str(extra["npz"])
        if not path.is_file():
            raise IngestError(f"{path}: no such npz file")
        return path
    found = sorted(input_path.glob("*.npz"))
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise IngestError(
            f"--input {input_path}: needs exactly one .npz file (found: {names}); pass the file itself as --input"
        )
    return found[0]


def task_classes(npz_name: str, label_width: int) -> list[str]:
    """Canonical classes of the file's label columns (by file name, else by label width)."""
    stem = npz_name.lower()
    for prefix, classes in TASKS.items():
        if stem.startswith(prefix):
            if len(classes) != label_width:
                raise IngestError(
                    f"{npz_name}: a {prefix} file has {len(classes)} label column(s), found {label_width}"
                )
            return classes
    if label_width == len(TASKS["chestmnist"]):
        return TASKS["chestmnist"]
    raise IngestError(
        f"{npz_name}: cannot tell the MedMNIST task; name the file pneumoniamnist*.npz or chestmnist*.npz "
        f"(found {label_width} label column(s))"
    )


def read_medmnist(input_dir: Path, options: AdapterOptions) -> SourceTable:
    """Read a MedMNIST npz, write its images as PNGs, return one row per image."""
    npz_path = find_npz(Path(input_dir), options.extra)
    image_dir = _image_dir(npz_path, options.extra)
    arrays = _load(npz_path)
    width = arrays["train"][1].shape[1]
    classes = task_classes(npz_path.name, width)
    frames = []
    for split in SPLITS:
        images, labels = arrays[split]
        paths = _write_pngs(images, image_dir, split)
        frames.append(_rows(npz_path.name, split, paths, labels, classes))
    frame = pd.concat(frames, ignore_index=True)
    return SourceTable(
        source=SOURCE,
        adapter_version=ADAPTER_VERSION,
        root=image_dir,
        frame=frame,
        classes=classes,
        set_aside=[],
        rows_read=len(frame),
        headers_checked=False,
        notes=[
            f"{npz_path.name}: MedMNIST has no patient ids; every image is its own patient (<split>-<index>)",
            f"{npz_path.name}: images written as PNG under {image_dir}",
        ],
    )


def _image_dir(npz_path: Path, extra: dict) -> Path:
    if extra.get("image_dir"):
        return Path(extra["image_dir"])
    if extra.get("out_dir"):
        return Path(extra["out_dir"]) / "_images" / npz_path.stem
    raise IngestError(
        "medmnist: no folder to write the PNGs into (pass options.extra['image_dir'] or ['out_dir'])"
    )


def _load(npz_path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``split → (images (N, H, W) uint8, labels (N, L) float)`` with the shapes checked."""
    check_npz(npz_path, npz_path.name)  # a regular file whose arrays fit their bytes and the bound
    try:
        data = np.load(npz_path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise IngestError(f"{npz_path}: cannot read as npz ({exc})") from None
    out = {}
    with data:
        for split in SPLITS:
            for key in (f"{split}_images", f"{split}_labels"):
                if key not in data.files:
                    raise IngestError(f"{npz_path.name}: missing array {key!r}; found {', '.join(data.files)}")
            images, labels = _gray(data[f"{split}_images"], npz_path.name, split), data[f"{split}_labels"]
            labels = labels.reshape(len(labels), -1) if labels.ndim == 1 else labels
            if labels.ndim != 2 or len(labels) != len(images):
                raise IngestError(
                    f"{npz_path.name}: {split}_labels has shape {labels.shape}, expected ({len(images)}, L)"
                )
            out[split] = (images, _binary(labels.astype(float), npz_path.name, split))
    widths = {s: out[s][1].shape[1] for s in SPLITS}
    if len(set(widths.values())) != 1:
        raise IngestError(f"{npz_path.name}: label widths differ between splits: {widths}")
    return out


def _binary(labels: np.ndarray, name: str, split: str) -> np.ndarray:
    """MedMNIST's chest tasks are binary per column; anything else is a broken file."""
    bad = ~np.isin(labels, (0.0, 1.0))
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise IngestError(f"{name}: {split}_labels row {row + 1} column {col} holds {labels[row, col]:g}; "
                          "expected 0 or 1")
    return labels


def _gray(images: np.ndarray, name: str, split: str) -> np.ndarray:
    if images.ndim == 4 and images.shape[-1] == 1:
        images = images[..., 0]
    if images.ndim == 4 and images.shape[-1] == 3:
        return np.stack([np.asarray(Image.fromarray(im, "RGB").convert("L")) for im in images])
    if images.ndim != 3 or images.dtype != np.uint8:
        raise IngestError(
            f"{name}: {split}_images has shape {images.shape} dtype {images.dtype}; expected uint8 (N, H, W[, 1|3])"
        )
    return images


def _write_pngs(images: np.ndarray, image_dir: Path, split: str) -> list[str]:
    """One PNG per image; an existing file with the same bytes is left alone (re-runs)."""
    folder = image_dir / split
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, image in enumerate(images):
        rel = f"{split}/{i}.png"
        buf = io.BytesIO()
        Image.fromarray(image, "L").save(buf, format="PNG")
        data = buf.getvalue()
        target = image_dir / rel
        if not (target.is_file() and os.path.getsize(target) == len(data) and target.read_bytes() == data):
            # no fsync per file: after a power loss a damaged PNG differs from the npz bytes and is
            # rewritten by the next run (the check above)
            atomic_write_bytes(target, data, fsync=False)
        paths.append(rel)
    return paths


def _rows(name: str, split: str, paths: list[str], labels: np.ndarray, classes: list[str]) -> pd.DataFrame:
    n = len(paths)
    ids = [f"{split}-{i}" for i in range(n)]
    frame = pd.DataFrame({
        "image_path": paths,
        "patient_id": ids,
        "study_id": ids,
        "official_split": split,
        "source_file": f"{name}:{split}",
        "source_row": np.arange(1, n + 1),
        "age": np.nan,
    })
    for j, cls in enumerate(classes):
        frame[raw_column(cls)] = labels[:, j]
    for col, series in empty_aux(n).items():
        frame[col] = series
    return frame

