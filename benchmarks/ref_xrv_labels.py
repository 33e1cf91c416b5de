"""Reference check (run on demand): fedcxr's CheXpert / MIMIC-CXR labels against TorchXRayVision's reading.

TorchXRayVision (``mlmed/torchxrayvision``, ``torchxrayvision/datasets.py``) is the field's
reference loader: ``CheX_Dataset`` and ``MIMIC_Dataset`` turn the label csvs into 1 / 0 / NaN
per pathology (-1 → NaN, and every pathology of a ``No Finding = 1`` row → 0, Support Devices
excepted in ``CheX_Dataset`` only). This script runs *their* class code — loaded from a
checkout's ``datasets.py``, with its image-library imports stubbed, since building the labels
never touches an image — and fedcxr's adapter plus the ingest's label steps (uncertain policy
``ignore``, implied negatives), and compares every cell.

    python benchmarks/ref_xrv_labels.py --xrv PATH/torchxrayvision \\
        [--chexpert-csv PATH/train.csv(.gz)] [--mimic-labels L.csv --mimic-meta M.csv]

``--xrv`` is a checkout of ``mlmed/torchxrayvision`` (or its ``datasets.py``); without
``--chexpert-csv`` the checkout's own ``torchxrayvision/data/chexpert_train.csv.gz`` (the real
223,414-row CheXpert-v1.0-small ``train.csv``) is used. Nothing here is timed; no code of
TorchXRayVision is copied into fedcxr.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import shutil
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import pandas as pd

#: TorchXRayVision pathology name → fedcxr canonical class.
XRV_TO_CANONICAL = {
    "Atelectasis": "atelectasis", "Cardiomegaly": "cardiomegaly", "Consolidation": "consolidation",
    "Edema": "edema", "Effusion": "pleural_effusion", "Enlarged Cardiomediastinum": "enlarged_cardiomediastinum",
    "Fracture": "fracture", "Lung Lesion": "lung_lesion", "Lung Opacity": "lung_opacity",
    "Pleural Other": "pleural_other", "Pneumonia": "pneumonia", "Pneumothorax": "pneumothorax",
    "Support Devices": "support_devices",
}


def load_xrv(path: Path) -> types.ModuleType:
    """TorchXRayVision's ``datasets.py`` as a module, its image/vision imports stubbed."""
    path = Path(path)
    if path.is_dir():
        path = next(p for p in (path / "torchxrayvision" / "datasets.py", path / "datasets.py") if p.is_file())
    for name in ("imageio", "skimage", "skimage.transform", "skimage.io", "torchvision", "torchvision.transforms",
                 "torchxrayvision"):
        if name not in sys.modules:
            stub = types.ModuleType(name)
            stub.__path__ = []  # a package, so "from skimage.io import imread" resolves
            sys.modules[name] = stub
    sys.modules["skimage.io"].imread = lambda *a, **k: None
    sys.modules["torchvision"].transforms = sys.modules["torchvision.transforms"]
    spec = importlib.util.spec_from_file_location("xrv_datasets_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def xrv_chexpert(xrv: types.ModuleType, csv_path: Path) -> pd.DataFrame:
    """CheX_Dataset's labels, every row (``views=['*']``, ``unique_patients=False``), keyed by image path."""
    with tempfile.TemporaryDirectory() as tmp:  # CheX_Dataset wants 'train' or 'valid' in the path
        local = Path(tmp) / ("valid.csv" if "valid" in csv_path.name else "train.csv")
        opener = gzip.open if csv_path.suffix == ".gz" else open
        with opener(csv_path, "rb") as src, open(local, "wb") as dst:
            shutil.copyfileobj(src, dst)
        data = xrv.CheX_Dataset(imgpath="", csvpath=str(local), views=["*"], unique_patients=False)
    labels = pd.DataFrame(data.labels, columns=[XRV_TO_CANONICAL[p] for p in data.pathologies])
    labels.index = data.csv["Path"].str.replace(r"^CheXpert-v1\.0(-small)?/", "", regex=True).to_numpy()
    return labels


def xrv_mimic(xrv: types.ModuleType, label_csv: Path, meta_csv: Path) -> pd.DataFrame:
    """MIMIC_Dataset's labels, every image, keyed by the MIMIC-CXR-JPG relative image path."""
    data = xrv.MIMIC_Dataset(imgpath="", csvpath=str(label_csv), metacsvpath=str(meta_csv), views=["*"],
                             unique_patients=False)
    labels = pd.DataFrame(data.labels, columns=[XRV_TO_CANONICAL[p] for p in data.pathologies])
    csv = data.csv
    subject, study = csv["subject_id"].astype(int).astype(str), csv["study_id"].astype(int).astype(str)
    labels.index = ("files/p" + subject.str[:2] + "/p" + subject + "/s" + study + "/" + csv["dicom_id"] + ".jpg").to_numpy()
    return labels


def fedcxr_labels(source: str, input_dir: Path, *, implied_negatives: bool = True) -> pd.DataFrame:
    """fedcxr's ``label__`` columns (policy ``ignore``) after the adapter and the ingest's label steps."""
    from fedcxr.site_adapters.base import AdapterOptions, ensure_columns
    from fedcxr.site_adapters.ingest import get_adapter
    from fedcxr.site_adapters.manifest import apply_implied_negatives, apply_uncertain_policy
    from fedcxr.vocab import label_column

    table = get_adapter(source)(Path(input_dir), AdapterOptions(plan=True, implied_negatives=implied_negatives))
    frame = apply_uncertain_policy(ensure_columns(table.frame, table.classes), table.classes, "ignore")
    frame = apply_implied_negatives(frame, table.implied_negative_classes)
    out = pd.DataFrame({c: frame[label_column(c)].to_numpy() for c in XRV_TO_CANONICAL.values()})
    out.index = frame["image_path"].to_numpy()
    return out


def compare(ours: pd.DataFrame, theirs: pd.DataFrame) -> dict:
    """Cell-by-cell agreement on the images both read, per class and in total."""
    common = ours.index.intersection(theirs.index)
    a, b = ours.loc[common, list(XRV_TO_CANONICAL.values())], theirs.loc[common, list(XRV_TO_CANONICAL.values())]
    same = (a.to_numpy() == b.to_numpy()) | (np.isnan(a.to_numpy()) & np.isnan(b.to_numpy()))
    per_class = {}
    for j, cls in enumerate(a.columns):
        per_class[cls] = {"differ": int((~same[:, j]).sum()), "negatives_fedcxr": int((a[cls] == 0).sum()),
                          "negatives_xrv": int((b[cls] == 0).sum()), "positives_fedcxr": int((a[cls] == 1).sum()),
                          "positives_xrv": int((b[cls] == 1).sum())}
    return {"images_fedcxr": len(ours), "images_xrv": len(theirs), "images_compared": len(common),
            "cells_compared": int(same.size), "cells_differ": int((~same).sum()), "per_class": per_class}


def write_chexpert_export(csv_path: Path, root: Path) -> Path:
    """A CheXpert export folder holding only ``CheXpert-v1.0-small/train.csv`` (no images: a plan)."""
    release = root / "CheXpert-v1.0-small"
    release.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if csv_path.suffix == ".gz" else open
    with opener(csv_path, "rb") as src, open(release / ("valid.csv" if "valid" in csv_path.name else "train.csv"),
                                               "wb") as dst:
        shutil.copyfileobj(src, dst)
    return root


def print_result(name: str, result: dict) -> None:
    print(f"{name}: {result['images_compared']} images compared ({result['images_fedcxr']} fedcxr, "
          f"{result['images_xrv']} TorchXRayVision); {result['cells_differ']} of {result['cells_compared']} cells differ")
    print(f"  {'class':28s} {'differ':>7s} {'neg fedcxr':>11s} {'neg xrv':>9s} {'pos fedcxr':>11s} {'pos xrv':>9s}")
    for cls, row in result["per_class"].items():
        print(f"  {cls:28s} {row['differ']:7d} {row['negatives_fedcxr']:11d} {row['negatives_xrv']:9d} "
              f"{row['positives_fedcxr']:11d} {row['positives_xrv']:9d}")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--xrv", type=Path, required=True, help="mlmed/torchxrayvision checkout (or its datasets.py)")
    parser.add_argument("--chexpert-csv", type=Path, default=None)
    parser.add_argument("--mimic-labels", type=Path, default=None, help="mimic-cxr-2.0.0-chexpert.csv(.gz)")
    parser.add_argument("--mimic-meta", type=Path, default=None, help="mimic-cxr-2.0.0-metadata.csv(.gz)")
    parser.add_argument("--mimic-input", type=Path, default=None, help="the MIMIC export folder fedcxr reads")
    args = parser.parse_args(argv)
    xrv = load_xrv(args.xrv)
    results = {}
    csv = args.chexpert_csv
    if csv is None and args.xrv.is_dir():
        csv = args.xrv / "torchxrayvision" / "data" / "chexpert_train.csv.gz"
    if csv is not None and csv.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            export = write_chexpert_export(csv, Path(tmp))
            for implied in (True, False):
                result = compare(fedcxr_labels("chexpert", export, implied_negatives=implied), xrv_chexpert(xrv, csv))
                results[f"chexpert{'' if implied else '_no_implied_negatives'}"] = result
                print_result(f"CheXpert {csv.name}, implied negatives {'on' if implied else 'off'}", result)
    if args.mimic_labels and args.mimic_meta and args.mimic_input:
        result = compare(fedcxr_labels("mimic", args.mimic_input), xrv_mimic(xrv, args.mimic_labels, args.mimic_meta))
        results["mimic"] = result
        print_result("MIMIC-CXR", result)
    return results


if __name__ == "__main__":
    main()
