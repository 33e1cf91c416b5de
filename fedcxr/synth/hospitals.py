"""The four synthetic hospitals: case mix, acquisition look, detector shapes, label sets.

Why four different hospitals: federated training and domain adaptation need sites that
differ the way real ones do — *label heterogeneity* (NIH-14 vs CheXpert-14 vs COVID-19 vs a
local finding list), *covariate shift* (contrast, gamma, noise, blur, positioning, detector
size and aspect) and *case-mix shift* (age, sex, race, AP share, prevalence). Every hospital's
findings depend on sex, age bin and view with NIH ChestX-ray14's odds ratios (``demographics:
nih``, :mod:`fedcxr.synth.cohort`), so the case-mix shift moves the findings as it would in real
hospitals and AuxInfo's auxiliary labels carry signal. Names are stable: configs, docs and the
demo refer to them.

=================  ========  ==========================================================
hospital           SOURCE    look and case mix
=================  ========  ==========================================================
``nih_style``      nih       square PNGs (some 1.5× larger), neutral contrast, outpatients,
                             many follow-ups, no race
``chexpert_style`` chexpert  portrait JPGs, high contrast, gamma < 1, inpatients (mostly AP),
                             30 % of studies with a lateral, race in a demographics sheet
``midrc_style``    midrc     larger 12-bit DICOMs (96×80 / 80×96 at 64 px), low contrast,
                             COVID-19 prevalence ~40 %, race + ethnicity, two states
``dicom_style``    dicom     noisy, blurred CR/DX of mixed sizes and bit depths, strong
                             positioning variation, a local label csv (eight findings and
                             COVID-19, so the COVID-only ``midrc_style`` helps it too)
=================  ========  ==========================================================

Randomness: every draw comes from ``numpy.random.SeedSequence([seed, hospital.stream,
purpose, index])``, so an image's pixels depend only on (seed, hospital, image index) and
not on how many other images or hospitals are written.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from fedcxr.errors import UserError
from fedcxr.synth.cohort import DEMOGRAPHICS, CohortProfile, ImageDraw, sample_cohort
from fedcxr.synth.phantom import SiteStyle, render
from fedcxr.vocab import CLASSES

# purposes (third seed word)
COHORT, PIXELS, FORMAT = 0, 1, 2

NIH_CLASSES = [
    "atelectasis", "cardiomegaly", "consolidation", "edema", "pleural_effusion", "pneumonia",
    "pneumothorax", "infiltration", "mass", "nodule", "emphysema", "fibrosis",
    "pleural_thickening", "hernia", "no_finding",
]
CHEXPERT_CLASSES = [
    "no_finding", "enlarged_cardiomediastinum", "cardiomegaly", "lung_opacity", "lung_lesion",
    "edema", "consolidation", "pneumonia", "atelectasis", "pneumothorax", "pleural_effusion",
    "pleural_other", "fracture", "support_devices",
]
DICOM_CLASSES = [
    "atelectasis", "cardiomegaly", "consolidation", "edema", "pleural_effusion", "pneumonia",
    "pneumothorax", "no_finding", "covid19",
]


@dataclass(frozen=True)
class Hospital:
    """One synthetic hospital (see module doc)."""

    name: str
    source: str  # the ``fedcxr ingest`` SOURCE that reads its export
    stream: int  # second seed word: hospitals never share random streams
    cohort: CohortProfile
    style: SiteStyle
    shapes: tuple  # ((probability, height factor, width factor), ...) × image_size
    classes: tuple  # canonical classes its export labels, canonical order

    def rng(self, seed: int, purpose: int, index: int = 0) -> np.random.Generator:
        return np.random.default_rng(np.random.SeedSequence([int(seed), self.stream, purpose, int(index)]))


def _ordered(names: Sequence[str]) -> tuple:
    return tuple(c for c in CLASSES if c in set(names))


HOSPITALS: dict[str, Hospital] = {
    h.name: h
    for h in (
        Hospital(
            "nih_style", "nih", 11,
            CohortProfile(female_fraction=0.44, age_mean=47, age_sd=17, prevalence_shift=-0.2,
                          ap_bias=-0.6, extra_studies=0.8),
            SiteStyle(contrast=1.0, gamma=1.0, offset=0.0, noise=0.012, blur=0.3, max_rotation=3.0),
            ((0.85, 1.0, 1.0), (0.15, 1.5, 1.5)),
            _ordered(NIH_CLASSES),
        ),
        Hospital(
            "chexpert_style", "chexpert", 12,
            CohortProfile(female_fraction=0.41, age_mean=60, age_sd=17,
                          race_probs={"white": 0.56, "black": 0.06, "asian": 0.16, "hispanic": 0.14, "other": 0.08},
                          race_missing=0.08, prevalence_shift=0.35, ap_bias=0.8, lateral_fraction=0.3,
                          extra_studies=0.6),
            SiteStyle(contrast=1.2, gamma=0.8, offset=0.04, noise=0.02, blur=0.6, max_rotation=4.0, max_shift=0.05),
            ((0.7, 1.25, 1.0), (0.3, 1.2, 1.1)),
            _ordered(CHEXPERT_CLASSES),
        ),
        Hospital(
            "midrc_style", "midrc", 13,
            CohortProfile(female_fraction=0.5, age_mean=58, age_sd=17,
                          race_probs={"white": 0.45, "black": 0.32, "asian": 0.05, "hispanic": 0.12, "other": 0.06},
                          race_missing=0.06, covid_prevalence=0.4, ap_bias=0.3, extra_studies=0.3),
            SiteStyle(contrast=0.85, gamma=1.3, offset=-0.05, noise=0.008, blur=0.0, max_rotation=2.0,
                      max_shift=0.03, zoom=(1.0, 1.1)),
            ((0.6, 1.5, 1.25), (0.4, 1.25, 1.5)),
            ("covid19",),
        ),
        Hospital(
            "dicom_style", "dicom", 14,
            CohortProfile(female_fraction=0.47, age_mean=62, age_sd=18, prevalence_shift=0.1, ap_bias=0.0,
                          covid_prevalence=0.2, extra_studies=0.2),
            SiteStyle(contrast=0.95, gamma=1.1, offset=0.0, noise=0.03, blur=0.9, max_rotation=7.0,
                      max_shift=0.08, zoom=(0.9, 1.1)),
            ((0.5, 1.0, 1.0), (0.5, 1.25, 1.5)),
            _ordered(DICOM_CLASSES),
        ),
    )
}


def select(sites: Sequence[str] | None) -> list[Hospital]:
    """Hospitals by name (all when ``sites`` is empty or None); exit-2 error for unknown names."""
    if not sites:
        return list(HOSPITALS.values())
    unknown = [s for s in sites if s not in HOSPITALS]
    if unknown:
        raise UserError(f"--sites: unknown synthetic hospital(s) {unknown}; choose from {', '.join(HOSPITALS)}")
    return [HOSPITALS[s] for s in dict.fromkeys(sites)]


def with_demographics(hospital: Hospital, demographics: str) -> Hospital:
    """The hospital with another ``demographics`` mode (:data:`fedcxr.synth.cohort.DEMOGRAPHICS`);
    exit-2 error for an unknown one."""
    if demographics not in DEMOGRAPHICS:
        raise UserError(f"demographics {demographics!r}: choose one of {', '.join(DEMOGRAPHICS)}")
    return replace(hospital, cohort=replace(hospital.cohort, demographics=demographics))


def cohort(hospital: Hospital, n_images: int, seed: int) -> list[ImageDraw]:
    """The hospital's ``n_images`` images (who, which study and view, which findings)."""
    return sample_cohort(n_images, hospital.cohort, hospital.rng(seed, COHORT))


def pixels(hospital: Hospital, draw: ImageDraw, image_size: int, seed: int) -> np.ndarray:
    """The image of ``draw``: float32 ``(H, W)`` in [0, 1]; shape from the hospital's detectors."""
    rng = hospital.rng(seed, PIXELS, draw.index)
    probs = np.array([s[0] for s in hospital.shapes])
    _, fh, fw = hospital.shapes[int(rng.choice(len(probs), p=probs / probs.sum()))]
    shape = (max(8, round(image_size * fh)), max(8, round(image_size * fw)))
    return render(draw.subject, shape, hospital.style, rng)


def to_uint(image: np.ndarray, bits: int) -> np.ndarray:
    """[0, 1] floats → unsigned integers using the full ``bits`` range (uint8 or uint16)."""
    top = (1 << bits) - 1
    dtype = np.uint8 if bits <= 8 else np.uint16
    return np.round(np.clip(image, 0.0, 1.0) * top).astype(dtype)
