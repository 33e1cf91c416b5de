"""Who the synthetic hospitals image, and what each image truly shows.

Why a model rather than independent coin flips: findings in real exports co-occur (heart
failure brings cardiomegaly, edema and effusions; infections bring consolidation and
pneumonia), depend on age and sex, and sicker patients are imaged AP with devices in place. A
federated method that exploits or suffers from such structure — AuxInfo's auxiliary heads learn
sex, age bin and view — should meet it here too.

Model (all per hospital, deterministic for a given ``numpy.random.Generator``):

* a patient has sex, age, race (canonical 5-way, or ``None`` = not recorded) and five
  latent factors ``cardiac, infection, chronic, neoplastic, acute`` ~ N(0, 1);
* a study's frontal view is AP with ``P = sigmoid(ap_bias + 1.2·acute)``, else PA; it gets an
  extra lateral view with probability ``lateral_fraction``; patients have 1 + Geometric studies;
* a study draws each finding with ``logit = offset + Σ loading·factor + noise`` (noise ~ N(0, 0.5²)
  per study), the loadings of :data:`FINDINGS` making findings co-occur. The offset depends on
  the profile's ``demographics``:

  - ``nih`` (the default) and ``nih_prevalence``, for the 14 NIH ChestX-ray14 findings: NIH's
    real log-odds by sex × age bin × frontal view (:mod:`fedcxr.synth.demographics`, fitted from
    the 112,120 images' metadata by :mod:`fedcxr.synth.nih_fit`), plus ``prevalence_shift``,
    calibrated so that the factors and the noise leave each cell's prevalence at that value —
    given the view, since acute patients are imaged AP. ``nih_prevalence`` keeps NIH's own levels
    (pneumonia 1.3 %, edema 2.0 %...: too rare for a demo's test split of a hundred images);
    ``nih`` shifts each finding's log-odds by one constant so that its prevalence in NIH's case
    mix is :attr:`FindingModel.level` (6-18 %, hernia 2.5 %) — NIH's odds ratios, measurable
    prevalences. The other findings (CheXpert's four, COVID-19) keep the legacy formula.
  - ``legacy`` (the model before NIH's effects; kept to reproduce earlier exports draw for draw):
    ``offset = base + prevalence_shift + age_slope·(age-55)/20`` for every finding; neither sex
    nor view changes a finding (the view only through the acute factor).

  ``covid19``'s base is the hospital's ``covid_prevalence`` (zero → never drawn); findings in
  :data:`PATIENT_LEVEL` are drawn at the first study and kept for the others.

Every mode draws the same random numbers in the same order, so for one seed the patients, their
ages, studies and views are the same in every mode; only the findings differ. Marginal
prevalences at the defaults are 6-35 % for the common findings (measured in
``tests/synth/test_cohort.py``), so per-class AUROCs are measurable on a few hundred images.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from fedcxr.synth.phantom import Subject
from fedcxr.vocab import age_bin_code

FACTORS = ("cardiac", "infection", "chronic", "neoplastic", "acute")
#: how strongly the acute factor makes a study AP, and the per-study noise of every finding's logit
AP_ACUTE_SLOPE = 1.2
STUDY_NOISE_SD = 0.5
#: the profile's ``demographics`` choices (module doc)
DEMOGRAPHICS = ("nih", "nih_prevalence", "legacy")


@dataclass(frozen=True)
class FindingModel:
    """Prevalence model of one finding: base logit, factor loadings, age slope (``legacy``) and
    the prevalence in NIH's case mix under ``demographics: nih`` (``level``; NIH findings only).

    The levels are the legacy model's marginal prevalences at the default profile (20,000 draws),
    so ``nih`` hospitals keep about the legacy case load while taking NIH's odds ratios."""

    base: float
    loadings: dict = field(default_factory=dict)
    age_slope: float = 0.4
    level: Optional[float] = None


FINDINGS: dict[str, FindingModel] = {
    "cardiomegaly": FindingModel(-2.3, {"cardiac": 1.6}, 0.6, 0.175),
    "enlarged_cardiomediastinum": FindingModel(-3.0, {"cardiac": 1.3}, 0.4),
    "edema": FindingModel(-2.7, {"cardiac": 1.5, "acute": 0.6}, 0.5, 0.134),
    "pleural_effusion": FindingModel(-2.2, {"cardiac": 1.1, "infection": 0.5, "acute": 0.4}, 0.5, 0.16),
    "atelectasis": FindingModel(-2.2, {"acute": 1.0, "infection": 0.4}, 0.4, 0.145),
    "consolidation": FindingModel(-2.6, {"infection": 1.5}, 0.2, 0.136),
    "pneumonia": FindingModel(-2.7, {"infection": 1.6}, 0.2, 0.133),
    "infiltration": FindingModel(-2.5, {"infection": 1.0}, 0.1, 0.111),
    "pneumothorax": FindingModel(-2.7, {"acute": 1.0}, -0.1, 0.094),
    "nodule": FindingModel(-3.0, {"neoplastic": 1.2}, 0.5, 0.092),
    "mass": FindingModel(-3.3, {"neoplastic": 1.5}, 0.6, 0.089),
    "emphysema": FindingModel(-3.4, {"chronic": 1.5}, 0.7, 0.084),
    "fibrosis": FindingModel(-3.5, {"chronic": 1.3}, 0.7, 0.069),
    "pleural_thickening": FindingModel(-3.3, {"chronic": 0.9}, 0.5, 0.059),
    "hernia": FindingModel(-4.0, {}, 0.8, 0.025),
    "pleural_other": FindingModel(-3.6, {"chronic": 0.5}, 0.4),
    "fracture": FindingModel(-3.6, {"acute": 0.5}, 0.4),
    "support_devices": FindingModel(-2.2, {"acute": 1.8}, 0.2),
    # base is replaced by the hospital's covid_prevalence (zero → never drawn)
    "covid19": FindingModel(0.0, {"infection": 1.2}, 0.1),
}

RACES = ("white", "black", "asian", "hispanic", "other")

#: Findings drawn once per patient and kept for every study (MIDRC's ``covid19_positive`` is
#: a case-level fact: "ever tested positive").
PATIENT_LEVEL = frozenset({"covid19"})


@dataclass(frozen=True)
class CohortProfile:
    """The case mix of one hospital (defaults: an adult general hospital)."""

    female_fraction: float = 0.45
    age_mean: float = 55.0
    age_sd: float = 18.0
    race_probs: Optional[dict] = None  # canonical race → probability; None = not recorded
    race_missing: float = 0.05  # fraction with race not recorded (when recorded at all)
    prevalence_shift: float = 0.0  # logit offset for every finding but covid19
    covid_prevalence: float = 0.0
    ap_bias: float = -0.8
    lateral_fraction: float = 0.0
    extra_studies: float = 0.35  # mean of the geometric number of follow-up studies
    demographics: str = "nih"  # how sex, age and view move the findings: DEMOGRAPHICS (module doc)

    def __post_init__(self) -> None:
        if self.demographics not in DEMOGRAPHICS:
            raise ValueError(f"demographics {self.demographics!r}: choose one of {', '.join(DEMOGRAPHICS)}")


@dataclass(frozen=True)
class Patient:
    index: int  # 0-based within the hospital
    sex: str  # "M" / "F"
    age: float  # years at the first study
    race: Optional[str]
    factors: tuple  # latent factors, FACTORS order


@dataclass(frozen=True)
class ImageDraw:
    """One image to write: who, which study and view, and what it shows."""

    index: int  # 0-based image index within the hospital (drives the pixel seed)
    patient: Patient
    study: int  # 1-based within the patient
    view_number: int  # 1-based within the study
    age: float  # years at this study
    subject: Subject


def sample_patient(index: int, profile: CohortProfile, rng: np.random.Generator) -> Patient:
    sex = "F" if rng.random() < profile.female_fraction else "M"
    age = float(np.clip(rng.normal(profile.age_mean, profile.age_sd), 1.0, 97.0))
    race = None
    if profile.race_probs and rng.random() >= profile.race_missing:
        names = list(profile.race_probs)
        p = np.array([profile.race_probs[n] for n in names], dtype=float)
        race = names[int(rng.choice(len(names), p=p / p.sum()))]
    return Patient(index, sex, age, race, tuple(float(v) for v in rng.standard_normal(len(FACTORS))))


def sample_study(patient: Patient, age: float, profile: CohortProfile, rng: np.random.Generator) -> tuple[frozenset, str]:
    """The true findings and the frontal view (``AP``/``PA``) of one study (see module doc).

    The random numbers are drawn in the legacy model's order (each finding's noise and uniform,
    then the view's uniform) whatever the mode, so a seed gives the same views in every mode."""
    draws = {}
    for name in FINDINGS:
        if name == "covid19" and profile.covid_prevalence <= 0:
            continue
        draws[name] = (rng.normal(0.0, STUDY_NOISE_SD), rng.random())
    z = dict(zip(FACTORS, patient.factors))
    view = "AP" if rng.random() < 1.0 / (1.0 + math.exp(-(profile.ap_bias + AP_ACUTE_SLOPE * z["acute"]))) else "PA"
    offsets = None if profile.demographics == "legacy" else _nih_offsets(
        profile.demographics, profile.ap_bias, profile.prevalence_shift)
    cell = (int(patient.sex == "M"), age_bin_code(age), int(view == "AP"))
    found = set()
    for name, (noise, u) in draws.items():
        model = FINDINGS[name]
        if offsets is not None and name in offsets:
            logit = offsets[name][cell] + sum(w * z[f] for f, w in model.loadings.items()) + noise
        else:
            logit = _legacy_base(name, profile) + sum(w * z[f] for f, w in model.loadings.items())
            logit += model.age_slope * (age - 55.0) / 20.0 + noise
        if u < 1.0 / (1.0 + math.exp(-logit)):
            found.add(name)
    return frozenset(found), view


def _legacy_base(name: str, profile: CohortProfile) -> float:
    if name == "covid19":
        return math.log(profile.covid_prevalence / (1.0 - profile.covid_prevalence)) - 0.3
    return FINDINGS[name].base + profile.prevalence_shift


@functools.lru_cache(maxsize=64)
def _nih_offsets(demographics: str, ap_bias: float, prevalence_shift: float) -> dict:
    """Per NIH finding, its calibrated logit offset per cell, a ``[sex, age_bin, view]`` array."""
    from fedcxr.synth import demographics as nih

    out = {}
    for name in nih.nih_findings():
        model = FINDINGS[name]
        target = nih.cell_logits(name) + prevalence_shift
        if demographics == "nih":
            target = target + nih.lift(name, model.level)
        out[name] = nih.calibrate(target, model.loadings, acute="acute", noise_sd=STUDY_NOISE_SD,
                                  ap_intercept=ap_bias, ap_slope=AP_ACUTE_SLOPE)
    return out


def sample_cohort(n_images: int, profile: CohortProfile, rng: np.random.Generator) -> list[ImageDraw]:
    """Exactly ``n_images`` images from as many patients as needed (the last may be cut short)."""
    images: list[ImageDraw] = []
    patient_index = 0
    while len(images) < n_images:
        patient = sample_patient(patient_index, profile, rng)
        patient_index += 1
        n_studies = 1 + int(rng.geometric(1.0 / (1.0 + profile.extra_studies)) - 1)
        age = patient.age
        persistent: Optional[frozenset] = None
        for study in range(1, n_studies + 1):
            findings, frontal = sample_study(patient, age, profile, rng)
            if persistent is None:
                persistent = findings & PATIENT_LEVEL
            findings = (findings - PATIENT_LEVEL) | persistent
            views = [frontal]
            if rng.random() < profile.lateral_fraction:
                views.append("LATERAL")
            for number, view in enumerate(views, start=1):
                if len(images) == n_images:
                    return images
                subject = Subject(sex=patient.sex, age=age, race=patient.race, view=view, findings=findings)
                images.append(ImageDraw(len(images), patient, study, number, age, subject))
            age = min(age + float(rng.uniform(0.05, 1.5)), 99.0)
    return images
