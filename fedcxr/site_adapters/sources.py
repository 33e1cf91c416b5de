"""Every ``fedcxr ingest`` SOURCE, declared once: one :class:`SourceSpec` per adapter.

A spec says what the source is (a one-line summary), which adapter reads it
(``"module:function"``, imported only when it runs or its help is asked for), a worked example,
whether it has a ``--plan`` and whether it honours ``--labels-key``. Everything else is derived
from :data:`SOURCES`: the SOURCE list of ``fedcxr ingest --help`` (:func:`source_list`), the
sources named by ``--plan``'s help and refusal (:func:`plan_sources`), the registry the ingest
dispatches on (:data:`fedcxr.site_adapters.ingest.ADAPTERS`) and the text of
``fedcxr ingest SOURCE --help`` (:meth:`SourceSpec.help`): the summary, the adapter module's own
documentation (its expected layout, columns and semantics — the adapters' docstrings are the
reference, so the help never drifts from the code), ``--plan`` support and the example.

The docstrings are written for developers (reStructuredText, cross-references, pointers into
``../shared/``, the project's data folder that a clone of the repository does not have);
:func:`plain_text` turns them into plain console text for the user.

* ``plan=True``: the adapter can run with ``options.plan`` (``fedcxr ingest --plan``): it reads
  metadata files only and never opens an image. A source whose metadata lives in the images' own
  headers (``dicom``, ``images``, ``midrc``) or that must write images to build its rows
  (``medmnist``) has no plan: ``--plan`` stops with a message naming the sources that have one.
* ``labels_key=True``: it honours ``options.labels_key`` (``--labels-key``: a label csv keyed by
  any DICOM tag; ``dicom``, ``images``); other sources refuse the option.

(This module does not import the adapters until a help text is asked for: ``fedcxr --help`` stays
fast.) Each adapter module still declares ``SOURCE_CLASSES``, the classes it labels
(:mod:`fedcxr.site_adapters.ingest`).
"""

from __future__ import annotations

import importlib
import inspect
import re
import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class SourceSpec:
    """One SOURCE: its name, its adapter (``"module:function"``), what it is in a line, a command
    that ingests it, and what it supports (see the module doc)."""

    name: str
    adapter: str
    summary: str
    example: str
    plan: bool = False
    labels_key: bool = False

    def adapter_function(self):
        """The adapter function (its module imported now)."""
        module_name, func_name = self.adapter.split(":")
        return getattr(importlib.import_module(module_name), func_name)

    def layout(self) -> str:
        """The expected layout, columns and semantics: the adapter's documentation as plain text."""
        module_name, func_name = self.adapter.split(":")
        module = importlib.import_module(module_name)
        parts = []
        if func_name != "read_" + module_name.rsplit(".", 1)[-1]:  # e.g. images = the dicom adapter + PNG/JPEG
            parts.append(inspect.getdoc(getattr(module, func_name)) or "")
        parts.append(textwrap.dedent(inspect.getdoc(module) or "").strip())
        return "\n\n".join(plain_text(p) for p in parts if p)

    def help(self) -> str:
        """What ``fedcxr ingest SOURCE --help`` prints before the options (layout, columns, example)."""
        plan = "yes (reads metadata files only)" if self.plan else "no (its metadata is in the images)"
        parts = [f"SOURCE {self.name}: {self.summary}", self.layout(), f"--plan: {plan}",
                 f"Example:\n  {self.example}"]
        return "\n\n".join(p for p in parts if p)


#: Every SOURCE of ``fedcxr ingest``, in the order ``--help`` lists them.
SOURCES: dict[str, SourceSpec] = {spec.name: spec for spec in (
    SourceSpec(
        "nih", "fedcxr.site_adapters.nih:read_nih",
        "NIH ChestX-ray14: Data_Entry_2017(_v2020).csv + train_val_list.txt/test_list.txt + images*/",
        "fedcxr ingest nih --input /data/ChestX-ray14 --out manifests --site-by iid:4:shared=3",
        plan=True,
    ),
    SourceSpec(
        "chexpert", "fedcxr.site_adapters.chexpert:read_chexpert",
        "CheXpert: train.csv / valid.csv (CheXpert-v1.0-small/ or CheXpert-v1.0/), optional CHEXPERT DEMO.xlsx",
        "fedcxr ingest chexpert --input /data/chexpert --out manifests --site-by chexpert-conditions",
        plan=True,
    ),
    SourceSpec(
        "mimic", "fedcxr.site_adapters.mimic:read_mimic",
        "MIMIC-CXR-JPG: mimic-cxr-2.0.0-{metadata,chexpert|negbio,split}.csv.gz + MIMIC-IV hosp/ tables",
        "fedcxr ingest mimic --input /data/physionet.org/files --out manifests --site-by race",
        plan=True,
    ),
    SourceSpec(
        "midrc", "fedcxr.site_adapters.midrc:read_midrc",
        "MIDRC data-commons TSVs (case, imaging_study, cr/dx_series_file) + the DICOM files",
        "fedcxr ingest midrc --input /data/midrc --out manifests --site-by state",
        plan=False,
    ),
    SourceSpec(
        "dicom", "fedcxr.site_adapters.dicom_folder:read_dicom_folder",
        "any folder of DICOM files, with a label csv keyed by SOPInstanceUID, StudyInstanceUID, a file "
        "name or any DICOM tag (--labels-key)",
        "fedcxr ingest dicom --input /pacs/export --labels labels.csv --labels-key AccessionNumber "
        "--out manifests --site-name hospital_a",
        plan=False, labels_key=True,
    ),
    SourceSpec(
        "images", "fedcxr.site_adapters.dicom_folder:read_image_folder",
        "a folder of DICOM, PNG and JPEG files (labeled by a csv like the dicom source, or unlabeled)",
        "fedcxr ingest images --input /data/new_films --out manifests --site-name clinic",
        plan=False, labels_key=True,
    ),
    SourceSpec(
        "csv", "fedcxr.site_adapters.csv_mapping:read_csv_mapping",
        "any export that is one csv plus image files, described by a YAML column mapping (--mapping)",
        "fedcxr ingest csv --input /data/covid-chestxray-dataset --mapping "
        "examples/covid_chestxray_by_site_group.yaml --out manifests --site-by site_group",
        plan=True,
    ),
    SourceSpec(
        "medmnist", "fedcxr.site_adapters.medmnist:read_medmnist",
        "a MedMNIST .npz (PneumoniaMNIST, ChestMNIST)",
        "fedcxr ingest medmnist --input pneumoniamnist.npz --out manifests --site-by skew:4:alpha=0.5",
        plan=False,
    ),
    SourceSpec(
        "rsna", "fedcxr.site_adapters.rsna:read_rsna",
        "RSNA Pneumonia: stage_2_train_labels.csv (+ stage_2_detailed_class_info.csv) + stage_2_train_images/*.dcm",
        "fedcxr ingest rsna --input /data/rsna-pneumonia --out manifests --site-name rsna",
        plan=True,
    ),
    SourceSpec(
        "vindr", "fedcxr.site_adapters.vindr:read_vindr",
        "VinDr-CXR: image_labels_{train,test}.csv (or the Kaggle box table) + train/ test/ *.dicom",
        "fedcxr ingest vindr --input /data/vindr-cxr --out manifests --readers any",
        plan=True,
    ),
    SourceSpec(
        "siim", "fedcxr.site_adapters.siim:read_siim",
        "SIIM-ACR Pneumothorax: train-rle.csv + dicom-images-train/**/*.dcm",
        "fedcxr ingest siim --input /data/siim-acr --out manifests --site-name siim",
        plan=True,
    ),
    SourceSpec(
        "openi", "fedcxr.site_adapters.openi:read_openi",
        "NLM Indiana / Open-i: the reports' XML (folder or .tgz) + NLMCXR_png/ or DICOMs",
        "fedcxr ingest openi --input /data/openi --out manifests --site-name openi",
        plan=True,
    ),
    SourceSpec(
        "padchest", "fedcxr.site_adapters.padchest:read_padchest",
        "PadChest: PADCHEST_chest_x_ray_images_labels_160K_01.02.19.csv + the PNG folders",
        "fedcxr ingest padchest --input /data/padchest --out manifests --site-by label_method",
        plan=True,
    ),
)}


def source_list() -> str:
    """``nih | chexpert | ...``: every SOURCE, for ``fedcxr ingest --help``."""
    return " | ".join(SOURCES)


def plan_sources() -> list[str]:
    """The sources with a ``--plan``, in :data:`SOURCES` order."""
    return [name for name, spec in SOURCES.items() if spec.plan]


def labels_key_sources() -> list[str]:
    """The sources that read a label csv keyed by a DICOM tag (``--labels-key``)."""
    return [name for name, spec in SOURCES.items() if spec.labels_key]


def get_source(name: str) -> SourceSpec:
    """The spec of SOURCE ``name``; :class:`~fedcxr.site_adapters.base.IngestError` (exit 2) naming the
    valid sources otherwise."""
    if name not in SOURCES:
        from fedcxr.site_adapters.base import IngestError
        from fedcxr.suggest import did_you_mean

        raise IngestError(f"unknown SOURCE {name!r}{did_you_mean(name, SOURCES)}; choose one of: "
                          f"{', '.join(sorted(SOURCES))}")
    return SOURCES[name]


#: ``(pattern, replacement)`` turning a developer docstring into console text, in order
_PLAIN = [
    # a parenthesis that points into the project's data folder (a clone has none): dropped
    (re.compile(r"\s*\((?:[^()]|\([^()]*\))*\.\./shared/(?:[^()]|\([^()]*\))*\)"), ""),
    # Sphinx cross-references: the last name, as text (:func:`~a.b.c` → c, :class:`Name` → Name)
    (re.compile(r":[a-z]+:`~?(?:[\w.]+\.)?([\w]+)`"), r"\1"),
    (re.compile(r"``(.+?)``", re.S), r"\1"),  # literals
    (re.compile(r"\*\*(.+?)\*\*", re.S), r"\1"),  # bold
    (re.compile(r"(\S)::\n"), r"\1:\n"),  # a literal block's marker
]


def plain_text(doc: str) -> str:
    """A reStructuredText docstring as console text: no ``literal`` quotes, no ``**bold**``, no
    ``:role:`` references, and no pointer into ``../shared/`` (a clone does not have it)."""
    for pattern, replacement in _PLAIN:
        doc = pattern.sub(replacement, doc)
    return doc


__all__ = ["SOURCES", "SourceSpec", "get_source", "labels_key_sources", "plain_text", "plan_sources", "source_list"]
