"""The sites of the regime benchmark: sources and target per shift type, on PneumoniaMNIST or Kermany.

Shift names (``bench_regime.py --shifts``):

* ``none`` — the target as it is;
* ``<kind><level>`` (``mix4``, ``noise3``, ``gamma2``, ``blur4`` …) — ``fedcxr shift`` of the target
  only (:mod:`fedcxr.site_adapters.shift`, seed 0);
* ``shortcut`` — a bright corner marker on 95 % of pneumonia / 5 % of normal images at every source
  and the reverse (5 % / 95 %) at the target (the FedGP papers' ColoredMNIST −90 % case);
* ``labelnoise<percent>`` — every source's training labels flipped at that rate (rows by patient
  hash); the target untouched;
* ``hetero`` — sources that differ from each other, each its own shift (:data:`HETERO_SOURCES`: the
  papers' 4–9 sources are different hospitals, not one hospital dealt in three), the target
  untouched; ``hetero_<shift>`` — the same sources with the target shifted by ``<shift>``
  (``hetero_mix4``).

Datasets (``--dataset``): ``pneumoniamnist`` (28 px npz, :func:`bench_shift.prepare_sites`) or
``kermany`` (the 1,705 real 224 px pediatric X-rays of ``../shared/data/kermany-pediatric-pneumonia``,
the images PneumoniaMNIST was made from: :func:`prepare_kermany_sites`, for the resolution check at
64 px). Both give the same layout: sources ``site-1..3`` = the official train rows dealt by patient
hash (10 % of each source's patients for validation), target ``target-base`` = the official
test (and val) rows re-split by patient hash.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))  # a real module: its functions must pickle into the worker processes
import bench_shift  # noqa: E402

#: The shortcut shift's marker rates (positive, negative) at the sources; the target gets them reversed.
SHORTCUT_RATES = (0.95, 0.05)
#: ``hetero``: each source its own covariate shift (kind, level of ``fedcxr shift``), level 3 of 0–4
HETERO_SOURCES = {1: ("gamma", 3), 2: ("blur", 3), 3: ("noise", 3)}
KERMANY = REPO.parent / "shared" / "data" / "kermany-pediatric-pneumonia"
#: the csv mapping of Kermany's labels.csv (fedcxr ingest csv): one class, pneumonia vs normal
KERMANY_MAPPING = {
    "version": 1, "description": "Kermany pediatric pneumonia (the images of PneumoniaMNIST), 224 px PNGs",
    "csv": "labels.csv", "image": "file", "patient": "patient_id", "classes": ["pneumonia"],
    "labels": {"pneumonia": {"column": "label", "values": {"PNEUMONIA": 1, "NORMAL": 0}}},
}


def prepare(dataset: str, source: Optional[Path], work: Path, *, target_split: Sequence[float],
            target_from: Sequence[str]) -> Path:
    """The manifests folder (``site-1..3``, ``target-base``) of ``dataset``."""
    if dataset == "pneumoniamnist":
        return bench_shift.prepare_sites(source or bench_shift.DEFAULT_NPZ, work, n_sources=3,
                                         target_split=tuple(target_split), target_from=tuple(target_from))
    if dataset == "kermany":
        return prepare_kermany_sites(source or KERMANY, work, target_split=target_split)
    raise SystemExit(f"--dataset: pneumoniamnist or kermany, got {dataset!r}")


def prepare_kermany_sites(folder: Path, work: Path, *, target_split: Sequence[float], n_sources: int = 3,
                          every: int = 1) -> Path:
    """Ingest Kermany's ``labels.csv`` (``fedcxr ingest csv``), then deal the sites as the 28 px map does.

    The release's patient ids repeat across its official splits (34 ids in this subset, "probably
    different children", its README): the patient of a row is named ``<official split>-<id>`` here,
    so no row is lost and none of a child's images straddle two splits. ``every`` > 1 keeps every
    k-th row (the smoke test's slice)."""
    import pandas as pd
    import yaml

    from fedcxr.site_adapters.ingest import run_ingest
    from fedcxr.site_adapters.manifest import patient_bucket, read_manifest, read_site_json, write_site

    manifests = work / "manifests"
    if (manifests / "target-base" / "site.json").is_file() and (manifests / f"site-{n_sources}" / "site.json").is_file():
        return manifests
    labels = pd.read_csv(folder / "labels.csv", dtype=str, keep_default_na=False)
    source = folder
    if every > 1:  # a slice: its own labels.csv beside the images is not ours to write, so a copy of both
        source = work / "kermany_slice"
        labels = labels.iloc[::every].reset_index(drop=True)
        for rel in labels["file"]:
            dest = source / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not dest.exists():
                dest.write_bytes((folder / rel).read_bytes())
        labels.to_csv(source / "labels.csv", index=False)
    mapping = work / "kermany_mapping.yaml"
    mapping.parent.mkdir(parents=True, exist_ok=True)
    mapping.write_text(yaml.safe_dump(KERMANY_MAPPING, sort_keys=False))
    whole = work / "whole"
    run_ingest("csv", source, whole, mapping=mapping, site_name="kermany", progress=False)
    meta, frame = read_site_json(whole / "kermany"), read_manifest(whole / "kermany")
    row = labels.iloc[frame["source_row"].astype(int).to_numpy() - 1]
    official = row["split"].to_numpy()
    frame["patient_id"] = official + "-" + row["patient_id"].to_numpy()
    frame["study_id"] = frame["patient_id"]
    root, classes = Path(meta["export_root"]), list(meta["class_set"])
    train = frame.loc[official == "train"].copy()
    train["site"] = (patient_bucket(train["patient_id"], salt="bench-shift-sources") * n_sources).astype(int) + 1
    train["split"] = np.where(patient_bucket(train["patient_id"], salt="bench-shift-source-val") < 0.1, "val", "train")
    for k in range(1, n_sources + 1):
        write_site(manifests, f"site-{k}", train.loc[train["site"] == k], classes=classes, source="csv",
                   adapter_version=meta["adapter_version"], export_root=root, set_aside=[],
                   options={"bench_regime": f"Kermany official train rows, patient-hash share {k}/{n_sources}"})
    target = frame.loc[official == "test"].copy()
    f_train, f_val, _ = target_split
    u = patient_bucket(target["patient_id"], salt="bench-shift-target")
    target["split"] = np.where(u < f_train, "train", np.where(u < f_train + f_val, "val", "test"))
    write_site(manifests, "target-base", target, classes=classes, source="csv", adapter_version=meta["adapter_version"],
               export_root=root, set_aside=[],
               options={"bench_regime": f"Kermany official test rows, re-split {list(target_split)} by patient hash"})
    return manifests


def cell_sites(manifests: Path, work: Path, shift: str) -> tuple[list[str], Path]:
    """The source site folders and the target site folder of one shift (module doc)."""
    sources = [str((manifests / f"site-{k}").resolve()) for k in (1, 2, 3)]
    if shift == "hetero" or shift.startswith("hetero_"):
        rest = shift[len("hetero_"):] if shift.startswith("hetero_") else "none"
        if rest.startswith("hetero") or rest in ("shortcut",) or rest.startswith("labelnoise"):
            raise SystemExit(f"--shifts {shift}: hetero_<shift> takes a target shift (none or <kind><level>)")
        return hetero_sources(manifests, work), cell_sites(manifests, work, rest)[1]
    if shift == "none":
        return sources, (manifests / "target-base").resolve()
    if shift == "shortcut":
        return shortcut_sites(manifests, work)
    kind, level = shift.rstrip("0123456789"), shift[len(shift.rstrip("0123456789")):]
    if kind == "labelnoise" and level:
        return noisy_sources(manifests, work, int(level) / 100), (manifests / "target-base").resolve()
    if kind not in ("noise", "gamma", "blur", "mix") or not level:
        raise SystemExit(f"--shifts: unknown shift {shift!r} (none, shortcut, labelnoise<percent>, hetero, "
                         "hetero_<shift>, or noise|gamma|blur|mix + level 0-4)")
    return sources, bench_shift.shifted_target(manifests, work, kind, int(level)).resolve()


def shortcut_sites(manifests: Path, work: Path) -> tuple[list[str], Path]:
    from fedcxr.site_adapters.shift import Shortcut, shift_site

    pos, neg = SHORTCUT_RATES
    marked = []
    out = work / "sources" / "shortcut"
    for k in (1, 2, 3):
        if not (out / f"site-{k}" / "site.json").is_file():
            shift_site(manifests / f"site-{k}", out, kind="shortcut", shortcut=Shortcut("pneumonia", pos, neg),
                       seed=0, site_name=f"site-{k}", progress=False)
        marked.append(str((out / f"site-{k}").resolve()))
    target = work / "targets" / "shortcut"
    if not (target / "target" / "site.json").is_file():
        shift_site(manifests / "target-base", target, kind="shortcut", shortcut=Shortcut("pneumonia", neg, pos),
                   seed=0, site_name="target", progress=False)
    return marked, (target / "target").resolve()


def hetero_sources(manifests: Path, work: Path) -> list[str]:
    """Each source shifted its own way (:data:`HETERO_SOURCES`, seed = the source's number)."""
    from fedcxr.site_adapters.shift import shift_site

    out, folders = work / "sources" / "hetero", []
    for k, (kind, level) in HETERO_SOURCES.items():
        if not (out / f"site-{k}" / "site.json").is_file():
            shift_site(manifests / f"site-{k}", out, kind=kind, level=level, seed=k, site_name=f"site-{k}",
                       progress=False)
        folders.append(str((out / f"site-{k}").resolve()))
    return folders


def noisy_sources(manifests: Path, work: Path, rate: float) -> list[str]:
    """The sources with each training label flipped with probability ``rate`` (chosen by a hash of the
    patient id, so the same rows every run); validation rows and the target are untouched."""
    from fedcxr.site_adapters.manifest import patient_bucket, read_manifest, read_site_json, write_site

    out, folders = work / "sources" / f"labelnoise{round(100 * rate)}", []
    for k in (1, 2, 3):
        site = manifests / f"site-{k}"
        if not (out / f"site-{k}" / "site.json").is_file():
            meta, frame = read_site_json(site), read_manifest(site)
            flip = (patient_bucket(frame["patient_id"], salt="bench-regime-label-noise") < rate) & (
                frame["split"] == "train").to_numpy() & frame["label__pneumonia"].notna().to_numpy()
            frame.loc[flip, "label__pneumonia"] = 1.0 - frame.loc[flip, "label__pneumonia"]
            write_site(out, f"site-{k}", frame, classes=list(meta["class_set"]), source=meta["source"],
                       adapter_version=meta["adapter_version"], export_root=Path(meta["export_root"]), set_aside=[],
                       options={**(meta.get("options") or {}), "bench_regime": f"training labels flipped at rate {rate}"})
        folders.append(str((out / f"site-{k}").resolve()))
    return folders
