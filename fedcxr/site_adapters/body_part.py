"""Is this DICOM a chest radiograph? What its own tags say (``Modality``, ``BodyPartExamined``).

A model trained on chest films scores a hip or a dental film like any other image and gives a
confident, meaningless answer. Real exports mix them in (MIMIC's metadata lists abdomen, knee
and "BABYGRAM" procedures; a PACS query by date returns every radiograph). So ingest sets a
DICOM aside when its tags give **positive evidence** that it is not a chest radiograph, and
keeps it otherwise — an unknown or blank tag never costs a hospital an image:

1. ``Modality`` (0008,0060) names a modality that is not projection radiography (``CT``,
   ``MR``, ``US``, ``MG``, ``NM``, ``PT``, fluoroscopy ``RF``/``XA``, dental ``IO``/``PX``...).
   ``CR``, ``DX`` (and the non-standard ``DR``), ``OT``/``SC`` (secondary captures, as the
   RSNA and NIH DICOM conversions use), and a blank or unlisted value are kept.
2. ``BodyPartExamined`` (0018,0015) names a body part, and it is not the chest: one of the
   DICOM defined terms of PS3.16 CID 4031 for other parts (``HIP``, ``KNEE``, ``SKULL``,
   ``ABDOMEN``, ``TEETH``...), matched as whole words. A value naming the chest (``CHEST``,
   ``THORAX``, ``LUNG``, Spanish ``TORAX``/``PECHO``, ...) keeps the file whatever else it says;
   a value in neither list (``PORTABLE``, a site's own code) is kept.
3. With no ``BodyPartExamined`` at all, ``StudyDescription`` / ``SeriesDescription`` are read
   the same way (the fo-dicom dental sample says only ``MODALITYLUT - TEETH``): a
   description naming another body part and no chest word sets the file aside.

:func:`not_chest_reason` returns the reason (``not a chest radiograph: BodyPartExamined
'HIP'``) or ``None``. ``fedcxr ingest --keep-non-chest`` keeps such files; their manifest
rows then carry the reason in the ``not_chest`` column and ``fedcxr predict`` flags them.
"""

from __future__ import annotations

import re
from typing import Mapping, Optional

#: Modalities that are projection radiographs (or cannot be told apart): kept.
RADIOGRAPH_MODALITIES = frozenset({"CR", "DX", "DR", "RG", "OT", "SC"})
#: Modalities that are certainly not a projection chest radiograph (DICOM PS3.3 C.7.3.1.1.1).
OTHER_MODALITIES = frozenset({
    "CT", "MR", "US", "NM", "PT", "MG", "XA", "RF", "IO", "PX", "OP", "OPT", "OCT", "ES", "SM",
    "ECG", "EEG", "EMG", "EPS", "HD", "IVUS", "OAM", "OPM", "OPV", "OSS", "BMD", "BI", "DG", "LS",
    "TG", "GM", "XC", "MS", "CP", "DF", "DS", "CD", "DD", "EC", "FA", "LP", "RTIMAGE", "RTDOSE",
    "RTSTRUCT", "RTPLAN", "RTRECORD", "SEG", "KO", "PR", "SR", "REG", "DOC", "AU", "HC",
})
#: Words that name the chest (upper case, whole words or word prefixes).
CHEST_WORDS = ("CHEST", "THORAX", "THORACIC", "THORAXPA", "LUNG", "LUNGS", "TORAX", "TÓRAX", "PECHO",
               "CXR", "TX", "POUMON", "BRUSTKORB", "THX", "TORACE")
#: DICOM body part defined terms (PS3.16 CID 4031, and common spellings) that are not the chest.
OTHER_PARTS = (
    "ABDOMEN", "ABDOMINAL", "ANKLE", "ARM", "BREAST", "CALCANEUS", "CLAVICLE", "COCCYX", "CSPINE",
    "ELBOW", "EXTREMITY", "FACE", "FEMUR", "FINGER", "FOOT", "FOREARM", "HAND", "HEAD", "HEEL", "HIP",
    "HUMERUS", "JAW", "KNEE", "LEG", "LSPINE", "MANDIBLE", "MAXILLA", "NECK", "ORBIT", "PATELLA",
    "PELVIS", "SACRUM", "SCAPULA", "SHOULDER", "SINUS", "SKULL", "SPINE", "TEETH", "TOOTH", "DENTAL",
    "TIBIA", "TOE", "TSPINE", "WRIST", "ZYGOMA", "BRAIN", "KIDNEY", "BLADDER", "COLON", "UTERUS",
    "RIB", "RIBS", "STERNUM", "LSSPINE", "WHOLEBODY", "BABYGRAM", "BONEAGE", "PANORAMIC", "DENTITION",
)
_WORD = re.compile(r"[A-ZÁÉÍÓÚ]+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.upper().replace("_", " "))


def _names(words: list[str], vocabulary: tuple[str, ...]) -> Optional[str]:
    """The first vocabulary term that a word equals (or, for longer terms, starts)."""
    for word in words:
        for term in vocabulary:
            if word == term or (len(term) >= 5 and word.startswith(term)):
                return term
    return None


def not_chest_reason(tags: Mapping[str, Optional[str]]) -> Optional[str]:
    """Why the tags say this is not a chest radiograph, or ``None`` (see the module doc).

    ``tags`` maps DICOM keywords (``Modality``, ``BodyPartExamined``, ``StudyDescription``,
    ``SeriesDescription``) to their text or ``None``.
    """
    modality = (tags.get("Modality") or "").strip().upper()
    for part in modality.split("\\"):
        part = part.strip()
        if part in OTHER_MODALITIES:
            return f"not a chest radiograph: Modality {part!r}"
    body = (tags.get("BodyPartExamined") or "").strip()
    if body:
        words = _words(body)
        if _names(words, CHEST_WORDS) is None and _names(words, OTHER_PARTS) is not None:
            return f"not a chest radiograph: BodyPartExamined {body[:40]!r}"
        return None
    for keyword in ("StudyDescription", "SeriesDescription"):
        text = (tags.get(keyword) or "").strip()
        words = _words(text)
        if words and _names(words, CHEST_WORDS) is None:
            part = _names(words, OTHER_PARTS)
            if part is not None:
                # the matched term only: a free-text description may hold more than a body part
                return f"not a chest radiograph: {keyword} names {part} (no BodyPartExamined)"
    return None


__all__ = ["CHEST_WORDS", "OTHER_MODALITIES", "OTHER_PARTS", "RADIOGRAPH_MODALITIES", "not_chest_reason"]
