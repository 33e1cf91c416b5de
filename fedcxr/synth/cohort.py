"""Who the synthetic hospitals image, and what each image truly shows.

Why a model rather than independent coin flips: findings in real exports co-occur (heart
failure brings cardiomegaly, edema and effusions; infections bring consolidation and
pneumonia), grow with age, and sicker patients are imaged AP with devices in place. A
federated method that exploits or suffers from such structure should meet it here too.

Model (all per hospital, deterministic for a given ``numpy.random.Generator``):

* a patient has sex, age, race (canonical 5-way, or ``None`` = not recorded) and five
  latent factors ``cardiac, infection, chronic, neoplastic, acute`` ~ N(0, 1);
* a study draws each finding with ``logit = base + Σ loading·factor + age_slope·(age-55)/20
  + study noise``; ``base`` comes from :data:`FINDINGS` scaled by the hospital's
  ``prevalence_shift`` (logit offset) and, for ``covid19``, its ``covid_prevalence``;
* findings in :data:`PATIENT_LEVEL` are drawn at the first study and kept for the others;
* the view is AP with ``P = sigmoid(ap_bias + 1.2·acute)``, else PA; a study gets an extra
  lateral view with probability ``lateral_fraction``; patients have 1 + Geometric studies.

Marginal prevalences at the defaults are 10-35 % for the common findings (measured in
``tests/synth/test_cohort.py``), so per-class AUROCs are measurable on a few hundred images.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from fedcxr.synth.phantom import Subject

FACTORS = ("cardiac", "infection", "chronic", "neoplastic", "acute")


@dataclass(frozen=True)
class FindingModel:
    """Prevalence model of one finding: base logit, factor loadings, age slope."""

    base: float
    loadings: dict = field(default_factory=dict)
    age_slope: float = 0.4


FINDINGS: dict[str, FindingModel] = {
    "cardiomegaly": FindingModel(-2.3, {"cardiac": 1.6}, 0.6),
    "enlarged_cardiomediastinum": FindingModel(-3.0, {"cardiac": 1.3}, 0.4),
    "edema": FindingModel(-2.7, {"cardiac": 1.5, "acute": 0.6}, 0.5),
    "pleural_effusion": FindingModel(-2.2, {"cardiac": 1.1, "infection": 0.5, "acute": 0.4}, 0.5),
    "atelectasis": FindingModel(-2.2, {"acute": 1.0, "infection": 0.4}, 0.4),
    "consolidation": FindingModel(-2.6, {"infection": 1.5}, 0.2),
    "pneumonia": FindingModel(-2.7, {"infection": 1.6}, 0.2),
    "infiltration": FindingModel(-2.5, {"infection": 1.0}, 0.1),
    "pneumothorax": FindingModel(-2.7, {"acute": 1.0}, -0.1),
    "nodule": FindingModel(-3.0, {"neoplastic": 1.2}, 0.5),
    "mass": FindingModel(-3.3, {"neoplastic": 1.5}, 0.6),
    "emphysema": FindingModel(-3.4, {"chronic": 1.5}, 0.7),
    "fibrosis": FindingModel(-3.5, {"chronic": 1.3}, 0.7),
    "pleural_thickening": FindingModel(-3.3, {"chronic": 0.9}, 0.5),
    "hernia": FindingModel(-4.0, {}, 0.8),
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


def sample_findings(patient: Patient, age: float, profile: CohortProfile, rng: np.random.Generator) -> frozenset:
    """The true findings of one study (see module doc)."""
    z = dict(zip(FACTORS, patient.factors))
    found = set()
    for name, model in FINDINGS.items():
        if name == "covid19":
            if profile.covid_prevalence <= 0:
                continue
            base = math.log(profile.covid_prevalence / (1.0 - profile.covid_prevalence)) - 0.3
        else:
            base = model.base + profile.prevalence_shift
        logit = base + sum(w * z[f] for f, w in model.loadings.items())
        logit += model.age_slope * (age - 55.0) / 20.0 + rng.normal(0.0, 0.5)
        if rng.random() < 1.0 / (1.0 + math.exp(-logit)):
            found.add(name)
    return frozenset(found)


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
            findings = sample_findings(patient, age, profile, rng)
            if persistent is None:
                persistent = findings & PATIENT_LEVEL
            findings = (findings - PATIENT_LEVEL) | persistent
            z_acute = patient.factors[FACTORS.index("acute")]
            ap = rng.random() < 1.0 / (1.0 + math.exp(-(profile.ap_bias + 1.2 * z_acute)))
            views = ["AP" if ap else "PA"]
            if rng.random() < profile.lateral_fraction:
                views.append("LATERAL")
            for number, view in enumerate(views, start=1):
                if len(images) == n_images:
                    return images
                subject = Subject(sex=patient.sex, age=age, race=patient.race, view=view, findings=findings)
                images.append(ImageDraw(len(images), patient, study, number, age, subject))
            age = min(age + float(rng.uniform(0.05, 1.5)), 99.0)
    return images
