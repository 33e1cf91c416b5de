"""Canonical vocabularies: finding classes and auxiliary (demographic) labels.

Every adapter maps its vendor's strings onto these, and nothing downstream ever sees a
vendor string. The codes are stable: they are written into manifests as integers and their
meaning is recorded in each ``site.json`` (``aux_vocab``), so changing an order here is a
breaking change of the manifest format (bump ``MANIFEST_VERSION``).

Finding classes are the union of NIH ChestX-ray14, CheXpert and COVID-19 (DESIGN §2), followed
by :data:`ADDED_CLASSES`: findings of VinDr-CXR, Open-i and PadChest that none of those names
(README "Sources and their findings" maps every source's labels onto these). New classes are
appended, never inserted, so the canonical order of the first 22 never changes.

A manifest written before a class existed (``manifest_version`` 2: the first 22 classes) has
no ``label__`` column for it; the class reads as *not labeled* there
(:func:`fedcxr.site_adapters.manifest.label_values`), exactly as a class a source never labels.

Auxiliary vocabularies (0-based integer codes; unknown is null, never a code):

* ``sex``: ``F`` (0), ``M`` (1). DICOM ``O`` and every "unknown"/"not reported" → null.
* ``age_bin``: ``0-19`` (0), ``20-39`` (1), ``40-59`` (2), ``60-79`` (3), ``80+`` (4), from age in
  years. Ages outside 0–120 are treated as unparseable (null), never clipped.
* ``race``: ``white`` (0), ``black`` (1), ``asian`` (2), ``hispanic`` (3), ``other`` (4).
  A combined race/ethnicity category as MIMIC records it: where a source records ethnicity
  separately (MIDRC), ``Hispanic or Latino`` takes precedence over race.
* ``view``: ``PA`` (0), ``AP`` (1), ``LATERAL`` (2). ``AP Supine``/``AP AXIAL``/``AP LLD`` → AP;
  ``LL``/``RL``/``L``/``XTABLE LATERAL`` → LATERAL; obliques and swimmers → null.
"""

from __future__ import annotations

import math
import re
from typing import Optional

#: 2: keyed (HMAC) pseudonyms and the image_key column; 3: the classes of ADDED_CLASSES
#: (a version-2 manifest still loads: its missing label columns read as not labeled, and an
#: older fedcxr refuses a version-3 manifest instead of silently dropping the classes it lacks).
MANIFEST_VERSION = 3

CLASSES: list[str] = [
    "atelectasis",
    "cardiomegaly",
    "consolidation",
    "edema",
    "pleural_effusion",
    "pneumonia",
    "pneumothorax",
    "infiltration",
    "mass",
    "nodule",
    "emphysema",
    "fibrosis",
    "pleural_thickening",
    "hernia",
    "enlarged_cardiomediastinum",
    "lung_opacity",
    "lung_lesion",
    "pleural_other",
    "fracture",
    "support_devices",
    "no_finding",
    "covid19",
]

#: Classes added for sources beyond NIH/CheXpert/COVID-19 (manifest version 3), in the order
#: appended to :data:`CLASSES`. VinDr-CXR: the first fourteen (its local and global labels that
#: have no earlier class); Open-i MeSH terms: granuloma, calcified_granuloma; PadChest (the
#: findings TorchXRayVision's ``PC_Dataset`` reads): scoliosis to hemidiaphragm_elevation.
#: Sources share a class where they name the same finding (copd, tuberculosis, granuloma...).
ADDED_CLASSES: list[str] = [
    "aortic_enlargement",
    "calcification",
    "ild",
    "nodule_mass",
    "other_lesion",
    "pulmonary_fibrosis",
    "enlarged_pa",
    "lung_cavity",
    "lung_cyst",
    "mediastinal_shift",
    "copd",
    "lung_tumor",
    "tuberculosis",
    "other_disease",
    "granuloma",
    "calcified_granuloma",
    "scoliosis",
    "bronchiectasis",
    "flattened_diaphragm",
    "aortic_elongation",
    "hilar_enlargement",
    "air_trapping",
    "costophrenic_angle_blunting",
    "aortic_atheromatosis",
    "hemidiaphragm_elevation",
]
#: The classes of manifest version 2 (every manifest has their ``label__`` columns).
CLASSES_V2: tuple[str, ...] = tuple(CLASSES)
CLASSES += ADDED_CLASSES
CLASS_SET = frozenset(CLASSES)

#: Vendor finding names (lower-cased, punctuation-normalised by :func:`normalise_name`) → class.
FINDING_SYNONYMS: dict[str, str] = {
    "effusion": "pleural_effusion",
    "pleural effusion": "pleural_effusion",
    "pleural thickening": "pleural_thickening",
    "pleural": "pleural_thickening",
    "enlarged cardiomediastinum": "enlarged_cardiomediastinum",
    "lung opacity": "lung_opacity",
    "lung lesion": "lung_lesion",
    "pleural other": "pleural_other",
    "support devices": "support_devices",
    "no finding": "no_finding",
    "infiltrate": "infiltration",
    "covid-19": "covid19",
    "covid 19": "covid19",
    "covid": "covid19",
    "nodule/mass": "nodule_mass",
    "interstitial lung disease": "ild",
    "enlarged pulmonary artery": "enlarged_pa",
    "chronic obstructive pulmonary disease": "copd",
    "other diseases": "other_disease",
}

AUX_TASKS: list[str] = ["sex", "age_bin", "race", "view"]

AUX_VOCAB: dict[str, list[str]] = {
    "sex": ["F", "M"],
    "age_bin": ["0-19", "20-39", "40-59", "60-79", "80+"],
    "race": ["white", "black", "asian", "hispanic", "other"],
    "view": ["PA", "AP", "LATERAL"],
}
AGE_BIN_EDGES: list[float] = [20.0, 40.0, 60.0, 80.0]  # upper-exclusive edges of bins 0..3
MAX_AGE = 120.0

_UNKNOWN = {
    "", "nan", "none", "null", "unknown", "u", "o", "other gender", "not reported",
    "unable to obtain", "patient declined to answer", "unknown/not specified", "declined",
    "na", "n/a", "?",
}


def normalise_name(name: str) -> str:
    """Lower-case a vendor label name and collapse ``_``/``-``/spaces (``Pleural_Thickening``)."""
    text = str(name).strip().lower().replace("_", " ")
    return re.sub(r"\s+", " ", text)


def canonical_class(name: str) -> Optional[str]:
    """Map a vendor finding name onto a canonical class, or ``None`` if it is not one of ours."""
    text = normalise_name(name)
    if text in FINDING_SYNONYMS:
        return FINDING_SYNONYMS[text]
    snake = text.replace(" ", "_").replace("-", "_")
    return snake if snake in CLASS_SET else None


def is_unknown(value: object) -> bool:
    """True for null-like values and the vendors' spellings of 'unknown'."""
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return str(value).strip().lower() in _UNKNOWN


def sex_code(value: object) -> Optional[int]:
    """``M``/``Male``/``m`` → 1, ``F``/``Female``/``f``/``W`` (German *weiblich*) → 0, else ``None``.

    Raises ``ValueError`` for a value that is neither a known sex nor a known 'unknown'.
    """
    if is_unknown(value):
        return None
    text = str(value).strip().lower()
    if text in {"m", "male", "man", "mann", "männlich"}:
        return 1
    if text in {"f", "female", "woman", "w", "weiblich"}:
        return 0
    raise ValueError(f"unknown sex value {value!r}")


_AGE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([YMWDymwd]?)\s*$")


def parse_age(value: object) -> Optional[float]:
    """Age in years from a number or a DICOM AS string (``062Y``, ``013M``, ``001D``, ``62``).

    Returns ``None`` for unknown; raises ``ValueError`` for a value that cannot be an age
    (unparseable text, negative, or over 120 years such as the NIH sample's ``411Y``).
    """
    if is_unknown(value):
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        years = float(value)
    else:
        match = _AGE_RE.match(str(value))
        if not match:
            raise ValueError(f"unparseable age {value!r}")
        number, unit = float(match.group(1)), match.group(2).upper()
        years = number / {"": 1.0, "Y": 1.0, "M": 12.0, "W": 52.1775, "D": 365.25}[unit]
    if not (0.0 <= years <= MAX_AGE):
        raise ValueError(f"age out of range {value!r}")
    return years


def age_bin_code(age: Optional[float]) -> Optional[int]:
    """Age in years → bin code (see module doc), ``None`` stays ``None``."""
    if age is None or (isinstance(age, float) and math.isnan(age)):
        return None
    return sum(age >= edge for edge in AGE_BIN_EDGES)


_RACE_PREFIXES: list[tuple[str, int]] = [
    ("hispanic", 3), ("latino", 3), ("south american", 3),
    ("white", 0), ("portuguese", 0), ("caucasian", 0),
    ("black", 1), ("african american", 1), ("caribbean island", 1),
    ("asian", 2),
    ("american indian", 4), ("native hawaiian", 4), ("pacific islander", 4),
    ("multiple race", 4), ("multi race", 4), ("other", 4),
]


def race_code(value: object, ethnicity: object = None) -> Optional[int]:
    """Collapse a race string (MIMIC, MIDRC, CheXpert sheet) into the 5-way race/ethnicity code.

    ``ethnicity`` (MIDRC's separate column) wins when it says Hispanic. Raises ``ValueError``
    for a value that matches no family and is not a known 'unknown'.
    """
    if ethnicity is not None and not is_unknown(ethnicity):
        eth = str(ethnicity).strip().lower()
        if eth.startswith("hispanic") and "not" not in eth:
            return 3
    if is_unknown(value):
        return None
    text = str(value).strip().lower()
    if "non-hispanic" in text or "non hispanic" in text:
        text = text.replace("non-hispanic", "").replace("non hispanic", "")
    text = text.strip(" ,-/")
    for prefix, code in _RACE_PREFIXES:
        if text.startswith(prefix):
            return code
    if "hispanic" in text or "latino" in text:
        return 3
    raise ValueError(f"unknown race value {value!r}")


def view_code(value: object) -> Optional[int]:
    """Map ViewPosition-like strings to PA/AP/LATERAL codes; obliques etc. → ``None``."""
    if is_unknown(value):
        return None
    text = str(value).strip().upper()
    if text.startswith("PA"):
        return 0
    if text.startswith("AP"):
        return 1
    if text in {"L", "LL", "RL", "LATERAL", "LAT", "XTABLE LATERAL", "LEFT LATERAL", "RIGHT LATERAL"}:
        return 2
    if text in {"POSTERO-ANTERIOR", "POSTEROANTERIOR"}:
        return 0
    if text in {"ANTERO-POSTERIOR", "ANTEROPOSTERIOR"}:
        return 1
    return None


def label_column(cls: str) -> str:
    """Manifest column holding the harmonised label of ``cls``."""
    return f"label__{cls}"


def raw_column(cls: str) -> str:
    """Manifest column holding the source's raw value of ``cls`` (before the uncertain policy)."""
    return f"raw__{cls}"


def aux_column(task: str) -> str:
    """Manifest column holding the integer code of auxiliary task ``task``."""
    return f"aux__{task}"
