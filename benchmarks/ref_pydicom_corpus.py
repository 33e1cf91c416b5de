"""Reference check (run on demand): fedcxr's DICOM checks and decode against pydicom's own, on a
corpus of DICOM files — pydicom's test files (``pydicom/pydicom`` ``src/pydicom/data/test_files``)
and ``pydicom/pydicom-data`` (``data_store/data``), or any folder.

For every file: pydicom's reading (``dcmread(force=True)`` → ``pixel_array`` (first frame) →
``apply_modality_lut`` → ``apply_voi_lut`` → MONOCHROME1 inverted; colour → ITU-R 601 luma;
min/max scaled to [0, 1]) against fedcxr's header check (``check_image``, what ingest runs on
every file), its full check (``check_image(decode=True)``, ``--verify-pixels``) and its decode
(``read_image``). Prints the counts the DESIGN promises: files both decode, files fedcxr
refuses that pydicom decodes (must be 0), files pydicom refuses that fedcxr decodes, and the
maximum pixel difference on the files both decode. Nothing here is timed.

    python benchmarks/ref_pydicom_corpus.py CORPUS_DIR [CORPUS_DIR ...] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from pathlib import Path

import numpy as np

#: Files in pydicom's test folders that are not DICOM datasets (archives, notes, JSON models).
NOT_DICOM = {".gz", ".bz2", ".json", ".txt", ".md", ".py", ".zip", ".xml", ".pdf", ".jpg", ".png", ".j2k",
             ".jls", ".raw", ".bin", ".csv"}


def reference(path: str) -> np.ndarray:
    """pydicom's own display pipeline, written out independently of fedcxr."""
    import pydicom
    from pydicom.pixels import apply_color_lut, apply_modality_lut, apply_voi_lut

    ds = pydicom.dcmread(path, force=True)
    if "TransferSyntaxUID" not in getattr(ds, "file_meta", {}):
        from pydicom.dataset import FileMetaDataset
        from pydicom.uid import ExplicitVRLittleEndian, ImplicitVRLittleEndian

        ds.file_meta = getattr(ds, "file_meta", None) or FileMetaDataset()
        implicit = getattr(ds, "original_encoding", (True, True))[0]
        ds.file_meta.TransferSyntaxUID = ImplicitVRLittleEndian if implicit is not False else ExplicitVRLittleEndian
    arr = ds.pixel_array
    frames = int(ds.get("NumberOfFrames") or 1)
    samples = int(ds.get("SamplesPerPixel") or 1)
    if frames > 1:
        arr = arr[0]
    pi = str(ds.get("PhotometricInterpretation", "MONOCHROME2")).strip().upper()
    if pi == "PALETTE COLOR":
        arr = apply_color_lut(arr, ds)
        samples = 3
    if samples > 1 or arr.ndim == 3:
        rgb = arr.astype(np.float32)
        values = rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114
        invert = False
    else:
        values = apply_voi_lut(apply_modality_lut(arr, ds), ds, index=0) if pi in ("MONOCHROME1", "MONOCHROME2") \
            else apply_modality_lut(arr, ds)
        invert = pi == "MONOCHROME1" or str(ds.get("PresentationLUTShape", "")).strip().upper() == "INVERSE"
    out = np.asarray(values, dtype=np.float32)
    lo, hi = float(out.min()), float(out.max())
    out = np.zeros(out.shape, np.float32) if hi <= lo else (out - np.float32(lo)) / np.float32(hi - lo)
    return 1.0 - out if invert else out


def candidates(folders: list[Path]) -> list[Path]:
    files = []
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and path.suffix.lower() not in NOT_DICOM and not path.name.startswith("."):
                files.append(path)
    return files


def run(folders: list[Path]) -> dict:
    from fedcxr.site_adapters.image_checks import check_image
    from fedcxr.site_adapters.images import read_image

    logging.getLogger("pydicom").setLevel(logging.CRITICAL + 1)
    rows = []
    for path in candidates(folders):
        entry = {"file": str(path)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                ref = reference(str(path))
                entry["pydicom"] = "ok"
            except Exception as exc:  # noqa: BLE001 — pydicom refuses: that is a result
                ref, entry["pydicom"] = None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
        entry["header_check"] = check_image(path) or "ok"
        entry["full_check"] = check_image(path, decode=True) or "ok"
        try:
            ours = read_image(path)
            entry["fedcxr_decode"] = "ok"
        except Exception as exc:  # noqa: BLE001
            ours, entry["fedcxr_decode"] = None, f"{type(exc).__name__}: {exc}"[:160]
        if ref is not None and ours is not None:
            entry["max_abs_diff"] = float(np.abs(ref - ours).max()) if ref.shape == ours.shape else None
            entry["shape_match"] = ref.shape == ours.shape
        rows.append(entry)
    ref_ok = [r for r in rows if r["pydicom"] == "ok"]
    both = [r for r in ref_ok if r["fedcxr_decode"] == "ok"]
    diffs = [r["max_abs_diff"] for r in both if r.get("max_abs_diff") is not None]
    summary = {
        "files": len(rows),
        "pydicom_decodes": len(ref_ok),
        "both_decode": len(both),
        "shape_mismatch": sum(not r.get("shape_match", True) for r in both),
        "max_pixel_diff": max(diffs) if diffs else None,
        "refused_by_header_check_but_pydicom_decodes": [r["file"] for r in ref_ok if r["header_check"] != "ok"],
        "refused_by_full_check_but_pydicom_decodes": [
            r["file"] for r in ref_ok if r["full_check"] != "ok" and not r["full_check"].startswith("constant image")],
        "constant_images_pydicom_decodes": sum(r["full_check"].startswith("constant image") for r in ref_ok),
        "fedcxr_decode_fails_but_pydicom_decodes": [r["file"] for r in ref_ok if r["fedcxr_decode"] != "ok"],
        "fedcxr_decodes_but_pydicom_fails": [r["file"] for r in rows if r["pydicom"] != "ok" and r["fedcxr_decode"] == "ok"],
        "both_fail": sum(r["pydicom"] != "ok" and r["fedcxr_decode"] != "ok" for r in rows),
        "header_check_passes_but_decode_fails": [
            r["file"] for r in rows if r["header_check"] == "ok" and r["fedcxr_decode"] != "ok"],
    }
    return {"summary": summary, "files": rows}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--json", type=Path, default=None, help="write every file's result here")
    args = parser.parse_args(argv)
    result = run(args.folders)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    summary = result["summary"]
    for key, value in summary.items():
        shown = value if not isinstance(value, list) else f"{len(value)}" + (
            "".join(f"\n    {os.path.relpath(v)}" for v in value) if value else "")
        print(f"{key}: {shown}")
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
