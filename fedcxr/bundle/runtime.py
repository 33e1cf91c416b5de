"""What a fedcxr MONAI bundle runs: shipped as ``BUNDLE/scripts/fedcxr_runtime.py`` at export.

MONAI's runner (``python -m monai.bundle run``) instantiates these from
``configs/inference.json``:

* :func:`load_network` — with a public key named by the user (``--verify_key PUB.pem`` on MONAI's
  command line, or ``$FEDCXR_BUNDLE_KEY``) first checks the Ed25519 signature over
  ``checksums.sha256`` with the *installed* fedcxr (:func:`fedcxr.bundle.signing.verify_signature`:
  an unsigned bundle, another signer or a change after signing stops the run); then checks every
  shipped file against ``BUNDLE/checksums.sha256`` (:func:`verify_bundle`: a changed, missing or
  added file stops the run naming it), then loads ``models/model.ts``. Without a key only the
  checksums are checked, and the log says that they catch damage, not a deliberate change;
* :func:`list_images` — the files under ``dataset_dir`` (DICOM with or without ``.dcm``, PNG, JPEG;
  hidden files and obvious metadata skipped), sorted by relative path. A file is never opened when
  its path leads out of ``dataset_dir`` (a symbolic link: ``fedcxr predict``'s containment) or when
  it is not a regular file (a named pipe would block the run forever, a device never ends): it is
  listed with its reason instead;
* :class:`LoadFedcxrImaged` — decodes and normalises an image with fedcxr's own preprocessing
  (:func:`fedcxr.pipeline.inference.preprocess`: the decoder the training cache uses, resize,
  ``(x/255 - 0.5) / 0.25``), so the bundle gives the same probabilities as ``fedcxr predict``
  whatever decoding rules the installed fedcxr has; it needs ``fedcxr`` importable. A file that
  cannot be decoded (empty, truncated, not an image) is set aside with the reason: one bad file
  never aborts the run, the rest are scored;
* :class:`ProbabilityWriter` — an ignite handler writing ``output_dir/predictions.csv``
  (``image`` relative to ``dataset_dir``, ``prob__<class>``) and ``output_dir/unread.csv``
  (``image``, ``reason``: every file not scored). The file names identify images: the CSVs
  stay where the images are. Both are written atomically, text cells escaped for spreadsheets.

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


CHECKSUMS = "checksums.sha256"
MAX_LISTING_BYTES = 4 << 20
#: folders of a bundle whose every file is listed in :data:`CHECKSUMS`
SHIPPED = ("models", "configs", "scripts", "docs")


def bundle_files(bundle_root: str | os.PathLike) -> list[str]:
    """The shipped files of a bundle (relative POSIX paths, sorted; ``__pycache__`` left out)."""
    root = Path(bundle_root)
    found = []
    for top in SHIPPED:
        for folder, dirs, files in os.walk(root / top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            found += [(Path(folder) / name).relative_to(root).as_posix() for name in files]
    return sorted(found)


def sha256_file(path: str | os.PathLike) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_bundle(bundle_root: str | os.PathLike) -> None:
    """Raise ``RuntimeError`` naming every shipped file that is changed, missing or not listed in
    ``checksums.sha256`` (``sha256sum -c checksums.sha256`` checks the same, from the bundle folder)."""
    import re

    root = Path(bundle_root)
    listing = root / CHECKSUMS
    if not listing.is_file():
        raise RuntimeError(f"{listing}: missing; this bundle cannot be verified (export it again with "
                           "`fedcxr export-bundle`)")
    with open(listing, "rb") as handle:  # a regular file (is_file above); bounded: a listing is a few kB
        data = handle.read(MAX_LISTING_BYTES + 1)
    if len(data) > MAX_LISTING_BYTES:
        raise RuntimeError(f"{listing}: over {MAX_LISTING_BYTES} bytes; not a bundle's checksum listing")
    expected: dict[str, str] = {}
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines()[:10000], 1):
        digest, _, name = line.partition("  ")
        if not re.fullmatch(r"[0-9a-f]{64}", digest) or not name or name.startswith("/") or ".." in name.split("/"):
            raise RuntimeError(f"{listing} line {number}: not '<sha256>  <relative path>'")
        expected[name] = digest
    problems = [f"{name}: missing" for name in expected if not (root / name).is_file()]
    problems += [f"{name}: changed (sha256 differs)" for name in expected
                 if (root / name).is_file() and sha256_file(root / name) != expected[name]]
    problems += [f"{name}: not part of the exported bundle" for name in bundle_files(root) if name not in expected]
    if problems:
        raise RuntimeError(f"bundle {root} fails its checksums ({CHECKSUMS}): " + "; ".join(problems[:10])
                           + ("" if len(problems) <= 10 else f"; and {len(problems) - 10} more"))


#: environment variable naming the public key a bundle's signature must verify with
KEY_ENV = "FEDCXR_BUNDLE_KEY"


def load_network(bundle_root: str, device: Any = "cpu", verify_key: str = "") -> torch.jit.ScriptModule:
    """``models/model.ts``, after the signature check (when a key is named: ``verify_key``, else
    ``$FEDCXR_BUNDLE_KEY``) and :func:`verify_bundle`: a damaged bundle never runs, nor, with a
    key, one changed after it was signed."""
    import logging

    log = logging.getLogger("fedcxr.bundle")
    key = str(verify_key or os.environ.get(KEY_ENV, "") or "")
    if key:
        from fedcxr.bundle.signing import verify_signature

        signer = verify_signature(bundle_root, key)
        log.info("bundle signature verified with %s (key id %s)", key, signer)
    else:
        log.warning("bundle checked against its checksums only: they catch damage, not a deliberate change; "
                    "name the signer's public key (--verify_key PUB.pem or $%s) to check its signature", KEY_ENV)
    verify_bundle(bundle_root)
    return torch.jit.load(str(Path(bundle_root) / "models" / "model.ts"), map_location=device)


def list_images(dataset_dir: str) -> list[dict[str, str]]:
    """``[{"image": absolute path, "image_path": path relative to dataset_dir, "unread": reason or ""}]``,
    sorted; ``unread`` names why a file is never opened (outside ``dataset_dir``, not a regular file)."""
    from fedcxr.site_adapters.paths import printable, regular_file_problem

    root = Path(dataset_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"dataset_dir {dataset_dir}: no such directory")
    real_root = os.path.realpath(root)
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            if name.startswith(".") or name in _SKIP_NAMES or os.path.splitext(name)[1].lower() in _SKIP_SUFFIXES:
                continue
            path = Path(folder) / name
            rel = printable(path.relative_to(root).as_posix())
            real = os.path.realpath(path)
            if real != real_root and not real.startswith(real_root + os.sep):
                reason = f"image path outside dataset_dir: {rel!r} is a symbolic link that leads out of it"
            else:
                reason = regular_file_problem(real) or ""
            found.append({"image": str(path), "image_path": rel, "unread": reason})
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
        d.setdefault("unread", "")
        for key in self.key_iterator(d):
            if d["unread"]:  # never opened (list_images said why)
                d[key] = torch.zeros(1, self.size, self.size)
                continue
            try:
                d[key] = preprocess(d[key], self.size)
            except Exception as exc:  # one bad file is set aside with its reason, never the end of the run
                d[key] = torch.zeros(1, self.size, self.size)
                d["unread"] = _reason(exc)
        return d


def _reason(exc: BaseException) -> str:
    """A decoder failure as a short reason (fedcxr's own image errors are already worded for users)."""
    from fedcxr.site_adapters.image_headers import ImageError

    text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return text if isinstance(exc, ImageError) and text else f"cannot decode: {type(exc).__name__}: {text}"


class ProbabilityWriter:
    """Collects every item's ``pred`` (sigmoid probabilities) and writes ``predictions.csv`` at the end."""

    def __init__(self, output_dir: str, classes: Sequence[str], name: str = "predictions.csv",
                 unread_name: str = "unread.csv") -> None:
        self.path = Path(output_dir) / name
        self.unread_path = Path(output_dir) / unread_name
        self.classes = list(classes)
        self.rows: list[tuple[str, np.ndarray]] = []
        self.unread: list[tuple[str, str]] = []

    def attach(self, engine) -> None:
        from ignite.engine import Events

        engine.add_event_handler(Events.ITERATION_COMPLETED, self.collect)
        engine.add_event_handler(Events.COMPLETED, self.write)

    def collect(self, engine) -> None:
        batch, output = engine.state.batch, engine.state.output
        items = output if isinstance(output, list) else [output]
        sources = batch if isinstance(batch, list) else [batch]
        for src, out in zip(sources, items):
            if src.get("unread"):
                self.unread.append((str(src["image_path"]), str(src["unread"])))
                continue
            pred = out["pred"]
            pred = pred.detach().cpu().numpy() if isinstance(pred, torch.Tensor) else np.asarray(pred)
            self.rows.append((str(src["image_path"]), pred.astype(np.float32).reshape(-1)))

    def write(self, engine) -> None:
        import pandas as pd

        from fedcxr.atomic import atomic_write_bytes
        from fedcxr.escape import to_csv_text

        frame = pd.DataFrame({"image": [r[0] for r in self.rows]})
        probs = np.stack([r[1] for r in self.rows]) if self.rows else np.zeros((0, len(self.classes)), np.float32)
        for j, cls in enumerate(self.classes):
            frame[f"prob__{cls}"] = probs[:, j]
        unread = pd.DataFrame(self.unread, columns=["image", "reason"])
        atomic_write_bytes(self.path, to_csv_text(frame).encode("utf-8"))
        atomic_write_bytes(self.unread_path, to_csv_text(unread).encode("utf-8"))
        if self.unread:
            import logging

            logging.getLogger("fedcxr.bundle").warning("%d file(s) not scored, with the reason: %s",
                                                        len(self.unread), self.unread_path)
