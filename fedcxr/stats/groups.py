"""What a site counts: every statistic is a *group* of count cells over fixed categories.

A group partitions a set of rows (or, for ``intensity``, of pixels) into categories fixed here
and nowhere else, so a site, the in-process merge and the FLARE server agree on what cell ``i``
of group ``g`` means without ever sending a category name a site chose itself. Fixed
vocabularies are also a privacy choice: a free-text DICOM tag (a rare scanner model, a
hospital's own manufacturer string) never leaves the site — it is counted as ``other``.

==========================  ====================================  ===============================
group                       categories                            rows counted
==========================  ====================================  ===============================
``split``                   train, val, test                      every row
``train_labels``            labeled, not_labeled                  train rows (≥ 1 finding label
                                                                  of the site's class set)
``label.<class>``           positive, negative, uncertain,        every row, one group per class
                            not_labeled                           of the site's class set
``sex`` ``age_bin``         the vocabulary of :mod:`fedcxr.vocab`  every row
``race`` ``view``           + ``unknown``
``sex_by_age``              F/0-19 … M/80+, unknown               every row (age/sex pyramid)
``file_format``             dicom, png, jpeg, unreadable          every row (file header)
``modality``                CR, DX, other, not DICOM, unknown     every row (DICOM header)
``manufacturer``            :data:`VENDORS`, other, not DICOM,    every row (DICOM header)
                            unknown
``photometric``             MONOCHROME1, MONOCHROME2, colour,     every row (DICOM header)
                            not DICOM, unknown
``image_rows``              :data:`SIZE_EDGES` bins, unknown      every row (file header)
``image_cols``
``intensity``               the 256 uint8 levels of the cache     every pixel of every cached
                                                                  image (decode-once cache)
==========================  ====================================  ===============================

``uncertain`` is the source's raw value -1 (``raw__<class>``), whatever the ingest's uncertain
policy made of it; ``not_labeled`` is a blank (NaN) label.
"""

from __future__ import annotations

import re
from typing import Optional

from fedcxr.site_adapters.manifest import SPLITS
from fedcxr.vocab import AUX_TASKS, AUX_VOCAB, CLASSES

UNKNOWN = "unknown"
NOT_DICOM = "not DICOM"
OTHER = "other"
LABEL_PREFIX = "label."
LABEL_STATES = ("positive", "negative", "uncertain", "not_labeled")
TRAIN_LABELS = ("labeled", "not_labeled")
DEMOGRAPHICS = tuple(AUX_TASKS)  # sex, age_bin, race, view
PYRAMID = "sex_by_age"
FORMATS = ("dicom", "png", "jpeg", "unreadable")
MODALITIES = ("CR", "DX", OTHER, NOT_DICOM, UNKNOWN)
PHOTOMETRIC = ("MONOCHROME1", "MONOCHROME2", "colour", NOT_DICOM, UNKNOWN)
#: Radiography vendors a DICOM ``Manufacturer`` is matched against (case-insensitive word
#: prefixes, see :func:`manufacturer_category`); anything else is ``other``.
VENDORS: dict[str, tuple[str, ...]] = {
    "Agfa": ("agfa",),
    "Canon/Toshiba": ("canon", "toshiba"),
    "Carestream/Kodak": ("carestream", "kodak", "eastman kodak"),
    "Fujifilm": ("fuji",),
    "GE": ("ge ", "ge healthcare", "ge medical", "general electric", "gems"),
    "Konica Minolta": ("konica",),
    "Philips": ("philips",),
    "Samsung": ("samsung",),
    "Shimadzu": ("shimadzu",),
    "Siemens": ("siemens",),
}
MANUFACTURERS = (*VENDORS, OTHER, NOT_DICOM, UNKNOWN)
#: Upper-exclusive edges of the image-size bins (pixels of the stored image, before any resize).
SIZE_EDGES = (128, 256, 512, 1024, 1536, 2048, 2560, 3072, 3584, 4096)
SIZES = tuple(
    [f"<{SIZE_EDGES[0]}"]
    + [f"{lo}-{hi - 1}" for lo, hi in zip(SIZE_EDGES, SIZE_EDGES[1:])]
    + [f"{SIZE_EDGES[-1]}+", UNKNOWN]
)
INTENSITY_LEVELS = 256
ACQUISITION = ("file_format", "modality", "manufacturer", "photometric", "image_rows", "image_cols")
#: Sections a site reports separately as available or not (and why).
SECTIONS = {"manifest": ("split", "train_labels", *DEMOGRAPHICS, PYRAMID), "acquisition": ACQUISITION,
            "intensity": ("intensity",)}


def age_bins() -> list[str]:
    return list(AUX_VOCAB["age_bin"])


def pyramid_categories() -> list[str]:
    return [f"{s}/{a}" for s in AUX_VOCAB["sex"] for a in age_bins()] + [UNKNOWN]


def label_group(cls: str) -> str:
    return LABEL_PREFIX + cls


def group_class(name: str) -> Optional[str]:
    """The class of a ``label.<class>`` group, else ``None``."""
    return name[len(LABEL_PREFIX):] if name.startswith(LABEL_PREFIX) else None


def categories(name: str) -> list[str]:
    """The fixed categories of group ``name`` (``KeyError`` for a name that is not a group)."""
    cls = group_class(name)
    if cls is not None:
        if cls not in CLASSES:
            raise KeyError(f"{name}: {cls!r} is not a canonical class")
        return list(LABEL_STATES)
    if name in DEMOGRAPHICS:
        return list(AUX_VOCAB[name]) + [UNKNOWN]
    fixed = {
        "split": list(SPLITS), "train_labels": list(TRAIN_LABELS), PYRAMID: pyramid_categories(),
        "file_format": list(FORMATS), "modality": list(MODALITIES), "manufacturer": list(MANUFACTURERS),
        "photometric": list(PHOTOMETRIC), "image_rows": list(SIZES), "image_cols": list(SIZES),
        "intensity": [str(v) for v in range(INTENSITY_LEVELS)],
    }
    return fixed[name]


def all_groups(class_set: list[str]) -> list[str]:
    """Every group a site with ``class_set`` reports, in the order of the report."""
    return (["split", "train_labels"] + [label_group(c) for c in CLASSES if c in set(class_set)]
            + list(DEMOGRAPHICS) + [PYRAMID] + list(ACQUISITION) + ["intensity"])


def is_group(name: str) -> bool:
    try:
        categories(name)
    except KeyError:
        return False
    return True


def section_of(name: str) -> str:
    for section, names in SECTIONS.items():
        if name in names:
            return section
    return "manifest"  # label.<class>


# --------------------------------------------------------------------------- header values → categories


def size_category(pixels: Optional[int]) -> str:
    """A stored image dimension (rows or columns) → its :data:`SIZES` bin."""
    if pixels is None or pixels <= 0:
        return UNKNOWN
    for i, edge in enumerate(SIZE_EDGES):
        if pixels < edge:
            return SIZES[i]
    return SIZES[len(SIZE_EDGES)]


def modality_category(kind: str, value: Optional[str]) -> str:
    if kind != "dicom":
        return NOT_DICOM
    if not value:
        return UNKNOWN
    text = value.strip().upper()
    return text if text in ("CR", "DX") else OTHER


def photometric_category(kind: str, value: Optional[str]) -> str:
    if kind != "dicom":
        return NOT_DICOM
    if not value:
        return UNKNOWN
    text = value.strip().upper()
    if text in ("MONOCHROME1", "MONOCHROME2"):
        return text
    return "colour" if text.startswith(("RGB", "YBR", "PALETTE")) else UNKNOWN


def manufacturer_category(kind: str, value: Optional[str]) -> str:
    """A DICOM ``Manufacturer`` → one of :data:`MANUFACTURERS` (never the string itself)."""
    if kind != "dicom":
        return NOT_DICOM
    if not value or not value.strip():
        return UNKNOWN
    text = re.sub(r"[^a-z0-9]+", " ", value.lower()).strip() + " "
    for vendor, prefixes in VENDORS.items():
        if any(text.startswith(p) if p.endswith(" ") else text.startswith(p) or f" {p}" in text for p in prefixes):
            return vendor
    return OTHER


def header_categories(header: Optional[dict]) -> dict[str, str]:
    """One image's acquisition categories from :func:`fedcxr.site_adapters.image_headers.read_header`'s
    dict (``None``: the header could not be read)."""
    if header is None:
        return {"file_format": "unreadable", **{name: UNKNOWN for name in ACQUISITION[1:]}}
    kind = str(header.get("kind") or "")
    return {
        "file_format": kind if kind in FORMATS else "unreadable",
        "modality": modality_category(kind, header.get("Modality")),
        "manufacturer": manufacturer_category(kind, header.get("Manufacturer")),
        "photometric": photometric_category(kind, header.get("PhotometricInterpretation")),
        "image_rows": size_category(header.get("rows")),
        "image_cols": size_category(header.get("cols")),
    }
