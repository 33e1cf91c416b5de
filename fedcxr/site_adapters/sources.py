"""What each ``fedcxr ingest SOURCE`` expects: one registry entry per source, for ``--help`` and ``--plan``.

``fedcxr ingest SOURCE --help`` prints :func:`source_help`: the entry's one-line summary, the
adapter module's own documentation (its expected layout, columns and semantics — the adapters'
docstrings are the reference, so the help never drifts from the code) and a worked example.

An adapter module tells the ingest two things about itself with module attributes:

* ``SOURCE_CLASSES`` — the classes it labels (see :mod:`fedcxr.site_adapters.ingest`);
* ``LABELS_KEY = True`` — it honours ``options.labels_key`` (``--labels-key``: a label csv
  keyed by any DICOM tag; ``dicom``, ``images``); other sources refuse the option;
* ``PLAN_MODE = True`` — it can run with ``options.plan`` (``fedcxr ingest --plan``): it reads
  metadata files only and never opens an image (NIH, CheXpert, MIMIC, csv). A source whose
  metadata lives in the images' own headers (``dicom``, ``images``, ``midrc``) or that must
  write images to build its rows (``medmnist``) has no plan: ``--plan`` stops with a message.

A source registered in :data:`fedcxr.site_adapters.ingest.ADAPTERS` but not here still gets a
help (its module's docstring) and no example. (This module does not import the ingest: the
functions take the adapter's ``"module:function"`` target.)
"""

from __future__ import annotations

import importlib
import inspect
import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class SourceInfo:
    """One source: what it is, in a line, and a command that ingests it."""

    summary: str
    example: str


SOURCES: dict[str, SourceInfo] = {
    "nih": SourceInfo(
        "NIH ChestX-ray14: Data_Entry_2017(_v2020).csv + train_val_list.txt/test_list.txt + images*/",
        "fedcxr ingest nih --input /data/ChestX-ray14 --out manifests --site-by iid:4:shared=3",
    ),
    "chexpert": SourceInfo(
        "CheXpert: train.csv / valid.csv (CheXpert-v1.0-small/ or CheXpert-v1.0/), optional CHEXPERT DEMO.xlsx",
        "fedcxr ingest chexpert --input /data/chexpert --out manifests --site-by chexpert-conditions",
    ),
    "mimic": SourceInfo(
        "MIMIC-CXR-JPG: mimic-cxr-2.0.0-{metadata,chexpert|negbio,split}.csv.gz + MIMIC-IV hosp/ tables",
        "fedcxr ingest mimic --input /data/physionet.org/files --out manifests --site-by race",
    ),
    "midrc": SourceInfo(
        "MIDRC data-commons TSVs (case, imaging_study, cr/dx_series_file) + the DICOM files",
        "fedcxr ingest midrc --input /data/midrc --out manifests --site-by state",
    ),
    "dicom": SourceInfo(
        "any folder of DICOM files, with a label csv keyed by SOPInstanceUID, StudyInstanceUID, a file "
        "name or any DICOM tag (--labels-key)",
        "fedcxr ingest dicom --input /pacs/export --labels labels.csv --labels-key AccessionNumber "
        "--out manifests --site-name hospital_a",
    ),
    "images": SourceInfo(
        "a folder of DICOM, PNG and JPEG files (labeled by a csv like the dicom source, or unlabeled)",
        "fedcxr ingest images --input /data/new_films --out manifests --site-name clinic",
    ),
    "csv": SourceInfo(
        "any export that is one csv plus image files, described by a YAML column mapping (--mapping)",
        "fedcxr ingest csv --input /data/covid-chestxray-dataset --mapping "
        "examples/covid_chestxray_by_site_group.yaml --out manifests --site-by site_group",
    ),
    "rsna": SourceInfo(
        "RSNA Pneumonia: stage_2_train_labels.csv (+ stage_2_detailed_class_info.csv) + stage_2_train_images/*.dcm",
        "fedcxr ingest rsna --input /data/rsna-pneumonia --out manifests --site-name rsna",
    ),
    "vindr": SourceInfo(
        "VinDr-CXR: image_labels_{train,test}.csv (or the Kaggle box table) + train/ test/ *.dicom",
        "fedcxr ingest vindr --input /data/vindr-cxr --out manifests --readers any",
    ),
    "siim": SourceInfo(
        "SIIM-ACR Pneumothorax: train-rle.csv + dicom-images-train/**/*.dcm",
        "fedcxr ingest siim --input /data/siim-acr --out manifests --site-name siim",
    ),
    "openi": SourceInfo(
        "NLM Indiana / Open-i: the reports' XML (folder or .tgz) + NLMCXR_png/ or DICOMs",
        "fedcxr ingest openi --input /data/openi --out manifests --site-name openi",
    ),
    "padchest": SourceInfo(
        "PadChest: PADCHEST_chest_x_ray_images_labels_160K_01.02.19.csv + the PNG folders",
        "fedcxr ingest padchest --input /data/padchest --out manifests --site-by label_method",
    ),
    "medmnist": SourceInfo(
        "a MedMNIST .npz (PneumoniaMNIST, ChestMNIST)",
        "fedcxr ingest medmnist --input pneumoniamnist.npz --out manifests --site-by skew:4:alpha=0.5",
    ),
}


def adapter_module(target: str):
    """The module of an adapter given as ``"module:function"`` (imported)."""
    return importlib.import_module(target.split(":")[0])


def declares(target: str, attribute: str) -> bool:
    """Whether the adapter ``"module:function"`` sets the module attribute ``attribute`` true."""
    return bool(getattr(adapter_module(target), attribute, False))


def supports_plan(target: str) -> bool:
    """Whether the adapter ``"module:function"`` declares ``PLAN_MODE = True`` (see the module doc)."""
    return declares(target, "PLAN_MODE")


def source_help(source: str, target: str) -> str:
    """The text ``fedcxr ingest SOURCE --help`` prints before the options (layout, columns, example).

    ``target`` is the source's adapter, ``"module:function"``
    (:data:`fedcxr.site_adapters.ingest.ADAPTERS`).
    """
    module_name, func_name = target.split(":")
    module = importlib.import_module(module_name)
    info = SOURCES.get(source)
    parts = [f"SOURCE {source}: {info.summary}" if info else f"SOURCE {source}"]
    if func_name != "read_" + module_name.rsplit(".", 1)[-1]:  # e.g. images = the dicom adapter + PNG/JPEG
        parts.append(inspect.getdoc(getattr(module, func_name)) or "")
    parts.append(textwrap.dedent(inspect.getdoc(module) or "").strip())
    plan = "yes (reads metadata files only)" if supports_plan(target) else "no (its metadata is in the images)"
    parts.append(f"--plan: {plan}")
    if info:
        parts.append(f"Example:\n  {info.example}")
    return "\n\n".join(p for p in parts if p)


__all__ = ["SOURCES", "SourceInfo", "adapter_module", "declares", "source_help", "supports_plan"]
